"""argmax: `torch.argmax(logits, dim=1)` over a vocabulary, as a split reduction.

    out[r] = argmax_v logits[r, v]

with torch's rules: the largest value wins, ties go to the lowest index, NaN is larger
than every number (the first NaN wins), a row of all -inf gives 0, -0.0 ties +0.0.

Each row is cut into `SPLIT` chunks of whole `BLOCK_V` tiles; one program scans one chunk
(stage 1, `chunk_argmax_packed`). With one chunk per row the program stores the answer.
Otherwise the chunks meet in a per-row int64 slot through `atomic_max` of their packed
(key, index), and the last program of the row to arrive (an atomic counter says which)
reads the slot, stores the index and puts the slot and counter back to rest: both stages
in one launch, so no partials buffer and no second kernel.

Edge cases: V < BLOCK_V and V not a multiple of it are masked loads; rows may be strided
(row offsets are int64, so a tensor over 2^31 elements is fine); R = 0 launches nothing.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _common as C
from ._argmax_core import (
    PACKED_EMPTY,
    SPLIT_SPACE,
    chunk_argmax_packed,
    lane_vec,
    publish_packed,
    split_constraint,
    split_heuristic,
    split_plan,
    unpack_index,
)
from ._tuning import Tuning

NAME = "argmax"


def reference(logits: torch.Tensor) -> torch.Tensor:
    """The semantics: torch's own argmax over the last dim (int64 [R])."""
    return torch.argmax(logits, dim=1)


@triton.jit
def _argmax_kernel(x_ptr, out_ptr, acc_ptr, cnt_ptr, V, stride_r, n_split, tiles_per,
                   ONE_CHUNK: tl.constexpr, BLOCK_V: tl.constexpr,
                   UNROLL: tl.constexpr, VEC: tl.constexpr, PDL: tl.constexpr):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    row = pid // n_split
    lo = (pid % n_split) * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    row_ptr = x_ptr + row.to(tl.int64) * stride_r
    packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC)
    C.pdl_release(PDL)
    if ONE_CHUNK:
        tl.store(out_ptr + row, unpack_index(packed).to(tl.int64))
    else:
        arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + row)
        if arrived == n_split - 1:
            # the counter's acquire already ordered every max before this read
            packed = tl.atomic_xchg(acc_ptr + row, PACKED_EMPTY, sem="relaxed")
            tl.store(out_ptr + row, unpack_index(packed).to(tl.int64))
            tl.store(cnt_ptr + row, 0)


# --- search space and heuristic (shared by every split-argmax kernel) -----------------
SPACE = SPLIT_SPACE


def constraint(config: dict, key: dict) -> bool:
    """The tuner's prune (`split_constraint`). Performance only: every config of SPACE
    gives the same bits, so an explicit config need only be in SPACE."""
    return split_constraint(config, key["V"])


def heuristic(key: dict, device: torch.device) -> dict:
    return split_heuristic(key["dtype"], key["V"], key["R"], C.sm_count(device))


def tune_key(dtype: torch.dtype, V: int, R: int) -> dict:
    return {"dtype": C._dtype_name(dtype), "V": int(V), "R": int(R)}


# --- launcher --------------------------------------------------------------------------
def launch_argmax(logits: torch.Tensor, out: torch.Tensor, cfg: dict) -> None:
    """Launch on validated tensors (2-D logits, out int64 [R])."""
    R, V = logits.shape
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    # the stage-2 scratch only where rows are split (a row a program never touches it, so
    # it need not grow, inside a graph capture least of all)
    acc = cnt = out
    if split > 1:
        acc, cnt = C.WORKSPACE.get(logits.device, R, R)
    pdl = C.pdl(logits.device, R * split)
    _argmax_kernel[(R * split,)](
        logits, out, acc, cnt, V, logits.stride(0), split, tiles_per,
        ONE_CHUNK=split == 1, BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"],
        VEC=lane_vec(logits.element_size(), cfg["BLOCK_V"], cfg["num_warps"]), PDL=pdl,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl > 0)


def resolve_config(config: dict | None, dtype: torch.dtype, V: int, R: int,
                   device: torch.device, tables: bool = True) -> dict:
    key = tune_key(dtype, V, R)
    return C.resolve_config(TUNING, config, key, device, tables)


def argmax(logits: torch.Tensor, *, out: torch.Tensor | None = None,
           config: dict | None = None) -> torch.Tensor:
    """Row-wise argmax of `logits` [R, V] (float16/bfloat16/float32, last dim
    contiguous, any row stride), returned as int64 [R]; equal to torch.argmax(dim=1)."""
    C.check_tensor("logits", logits, dtypes=C.FLOAT_DTYPES, ndim=2)
    C.check_runnable("logits", logits)
    C.check_logits_rows("logits", logits)
    R, V = logits.shape
    if out is None:
        out = torch.empty((R,), dtype=torch.int64, device=logits.device)
    else:
        C.check_out("out", out, (R,), torch.int64, logits.device)
        C.check_no_overlap((("out", out),), (("logits", logits),))
    if R == 0:
        return out
    cfg = resolve_config(config, logits.dtype, V, R, logits.device)
    launch_argmax(logits, out, cfg)
    return out


# --- what dispatch knows (read by the autotuner too) ---------------------------------
TUNING = Tuning(
    name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
    sources=(_argmax_kernel, chunk_argmax_packed, publish_packed, launch_argmax))


argmax.reference = reference   # `recipes.argmax.reference` reaches the semantics too
