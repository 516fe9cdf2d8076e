"""draft_tail's grid layout at B=256, and one program a row at B=1 (GPU only).

`tools/probe_tail.py` found (results/h200/probes/probe-tail.txt) that at B=256 V=151936
the hidden copy costs 2.5 us in the recipe's grid for 4.2 MB moved, and that the argmax
alone runs at 3.46 TB/s. Hypotheses timed here (CUDA-graph replay medians, each best
variant twice; every variant's outputs checked against the reference first):

1. Hidden last: the recipe put its B * cdiv(H, BLOCK_H) hidden-copy programs first in
   the grid, so at 2 programs an SM they held every slot for a DRAM round trip before
   the first argmax program started; a variant kernel put them after the argmax
   programs. That is the recipe's layout since commit 90a2d9f, so the variant is gone
   from this file: the "hidden last" lines of probes/probe-layout.txt (and its "recipe"
   lines, hidden first) were made by this file at commit 5c9e7d5.
2. Balanced ranges: one program a row leaves 124 SMs with two rows and 8 with one at
   B=256. `_bal` gives each of G programs an equal range of the flattened (row, tile)
   space (rows cut anywhere); a row's pieces meet through the usual max slot, and the
   arrival counter counts tiles, so the last piece of a row finishes it whatever the
   number of programs that share it. Hidden programs last, as in 1.
3. The read ceiling: a read-only kernel (one 8 KB tile a program, a sum stored) over the
   same bytes, next to the copy curve (`probes/probe-bw.txt`).
4. B=1: one program for the whole row (no stage 2) with 16 and 32 warps.
Usage: python tools/probe_layout.py OUTFILE
"""
import importlib
import sys

import torch
import triton
import triton.language as tl

from autotune.timing import rotation, time_graph
from recipes import _common as C
from recipes._argmax_core import PACKED_EMPTY, chunk_argmax_packed, split_plan, unpack_index

DT = importlib.import_module("recipes.draft_tail")
from probe_tail import _check, _clone, _states, rec, sayer  # noqa: E402


@triton.jit
def _bal(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, h_ptr, hout_ptr,
         acc_ptr, cnt_ptr, R, V, stride_x, stride_map, stride_pos, stride_dt, dt_col,
         tpr, T, G, H, stride_h, h_tiles,
         BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, UNROLL: tl.constexpr):
    g = tl.program_id(0)
    if g < G:
        t = g.to(tl.int64) * T // G
        t1 = (g + 1).to(tl.int64) * T // G
        while t < t1:
            b = t // tpr
            rs = b * tpr
            e = tl.minimum(t1, rs + tpr)
            n = (e - t).to(tl.int32)
            head = t == rs
            pos = tl.load(pos_ptr + b * stride_pos, mask=head, other=0)
            r = tl.load(rows_ptr + b).to(tl.int64)
            r = tl.minimum(tl.maximum(r, 0), R - 1)
            lo = (t - rs).to(tl.int32) * BLOCK_V
            hi = tl.minimum(lo + n * BLOCK_V, V)
            packed = chunk_argmax_packed(x_ptr + r * stride_x, lo, hi, n, BLOCK_V, UNROLL)
            tl.store(probs_ptr + b, 1.0, mask=head)
            tl.store(pos_ptr + b * stride_pos, pos + 1, mask=head)
            finish = head & (n == tpr)
            if n != tpr:
                tl.atomic_max(acc_ptr + b, packed, sem="relaxed")
                before = tl.atomic_add(cnt_ptr + b, n, sem="acq_rel")
                if before + n == tpr:
                    packed = tl.atomic_xchg(acc_ptr + b, PACKED_EMPTY, sem="relaxed")
                    tl.store(cnt_ptr + b, 0)
                    finish = t >= 0
            if finish:
                token = tl.load(map_ptr + unpack_index(packed).to(tl.int64) * stride_map)
                tl.store(tok_ptr + b, token.to(tl.int64))
                tl.store(dt_ptr + b * stride_dt + dt_col, token.to(tl.int64))
            t = e
    else:
        DT._copy_hidden(g - G, rows_ptr, h_ptr, hout_ptr, R, 1, H, stride_h, h_tiles, True,
                        BLOCK_H)


@triton.jit
def _readsum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(v, 0))


class Ws:
    def __init__(self, B, dev):
        self.acc = torch.full((B,), -(2**63), dtype=torch.int64, device=dev)
        self.cnt = torch.zeros(B, dtype=torch.int32, device=dev)


def run_bal(st, cfg, ws):
    x, rows, hid, tmap = st["logits"], st["rows"], st["hidden"], st["token_map"]
    pos, dt, out = st["positions"], st["draft_tokens"], st["out"]
    R, V = x.shape
    B, H = rows.shape[0], hid.shape[1]
    tpr = C.cdiv(V, cfg["BLOCK_V"])
    T = B * tpr
    G = min(cfg["G"], T)
    bh = cfg["BLOCK_H"]
    h_tiles = C.cdiv(H, bh)
    _bal[(G + B * h_tiles,)](
        x, rows, tmap, out.tokens, out.probs, pos, dt, hid, out.hidden, ws.acc, ws.cnt,
        R, V, x.stride(0), tmap.stride(0), pos.stride(0), dt.stride(0),
        st["column"] * dt.stride(1), tpr, T, G, H, hid.stride(0), h_tiles,
        BLOCK_V=cfg["BLOCK_V"], BLOCK_H=bh, UNROLL=cfg["UNROLL"],
        num_warps=cfg["num_warps"], num_stages=1)


def run_recipe(st, cfg, **kw):
    a = {"hidden": st["hidden"], "token_map": st["token_map"],
         "positions": st["positions"], "draft_tokens": st["draft_tokens"]}
    a.update(kw)
    o = st["out"] if a["hidden"] is not None else DT.DraftTail(st["out"].tokens,
                                                               st["out"].probs, None)
    return DT.draft_tail(st["logits"], rows=st["rows"], column=st["column"], out=o,
                         config=cfg, **a)


def _layouts(say, dev, sms, B, V, H):
    """Part 2-3 for one shape: the read ceiling, the recipe, balanced."""
    key = DT.tune_key(torch.bfloat16, V, B, H)
    nb = DT._bytes(key)
    sts = _states(key, dev, rotation(nb))
    master = _clone(sts[0])
    ws = Ws(B, dev)
    say(f"## B={B} V={V} H={H} bf16: {nb / 1e6:.2f} MB; floor at 4.24 TB/s "
        f"{nb / 4.24e6:.2f} us; 85% of it: {nb / 4.24e6 / 0.85:.2f} us")
    xs = [torch.randn(nb // 2, device=dev).to(torch.bfloat16)
          for _ in range(rotation(nb))]
    part = torch.empty(C.cdiv(nb // 2, 4096), device=dev)
    t = rec(lambda x: _readsum[(C.cdiv(nb // 2, 4096),)](x, part, nb // 2, BLOCK=4096,
                                                           num_warps=4), xs, twice=True)
    say(f"read-only, 8 KB a program, same bytes        {t[0]:7.2f} {t[1]:7.2f} "
        f"({nb / t[0] / 1e6:.2f} TB/s)")
    res = []

    def trial(tag, fn):
        try:
            bad = _check(fn, master)
        except Exception as e:  # noqa: BLE001
            say(f"{tag}: ERROR {type(e).__name__}: {str(e)[:160]}")
            return
        if bad:
            say(f"{tag}: WRONG {bad}")
            return
        t = rec(fn, sts)[0]
        res.append((t, tag, fn))
        say(f"{tag:<48} {t:7.2f}")

    base = [(4096, 1, 2, 16), (4096, 2, 1, 16), (2048, 2, 1, 16), (8192, 1, 1, 16),
            (1024, 4, 1, 8), (4096, 1, 2, 8)]
    for bv, sp, u, w in base:
        cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": u, "num_warps": w,
               "num_stages": 1, "BLOCK_H": 4096}
        trial(f"recipe {bv} split {sp} U{u} w{w}",
              lambda s, c=cfg: run_recipe(s, c))
    for bv, u, w in ((4096, 2, 16), (4096, 1, 16), (2048, 2, 16), (4096, 2, 8),
                     (2048, 2, 8), (8192, 1, 16)):
        for k in (1, 2, 3, 4):
            G = k * sms
            if B == 64 and k > 2 and w == 16:
                continue
            cfg = {"BLOCK_V": bv, "UNROLL": u, "num_warps": w, "G": G, "BLOCK_H": 4096}
            trial(f"balanced {bv} U{u} w{w} G={G}", lambda s, c=cfg: run_bal(s, c, ws))
    res.sort(key=lambda r: r[0])
    for _, tag, fn in res[:3]:
        tt = rec(fn, sts, twice=True)
        say(f"best again: {tag:<40} {tt[0]:7.2f} {tt[1]:7.2f} "
            f"({nb / tt[0] / 1e6:.2f} TB/s, {nb / tt[0] / 4.24e6:.0%})")


def main(path):
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    say = sayer(path)

    say(f"# {torch.cuda.get_device_name(dev)} ({sms} SMs); torch {torch.__version__}, "
        f"triton {triton.__version__}; graph-replay medians in us")
    for B, V, H in ((256, 151936, 4096), (256, 151936, 7168), (64, 151936, 4096)):
        _layouts(say, dev, sms, B, V, H)

    B, V, H = 1, 32000, 4096
    key = DT.tune_key(torch.bfloat16, V, B, H)
    sts = _states(key, dev, rotation(DT._bytes(key)))
    say(f"## B=1 V={V} H={H}: one program a row vs split 32")
    for cfg in ({"BLOCK_V": 1024, "SPLIT": 32, "UNROLL": 1, "num_warps": 4},
                {"BLOCK_V": 16384, "SPLIT": 1, "UNROLL": 2, "num_warps": 16},
                {"BLOCK_V": 16384, "SPLIT": 1, "UNROLL": 2, "num_warps": 32},
                {"BLOCK_V": 32768, "SPLIT": 1, "UNROLL": 1, "num_warps": 32},
                {"BLOCK_V": 8192, "SPLIT": 1, "UNROLL": 2, "num_warps": 32}):
        for what, kw in (("full", {}), ("argmax only", {"token_map": None, "hidden": None,
                                                        "positions": None,
                                                        "draft_tokens": None})):
            fn = (lambda s, c=cfg, kw=kw: run_recipe(s, c, **kw))
            try:
                t = rec(fn, sts, twice=True)
                say(f"{cfg['BLOCK_V']:>5} split {cfg['SPLIT']:>2} U{cfg['UNROLL']} "
                    f"w{cfg['num_warps']:<2} {what:<12} {t[0]:7.2f} {t[1]:7.2f}")
            except Exception as e:  # noqa: BLE001
                say(f"{cfg}: ERROR {type(e).__name__}: {str(e)[:160]}")


if __name__ == "__main__" and len(sys.argv) < 3:
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-layout.txt")


def splits(path):
    """B=256: the recipe's layout with many programs a row (SPLIT 8-64), like the
    read-only kernel's 8 KB programs, full and argmax only."""
    dev = torch.device("cuda")
    say = sayer(path)

    for B, V, H in ((256, 151936, 4096),):
        key = DT.tune_key(torch.bfloat16, V, B, H)
        nb = DT._bytes(key)
        sts = _states(key, dev, rotation(nb))
        say(f"## B={B} V={V} H={H}: the recipe with many programs a row")
        for bv in (1024, 2048, 4096):
            for sp in (1, 8, 16, 32, 64, 128):
                for w in (4, 8):
                    for u in (1, 2):
                        cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": u, "num_warps": w,
                               "num_stages": 1, "BLOCK_H": 4096, "FUSE_H": 0}
                        if not DT.constraint(cfg, key):
                            continue
                        ts = []
                        for kw in ({}, {"token_map": None, "hidden": None,
                                        "positions": None, "draft_tokens": None}):
                            ts.append(time_graph(lambda s, c=cfg, kw=kw: run_recipe(s, c, **kw),
                                                 sts, reps=30).p50)
                        say(f"{bv:>5} split {split_plan(V, bv, sp)[0]:>3} U{u} w{w} "
                            f"full {ts[0]:7.2f} argmax only {ts[1]:7.2f}")


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[2] == "splits":
    splits(sys.argv[1])
