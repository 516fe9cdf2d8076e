"""draft_tail at B=256: more tiles in flight a program, and a cheaper comparison (GPU only).

`probe_staged.py` (results/h200/probes/probe-staged.txt) found that a program a row
reads its row in 20.3-20.7 us when Triton's pipeliner keeps 3-5 tiles in flight
(cp.async to shared memory), against 22.3 us with one tile, but the argmax through the
same staged loop took 25.9 us or more (the recipe: 24.5). The sm_90 SASS of the
recipe's loop spends ~7-8 instructions an element (bf16 -> fp32, two FSETP, FSEL, SEL,
register moves of the hand pipeline), so at two 16-warp programs an SM the issue slots
are ~40% busy. Variants timed here, the hidden row copied by the argmax programs (as
FUSE_H), outputs compared with the reference first:

* `_tail`, D tiles in flight in registers (1-8): the loop folds tile t and at once
  reloads its buffer with tile t + D, so no register rotates (unrolled by D); SPLIT
  programs a row (1-4; more than one meet through the recipe's arrival counter);
* `_stail`, the staged loop: whole tiles through tl.range(num_stages=S) unmasked (no
  select after the shared-memory load), the last partial tile masked after it;
* CMP 0: the recipe's comparison in float32; CMP 1: in the logits' own dtype (bf16
  `HSETP2` compares two elements an instruction; exact, since widening is exact);
  CMP 9: no argmax, the row summed (what the same loop costs to read).
Part 1 (D 1-4, CMP 0/1/9), part 2 (D 4-8 and the staged loop) and part 3 (SPLIT 2-4) made
probes/probe-inflight.txt, -2.txt and -3.txt; parts 1 and 2 ran before `_tail` took
SPLIT (its SPLIT 1 code is the same).
Usage: python tools/probe_inflight.py OUTFILE [PART]
"""
import importlib
import sys

import torch
import triton
import triton.language as tl

from autotune.timing import rotation
from recipes import _common as C
from recipes._argmax_core import PACKED_EMPTY, pack, publish_packed, split_plan, unpack_index

DT = importlib.import_module("recipes.draft_tail")
from probe_layout import run_recipe  # noqa: E402
from probe_tail import _clone, _states, rec, sayer, verified  # noqa: E402


@triton.jit
def _upd(x, t, best, bt, acc, CMP: tl.constexpr):
    if CMP == 0:
        xf = x.to(tl.float32)
        take = (~(xf <= best)) & (best == best)
        nb = tl.where(take, xf, best)
        nt = tl.where(take, t, bt)
    elif CMP == 1:
        take = (~(x <= best)) & (best == best)
        nb = tl.where(take, x, best)
        nt = tl.where(take, t, bt)
    else:
        nb = best
        nt = bt
        acc += x.to(tl.float32)
    return nb, nt, acc


@triton.jit
def _ld(row, t, lanes, hi, BLOCK: tl.constexpr):
    o = t * BLOCK + lanes
    return tl.load(row + o, mask=o < hi, other=float("-inf"))


@triton.jit
def _tail(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, h_ptr, hout_ptr,
          sum_ptr, acc_ptr, cnt_ptr, R, V, stride_x, stride_map, stride_pos, stride_dt,
          dt_col, n_split, tiles_per, H, stride_h, h_slice, BLOCK: tl.constexpr,
          BLOCK_H: tl.constexpr, D: tl.constexpr, CMP: tl.constexpr):
    q = tl.program_id(0)
    b = q // n_split
    sp = q % n_split
    first = sp == 0
    pos = tl.load(pos_ptr + b.to(tl.int64) * stride_pos, mask=first, other=0)
    r = DT._selected_row(rows_ptr, b, 1, R, True)
    lo = sp * tiles_per * BLOCK
    V = tl.minimum(lo + tiles_per * BLOCK, V) - lo     # the chunk's length from its start
    row = x_ptr + r * stride_x + lo
    hl = tl.arange(0, BLOCK_H)
    hc = sp * h_slice + hl
    hm = (hl < h_slice) & (hc < H)
    hv = tl.load(h_ptr + r * stride_h + hc, mask=hm)
    lanes = tl.arange(0, BLOCK)
    if CMP == 1:
        best = tl.full([BLOCK], float("-inf"), x_ptr.dtype.element_ty)
    else:
        best = tl.full([BLOCK], float("-inf"), tl.float32)
    bt = tl.zeros([BLOCK], tl.int32)
    acc = tl.zeros([BLOCK], tl.float32)
    # the D buffers are written out one by one: a Triton kernel has no arrays of tensors
    a0 = _ld(row, 0, lanes, V, BLOCK)
    a1 = a0
    a2 = a0
    a3 = a0
    a4 = a0
    a5 = a0
    a6 = a0
    a7 = a0
    if D > 1:
        a1 = _ld(row, 1, lanes, V, BLOCK)
    if D > 2:
        a2 = _ld(row, 2, lanes, V, BLOCK)
    if D > 3:
        a3 = _ld(row, 3, lanes, V, BLOCK)
    if D > 4:
        a4 = _ld(row, 4, lanes, V, BLOCK)
    if D > 5:
        a5 = _ld(row, 5, lanes, V, BLOCK)
    if D > 6:
        a6 = _ld(row, 6, lanes, V, BLOCK)
    if D > 7:
        a7 = _ld(row, 7, lanes, V, BLOCK)
    tl.store(hout_ptr + b.to(tl.int64) * H + hc, hv, mask=hm)
    for t in range(0, tiles_per, D):
        best, bt, acc = _upd(a0, t, best, bt, acc, CMP)
        a0 = _ld(row, t + D, lanes, V, BLOCK)
        if D > 1:
            best, bt, acc = _upd(a1, t + 1, best, bt, acc, CMP)
            a1 = _ld(row, t + 1 + D, lanes, V, BLOCK)
        if D > 2:
            best, bt, acc = _upd(a2, t + 2, best, bt, acc, CMP)
            a2 = _ld(row, t + 2 + D, lanes, V, BLOCK)
        if D > 3:
            best, bt, acc = _upd(a3, t + 3, best, bt, acc, CMP)
            a3 = _ld(row, t + 3 + D, lanes, V, BLOCK)
        if D > 4:
            best, bt, acc = _upd(a4, t + 4, best, bt, acc, CMP)
            a4 = _ld(row, t + 4 + D, lanes, V, BLOCK)
        if D > 5:
            best, bt, acc = _upd(a5, t + 5, best, bt, acc, CMP)
            a5 = _ld(row, t + 5 + D, lanes, V, BLOCK)
        if D > 6:
            best, bt, acc = _upd(a6, t + 6, best, bt, acc, CMP)
            a6 = _ld(row, t + 6 + D, lanes, V, BLOCK)
        if D > 7:
            best, bt, acc = _upd(a7, t + 7, best, bt, acc, CMP)
            a7 = _ld(row, t + 7 + D, lanes, V, BLOCK)
    tl.store(probs_ptr + b, 1.0, mask=first)
    tl.store(pos_ptr + b.to(tl.int64) * stride_pos, pos + 1, mask=first)
    if CMP == 9:
        tl.store(sum_ptr + q, tl.sum(acc, 0))
    else:
        packed = tl.max(pack(best.to(tl.float32), lo + bt * BLOCK + lanes), 0)
        if n_split == 1:
            DT._finish(b, unpack_index(packed), map_ptr, tok_ptr, dt_ptr, stride_map,
                       stride_dt, dt_col, True, True)
        else:
            arrived = publish_packed(packed, acc_ptr + b, cnt_ptr + b)
            if arrived == n_split - 1:
                packed = tl.atomic_xchg(acc_ptr + b, PACKED_EMPTY, sem="relaxed")
                DT._finish(b, unpack_index(packed), map_ptr, tok_ptr, dt_ptr, stride_map,
                           stride_dt, dt_col, True, True)
                tl.store(cnt_ptr + b, 0)


@triton.jit
def _stail(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, h_ptr, hout_ptr,
           sum_ptr, R, V, stride_x, stride_map, stride_pos, stride_dt, dt_col, H, stride_h,
           BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, S: tl.constexpr,
           CMP: tl.constexpr):
    """The staged scan: whole tiles through tl.range(num_stages=S) with no mask (no
    select after the shared-memory load), then the last, partial tile masked."""
    b = tl.program_id(0)
    pos = tl.load(pos_ptr + b.to(tl.int64) * stride_pos)
    r = DT._selected_row(rows_ptr, b, 1, R, True)
    row = x_ptr + r * stride_x
    hl = tl.arange(0, BLOCK_H)
    hv = tl.load(h_ptr + r * stride_h + hl, mask=hl < H)
    lanes = tl.arange(0, BLOCK)
    if CMP == 1:
        best = tl.full([BLOCK], float("-inf"), x_ptr.dtype.element_ty)
    else:
        best = tl.full([BLOCK], float("-inf"), tl.float32)
    bt = tl.zeros([BLOCK], tl.int32)
    acc = tl.zeros([BLOCK], tl.float32)
    n_full = V // BLOCK
    tl.store(hout_ptr + b.to(tl.int64) * H + hl, hv, mask=hl < H)
    for t in tl.range(0, n_full, num_stages=S):
        x = tl.load(row + t * BLOCK + lanes)
        best, bt, acc = _upd(x, t, best, bt, acc, CMP)
    x = _ld(row, n_full, lanes, V, BLOCK)
    best, bt, acc = _upd(x, n_full, best, bt, acc, CMP)
    tl.store(probs_ptr + b, 1.0)
    tl.store(pos_ptr + b.to(tl.int64) * stride_pos, pos + 1)
    if CMP == 9:
        tl.store(sum_ptr + b, tl.sum(acc, 0))
    else:
        packed = tl.max(pack(best.to(tl.float32), bt * BLOCK + lanes), 0)
        DT._finish(b, unpack_index(packed), map_ptr, tok_ptr, dt_ptr, stride_map, stride_dt,
                   dt_col, True, True)


def run_tail(st, cfg, sums):
    x, rows, hid, tmap = st["logits"], st["rows"], st["hidden"], st["token_map"]
    pos, dt, out = st["positions"], st["draft_tokens"], st["out"]
    R, V = x.shape
    B, H = rows.shape[0], hid.shape[1]
    if cfg.get("S"):
        return _stail[(B,)](
            x, rows, tmap, out.tokens, out.probs, pos, dt, hid, out.hidden, sums,
            R, V, x.stride(0), tmap.stride(0), pos.stride(0), dt.stride(0),
            st["column"] * dt.stride(1), H, hid.stride(0),
            BLOCK=cfg["BLOCK"], BLOCK_H=C.next_pow2(H), S=cfg["S"], CMP=cfg["CMP"],
            num_warps=cfg["w"], num_stages=cfg["S"])
    split, tiles_per = split_plan(V, cfg["BLOCK"], cfg.get("split", 1))
    h_slice = C.cdiv(H, split)
    acc, cnt = C.WORKSPACE.get(x.device, B, B)
    return _tail[(B * split,)](
        x, rows, tmap, out.tokens, out.probs, pos, dt, hid, out.hidden, sums, acc, cnt,
        R, V, x.stride(0), tmap.stride(0), pos.stride(0), dt.stride(0),
        st["column"] * dt.stride(1), split, tiles_per, H, hid.stride(0), h_slice,
        BLOCK=cfg["BLOCK"], BLOCK_H=C.next_pow2(h_slice), D=cfg["D"], CMP=cfg["CMP"],
        num_warps=cfg["w"], num_stages=1)


# The variants of each run (the first shape times them all, the others its best eight):
# part 1 -> probes/probe-inflight.txt, part 2 -> probe-inflight-2.txt, part 3 -> -3.txt.
PARTS = {
    1: [{"BLOCK": bv, "w": w, "D": d, "CMP": c} for c in (0, 1, 9)
        for bv, w in ((4096, 16), (2048, 16), (4096, 8), (2048, 8), (8192, 16), (1024, 4),
                      (2048, 4))
        for d in (1, 2, 3, 4)],
    2: ([{"BLOCK": bv, "w": w, "D": d, "CMP": c}
         for c in (1, 9) for bv, w in ((4096, 16), (2048, 16), (1024, 16), (2048, 8))
         for d in (4, 6, 8)]
        + [{"BLOCK": bv, "w": w, "S": sg, "CMP": c}
           for c in (0, 1, 9) for bv, w in ((4096, 16), (4096, 8), (2048, 8), (2048, 4),
                                            (8192, 16), (4096, 4))
           for sg in (3, 4, 6, 8) if (sg - 1) * bv * 2 <= 96 * 1024]
        + [{"BLOCK": 2048, "w": 16, "D": 4, "CMP": 1}]),
    3: ([{"BLOCK": bv, "w": w, "D": d, "CMP": c, "split": sp}
         for c in (1, 9) for sp in (2, 3, 4)
         for bv, w in ((2048, 16), (1024, 16), (2048, 8), (4096, 8), (1024, 8))
         for d in (2, 4)]
        + [{"BLOCK": 2048, "w": 16, "D": 4, "CMP": 1}]),
}


def main(path, part):
    dev = torch.device("cuda")
    say = sayer(path)
    say(f"# {torch.cuda.get_device_name(dev)} ({C.sm_count(dev)} SMs); torch "
        f"{torch.__version__}, triton {triton.__version__}; graph-replay medians in us")
    cands = PARTS[part]
    first = None
    for B, V, H in ((256, 151936, 4096), (256, 151936, 7168), (64, 151936, 4096)):
        key = DT.tune_key(torch.bfloat16, V, B, H)
        nb1 = DT._bytes(key, hidden_passes=1)
        sts = _states(key, dev, rotation(DT._bytes(key)))
        master = _clone(sts[0])
        sums = torch.empty(B * 8, device=dev)
        say(f"## B={B} V={V} H={H} bf16: issue's count {nb1 / 1e6:.2f} MB, 85% of 4.24 "
            f"TB/s: {nb1 / 4.24e6 / 0.85:.2f} us")
        t = rec(lambda s: run_recipe(s, None), sts, twice=True)
        say(f"recipe, dispatched config                      {t[0]:7.2f} {t[1]:7.2f}")
        res = []
        for cfg in cands if first is None else first:
            bv, w, cmp_ = cfg["BLOCK"], cfg["w"], cfg["CMP"]
            how = (f"S{cfg['S']}" if cfg.get("S") else f"D{cfg['D']}")
            how += f" split {cfg.get('split', 1)}"
            tag = f"{bv:>5} w{w:<2} {how} CMP{cmp_}"
            fn = (lambda s, c=cfg, o=sums: run_tail(s, c, o))
            try:
                k = fn(sts[0])
            except Exception as e:  # noqa: BLE001
                say(f"{tag}: ERROR {type(e).__name__}: {str(e)[:160]}")
                continue
            if cmp_ != 9 and not verified(say, tag, fn, master):   # CMP 9 only sums
                continue
            regs, spills = k.n_regs, k.n_spills
            t = rec(fn, sts)[0]
            say(f"{tag:<46} {t:7.2f}   regs {regs} spills {spills}")
            if cmp_ != 9:
                res.append((t, tag, fn, cfg))
        res.sort(key=lambda r: r[0])
        if first is None:   # the other shapes: the first one's best eight
            first = [r[3] for r in res[:8]]
        for _, tag, fn, _ in res[:4]:
            tt = rec(fn, sts, twice=True)
            say(f"best again: {tag:<34} {tt[0]:7.2f} {tt[1]:7.2f} "
                f"({nb1 / tt[0] / 1e6:.2f} TB/s by the issue's count, "
                f"{nb1 / tt[0] / 4.24e6:.0%})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-inflight.txt",
         int(sys.argv[2]) if len(sys.argv) > 2 else 3)
