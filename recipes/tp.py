"""tp: argmax and chain verification over a vocabulary split across tensor-parallel ranks.

For a model whose lm_head is split by vocabulary, rank p of the group holds the columns
of global ids s_p .. s_p + Vl_p - 1 of every logits row (s_p = `vocab_start`; ids >= V =
`vocab_size` are padding), the ranks' ranges cover [0, V) without overlap, and

    tp.argmax(local, vocab_start=s_p, vocab_size=V)          == recipes.argmax(full)
    tp.chain_verify(local, d, vocab_start=s_p, vocab_size=V) == recipes.chain_verify(full, d)

on every rank, bit for bit, `full` being the ranks' live columns side by side (sampled
rows too: temperature=, seeds=, positions= as in chain_verify). The logits are never
gathered: which column wins a row is one int64.

Why one int64 is enough: `_argmax_core.pack(x, i) = key(x) << 32 | (0x7FFFFFFF - i)` is
ordered as the argmax rules order (value, index) pairs: the larger value first, ties to
the lower index, NaN above every number (the first NaN winning), -0.0 equal to +0.0. With
GLOBAL indices, the max over ranks of each rank's max is the max over all columns, and
the row's argmax is its index. Three steps, each a public function of this module:

1. `local_keys` (one launch per rank): keys[r] = max over the rank's live columns v
   (global ids below V) of pack(x[r, v], v), or of pack(s[r, v], v) on sampled rows
   (chain_verify's scores). Padding columns are never read, so they may hold anything.
   The chunks of a row meet in the stage-2 workspace as in argmax (`atomic_max` and an
   arrival counter); the last one stores the row's key.
2. `torch.distributed.all_reduce(keys, MAX, group)`: 8 bytes a row, where gathering the
   logits would move R x V x (dtype size) bytes.
3. `finish_argmax` (the index of each key, int64 [R]) or `finish_verify` (chain_verify's
   accept logic on the K+1 keys of each request): one small launch.

Greedy rows scan the rank's columns like argmax (offsets from the rank's first column)
and move the packed key to global ids: pack(x, i) - s = pack(x, s + i) (the low word
0x7FFFFFFF - i - s stays non-negative: ids are below 2^31).

Sampled rows need the noise of the GLOBAL id v: component v & 3 of the Philox call with
counter (v >> 2, positions[b] + j), which the scan draws four ids at a time from a
multiple of 4. So their scan runs in global ids: the row pointer shifted by -s, chunks
laid from s rounded down to a multiple of 4, and where s is not a multiple of 4 the
(at most 3) ids below s masked (`_gumbel_core`'s live_lo; greedy rows of that launch
share the chunk grid). Any split of the vocabulary then samples the tokens one device
samples, with the filtered scan and EXACT=1 alike.

Edge cases: a row whose live values (or scores) on a rank are all -inf gives that rank
pack(-inf, s); it loses to every other candidate, and the rank holding id 0 gives
pack(-inf, 0) or better, so an all -inf row gives 0 as torch does. A draft id outside
[0, V) (padding ids included) never matches: target tokens lie in [0, V). B = 0 or R = 0:
empty outputs, no launch and no collective (the ranks of a group share the batch).
One rank (no process group initialised, or a group of one): local_logits must be the
whole vocabulary (vocab_start 0, V columns) and the call is recipes.argmax /
recipes.chain_verify itself (one fused launch, no collective).

Configuration: the scan is argmax's (tp.argmax) or chain_verify's (tp.chain_verify):
the same config keys, search space and heuristic, at the rank's live width
(min(Vl, V - s)) instead of V. `config=None` runs the heuristic: the tuned tables were
measured on the single-GPU kernels, whose finish the keys kernel does not run, and a
config they lent measured slower here (docs/performance.md, Dispatch). With one rank
the call is the single-GPU recipe and uses its table. Outputs never depend on the
config.

Stream order and capture: the three steps run on the current stream (NCCL orders its
own stream after it and it after the collective), nothing syncs the host, and with every
`out=` given nothing is allocated after the first call at the largest batch (the key
buffer of chain_verify and the stage-2 scratch are per-device workspaces), so a call can
be captured in a CUDA graph with NCCL. gloo all-reduces CPU tensors (the interpreter);
for CUDA tensors it would go through the host, so it is refused.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from . import _common as C
from . import argmax as AM
from . import chain_verify as CV
from ._argmax_core import (
    PACKED_EMPTY,
    chunk_argmax_packed,
    lane_vec,
    pack,
    publish_packed,
    split_plan,
    unpack_index,
)
from ._gumbel_core import sampled_chunk_packed
from .chain_verify import VerifyResult, write_accept

FINISH_BLOCK = 1024     # keys unpacked per program of finish_argmax


# --- the semantics in plain torch ------------------------------------------------------
def reference(logits, draft_tokens=None, temperature=None, seeds=None, positions=None):
    """What every rank returns, on the full logits (the ranks' live columns side by
    side): torch.argmax of each row without draft_tokens, else chain_verify's
    reference."""
    if draft_tokens is None:
        return AM.reference(logits)
    return CV.reference(logits, draft_tokens, temperature, seeds, positions)


# --- kernels ---------------------------------------------------------------------------
@triton.jit
def _greedy_key(row_ptr, lo, hi, vs, tiles_per, BLOCK_V: tl.constexpr,
                UNROLL: tl.constexpr, VEC: tl.constexpr):
    """Packed argmax of the rank's columns [lo, hi) at global ids: pack(x, i) - vs is
    pack(x, vs + i)."""
    return chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC) - vs


@triton.jit
def _keys_kernel(x_ptr, keys_ptr, acc_ptr, cnt_ptr, temp_ptr, seed_ptr, pos_ptr,
                 vs, vs4, n_live, K1, stride_b, stride_j, stride_t, stride_s, stride_p,
                 n_split, tiles_per, ONE_CHUNK: tl.constexpr, BLOCK_V: tl.constexpr,
                 UNROLL: tl.constexpr, VEC: tl.constexpr, SAMPLED: tl.constexpr,
                 EXACT: tl.constexpr, MAXC: tl.constexpr, LIVE_LO: tl.constexpr,
                 PDL: tl.constexpr):
    """Program pid scans chunk c of row b*K1 + j (rows of the rank's columns, n_live of
    them live). Chunks tile [vs4, vs + n_live) in global ids, vs4 = vs rounded down to a
    multiple of 4 (= vs unless LIVE_LO)."""
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    row = pid // n_split
    c = pid - row * n_split
    b = row // K1
    j = row - b * K1
    row_ptr = x_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_j
    lo = c * tiles_per * BLOCK_V                    # from global id vs4
    if LIVE_LO:
        llo = tl.maximum(lo - (vs - vs4), 0)        # the same chunk in local columns
        lhi = tl.minimum(lo - (vs - vs4) + tiles_per * BLOCK_V, n_live)
    else:
        llo = lo
        lhi = tl.minimum(lo + tiles_per * BLOCK_V, n_live)
    if SAMPLED:
        T = tl.load(temp_ptr + b.to(tl.int64) * stride_t).to(tl.float32)
        if T > 0:
            seed = tl.load(seed_ptr + b.to(tl.int64) * stride_s).to(tl.int64)
            pos = tl.load(pos_ptr + b.to(tl.int64) * stride_p).to(tl.int64)
            ctr = (pos + j).to(tl.uint32)
            glo = vs4 + lo
            ghi = tl.minimum(glo + tiles_per * BLOCK_V, vs + n_live)
            if LIVE_LO:
                packed = sampled_chunk_packed(row_ptr - vs, glo, ghi, tiles_per, T, seed,
                                              ctr, BLOCK_V, EXACT, MAXC, UNROLL == 2, vs)
                # a chunk of -inf scores answers with its lowest lane, which may be one
                # of the masked ids below vs: answer with the first live id instead
                floor = pack(tl.full([], float("-inf"), tl.float32), tl.maximum(glo, vs))
                packed = tl.where((packed > floor) & ((packed >> 32) == (floor >> 32)),
                                  floor, packed)
            else:
                packed = sampled_chunk_packed(row_ptr - vs, glo, ghi, tiles_per, T, seed,
                                              ctr, BLOCK_V, EXACT, MAXC, UNROLL == 2)
        else:
            packed = _greedy_key(row_ptr, llo, lhi, vs, tiles_per, BLOCK_V, UNROLL, VEC)
    else:
        packed = _greedy_key(row_ptr, llo, lhi, vs, tiles_per, BLOCK_V, UNROLL, VEC)
    C.pdl_release(PDL)
    if ONE_CHUNK:
        tl.store(keys_ptr + row, packed)
    else:
        arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + row)
        if arrived == n_split - 1:
            # the counter's acquire already ordered every max before this read
            packed = tl.atomic_xchg(acc_ptr + row, PACKED_EMPTY, sem="relaxed")
            tl.store(keys_ptr + row, packed)
            tl.store(cnt_ptr + row, 0)


@triton.jit
def _unpack_kernel(keys_ptr, out_ptr, R, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """out[r] = the index of keys[r] (int64); out may be keys itself."""
    C.pdl_enter(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < R
    k = tl.load(keys_ptr + offs, mask=live)
    tl.store(out_ptr + offs, unpack_index(k).to(tl.int64), mask=live)


@triton.jit
def _accept_kernel(keys_ptr, draft_ptr, tokens_ptr, accept_ptr, bonus_ptr, select_ptr, K,
                   stride_db, stride_dk, KP1: tl.constexpr, PDL: tl.constexpr):
    """Request b = program_id: chain_verify's accept logic on its K+1 keys."""
    C.pdl_enter(PDL)
    b = tl.program_id(0)
    j = tl.arange(0, KP1)
    keys = tl.load(keys_ptr + b.to(tl.int64) * (K + 1) + j, mask=j <= K, other=0)
    d = tl.load(draft_ptr + b.to(tl.int64) * stride_db + j * stride_dk, mask=j < K,
                other=-1).to(tl.int64)
    write_accept(unpack_index(keys), d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr, b,
                 K, KP1)


# --- launchers -------------------------------------------------------------------------
def _launch_keys(x, keys, cfg, vs, n_live, B, K1, stride_b, stride_j, sampling) -> None:
    """The per-rank scan of B*K1 rows (row b*K1 + j at x + b*stride_b + j*stride_j)."""
    R = B * K1
    # sampled rows draw their noise four global ids at a time: their chunks start at a
    # multiple of 4 (the ids below vs masked); greedy-only launches start at vs
    vs4 = vs - vs % 4 if sampling is not None else vs
    split, tiles_per = split_plan(n_live + vs - vs4, cfg["BLOCK_V"], cfg["SPLIT"])
    acc = cnt = keys
    if split > 1:
        acc, cnt = C.WORKSPACE.get(x.device, R, R)
    temp, seeds, pos, st, ss, sp = CV.sampling_args(sampling, x)
    pdl = C.pdl(x.device, R * split)
    _keys_kernel[(R * split,)](
        x, keys, acc, cnt, temp, seeds, pos, vs, vs4, n_live, K1, stride_b, stride_j,
        st, ss, sp, split, tiles_per, ONE_CHUNK=split == 1, BLOCK_V=cfg["BLOCK_V"],
        UNROLL=cfg["UNROLL"], VEC=lane_vec(x.element_size(), cfg["BLOCK_V"], cfg["num_warps"]),
        SAMPLED=sampling is not None, EXACT=cfg.get("EXACT", 0),
        MAXC=CV.MAXC, LIVE_LO=vs4 != vs, PDL=pdl, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], launch_pdl=pdl > 0)


def _launch_unpack(keys, out) -> None:
    R = keys.shape[0]
    pdl = C.pdl(keys.device)
    _unpack_kernel[(C.cdiv(R, FINISH_BLOCK),)](keys, out, R, BLOCK=FINISH_BLOCK, PDL=pdl,
                                                num_warps=4, launch_pdl=pdl > 0)


def _launch_accept(keys, draft_tokens, out, B, K) -> None:
    pdl = C.pdl(keys.device)
    _accept_kernel[(B,)](keys, draft_tokens, out.tokens, out.accept_len, out.bonus,
                         out.select_index, K, draft_tokens.stride(0), draft_tokens.stride(1),
                         KP1=C.next_pow2(K + 1), PDL=pdl, num_warps=1, launch_pdl=pdl > 0)


# --- validation ------------------------------------------------------------------------
def _live_width(local_logits, vocab_start, vocab_size) -> tuple[int, int, int]:
    """(vocab_start, vocab_size, live columns min(Vl, V - vocab_start)), checked."""
    vs, V = C.check_int("vocab_start", vocab_start), C.check_int("vocab_size", vocab_size)
    if not 1 <= V < 2**31:
        raise ValueError(f"vocab_size: expected 1 <= vocab_size < 2^31, got {V}")
    if not 0 <= vs < V:
        raise ValueError(f"vocab_start: expected 0 <= vocab_start < vocab_size = {V} (the "
                         f"global id of the rank's first column), got {vs}")
    Vl = local_logits.shape[-1]
    if Vl > V:
        raise ValueError(f"local_logits: expected at most vocab_size = {V} columns (the "
                         f"rank's shard of the vocabulary), got {Vl}")
    return vs, V, min(Vl, V - vs)


def _world(group, device: torch.device) -> int:
    """Ranks of the call's group: 1 without an initialised process group. A group of
    several must all-reduce tensors of `device`'s type on the device (no host sync):
    a backend registered for that type, and not gloo for CUDA tensors."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise ValueError("group: expected None (one rank) when no torch.distributed "
                             "process group is initialised, got a group")
        return 1
    world = dist.get_world_size(group)
    if world < 1:
        raise ValueError("group: expected a process group this rank belongs to, got one "
                         "it is not a member of")
    if world == 1:
        return 1
    config = dist.get_backend_config(group)      # e.g. "cpu:gloo,cuda:nccl"
    backends = dict(e.split(":", 1) if ":" in e else (device.type, e)
                    for e in config.split(","))
    backend = backends.get(device.type)
    if backend is None:
        raise ValueError(f"group: expected a backend that all-reduces {device.type} "
                         f"tensors (gloo for CPU, nccl for CUDA), got {config!r}")
    if device.type == "cuda" and backend == "gloo":
        raise ValueError("group: gloo all-reduces CUDA tensors through the host (a sync, "
                         f"not capturable); expected nccl for CUDA tensors, got {config!r}")
    return world


def _whole(local_logits, vs: int, V: int) -> None:
    """One rank holds the whole vocabulary."""
    if vs != 0 or local_logits.shape[-1] != V:
        raise ValueError(f"local_logits: a single rank (no process group, or a group of "
                         f"one) must hold the whole vocabulary: expected vocab_start = 0 "
                         f"and {V} columns, got vocab_start = {vs} and "
                         f"{local_logits.shape[-1]} columns")


def _check_keys(name: str, keys, R: int | None = None, device=None) -> None:
    C.check_tensor(name, keys, dtypes=(torch.int64,), ndim=1, device=device)
    C.check_runnable(name, keys)
    if R is not None and keys.shape[0] != R:
        raise ValueError(f"{name}: expected {R} keys (B*(K+1) from draft_tokens), got "
                         f"shape {tuple(keys.shape)}")
    if not keys.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {keys.stride()}")


def _local_rows(local_logits, sampling_given: bool, temperature):
    """(B, K1, stride_b, stride_j) of local_logits: [B, K+1, Vl]; [R, Vl] with
    temperature [B] is B requests of R / B rows; [R, Vl] alone is R rows."""
    x = local_logits
    if x.dim() == 3:
        return x.shape[0], x.shape[1], x.stride(0), x.stride(1)
    R = x.shape[0]
    if not sampling_given:
        return R, 1, x.stride(0), 0
    C.check_tensor("temperature", temperature, dtypes=C.FLOAT_DTYPES, ndim=1)
    B = temperature.shape[0]
    if (B == 0 and R != 0) or (B and R % B):
        raise ValueError(f"local_logits: expected B*(K+1) rows for temperature [B={B}], "
                         f"got shape {tuple(x.shape)}")
    K1 = R // B if B else 1
    return B, K1, K1 * x.stride(0), x.stride(0)


# --- public: the per-rank pieces -------------------------------------------------------
def local_keys(local_logits: torch.Tensor, *, vocab_start: int, vocab_size: int,
               temperature=None, seeds=None, positions=None, out=None,
               config=None) -> torch.Tensor:
    """Step 1 on one rank: int64 [R], the packed argmax key (`_argmax_core.pack`, global
    ids) of each row over the rank's live columns. `local_logits`: [R, Vl] or
    [B, K+1, Vl] (row b*(K+1) + j); with `temperature` [B] (and `seeds`, `positions`, as
    in chain_verify) request b's rows sample when temperature[b] > 0, a 2-D
    local_logits then holding R = B*(K+1) rows. No collective. Config: argmax's keys and
    table for 2-D rows without temperature, else chain_verify's."""
    C.check_tensor("local_logits", local_logits, dtypes=C.FLOAT_DTYPES, ndim=(2, 3))
    device = local_logits.device
    C.check_runnable("local_logits", local_logits)
    C.check_logits_rows("local_logits", local_logits)
    vs, _, n_live = _live_width(local_logits, vocab_start, vocab_size)
    B, K1, stride_b, stride_j = _local_rows(local_logits, temperature is not None,
                                            temperature)
    sampling = CV.validate_sampling(temperature, seeds, positions, B, device)
    R = B * K1
    if out is None:
        out = torch.empty((R,), dtype=torch.int64, device=device)
    else:
        C.check_out("out", out, (R,), torch.int64, device)
        reads = [("local_logits", local_logits)]
        if sampling is not None:
            reads += zip(("temperature", "seeds", "positions"), sampling, strict=True)
        C.check_no_overlap([("out", out)], reads)
    if R == 0:
        return out
    if local_logits.dim() == 2 and sampling is None:
        cfg = AM.resolve_config(config, local_logits.dtype, n_live, R, device, tables=False)
    else:
        key = CV.tune_key(local_logits.dtype, n_live, B, K1 - 1, sampling is not None)
        cfg = CV.resolve_config(config, key, device, tables=False)
    _launch_keys(local_logits, out, cfg, vs, n_live, B, K1, stride_b, stride_j, sampling)
    return out


def finish_argmax(keys: torch.Tensor, *, out=None) -> torch.Tensor:
    """Step 3 of argmax: int64 [R], the index of each reduced key (`out` may be `keys`
    itself: unpacked in place). One launch."""
    _check_keys("keys", keys)
    if out is None:
        out = torch.empty_like(keys)
    else:
        C.check_out("out", out, tuple(keys.shape), torch.int64, keys.device)
        if out.data_ptr() != keys.data_ptr():       # in place, or apart
            C.check_no_overlap([("out", out)], [("keys", keys)])
    if keys.shape[0]:
        _launch_unpack(keys, out)
    return out


def finish_verify(keys: torch.Tensor, draft_tokens: torch.Tensor, *,
                  out=None) -> VerifyResult:
    """Step 3 of chain_verify: the accept logic on the reduced keys (int64 [B*(K+1)],
    request b's at b*(K+1) + j) against `draft_tokens` (int32/int64 [B, K]): a
    VerifyResult as recipes.chain_verify returns. One launch."""
    C.check_tensor("draft_tokens", draft_tokens, dtypes=C.INDEX_DTYPES, ndim=2)
    CV.check_draft_width("draft_tokens", draft_tokens)
    B, K = draft_tokens.shape
    _check_keys("keys", keys, B * (K + 1), draft_tokens.device)
    given = out is not None
    out = CV.validate_out(out, B, K, draft_tokens.device)
    if given:
        C.check_no_overlap(zip(CV._OUT_NAMES, out, strict=True),
                           [("keys", keys), ("draft_tokens", draft_tokens)])
    if B:
        _launch_accept(keys, draft_tokens, out, B, K)
    return out


# --- public: the calls -----------------------------------------------------------------
def argmax(local_logits: torch.Tensor, *, vocab_start: int, vocab_size: int, group=None,
           out: torch.Tensor | None = None, config: dict | None = None) -> torch.Tensor:
    """Vocabulary-parallel `recipes.argmax`: `local_logits` [R, Vl] are this rank's
    columns (global ids vocab_start ..); returns int64 [R] global ids, the same on every
    rank of `group` (None: the default group). `out` holds the packed keys until the
    all-reduce and the ids after it. Config: argmax's."""
    C.check_tensor("local_logits", local_logits, dtypes=C.FLOAT_DTYPES, ndim=2)
    device = local_logits.device
    C.check_runnable("local_logits", local_logits)
    C.check_logits_rows("local_logits", local_logits)
    vs, V, n_live = _live_width(local_logits, vocab_start, vocab_size)
    R = local_logits.shape[0]
    if out is None:
        out = torch.empty((R,), dtype=torch.int64, device=device)
    else:
        C.check_out("out", out, (R,), torch.int64, device)
        C.check_no_overlap([("out", out)], [("local_logits", local_logits)])
    if _world(group, device) == 1:
        _whole(local_logits, vs, V)
        return AM.argmax(local_logits, out=out, config=config)
    if R == 0:
        return out
    cfg = AM.resolve_config(config, local_logits.dtype, n_live, R, device, tables=False)
    _launch_keys(local_logits, out, cfg, vs, n_live, R, 1, local_logits.stride(0), 0, None)
    dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    _launch_unpack(out, out)
    return out


def chain_verify(local_logits: torch.Tensor, draft_tokens: torch.Tensor, *,
                 vocab_start: int, vocab_size: int, group=None, temperature=None,
                 seeds=None, positions=None, top_k=None, top_p=None, min_p=None, out=None,
                 config=None) -> VerifyResult:
    """Vocabulary-parallel `recipes.chain_verify`: `local_logits` [B*(K+1), Vl] or
    [B, K+1, Vl] are this rank's columns (global ids vocab_start ..); the other
    arguments and the VerifyResult (global ids, the same on every rank of `group`) are
    chain_verify's. Config: chain_verify's. The sampling controls (top_k, top_p, min_p)
    are single-device for now: given, they raise NotImplementedError."""
    controls = [n for n, t in zip(CV.CONTROL_NAMES, (top_k, top_p, min_p), strict=True)
                if t is not None]
    if controls:
        raise NotImplementedError(
            f"{', '.join(controls)}: the sampling controls are single-device for now "
            "(recipes.chain_verify); tp.chain_verify takes temperature, seeds and "
            "positions only")
    given = out is not None
    B, K, _, stride_b, stride_j, out = CV.validate(local_logits, draft_tokens, out,
                                                   name="local_logits")
    device = local_logits.device
    sampling = CV.validate_sampling(temperature, seeds, positions, B, device)
    if given:
        CV.check_out_overlap(out, local_logits, draft_tokens, sampling)
    vs, V, n_live = _live_width(local_logits, vocab_start, vocab_size)
    if _world(group, device) == 1:
        _whole(local_logits, vs, V)
        return CV.chain_verify(local_logits, draft_tokens, temperature=temperature,
                               seeds=seeds, positions=positions, out=out, config=config)
    if B == 0:
        return out
    key = CV.tune_key(local_logits.dtype, n_live, B, K, sampling is not None)
    cfg = CV.resolve_config(config, key, device, tables=False)
    R = B * (K + 1)
    keys = C.KEYS.get(device, R, 1)[0][:R]
    _launch_keys(local_logits, keys, cfg, vs, n_live, B, K + 1, stride_b, stride_j, sampling)
    dist.all_reduce(keys, op=dist.ReduceOp.MAX, group=group)
    _launch_accept(keys, draft_tokens, out, B, K)
    return out


argmax.reference = reference
chain_verify.reference = reference
