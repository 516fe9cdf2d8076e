"""copy_inputs: the step graph's input copies, dst[i] = src[i] for 1 to 16 pairs, one launch.

    copy_inputs(src=[s0, s1, ...], dst=[d0, d1, ...]):  bytes(d_i) = bytes(s_i)

Keyword-only: a swapped pair has matching shapes and would silently overwrite its
source, so a positional call raises TypeError asking for `src=` and `dst=`. Each pair
has one dtype and one number of elements (shapes may differ), both tensors
contiguous; dtypes differ freely across pairs (bool, ints, floats, complex, float8...).
The copy is of bits, never of values: every pair is reinterpreted as the widest of
int64/int32/int16/int8 that divides its byte count and the byte alignment of both
pointers, so NaN payloads, -0.0 and subnormals arrive unchanged. Pairs with no elements
are skipped; if every pair is empty nothing is launched.

Kernel: one launch over a 1-D grid. Pair i owns the programs [start_i, start_(i+1)), one
per chunk of TILES x BLOCK units (BLOCK counts elements of the pair's unit, so every
unit costs the same registers); a program finds its pair with a static chain of
range tests over the (at most 16) pairs, passed as tuples of pointers and lengths, and
copies its chunk in TILES tiles (unmasked when the tile is full, masked for the tail).
Programs never read or write past a pair's length, so any config copies the same bits.

A dst must not share memory with any src or another dst (a tensor may appear in several
pairs only as a source): ValueError, from the tensors' address ranges
(`_common.check_no_overlap`: metadata only, no value read).
"""
from __future__ import annotations

from typing import Sequence

import torch
import triton
import triton.language as tl

from . import _common as C
from ._tuning import Tuning

NAME = "copy_inputs"
MAX_PAIRS = 16
_DST_NAMES = tuple(f"dst[{i}]" for i in range(MAX_PAIRS))
_SRC_NAMES = tuple(f"src[{i}]" for i in range(MAX_PAIRS))
_UNITS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.int8))


def reference(*, src: Sequence[torch.Tensor], dst: Sequence[torch.Tensor]) -> None:
    """The semantics: dst[i].copy_(src[i]) for every pair, as bits (through an int8 view,
    so no value conversion can touch a NaN payload)."""
    for s, d in zip(src, dst, strict=True):
        if d.numel():
            d.reshape(-1).view(torch.int8).copy_(s.reshape(-1).view(torch.int8))


# --- kernel ----------------------------------------------------------------------------
@triton.jit
def _copy_chunk(dst, src, n, local, BLOCK: tl.constexpr, TILES: tl.constexpr):
    """Copy chunk `local` (TILES tiles of BLOCK units) of a pair of n units."""
    base = local.to(tl.int64) * (TILES * BLOCK)
    d = dst + base
    s = src + base
    rem = n - base
    lanes = tl.arange(0, BLOCK)
    for t in range(0, TILES):
        offs = t * BLOCK + lanes
        if rem >= (t + 1) * BLOCK:
            tl.store(d + offs, tl.load(s + offs))
        else:
            m = offs < rem
            tl.store(d + offs, tl.load(s + offs, mask=m), mask=m)


@triton.jit
def _copy_inputs_kernel(dsts, srcs, ns, starts, NP: tl.constexpr, BLOCK: tl.constexpr,
                        TILES: tl.constexpr, PDL: tl.constexpr):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    for i in tl.static_range(NP):
        if (pid >= starts[i]) & (pid < starts[i + 1]):
            _copy_chunk(dsts[i], srcs[i], ns[i], pid - starts[i], BLOCK, TILES)


# --- search space and heuristic -------------------------------------------------------
# BLOCK: units (int64/int32/int16/int8 elements) per tile, so a thread holds the same
# number of registers whatever the unit; TILES: tiles per program.
SPACE = {
    "BLOCK": (64, 128, 256, 512, 1024, 2048, 4096),
    "TILES": (1, 2, 4, 8),
    "num_warps": (1, 2, 4, 8, 16),
    "num_stages": (1,),
}


def constraint(config: dict, key: dict) -> bool:
    """The tuner's prune, for performance only (every config of SPACE copies the same
    bits), so an explicit config need only be in SPACE. 2 to 16 units a thread (one
    16-byte int64 vector at least, no register spills), and no chunk over four times
    the largest pair in int64 units (bigger chunks run exactly like a smaller one)."""
    per_thread = config["BLOCK"] // (32 * config["num_warps"])
    if not 2 <= per_thread <= 16:
        return False
    chunk = config["BLOCK"] * config["TILES"] * 8
    return chunk <= max(8 * min(SPACE["BLOCK"]), 4 * C.next_pow2(key["pair_bytes"]))


def heuristic(key: dict, device: torch.device) -> dict:
    """Small inputs (a step's tokens, positions, lengths): 512 units (4 KB of int64) a
    program, 4 units a thread. Large pairs: 2048-unit tiles, two a program, 8 units a
    thread, so that many loads are in flight."""
    if key["pair_bytes"] <= 64 * 1024:
        return {"BLOCK": 512, "TILES": 1, "num_warps": 4, "num_stages": 1}
    return {"BLOCK": 2048, "TILES": 2, "num_warps": 8, "num_stages": 1}


def tune_key(n_pairs: int, pair_bytes: int) -> dict:
    return {"pairs": int(n_pairs), "pair_bytes": int(pair_bytes)}


def resolve_config(config: dict | None, key: dict, device: torch.device) -> dict:
    return C.resolve_config(TUNING, config, key, device)


# --- launcher --------------------------------------------------------------------------
def positional_error(args: tuple) -> TypeError:
    """The error of a positional call (`copy_inputs` and its custom-op wrapper)."""
    got = ", ".join(type(a).__name__ for a in args)
    return TypeError(
        f"copy_inputs: expected keyword arguments src=[...] and dst=[...] (named, because "
        f"a swapped pair has matching shapes and would overwrite its source), got "
        f"{len(args)} positional argument{'s' if len(args) > 1 else ''} ({got})")


def _sequence(name: str, v) -> None:
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a list or tuple of 1 to {MAX_PAIRS} tensors, got "
                        f"{type(v).__name__}")


def _validate(src, dst):
    """Host-side checks; returns the device."""
    _sequence("src", src)
    _sequence("dst", dst)
    if len(src) != len(dst):
        raise ValueError(f"src, dst: expected sequences of the same length (pair i copies "
                         f"src[i] into dst[i]), got {len(src)} and {len(dst)}")
    if not 1 <= len(src) <= MAX_PAIRS:
        raise ValueError(f"src, dst: expected 1 to {MAX_PAIRS} pairs, got {len(src)}")
    dev = None
    for i, (s, d) in enumerate(zip(src, dst, strict=True)):
        for name, t in ((_SRC_NAMES[i], s), (_DST_NAMES[i], d)):
            C.check_tensor(name, t)
            if dev is None:
                dev = t.device
            C.check_device(name, t, dev)
            if not t.is_contiguous():
                if t is d:
                    C.check_written(name, t)
                raise ValueError(f"{name}: expected a contiguous tensor, got shape "
                                 f"{tuple(t.shape)} with strides {t.stride()}")
        if d.dtype != s.dtype:
            raise TypeError(f"dst[{i}]: expected the dtype of src[{i}], "
                            f"{C._dtype_name(s.dtype)}, got {C._dtype_name(d.dtype)}")
        if d.numel() != s.numel():
            raise ValueError(f"dst[{i}]: expected the number of elements of src[{i}], "
                             f"{s.numel()} (shape {tuple(s.shape)}), got {d.numel()} "
                             f"(shape {tuple(d.shape)})")
    C.check_runnable("src[0]", src[0])              # after the device checks
    C.check_no_overlap(zip(_DST_NAMES, dst, strict=False), zip(_SRC_NAMES, src, strict=False))
    return dev


def _unit_view(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if t.dtype == dtype:
        return t.reshape(-1)
    return t.reshape(-1).view(dtype)


def _plan(src_list, dst_list):
    """(dst views, src views, lengths in units) of the non-empty pairs."""
    dsts, srcs, ns = [], [], []
    for src, dst in zip(src_list, dst_list, strict=True):
        es = dst.element_size()
        nbytes = dst.numel() * es
        if nbytes == 0:
            continue
        width, dtype = next(           # int8 (width 1) always qualifies
            (w, dt) for w, dt in _UNITS
            if nbytes % w == 0 and all(t.data_ptr() % w == 0
                                       and (t.storage_offset() * es) % w == 0
                                       for t in (dst, src)))
        dsts.append(_unit_view(dst, dtype))
        srcs.append(_unit_view(src, dtype))
        ns.append(nbytes // width)
    return dsts, srcs, ns


def launch_copy_inputs(dsts: list, srcs: list, ns: list, cfg: dict) -> None:
    """Launch on unit views (equal dtypes per pair, lengths `ns` in units)."""
    chunk = int(cfg["BLOCK"]) * int(cfg["TILES"])
    starts = [0]
    for n in ns:
        starts.append(starts[-1] + C.cdiv(n, chunk))
    pdl = C.pdl(dsts[0].device)          # no main loop: release at start, any grid
    _copy_inputs_kernel[(starts[-1],)](
        tuple(dsts), tuple(srcs), tuple(ns), tuple(starts), NP=len(dsts),
        BLOCK=int(cfg["BLOCK"]), TILES=int(cfg["TILES"]), PDL=pdl,
        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]), launch_pdl=pdl > 0)


def copy_inputs(*args, src: Sequence[torch.Tensor] | None = None,
                dst: Sequence[torch.Tensor] | None = None,
                config: dict | None = None) -> None:
    """Copy src[i] into dst[i] bit for bit for 1 to 16 pairs, in one launch: each pair
    one dtype and one number of elements, both contiguous, all on one device; any
    dtypes across pairs. Keyword-only (a positional call raises TypeError: a swapped
    pair would silently overwrite its source). A dst shares no memory with a src or
    another dst (ValueError)."""
    if args:
        raise positional_error(args)
    dev = _validate(src, dst)
    dsts, srcs, ns = _plan(src, dst)
    if not dsts:
        return None
    largest = max(n * d.element_size() for d, n in zip(dsts, ns, strict=True))
    key = tune_key(len(src), largest)
    cfg = resolve_config(config, key, dev)
    launch_copy_inputs(dsts, srcs, ns, cfg)
    return None


# --- what dispatch knows (read by the autotuner too) ---------------------------------
TUNING = Tuning(
    name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
    sources=(_copy_inputs_kernel, _copy_chunk, launch_copy_inputs, _plan))


copy_inputs.reference = reference
