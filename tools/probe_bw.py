"""Two bandwidth questions, answered on the GPU (timing only; CUDA-graph replay medians,
inputs rotated past twice the L2, each variant timed twice).

1. What does a plain device copy reach at the sizes the recipes move? A Triton copy
   kernel (16-byte vectors, 8 KB a program) and torch's `neg` (a read + write kernel),
   from 64 KB to 1 GiB a side. The asymptotic ceiling (4.24 TB/s) is not reachable by a
   7 MB move that also pays a launch: this gives each size its own ceiling.
2. Does software pipelining help the shared argmax scan? The first scan (PIPE=0, kept
   here as `_chunk_plain`) issues a step's loads, waits, folds, then issues the next
   step's loads, so the memory pipe drains once per step. PIPE=1 (the recipes'
   `chunk_argmax_packed` since this probe) loads step t+1 before folding step t
   (register double buffering), same lanes, same fold order (so the same answer).
   Scan only: every program stores its packed chunk result.

Usage: python tools/probe_bw.py OUTFILE
"""
import sys

import torch
import triton
import triton.language as tl

from autotune.timing import rotation, time_graph
from recipes._argmax_core import chunk_argmax_packed, lane_update, pack, split_plan


@triton.jit
def _copy(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m), mask=m)


@triton.jit
def _chunk_plain(row_ptr, lo, hi, n_tiles, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """The scan before pipelining (PIPE=0): a step's loads, a wait, the fold, the next
    step's loads. The recipes' `chunk_argmax_packed` is the pipelined one (PIPE=1)."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    best_tile = tl.zeros([BLOCK], tl.int32)
    for t0 in range(0, n_tiles, UNROLL):
        if UNROLL == 1:
            offs = lo + t0 * BLOCK + lanes
            x = tl.load(row_ptr + offs, mask=offs < hi, other=float("-inf")).to(tl.float32)
            best, best_tile = lane_update(x, t0, best, best_tile)
        else:
            offs0 = lo + t0 * BLOCK + lanes
            offs1 = offs0 + BLOCK
            x0 = tl.load(row_ptr + offs0, mask=offs0 < hi, other=float("-inf"))
            x1 = tl.load(row_ptr + offs1, mask=offs1 < hi, other=float("-inf"))
            best, best_tile = lane_update(x0.to(tl.float32), t0, best, best_tile)
            best, best_tile = lane_update(x1.to(tl.float32), t0 + 1, best, best_tile)
    return tl.max(pack(best, lo + best_tile * BLOCK + lanes), 0)


@triton.jit
def _scan(x_ptr, part_ptr, V, stride, n_split, tiles_per, BLOCK_V: tl.constexpr,
          UNROLL: tl.constexpr, PIPE: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // n_split
    lo = (pid % n_split) * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    ptr = x_ptr + row.to(tl.int64) * stride
    if PIPE:
        packed = chunk_argmax_packed(ptr, lo, hi, tiles_per, BLOCK_V, UNROLL)
    else:
        packed = _chunk_plain(ptr, lo, hi, tiles_per, BLOCK_V, UNROLL)
    tl.store(part_ptr + pid, packed)


def main(path):
    dev = torch.device("cuda")
    lines = []

    def say(s):
        lines.append(s)
        print(s, flush=True)

    def rec(fn, states):
        t1 = time_graph(fn, states, reps=40)
        t2 = time_graph(fn, states, reps=40, warm_gpu=False)
        return t1.p50, t2.p50

    say(f"# {torch.cuda.get_device_name(dev)}; torch {torch.__version__}, "
        f"triton {triton.__version__}")
    say("## 1. copy time against size (bytes a side; TB/s counts read + write)")
    say(f"{'bytes':>12} {'triton us':>10} {'again':>8} {'TB/s':>6} {'neg us':>8} "
        f"{'again':>8} {'TB/s':>6}")
    for nbytes in (1 << 16, 1 << 19, 2 << 20, 256 * 7168 * 2, 8 << 20, 40 << 20,
                   80 << 20, 512 << 20, 1 << 30):
        n = nbytes // 2
        k = rotation(2 * nbytes)
        sts = [(torch.randn(n, device=dev).to(torch.bfloat16),
                torch.empty(n, device=dev, dtype=torch.bfloat16)) for _ in range(k)]
        blk = 4096
        a = rec(lambda s: _copy[(triton.cdiv(n, blk),)](s[0], s[1], n, BLOCK=blk,
                                                         num_warps=4), sts)
        b = rec(lambda s: torch.neg(s[0], out=s[1]), sts)
        say(f"{nbytes:>12} {a[0]:>10.2f} {a[1]:>8.2f} {2 * nbytes / a[0] / 1e6:>6.3f} "
            f"{b[0]:>8.2f} {b[1]:>8.2f} {2 * nbytes / b[0] / 1e6:>6.3f}")
        del sts

    say("## 2. argmax scan: PIPE=0 (current) vs PIPE=1 (next step's loads first), bf16")
    say(f"{'R':>4} {'V':>7} {'split':>5} {'BLOCK':>5} {'w':>3} {'U':>2} "
        f"{'PIPE=0 us':>10} {'again':>7} {'PIPE=1 us':>10} {'again':>7} {'TB/s 0/1':>12}")
    V = 151936
    for R, split in ((256, 1), (320, 1), (64, 4), (64, 2), (4, 32)):
        nb = R * V * 2
        k = rotation(nb)
        sts = [torch.randn(R, V, device=dev).to(torch.bfloat16) for _ in range(k)]
        for blk in (4096, 8192):
            for w in (8, 16):
                for u in (1, 2):
                    sp, tiles = split_plan(V, blk, split)
                    if u == 2 and tiles < 2:
                        continue
                    part = torch.empty(R * sp, dtype=torch.int64, device=dev)
                    res, outs = [], []
                    for pipe in (0, 1):
                        fn = (lambda s, p=pipe: _scan[(R * sp,)](
                            s, part, V, V, sp, tiles, BLOCK_V=blk, UNROLL=u, PIPE=p,
                            num_warps=w))
                        res.append(rec(fn, sts))
                        fn(sts[0])
                        outs.append(part.clone())
                    same = torch.equal(outs[0], outs[1])
                    say(f"{R:>4} {V:>7} {sp:>5} {blk:>5} {w:>3} {u:>2} {res[0][0]:>10.2f} "
                        f"{res[0][1]:>7.2f} {res[1][0]:>10.2f} {res[1][1]:>7.2f} "
                        f"{nb / res[0][0] / 1e6:>5.2f}/{nb / res[1][0] / 1e6:<5.2f}"
                        + ("" if same else "  DIFFERENT ANSWERS"))
        del sts
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "probe-bw.txt")
