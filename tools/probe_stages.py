"""Price each stage of the one-launch split argmax at B=1 (GPU only).

Times, in CUDA-graph replays, kernels that stop after each stage: an empty launch, the
stage-1 scan with a plain store per program, + the relaxed stage-2 max, + the arrival
counter, and the full chain_verify; plus a naive two-launch version (partials, then a
second kernel). Intermediate variants give wrong answers on purpose: timing only.
Usage: python tools/probe_stages.py OUTFILE
"""
import importlib
import sys

import torch
import triton
import triton.language as tl

import recipes
from autotune.timing import rotation, time_graph
from recipes._argmax_core import chunk_argmax_packed, split_plan

CV = importlib.import_module("recipes.chain_verify")


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _stage(x_ptr, part_ptr, acc_ptr, cnt_ptr, V, stride, n_split, tiles_per,
           BLOCK_V: tl.constexpr, UPTO: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // n_split
    lo = (pid % n_split) * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    packed = chunk_argmax_packed(x_ptr + row.to(tl.int64) * stride, lo, hi, tiles_per,
                                 BLOCK_V)
    if UPTO == 0:
        tl.store(part_ptr + pid, packed)
    if UPTO >= 1:
        tl.atomic_max(acc_ptr + row, packed, sem="relaxed")
    if UPTO >= 2:
        tl.atomic_add(cnt_ptr, 1, sem="acq_rel")


@triton.jit
def _second(part_ptr, out_ptr, n_split, SP: tl.constexpr):
    row = tl.program_id(0)
    s = tl.arange(0, SP)
    p = tl.load(part_ptr + row * n_split + s, mask=s < n_split, other=-(2**63))
    tl.store(out_ptr + row, tl.max(p, 0))


def main(path):
    dev = torch.device("cuda")
    B, K, V = 1, 3, 151936
    key = CV.tune_key(torch.bfloat16, V, B, K)
    n = rotation(CV._bytes(key))
    states = [CV.make_inputs(key, dev, i) for i in range(n)]
    part = torch.empty(1 << 16, dtype=torch.int64, device=dev)
    acc = torch.full((1 << 10,), -(2**63), dtype=torch.int64, device=dev)
    cnt = torch.zeros(1 << 10, dtype=torch.int32, device=dev)
    out = torch.empty(64, dtype=torch.int64, device=dev)
    lines = []

    def rec(name, fn, sts=states):
        t = time_graph(fn, sts, reps=40)
        t2 = time_graph(fn, sts, reps=40, warm_gpu=False)
        lines.append(f"{name:<58} {t.p50:7.2f} us (again {t2.p50:7.2f})")
        print(lines[-1], flush=True)

    rec("empty Triton launch", lambda s: _empty[(1,)](s[0]))
    rec("empty Triton launch, 148 programs", lambda s: _empty[(148,)](s[0]))
    for block, split, w in ((4096, 64, 4), (4096, 16, 4), (2048, 128, 4), (4096, 8, 8)):
        sp, tiles = split_plan(V, block, split)
        grid = (4 * sp,)
        tag = f"BLOCK {block} split {sp} ({grid[0]} programs) w{w}"
        for upto, what in ((0, "scan + plain store"), (1, "scan + relaxed max"),
                           (2, "scan + max + counter")):
            rec(f"{what:<22} {tag}", lambda s, u=upto: _stage[grid](
                s[0], part, acc, cnt, V, V, sp, tiles, BLOCK_V=block, UPTO=u, num_warps=w))
        cfg = {"BLOCK_V": block, "SPLIT": split, "num_warps": w, "num_stages": 1, "UNROLL": 1}
        rec(f"{'full chain_verify':<22} {tag}",
            lambda s, c=cfg: recipes.chain_verify(s[0], s[1], config=c))

        def two(s):
            _stage[grid](s[0], part, acc, cnt, V, V, sp, tiles, BLOCK_V=block, UPTO=0,
                         num_warps=w)
            _second[(4,)](part, out, sp, SP=triton.next_power_of_2(sp))
        rec(f"{'two launches (naive)':<22} {tag}", two)
    with open(path, "w") as f:
        f.write("# tools/probe_stages.py: B=1 K=3 V=151936 bf16, CUDA-graph replay medians; "
                f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
                f"triton {triton.__version__}\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/dev/stdout")
