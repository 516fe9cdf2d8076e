"""draft_tail, session 4: launch latency (PDL), a spin-wait finisher, and two launches.

Issue 5's targets (B=1 Vd=32000 H=4096 <= 2.0 us; B=256 Vd=151936 >= 85% of the copy
bandwidth) were missed by 0.8 us and by 8 points. This probe (GPU only) times, in
CUDA-graph replays of 20+ back-to-back calls (each best variant twice):

1. empty kernels, one program, with and without programmatic dependent launch (PDL:
   the next kernel launches while this one runs and waits in `griddepcontrol.wait`);
2. the recipe at B=1 and B=256 over a few configs with PDL off and on;
3. `_spin` (B=1 only): the recipe's arrival counter replaced by a finisher that polls:
   the last chunk's program of a row exchanges the other chunks' slots back to EMPTY until each has
   given its candidate (no fence, no counter; the others write their slot and stop);
4. `_stage1` + `_stage2` (B >= 8): two launches; stage 1 stores each chunk's packed
   candidate with a plain store (no atomics, no fence) and copies the hidden rows,
   stage 2 folds a row's chunks, maps, and writes the outputs.
Every variant's outputs are compared with the reference before it is timed.

Part 2 (`python tools/probe_pdl.py OUTFILE 2`), after part 1 found PDL worth 0.45-0.6 us
and the spin finisher 0.26 us at B=1, two launches no better at B >= 64:
5. B=1: the spin finisher on 1-4 warps and 256-2048-element tiles, the finisher either
   the last chunk's program or a dedicated program that scans nothing (`_spin` DED);
6. B=256: the hidden row copied by the row's own program, its load issued with the
   first logits tile and its store right after (`_fused`: no registers held through the
   scan), against a read-only kernel on the recipe's layout (one program a row, the same
   pipelined loop summing instead of comparing: is the gap to the read ceiling the
   layout or the arithmetic?).
Usage: python tools/probe_pdl.py OUTFILE [2]
"""
import sys

import torch
import triton
import triton.language as tl
from probe_tail import _check, _clone, _states, rec, sayer, verified

from autotune.timing import rotation
from recipes import _common as C
from recipes._argmax_core import (
    PACKED_EMPTY,
    chunk_argmax_packed,
    lane_update,
    pack,
    split_plan,
    unpack_index,
)
from recipes.draft_tail import SPACE, _bytes, constraint, draft_tail, tune_key


@triton.jit
def _empty(x_ptr, PDL: tl.constexpr):
    C.pdl_enter(PDL)


@triton.jit
def _row_of(rows_ptr, b, R):
    r = tl.load(rows_ptr + b).to(tl.int64)
    return tl.minimum(tl.maximum(r, 0), R - 1)


@triton.jit
def _hidden_tile(p, rows_ptr, h_ptr, hout_ptr, R, H, stride_h, h_tiles,
                 BLOCK_H: tl.constexpr):
    b = p // h_tiles
    cols = (p % h_tiles) * BLOCK_H + tl.arange(0, BLOCK_H)
    r = _row_of(rows_ptr, b, R)
    m = cols < H
    tl.store(hout_ptr + b.to(tl.int64) * H + cols,
             tl.load(h_ptr + r * stride_h + cols, mask=m), mask=m)


@triton.jit
def _write_row(b, packed, map_ptr, tok_ptr, dt_ptr, stride_map, stride_dt, dt_col):
    token = tl.load(map_ptr + unpack_index(packed).to(tl.int64) * stride_map).to(tl.int64)
    tl.store(tok_ptr + b, token)
    tl.store(dt_ptr + b.to(tl.int64) * stride_dt + dt_col, token)


@triton.jit
def _spin(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, h_ptr, hout_ptr,
          slot_ptr, R, V, stride_x, stride_map, stride_pos, stride_dt, dt_col, n_split,
          tiles_per, H, stride_h, h_tiles, n_arg, BLOCK_V: tl.constexpr,
          BLOCK_H: tl.constexpr, UNROLL: tl.constexpr, SP: tl.constexpr,
          PDL: tl.constexpr, DED: tl.constexpr = False):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    if DED and pid == n_arg:        # B=1 only: a finisher that scans nothing
        lanes = tl.arange(0, SP)
        got = lanes >= n_split
        best = tl.full([], PACKED_EMPTY, tl.int64)
        while tl.min(got.to(tl.int32), 0) == 0:
            v = tl.atomic_xchg(slot_ptr + lanes, PACKED_EMPTY, mask=~got, sem="relaxed")
            new = (v != PACKED_EMPTY) & ~got
            best = tl.maximum(best, tl.max(tl.where(new, v, PACKED_EMPTY), 0))
            got = got | new
        _write_row(pid - n_arg, best, map_ptr, tok_ptr, dt_ptr, stride_map,
                   stride_dt, dt_col)
    elif pid < n_arg:
        b = pid // n_split
        s = pid % n_split
        first = s == 0
        pos = tl.load(pos_ptr + b.to(tl.int64) * stride_pos, mask=first, other=0)
        r = _row_of(rows_ptr, b, R)
        lo = s * tiles_per * BLOCK_V
        hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
        packed = chunk_argmax_packed(x_ptr + r * stride_x, lo, hi, tiles_per, BLOCK_V,
                                     UNROLL)
        if first:
            tl.store(probs_ptr + b, 1.0)
            tl.store(pos_ptr + b.to(tl.int64) * stride_pos, pos + 1)
        if (s == n_split - 1) and not DED:    # the last chunk finishes (in order here)
            lanes = tl.arange(0, SP)
            got = (lanes >= n_split - 1)
            best = packed
            while tl.min(got.to(tl.int32), 0) == 0:
                v = tl.atomic_xchg(slot_ptr + b * SP + lanes, PACKED_EMPTY, mask=~got,
                                   sem="relaxed")
                new = (v != PACKED_EMPTY) & ~got
                best = tl.maximum(best, tl.max(tl.where(new, v, PACKED_EMPTY), 0))
                got = got | new
            _write_row(b, best, map_ptr, tok_ptr, dt_ptr, stride_map,
                       stride_dt, dt_col)
        else:
            tl.atomic_xchg(slot_ptr + b * SP + s, packed, sem="relaxed")
    else:
        _hidden_tile(pid - n_arg - DED, rows_ptr, h_ptr, hout_ptr, R, H, stride_h, h_tiles,
                     BLOCK_H)


@triton.jit
def _fused(x_ptr, rows_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, h_ptr, hout_ptr,
           R, V, stride_x, stride_map, stride_pos, stride_dt, dt_col, H, stride_h,
           BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
           READ_ONLY: tl.constexpr):
    """One program a row (SPLIT 1, UNROLL 1): hidden load, first tile load, hidden store,
    then the recipe's pipelined scan (READ_ONLY: a sum instead, stored as the token)."""
    C.pdl_enter(PDL)
    b = tl.program_id(0)
    pos = tl.load(pos_ptr + b.to(tl.int64) * stride_pos)
    r = _row_of(rows_ptr, b, R)
    hc = tl.arange(0, BLOCK_H)
    hv = tl.load(h_ptr + r * stride_h + hc, mask=hc < H)
    row = x_ptr + r * stride_x
    lanes = tl.arange(0, BLOCK_V)
    x0 = tl.load(row + lanes, mask=lanes < V, other=float("-inf"))
    tl.store(hout_ptr + b.to(tl.int64) * H + hc, hv, mask=hc < H)
    n_tiles = tl.cdiv(V, BLOCK_V)
    if READ_ONLY:
        acc = tl.zeros([BLOCK_V], tl.float32)
        for t in range(0, n_tiles):
            on = lanes + (t + 1) * BLOCK_V
            xn = tl.load(row + on, mask=on < V, other=0.0)
            acc += x0.to(tl.float32)
            x0 = xn
        tl.store(tok_ptr + b, tl.sum(acc, 0).to(tl.int64))
    else:
        best = tl.full([BLOCK_V], float("-inf"), tl.float32)
        best_tile = tl.zeros([BLOCK_V], tl.int32)
        for t in range(0, n_tiles):
            on = lanes + (t + 1) * BLOCK_V
            xn = tl.load(row + on, mask=on < V, other=float("-inf"))
            best, best_tile = lane_update(x0.to(tl.float32), t, best, best_tile)
            x0 = xn
        packed = tl.max(pack(best, best_tile * BLOCK_V + lanes), 0)
        tl.store(probs_ptr + b, 1.0)
        tl.store(pos_ptr + b.to(tl.int64) * stride_pos, pos + 1)
        _write_row(b, packed, map_ptr, tok_ptr, dt_ptr, stride_map,
                   stride_dt, dt_col)


class Fused:
    def __call__(self, s, cfg, pdl, read_only=False):
        x, rows, tm, tok, probs, pos, dt, h, hout = _args(s)
        B, (R, V), H = rows.shape[0], x.shape, h.shape[1]
        _fused[(B,)](x, rows, tm, tok, probs, pos, dt, h, hout, R, V, x.stride(0),
                     tm.stride(0), pos.stride(0), dt.stride(0), s["column"] * dt.stride(1),
                     H, h.stride(0), BLOCK_V=cfg["BLOCK_V"], BLOCK_H=C.next_pow2(H),
                     PDL=pdl, READ_ONLY=read_only, num_warps=cfg["num_warps"],
                     num_stages=1, launch_pdl=pdl)


@triton.jit
def _stage1(x_ptr, rows_ptr, ws_ptr, h_ptr, hout_ptr, R, V, stride_x, n_split, tiles_per,
            H, stride_h, h_tiles, n_arg, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
            UNROLL: tl.constexpr, PDL: tl.constexpr):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    if pid < n_arg:
        b = pid // n_split
        s = pid % n_split
        r = _row_of(rows_ptr, b, R)
        lo = s * tiles_per * BLOCK_V
        hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
        tl.store(ws_ptr + pid, chunk_argmax_packed(x_ptr + r * stride_x, lo, hi, tiles_per,
                                                   BLOCK_V, UNROLL))
    else:
        _hidden_tile(pid - n_arg, rows_ptr, h_ptr, hout_ptr, R, H, stride_h, h_tiles,
                     BLOCK_H)


@triton.jit
def _stage2(ws_ptr, map_ptr, tok_ptr, probs_ptr, pos_ptr, dt_ptr, B, n_split, stride_map,
            stride_pos, stride_dt, dt_col, RB: tl.constexpr, SP: tl.constexpr,
            PDL: tl.constexpr):
    C.pdl_enter(PDL)
    bs = tl.program_id(0) * RB + tl.arange(0, RB)
    bm = bs < B
    lanes = tl.arange(0, SP)
    p = tl.load(ws_ptr + bs[:, None] * n_split + lanes[None, :],
                mask=bm[:, None] & (lanes[None, :] < n_split), other=PACKED_EMPTY)
    best = tl.max(p, 1)
    token = tl.load(map_ptr + unpack_index(best).to(tl.int64) * stride_map, mask=bm)
    token = token.to(tl.int64)
    tl.store(tok_ptr + bs, token, mask=bm)
    tl.store(dt_ptr + bs.to(tl.int64) * stride_dt + dt_col, token, mask=bm)
    tl.store(probs_ptr + bs, 1.0, mask=bm)
    pos = tl.load(pos_ptr + bs.to(tl.int64) * stride_pos, mask=bm)
    tl.store(pos_ptr + bs.to(tl.int64) * stride_pos, pos + 1, mask=bm)


def _args(s):
    o = s["out"]
    return s["logits"], s["rows"], s["token_map"], o.tokens, o.probs, s["positions"], \
        s["draft_tokens"], s["hidden"], o.hidden


class Spin:
    def __init__(self, B, dev):
        self.slots = torch.full((B * 128,), C.INT64_MIN, dtype=torch.int64, device=dev)

    def __call__(self, s, cfg, pdl):
        x, rows, tm, tok, probs, pos, dt, h, hout = _args(s)
        B, (R, V), H = rows.shape[0], x.shape, h.shape[1]
        split, tiles = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
        h_tiles = C.cdiv(H, 4096)
        ded = cfg.get("DED", False)
        _spin[(B * split + ded + B * h_tiles,)](
            x, rows, tm, tok, probs, pos, dt, h, hout, self.slots, R, V, x.stride(0),
            tm.stride(0), pos.stride(0), dt.stride(0), s["column"] * dt.stride(1), split,
            tiles, H, h.stride(0), h_tiles, B * split, BLOCK_V=cfg["BLOCK_V"],
            BLOCK_H=4096, UNROLL=cfg["UNROLL"], SP=128, PDL=pdl, DED=ded,
            num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl)


class Two:
    def __init__(self, B, dev):
        self.ws = torch.empty((B * 128,), dtype=torch.int64, device=dev)

    def __call__(self, s, cfg, pdl):
        x, rows, tm, tok, probs, pos, dt, h, hout = _args(s)
        B, (R, V), H = rows.shape[0], x.shape, h.shape[1]
        split, tiles = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
        h_tiles = C.cdiv(H, 4096)
        _stage1[(B * split + B * h_tiles,)](
            x, rows, self.ws, h, hout, R, V, x.stride(0), split, tiles, H, h.stride(0),
            h_tiles, B * split, BLOCK_V=cfg["BLOCK_V"], BLOCK_H=4096, UNROLL=cfg["UNROLL"],
            PDL=pdl, num_warps=cfg["num_warps"], num_stages=1, launch_pdl=pdl)
        SP = C.next_pow2(split)
        RB = max(1, min(C.next_pow2(B), 4096 // SP))
        _stage2[(C.cdiv(B, RB),)](
            self.ws, tm, tok, probs, pos, dt, B, split, tm.stride(0), pos.stride(0),
            dt.stride(0), s["column"] * dt.stride(1), RB=RB, SP=SP, PDL=pdl,
            num_warps=4, num_stages=1, launch_pdl=pdl)


def main(path):
    dev = torch.device("cuda")
    say = sayer(path)

    def fmt(ts):
        return " ".join(f"{t:7.2f}" for t in ts)

    say(f"# {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, "
        f"triton {triton.__version__}; graph-replay medians in us, 20+ calls a replay")
    dummy = torch.zeros(16, device=dev)
    for pdl in (False, True):
        t = rec(lambda s, p=pdl: _empty[(1,)](s, PDL=p, launch_pdl=p), [dummy], twice=True)
        say(f"empty kernel, 1 program, pdl={int(pdl)}            {fmt(t)}")

    def recipe(pdl):
        C.os.environ[C.PDL_ENV] = "1" if pdl else "0"

    shapes = [(1, 32000, 4096), (1, 151936, 4096), (8, 151936, 4096),
              (64, 151936, 4096), (256, 151936, 4096), (256, 151936, 7168)]
    for B, V, H in shapes:
        key = tune_key(torch.bfloat16, V, B, H)
        nb = _bytes(key)
        sts = _states(key, dev, rotation(nb))
        master = _clone(sts[0])
        say(f"## B={B} V={V} H={H} bf16: {nb / 1e6:.2f} MB, {len(sts)} input sets")
        # 1. the recipe over a few configs, PDL off and on
        grid = []
        for bv in SPACE["BLOCK_V"]:
            for sp in SPACE["SPLIT"]:
                for u in SPACE["UNROLL"]:
                    for w in SPACE["num_warps"]:
                        cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": u, "num_warps": w,
                               "num_stages": 1, "BLOCK_H": 4096, "FUSE_H": 0}
                        ok = constraint(cfg, key) and (
                            (B == 1 and bv <= 2048 and w <= 8) or
                            (B == 8 and bv == 2048 and w <= 8 and sp >= 8) or
                            (B == 64 and bv in (2048, 4096) and sp in (1, 2, 4)) or
                            (B == 256 and sp <= 2 and w >= 8))
                        if ok:
                            grid.append(cfg)
        best = {}
        for pdl in (False, True):
            recipe(pdl)
            res = []
            for cfg in grid:
                fn = (lambda s, c=cfg: draft_tail(
                    s["logits"], rows=s["rows"], hidden=s["hidden"],
                    token_map=s["token_map"], positions=s["positions"],
                    draft_tokens=s["draft_tokens"], column=s["column"], out=s["out"],
                    config=c))
                if pdl and _check(fn, master):
                    say(f"recipe pdl=1 {cfg}: WRONG")
                    continue
                res.append((rec(fn, sts)[0], cfg, fn))
            res.sort(key=lambda t: t[0])
            for t, cfg, _ in res[:4]:
                say(f"recipe pdl={int(pdl)} {cfg['BLOCK_V']:>5} split {cfg['SPLIT']:>3} "
                    f"U{cfg['UNROLL']} w{cfg['num_warps']:<2} {t:7.2f}")
            t = rec(res[0][2], sts, twice=True)
            say(f"recipe pdl={int(pdl)} best again                 {fmt(t)}")
            best[pdl] = res[0][1]
        recipe(True)
        # 2. the variants
        variants = []
        if B == 1:
            spin, seen = Spin(B, dev), set()
            for bv in (1024, 2048):
                for sp in (4, 8, 16, 32, 64, 128):
                    split, tiles = split_plan(V, bv, sp)
                    if (bv, split) in seen or split < 2:
                        continue
                    seen.add((bv, split))
                    for w in (4, 8):
                        cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": 1, "num_warps": w}
                        variants.append((f"spin {bv:>5} split {split:>3} w{w:<2}", spin, cfg))
        else:
            two = Two(B, dev)
            for bv in (2048, 4096, 8192):
                for sp in (1, 2, 4, 8, 16, 32):
                    split, tiles = split_plan(V, bv, sp)
                    if B * split < 132 or B * split > 8192 or split < sp:
                        continue
                    for w in (4, 8, 16):
                        for u in (1, 2):
                            if bv < 128 * w or bv * u > 64 * 32 * w or (u == 2 and tiles < 2):
                                continue
                            cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": u, "num_warps": w}
                            variants.append((f"two {bv:>5} split {split:>3} U{u} w{w:<2}",
                                             two, cfg))
        for pdl in (False, True):
            vres = []
            for tag, fn, cfg in variants:
                call = (lambda s, f=fn, c=cfg, p=pdl: f(s, c, p))
                tag = f"{tag} pdl={int(pdl)}"
                vres.append((_timed(say, tag, call, sts, master), tag, call))
            _best(say, vres, sts)
        del sts


def _timed(say, tag, call, sts, master, check=True):
    if check and not verified(say, tag, call, master):
        return None
    return rec(call, sts)[0]


def _best(say, res, sts, n=5):
    res = [r for r in res if r[0] is not None]
    res.sort(key=lambda t: t[0])
    for t, tag, _ in res[:n]:
        say(f"{tag} {t:7.2f}")
    if res:
        again = rec(res[0][2], sts, twice=True)
        say(f"{res[0][1]} again " + " ".join(f"{t:7.2f}" for t in again))


def main2(path):
    dev = torch.device("cuda")
    say = sayer(path)
    say(f"# part 2. {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, "
        f"triton {triton.__version__}; graph-replay medians in us, PDL on")
    C.os.environ[C.PDL_ENV] = "1"
    for B, V, H in ((1, 32000, 4096), (1, 151936, 4096)):
        key = tune_key(torch.bfloat16, V, B, H)
        sts = _states(key, dev, rotation(_bytes(key)))
        master = _clone(sts[0])
        say(f"## B={B} V={V} H={H}")
        spin, seen, res = Spin(B, dev), set(), []
        for bv in (256, 512, 1024, 2048):
            for sp in (8, 16, 32, 64, 128):
                split, tiles = split_plan(V, bv, sp)
                if (bv, split) in seen or split < 2 or tiles > 4:
                    continue
                seen.add((bv, split))
                for w in (1, 2, 4):
                    if bv < 128 * w:
                        continue
                    for ded in (False, True):
                        cfg = {"BLOCK_V": bv, "SPLIT": sp, "UNROLL": 1, "num_warps": w,
                               "DED": ded}
                        call = (lambda s, c=cfg, f=spin: f(s, c, True))
                        tag = f"spin {bv:>5} split {split:>3} w{w} ded {int(ded)}"
                        res.append((_timed(say, tag, call, sts, master), tag, call))
        _best(say, res, sts, 8)
        del sts
    for B, V, H in ((256, 151936, 4096), (256, 151936, 7168)):
        key = tune_key(torch.bfloat16, V, B, H)
        sts = _states(key, dev, rotation(_bytes(key)))
        master = _clone(sts[0])
        say(f"## B={B} V={V} H={H}")
        fused = Fused()
        for ro in (False, True):
            res = []
            for bv in (2048, 4096, 8192):
                for w in (4, 8, 16):
                    if bv < 128 * w or bv > 32 * 32 * w:
                        continue
                    cfg = {"BLOCK_V": bv, "num_warps": w}
                    call = (lambda s, c=cfg, ro=ro, f=fused: f(s, c, True, ro))
                    tag = f"{'read-only' if ro else 'fused'} {bv:>5} w{w:<2}"
                    res.append((_timed(say, tag, call, sts, master, check=not ro), tag, call))
            _best(say, res, sts, 4)
        del sts


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "2":
        main2(sys.argv[1])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "probe-pdl.txt")
