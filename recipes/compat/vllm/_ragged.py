"""Ragged chain verification: requests with different draft counts, read where they lie.

vLLM lays a batch's verify rows out back to back: request b owns the logits rows
[P'_b, P'_(b+1)) of one [N, V] tensor, from cumulative counts (v1: `cu_num_draft_tokens`,
inclusive ends, one row per draft; model-runner v2: `cu_num_logits`, exclusive starts,
one row per draft plus the bonus row). Neither engine pads the rows, and neither does
this kernel: every program finds its row's request from the counts itself.

    P   = the B + 1 boundaries (v1: 0, cu[0], ..., cu[B-1]; MRv2: cu[0], ..., cu[B])
    P'_i = max(P_0..P_i) clamped to [0, N]       (monotone whatever the values)
    request b: rows [P'_b, P'_(b+1)), of which the first L_b = min(P'_(b+1) - P'_b, MAXROWS)
               are verified (MAXROWS: v1 max_spec_len, MRv2 K + 1); rows outside every
               request, or past L_b, are not read

With t[b, j] the target token of row P'_b + j (argmax, or the Gumbel-max sample of
`recipes.chain_verify` on sampled rows) and n_b the request's drafts (v1: L_b; MRv2:
L_b - 1), m_b = the leading drafts equal to their target token (int64 compare: an id
outside [0, V) never matches). The output row of request b (WIDTH entries):

* v1: t[b, j] for j <= m_b, j < n_b; then `bonus[b]` at n_b if m_b = n_b; -1 elsewhere.
* MRv2: k_b = min(m_b + 1, L_b) tokens t[b, 0..k_b-1], -1 after; `num_sampled[b] = k_b`.

Kernel: one launch of B + N x SPLIT programs. Program b < B is request b's own: it finds
the request's span (two maxima over the boundaries) and counts in; the others scan one
chunk of one row each. A row program finds its request with one vector load of the
boundaries (the first P'_i above the row; no binary search, no dependent loads), loads
the request's drafts, scans with the shared building blocks (`chunk_argmax_packed` /
`sampled_chunk_packed`) and folds its candidate into the row's stage-2 slot
(`publish_packed`). The last of the request's L_b x SPLIT + 1 arrivals (counted on the
request's counter) reads the L_b slots, accepts and writes the row, and leaves slots and
counter at rest: a request with no row is finished by its own program. Sampled rows
(temperature > 0) key Philox with the request's seed and the row's position (v1:
positions[b] + j; MRv2: pos[row]), the stream of `recipes.chain_verify`.

Sampling controls (top_k/top_p/min_p per request or state, with the temperature applied
here): a launch before, `_select_kernel`, one program per logits row, finds the row's
request the same way and writes its packed-key threshold (`_controls_core`'s
`row_threshold`) into the scratch after the rows' slots; the verify launch then scans
those rows restricted to the kept ids (`restricted_chunk_packed`) and the finisher puts
the request's thresholds back to rest. Without controls that code is not compiled in.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import _common as C
from ... import _controls_core as CC
from ..._argmax_core import (
    PACKED_EMPTY,
    chunk_argmax_packed,
    lane_vec,
    publish_packed,
    split_heuristic,
    split_plan,
    unpack_index,
)
from ..._gumbel_core import sampled_chunk_packed
from ..._tuning import Tuning
from ...chain_verify import MAXC, sampled_heuristic
from ...chain_verify import SPACE as VERIFY_SPACE
from ...chain_verify import constraint as verify_constraint

NAME = "vllm_ragged_verify"
SPACE = VERIFY_SPACE
CB_MAX = 1024           # boundaries read per vector load


# --- the semantics in plain torch ------------------------------------------------------
def spans(bounds: torch.Tensor, N: int, lead0: bool) -> list[tuple[int, int]]:
    """[(start, end)] of every request from the boundary values (host lists: a
    reference, not a launcher): P' as in the module doc."""
    p = ([0] if lead0 else []) + [int(v) for v in bounds.tolist()]
    out, run = [], 0
    for i, v in enumerate(p):
        run = max(run, min(max(v, 0), N)) if i else min(max(v, 0), N)
        p[i] = run
    for b in range(len(p) - 1):
        out.append((p[b], p[b + 1]))
    return out


def target_rows(logits, rows, temp=None, seed=None, counters=None, apply_temperature=False,
                controls=None):
    """t of the given logits rows (int64): argmax, or where temp > 0 the Gumbel-max sample
    with that seed and counter (temperature divided only with `apply_temperature`) over
    the kept set of the per-row `controls` (top_k, top_p, min_p; each [rows] or None):
    `recipes.chain_verify`'s semantics, a row at a time (K = 0)."""
    from ...chain_verify import target_tokens

    x = logits[rows]
    if temp is None or not len(rows):
        return torch.argmax(x, dim=-1)
    tf = temp.to(torch.float32)
    if not apply_temperature:       # sampled iff temp > 0, over the logits as given
        tf = torch.where(tf > 0, torch.ones_like(tf), tf)
    return target_tokens(x, len(rows), 0, tf, seed, counters,
                         *(controls or (None, None, None))).view(-1)


def accept_len(t: torch.Tensor, d: torch.Tensor) -> int:
    """m: leading drafts d equal to t (int64)."""
    m = 0
    for a, b in zip(d.tolist(), t.tolist(), strict=False):
        if a != b:
            break
        m += 1
    return m


# --- kernel ----------------------------------------------------------------------------
@triton.jit
def _bound(cu_ptr, stride_cu, i, B, N, LEAD0: tl.constexpr):
    """P_i clamped to [0, N] for lanes i (int64), and which lanes are boundaries."""
    valid = i <= B
    k = i - LEAD0
    p = tl.load(cu_ptr + k.to(tl.int64) * stride_cu, mask=valid & (k >= 0),
                other=0).to(tl.int64)
    return tl.minimum(tl.maximum(p, 0), N), valid


@triton.jit
def _find_request(cu_ptr, stride_cu, r, B, N, LEAD0: tl.constexpr, CB: tl.constexpr):
    """(b, P'_b, P'_(b+1)) of row r: b + 1 = the first i with P_i > r (clamped; then
    P'_(b+1) = that P_i and P'_b the max before it). b = -1 or B: no request."""
    first = B + 1
    start = tl.zeros([], tl.int64)
    end = tl.zeros([], tl.int64) + N
    for i0 in range(0, B + 1, CB):
        i = i0 + tl.arange(0, CB)
        p, valid = _bound(cu_ptr, stride_cu, i, B, N, LEAD0)
        f = tl.min(tl.where(valid & (p > r), i, B + 1), 0)
        open_ = first > B
        start = tl.where(open_, tl.maximum(start, tl.max(tl.where(valid & (i < f), p, 0), 0)),
                         start)
        end = tl.where(open_ & (f <= B), tl.sum(tl.where(i == f, p, 0), 0), end)
        first = tl.where(open_, f, first)
    return first - 1, start, end


@triton.jit
def _request_span(cu_ptr, stride_cu, b, B, N, LEAD0: tl.constexpr, CB: tl.constexpr):
    """(P'_b, P'_(b+1)) of request b: the maxima of P_0..P_b and P_0..P_(b+1)."""
    start = tl.zeros([], tl.int64)
    end = tl.zeros([], tl.int64)
    for i0 in range(0, b + 2, CB):
        i = i0 + tl.arange(0, CB)
        p, valid = _bound(cu_ptr, stride_cu, i, B, N, LEAD0)
        start = tl.maximum(start, tl.max(tl.where(valid & (i <= b), p, 0), 0))
        end = tl.maximum(end, tl.max(tl.where(valid & (i <= b + 1), p, 0), 0))
    return start, end


@triton.jit
def _finish(acc_ptr, cnt_ptr, d, b, start, L, n, out_ptr, stride_out, WIDTH, num_ptr,
            bonus_ptr, stride_bonus, thr_ptr, V1: tl.constexpr, WP: tl.constexpr,
            CONTROLS: tl.constexpr):
    """The last arrival of request b: read its L slots (resetting them, and with CONTROLS
    the rows' thresholds), accept against the drafts d (int64 [WP], n of them) and write
    the request's row (module doc)."""
    j = tl.arange(0, WP)
    packed = tl.atomic_xchg(acc_ptr + start + j, tl.full([WP], PACKED_EMPTY, tl.int64),
                            sem="relaxed", mask=j < L)
    if CONTROLS:
        tl.store(thr_ptr + start + j, PACKED_EMPTY, mask=j < L)
    t = tl.where(j < L, unpack_index(packed), 0)
    miss = (j < n) & (d != t.to(tl.int64))
    m = tl.min(tl.where(miss, j, n), 0)
    row = out_ptr + b.to(tl.int64) * stride_out + j
    if V1:
        bonus = tl.load(bonus_ptr + b.to(tl.int64) * stride_bonus).to(tl.int32)
        val = tl.where((j <= m) & (j < n), t, -1)
        val = tl.where((j == n) & (m == n), bonus, val)
        tl.store(row, val, mask=j < WIDTH)
    else:
        k = tl.minimum(m + 1, L)
        tl.store(row, tl.where(j < k, t, -1).to(tl.int64), mask=j < WIDTH)
        tl.store(num_ptr + b, k.to(tl.int32))
    tl.store(cnt_ptr + b, 0)


@triton.jit
def _ragged_kernel(logits_ptr, stride_row, V, N, B, cu_ptr, stride_cu, draft_ptr, stride_d,
                   out_ptr, stride_out, WIDTH, MAXROWS, num_ptr, bonus_ptr, stride_bonus,
                   acc_ptr, cnt_ptr, map_ptr, stride_map, n_state, temp_ptr, stride_t,
                   seed_ptr, stride_s, pos_ptr, stride_p, n_split, tiles_per, thr_ptr, IDB,
                   LEAD0: tl.constexpr, V1: tl.constexpr, DOFF: tl.constexpr,
                   CB: tl.constexpr,
                   WP: tl.constexpr, BLOCK_V: tl.constexpr, UNROLL: tl.constexpr,
                   VEC: tl.constexpr, SAMPLED: tl.constexpr, MAPPED: tl.constexpr,
                   ROW_POS: tl.constexpr, APPLY_T: tl.constexpr, EXACT: tl.constexpr,
                   MAXC: tl.constexpr, PDL: tl.constexpr, CONTROLS: tl.constexpr):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    own = pid < B                         # request b's own program, else a row's chunk
    q = tl.maximum(pid - B, 0)
    r = (q // n_split).to(tl.int64)
    chunk = q - (q // n_split) * n_split
    if own:
        b = pid
        start, end = _request_span(cu_ptr, stride_cu, b, B, N, LEAD0, CB)
    else:
        b, start, end = _find_request(cu_ptr, stride_cu, r, B, N, LEAD0, CB)
    L = tl.minimum(end - start, MAXROWS).to(tl.int32)
    if V1:
        n = L                             # v1: a row per draft
    else:
        n = tl.maximum(L - 1, 0)          # MRv2: a row per draft, then the bonus row
    jrow = (r - start).to(tl.int32)
    scan = (pid >= B) & (b >= 0) & (b < B) & (jrow < L)
    arrived = -1
    if own | scan:
        # the drafts, before the scan: the finisher then waits on the slots only
        jd = tl.arange(0, WP)
        d = tl.load(draft_ptr + (start + jd + DOFF) * stride_d, mask=jd < n,
                    other=-1).to(tl.int64)
        if scan:
            lo = chunk * tiles_per * BLOCK_V
            hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
            row_ptr = logits_ptr + r * stride_row
            if SAMPLED:
                # the request's temperature (MRv2: through idx_mapping; a state index
                # outside the tables reads as greedy): > 0 samples
                s_idx = b.to(tl.int64)
                ok = b >= 0
                if MAPPED:
                    s_idx = tl.load(map_ptr + b.to(tl.int64) * stride_map).to(tl.int64)
                    ok = (s_idx >= 0) & (s_idx < n_state)
                T = tl.load(temp_ptr + s_idx * stride_t, mask=ok, other=0.0).to(tl.float32)
                if T > 0:
                    seed = tl.load(seed_ptr + s_idx * stride_s, mask=ok, other=0).to(tl.int64)
                    if ROW_POS:
                        pos = tl.load(pos_ptr + r * stride_p).to(tl.int64)
                    else:
                        pos = tl.load(pos_ptr + b.to(tl.int64) * stride_p).to(tl.int64) + jrow
                    Tk = T
                    if not APPLY_T:
                        Tk = tl.full([], 1.0, tl.float32)   # the logits arrive divided
                    if CONTROLS:       # the row's threshold (`_select_kernel`), if any
                        P = tl.load(thr_ptr + r)
                        if P != PACKED_EMPTY:
                            packed = CC.restricted_chunk_packed(
                                row_ptr, lo, hi, tiles_per, Tk, seed, pos.to(tl.uint32), P,
                                IDB, BLOCK_V)
                        else:
                            packed = sampled_chunk_packed(
                                row_ptr, lo, hi, tiles_per, Tk, seed, pos.to(tl.uint32),
                                BLOCK_V, EXACT, MAXC, UNROLL == 2)
                    else:              # not compiled in: the kernel without controls
                        packed = sampled_chunk_packed(row_ptr, lo, hi, tiles_per, Tk, seed,
                                                      pos.to(tl.uint32), BLOCK_V, EXACT,
                                                      MAXC, UNROLL == 2)
                else:
                    packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL,
                                                 VEC)
            else:
                packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL,
                                             VEC)
            C.pdl_release(PDL)
            arrived = publish_packed(packed, acc_ptr + r, cnt_ptr + b)
        else:
            arrived = tl.atomic_add(cnt_ptr + b, 1, sem="acq_rel")
        if arrived == L * n_split:
            _finish(acc_ptr, cnt_ptr, d, b, start, L, n, out_ptr, stride_out, WIDTH,
                    num_ptr, bonus_ptr, stride_bonus, thr_ptr, V1, WP, CONTROLS)


@triton.jit
def _select_kernel(logits_ptr, stride_row, V, N, B, cu_ptr, stride_cu, MAXROWS, map_ptr,
                   stride_map, n_state, temp_ptr, stride_t, topk_ptr, topp_ptr, minp_ptr,
                   sk, sp, sm, thr_ptr, IDB, LEAD0: tl.constexpr, CB: tl.constexpr,
                   MAPPED: tl.constexpr, HAS_K: tl.constexpr, HAS_P: tl.constexpr,
                   HAS_M: tl.constexpr, BLOCK: tl.constexpr):
    """One program per logits row r: thr[r] = the packed-key threshold of the sampling
    controls (`_controls_core.row_threshold`) when r is a verified row of a sampled
    request (found as `_ragged_kernel` finds it) with a control on, else PACKED_EMPTY
    (the resting value)."""
    r = tl.program_id(0).to(tl.int64)
    b, start, end = _find_request(cu_ptr, stride_cu, r, B, N, LEAD0, CB)
    L = tl.minimum(end - start, MAXROWS)
    ok = (b >= 0) & (b < B) & (r - start < L)
    q = tl.maximum(b, 0).to(tl.int64)
    if MAPPED:
        q = tl.load(map_ptr + q * stride_map, mask=ok, other=0).to(tl.int64)
        ok = ok & (q >= 0) & (q < n_state)
    T = tl.load(temp_ptr + q * stride_t, mask=ok, other=0.0).to(tl.float32)
    k, p, mp, on = CC.load_controls(topk_ptr, topp_ptr, minp_ptr, q, sk, sp, sm, V, ok,
                                    HAS_K, HAS_P, HAS_M)
    P = tl.full([], PACKED_EMPTY, tl.int64)
    if ok & (T > 0) & on:
        P = CC.row_threshold(logits_ptr + r * stride_row, V, T, k, p, mp, IDB, BLOCK)
    tl.store(thr_ptr + r, P)


# --- search space and heuristic ----------------------------------------------------------
# chain_verify's space and constraint (the same scan); the heuristic reads the batch's
# logits rows N (ragged: fewer than B x (K + 1)).
def constraint(config: dict, key: dict) -> bool:
    return verify_constraint(config, key)


def heuristic(key: dict, device: torch.device) -> dict:
    rows = max(1, key["N"])
    if key.get("mode", "greedy") != "sampled":
        return {**split_heuristic(key["dtype"], key["V"], rows, C.sm_count(device)),
                "EXACT": 0}
    return sampled_heuristic(key["V"], rows, C.sm_count(device))


def tune_key(dtype: torch.dtype, V: int, N: int, sampled: bool) -> dict:
    return {"dtype": C._dtype_name(dtype), "mode": "sampled" if sampled else "greedy",
            "V": int(V), "N": int(N)}


def resolve_config(config, dtype, V: int, N: int, sampled: bool, device) -> dict:
    return C.resolve_config(TUNING, config, tune_key(dtype, V, N, sampled), device)


# --- launcher --------------------------------------------------------------------------
def launch(logits, cu, draft, out, cfg, *, B: int, width: int, maxrows: int, v1: bool,
           num=None, bonus=None, sampling=None, idx_mapping=None, row_pos=False,
           apply_temperature=False, n_state=0, controls=None) -> None:
    """Launch on validated tensors (B >= 1). v1: `bonus` [B] any stride, `out` int32
    [B, width]; MRv2: `out` int64 [B, width] and `num` int32 [B]. `sampling`: None or
    (temperature, seeds, positions) (per request, or per state through `idx_mapping`
    with `n_state` entries; positions per row with `row_pos`). `controls`: None or
    (top_k, top_p, min_p) indexed like the temperature (each a tensor or None; only with
    `apply_temperature`): then a first launch (`_select_kernel`) puts each row's
    threshold in the scratch after the rows' slots, and the verify launch samples the
    rows that have one over the ids it keeps."""
    N, V = logits.shape
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    rows = max(N, 1)
    acc, cnt = C.WORKSPACE.get(logits.device, 2 * rows if controls else rows, B)
    like = logits
    temp, seeds, pos = sampling if sampling is not None else (like, like, like)
    st, ss, sp = (0, 0, 0) if sampling is None else (temp.stride(0), seeds.stride(0),
                                                     pos.stride(0))
    mp = idx_mapping if idx_mapping is not None else like
    stride_map = 0 if idx_mapping is None else idx_mapping.stride(0)
    CB = min(C.next_pow2(B + 1), CB_MAX)
    thr = acc[rows:2 * rows] if controls else acc
    if controls:
        ts, strides, flags = CC.control_args(controls, temp)
        _select_kernel[(N,)](
            logits, logits.stride(0), V, N, B, cu, cu.stride(0), maxrows, mp, stride_map,
            n_state, temp, st, *ts, *strides, thr, CC.id_bits(V), LEAD0=int(v1), CB=CB,
            MAPPED=idx_mapping is not None, **flags, BLOCK=CC.SELECT_BLOCK,
            num_warps=CC.SELECT_WARPS)
    programs = B + N * split
    pdl = C.pdl(logits.device, programs)
    _ragged_kernel[(programs,)](
        logits, logits.stride(0), V, N, B, cu, cu.stride(0), draft, draft.stride(0),
        out, out.stride(0), width, maxrows, num if num is not None else out,
        bonus if bonus is not None else out, 0 if bonus is None else bonus.stride(0),
        acc, cnt, mp, stride_map, n_state, temp, st, seeds, ss, pos, sp, split, tiles_per,
        thr, CC.id_bits(V),
        LEAD0=int(v1), V1=v1, DOFF=0 if v1 else 1, CB=CB,
        WP=C.next_pow2(width), BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"],
        VEC=lane_vec(logits.element_size(), cfg["BLOCK_V"], cfg["num_warps"]),
        SAMPLED=sampling is not None, MAPPED=idx_mapping is not None, ROW_POS=row_pos,
        APPLY_T=apply_temperature, EXACT=cfg.get("EXACT", 0), MAXC=MAXC, PDL=pdl,
        CONTROLS=controls is not None, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], launch_pdl=pdl > 0)


# --- what dispatch knows (read by the autotuner too) ---------------------------------
# the ragged launch of v1 and MRv2 (their layouts differ only in the finishing store),
# over chain_verify's space and constraint, keyed by the batch's logits rows N
TUNING = Tuning(
    name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
    sources=(_ragged_kernel, launch),
    # its own binaries (another kernel): tuned when named, `make tune TUNE_ARGS="--recipe
    # vllm_ragged_verify"`; without a table the calls take chain_verify's heuristics
    on_request=True)
