"""Stage pricing of chain_verify's sampling controls: where the microseconds of a
controlled sampled verify go, at the shapes of the controls targets (K=3, V=151936 bf16,
T=0.7, the config chain_verify dispatches for mode "controls").

    python tools/controls_stages.py [B ...]       (a GPU; default B = 1 8 64; with a cold
                                                  Triton cache the compiles come first:
                                                  over 2 min on an H100)

Every call is timed behind a plain one-element torch op in a CUDA graph, as
time(op + call) - time(op) (`autotune.timing`). The stage kernels run the recipe's own
pieces on the launch's chunks (R = B * (K + 1) rows, S chunks a row), each alone:

    temperature only   the recipe, temperature alone (the bar)
    every control off  the recipe, every control passed and off (idle threshold blocks)
    lane max           per chunk, the lane-max pass that `chunk_top_packed` starts with
    chunk top          per chunk, the whole `chunk_top_packed` (lane max, compaction, sort)
    + row merge        chunk top, then per row `candidates_packed` over the S lists it
                       left (top_k 20, top_p 0.95): two launches (the merge puts the
                       lists back to rest, so it is priced on lists made again)
    top_k 20 top_p .95 the recipe (the candidate path)
    pk range           per chunk, `pk_range` (the threshold path's phase 0)
    best               per chunk, `_topp_core.chunk_best` (the top_p check's block 1)
    merge best         per row, `_topp_core.merge_best` over S lists
    masses above       per chunk, `_topp_core.masses_above` (the check's block 2)
    top_p 0.9          the recipe (the check, then the restricted scan's count-in)
    min_p 0.05         the recipe

A path's recipe time minus the sum of its stages is what its hand-offs cost (the waits
on earlier programs, the idle blocks, the accept logic). Stage outputs are not checked
here: the pieces are the recipe's, and its tests check the recipe's bits. The recipe's
kernels are first compiled in parallel processes, as `controls_probe` does.
"""
from __future__ import annotations

import importlib
import multiprocessing as mp
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, not tools/, first

import torch
import triton
import triton.language as tl

from autotune.timing import plain_op, time_graph
from recipes import _controls_core as CC
from recipes import _topp_core as TP
from recipes._argmax_core import PACKED_EMPTY, split_plan
from recipes._common import pick_config
from tools import controls_probe as P

CV = importlib.import_module("recipes.chain_verify")
T = 0.7
LANE_MAX, CHUNK_TOP, ROW_MERGE, PK_RANGE, BEST, MERGE_BEST, MASSES = range(7)
PER_ROW = (ROW_MERGE, MERGE_BEST)
EMPTY = PACKED_EMPTY.value     # scratch at rest


@triton.jit
def _stage_kernel(x_ptr, out_ptr, buf_ptr, cand_ptr, V, stride, T, seed, n_split,
                  tiles_per, IDB, zmax, STAGE: tl.constexpr, BLOCK_V: tl.constexpr,
                  CAPK: tl.constexpr, SUBN: tl.constexpr, NCN: tl.constexpr,
                  MN: tl.constexpr, SEL: tl.constexpr, LB: tl.constexpr):
    pid = tl.program_id(0)
    if STAGE == 2 or STAGE == 5:                   # ROW_MERGE, MERGE_BEST: one a row
        r = pid
        chunk = 0
    else:
        r = pid // n_split
        chunk = pid - r * n_split
    row_ptr = x_ptr + r.to(tl.int64) * stride
    lo = chunk * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    ctr = r.to(tl.uint32)
    seed = seed.to(tl.int64)
    if STAGE == 0:
        lm = tl.full([SUBN], PACKED_EMPTY, tl.int64)
        for base in range(lo, hi, SUBN):
            ids = base + tl.arange(0, SUBN)
            z = tl.math.div_rn(tl.load(row_ptr + ids, mask=ids < hi, other=0.0).to(tl.float32), T)
            lm = tl.maximum(lm, tl.where(ids < hi, CC.packed_key(z, ids, IDB), PACKED_EMPTY))
        tl.store(out_ptr + pid, tl.max(lm, 0))
    elif STAGE == 1:
        top = CC.chunk_top_packed(row_ptr, lo, hi, T, IDB, buf_ptr + pid * NCN, CAPK, SUBN, NCN)
        tl.store(cand_ptr + pid * CAPK + tl.arange(0, CAPK), top)
    elif STAGE == 2:
        k = tl.full([], 20, tl.int64)
        p = tl.full([], 0.95, tl.float32)
        tl.store(out_ptr + pid, CC.candidates_packed(cand_ptr + r * n_split * CAPK, n_split,
                                                     row_ptr, T, seed, ctr, k, p, 0.0, IDB,
                                                     buf_ptr + r * n_split * NCN, True,
                                                     False, CAPK, MN))
    elif STAGE == 3:
        pmax, pmin = CC.pk_range(row_ptr, lo, hi, T, IDB, SEL)
        tl.store(out_ptr + pid, pmax ^ pmin)
    elif STAGE == 4:
        best, w = TP.chunk_best(row_ptr, lo, hi, 2 * tiles_per, T, seed, ctr,
                                PACKED_EMPTY + 1, IDB, zmax, BLOCK_V // 2)
        tl.store(cand_ptr + pid * TP.C + tl.arange(0, TP.C), best)
        tl.store(out_ptr + pid, w)
    elif STAGE == 5:
        best = TP.merge_best(cand_ptr + r * n_split * TP.C, n_split)
        tl.store(out_ptr + pid, tl.max(best, 0))
    else:
        pks = tl.full([TP.C], 0, tl.int64) + tl.arange(0, TP.C)
        m = TP.masses_above(row_ptr, lo, hi, T, zmax, IDB, pks, LB)
        tl.store(out_ptr + pid, tl.sum(m, 0))


def stage_call(stage: int, x, cfg, scratch):
    """A call of stage `stage` over the rows of x on the chunks of config cfg."""
    R, V = x.shape
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    out, buf, cand = scratch
    zmax = float(x.float().max()) / T
    grid = (R if stage in PER_ROW else R * split,)

    def call(_state):
        _stage_kernel[grid](x, out, buf, cand, V, x.stride(0), T, 12345, split, tiles_per,
                            CC.id_bits(V), zmax, STAGE=stage, BLOCK_V=cfg["BLOCK_V"],
                            CAPK=CC.CAP, SUBN=min(CC.SUB, cfg["BLOCK_V"]), NCN=CC.NC,
                            MN=CC.MN, SEL=256 * cfg["num_warps"],
                            LB=32 * cfg["num_warps"], num_warps=cfg["num_warps"])
    return call


def stages_call(what, x, cfg, scratch):
    """A call of one stage, or of a tuple of stages in turn."""
    calls = [stage_call(w, x, cfg, scratch) for w in (what if isinstance(what, tuple)
                                                      else (what,))]
    return lambda state: [c(state) for c in calls]


def row_for(B: int, dev):
    x, d, kw = P.inputs(B, dev)
    cfg = pick_config(CV.TUNING, CV.tune_key(x.dtype, P.V, B, P.K, True, True), dev)
    split, _ = split_plan(P.V, cfg["BLOCK_V"], cfg["SPLIT"])
    n = x.shape[0] * split
    scratch = (torch.zeros(n, dtype=torch.int64, device=dev),
               torch.full((n * CC.NC,), EMPTY, dtype=torch.int64, device=dev),
               torch.full((n * CC.CAP,), EMPTY, dtype=torch.int64, device=dev))
    return x, d, kw, cfg, split, scratch


def recipe_call(name: str, x, d, kw, B: int, dev):
    state = {"x": x, "d": d, "out": CV.chain_verify(x, d, **kw),
             "kw": {**kw, **P.controls(name, B, dev)}}
    return lambda _s: P.call(state)


ROWS = (("temperature only", "temperature only"), ("every control off", "controls_off"),
        ("lane max", LANE_MAX), ("chunk top", CHUNK_TOP), ("+ row merge", (CHUNK_TOP, ROW_MERGE)),
        ("top_k 20 top_p .95", "controls_topk_topp"), ("pk range", PK_RANGE),
        ("best", BEST), ("merge best", MERGE_BEST), ("masses above", MASSES),
        ("top_p 0.9", "controls_topp"), ("min_p 0.05", "controls_minp"))


def main(batches=(1, 8, 64), jobs: int = 8):
    with mp.get_context("spawn").Pool(jobs) as pool:    # the recipe's binaries, in parallel
        pool.map(P.warm, P.warm_jobs(batches))
    dev = torch.device("cuda")
    res = {label: [] for label, _ in ROWS}
    plans = []
    behind = plain_op(dev)
    for B in batches:
        x, d, kw, cfg, split, scratch = row_for(B, dev)
        plans.append(f"B={B}: {cfg} ({split} chunks a row)")
        for label, what in ROWS:
            call = (recipe_call(what, x, d, kw, B, dev) if isinstance(what, str)
                    else stages_call(what, x, cfg, scratch))
            call(None)
            torch.cuda.synchronize()
            t = time_graph(call, [None], reps=20, behind=behind)
            res[label].append(statistics.median(t.samples))
    print("\n".join(plans))
    print("| stage | " + " | ".join(f"B={b} us" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    for label, ts in res.items():
        print(f"| {label} | " + " | ".join(f"{t:.2f}" for t in ts) + " |")


if __name__ == "__main__":
    main(tuple(int(b) for b in sys.argv[1:]) or (1, 8, 64))
