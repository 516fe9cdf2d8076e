"""chain_verify: verification of top-1 ("chain") drafts fused with the final argmax.

One request per batch row b, with K drafted tokens d[b, 0..K-1] and K+1 logits rows:
row j is the target's distribution for the token after input j (input 0 is the last
committed token, input j >= 1 is d[b, j-1]).

    t[b, j] = argmax_v logits[b, j, v]            (greedy rows; torch's argmax rules)
    t[b, j] = argmax_v s[b, j, v]                 (sampled rows: temperature[b] > 0)
    m[b]    = #leading j < K with d[b, j] == t[b, j]
    tokens[b, j] = t[b, j] for j <= m[b], else -1
    accept_len[b] = m[b],  bonus[b] = t[b, m[b]],  select_index[b] = b*(K+1) + m[b]

A draft id outside [0, V) never matches (t is always in [0, V), and the comparison is
in int64, so no id wraps onto a real one): -1 pads a request that drafted fewer tokens.

Sampled rows (`temperature=` float [B], `seeds=`/`positions=` integer [B]; a request
samples when temperature[b] > 0, so 0, negatives and NaN stay greedy in the same launch):

    s[b, j, v] = float32(logit) / temperature[b] + g,   g = -log(-log(u))   (float32)
    u = component v & 3 of tl.rand4x(seeds[b], ((positions[b] + j) << 32) + (v >> 2))

i.e. Philox4x32-10 with counter (v >> 2, lo32(positions[b] + j), 0, 0) and key
(lo32(seed), hi32(seed)), Triton's uint_to_uniform_float (module `_gumbel_core`). For a
draft that puts probability 1 on its token, accepting the matching prefix of these
Gumbel-max samples is exact speculative sampling: every emitted token ~ softmax(logits/T).
The stream depends on (seed, position + j, id) only: batch position, batch size, draft
length and config do not change a request's tokens. Stream facts worth knowing: the
scale 4.6566127342e-10 rounds to 2^-31 (1 - 2^-24), so u is never 1 (g < 16.7, no +inf)
and u = 0 (g = -inf) for 2 of 2^32 draws; with temperature = +inf a -inf logit scores
-inf/inf = NaN, which wins the argmax (the reference's semantics, kept).

Kernel: one launch. Every program scans one chunk of one row and folds its candidate into
the row's stage-2 slot; a per-request arrival counter elects the last of the request's
(K+1) x SPLIT programs, which reads the K+1 slots, runs the accept logic
(`_verify_finalize`) and writes all four outputs, leaving slots and counter at rest for
the next call. K = 0 is the plain argmax row with m = 0. B = 0 launches nothing.
Greedy rows scan with `chunk_argmax_packed`; sampled rows with
`_gumbel_core.sampled_chunk_packed` (same stage 2: the exact float32 score is packed like
a logit). Without `temperature` the sampled code is not compiled in (SAMPLED=False).
The same finish can also write SGLang's layout of the answer (SGLANG=True: the launcher's
`sglang` tensors, for `recipes.compat.sglang`), greedy or sampled rows alike; off, it is
not compiled in and the kernel is the same instruction for instruction (sm_90 SASS).

Sampled scan (EXACT=0, the default): one pass over the logits, per id an upper bound of
its score from the Philox bits, two MUFU.LG2 and an FFMA, kept as a per-lane max; then
only the lanes that can hold the winner are scored exactly (IEEE division `div_rn`, the
accurate log `__nv_logf`) - see `_gumbel_core` for the bound and why the answer is the
exact scan's. EXACT=1 scores every id exactly (same outputs, ~4x the arithmetic). The
sampled loop is issue-bound, not bandwidth-bound: its instruction counts and the floor
they set are in docs/performance.md, section "The filtered Gumbel scan".
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import _common as C
from . import _controls_core as CC
from . import _gumbel_core as GC
from . import _threshold_core as TC
from . import _topp_core as TP
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
from ._gumbel_core import sampled_chunk_packed
from ._registers import matching_cap
from ._tuning import Tuning

NAME = "chain_verify"
MAXC = 4        # filtered scan: lanes scored exactly besides the top one, else rescan


class VerifyResult(NamedTuple):
    tokens: torch.Tensor        # int32 [B, K+1]: t[b, j] for j <= m[b], -1 after
    accept_len: torch.Tensor    # int32 [B]: m[b]
    bonus: torch.Tensor         # int32 [B]: t[b, m[b]]
    select_index: torch.Tensor  # int64 [B]: b*(K+1) + m[b]


# --- the semantics in plain torch ------------------------------------------------------
def accept(t: torch.Tensor, draft_tokens: torch.Tensor) -> VerifyResult:
    """The accept logic on target tokens t (int64 [B, K+1])."""
    B, K1 = t.shape
    K = K1 - 1
    match = draft_tokens.to(torch.int64) == t[:, :K]
    m = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)
    j = torch.arange(K1, device=t.device)
    tokens = torch.where(j[None, :] <= m[:, None], t, torch.full_like(t, -1))
    bonus = t.gather(1, m[:, None]).squeeze(1)
    select = torch.arange(B, device=t.device, dtype=torch.int64) * K1 + m
    return VerifyResult(tokens.to(torch.int32), m.to(torch.int32), bonus.to(torch.int32),
                        select)


def sampled_rows(temperature, B: int, K: int):
    """bool [B*(K+1)]: rows of sampled requests (temperature > 0; 0, negatives and NaN
    stay greedy)."""
    return (temperature.to(torch.float32) > 0).repeat_interleave(K + 1)


def row_scores(logits: torch.Tensor, B: int, K: int, temperature, seeds, positions):
    """The sampled scores s of every row, float32 [B*(K+1), V] (meaningful on sampled
    rows): row b*(K+1)+j uses temperature[b], seeds[b] and counter positions[b] + j."""
    V = logits.shape[-1]
    x = logits.reshape(B * (K + 1), V)
    j = torch.arange(K + 1, device=x.device, dtype=torch.int64)
    ctr = (positions.to(torch.int64)[:, None] + j[None, :]).reshape(-1)
    rep = lambda t: t.repeat_interleave(K + 1)  # noqa: E731
    return GC.scores(x, rep(temperature.to(torch.float32)), rep(seeds.to(torch.int64)), ctr)


def target_tokens(logits: torch.Tensor, B: int, K: int, temperature=None, seeds=None,
                  positions=None, top_k=None, top_p=None, min_p=None) -> torch.Tensor:
    """t[b, j] (int64 [B, K+1]): the argmax of each greedy row, the argmax of the
    sampled scores (`row_scores`) of each sampled row, over the kept set of the
    sampling controls (`_controls_core.kept`) where a control of the request is on."""
    V = logits.shape[-1]
    x = logits.reshape(B * (K + 1), V)
    t = torch.argmax(x, dim=-1)
    if temperature is not None and B > 0:
        s = row_scores(logits, B, K, temperature, seeds, positions)
        ts = torch.argmax(s, dim=-1)
        if any(c is not None for c in (top_k, top_p, min_p)):
            rep = lambda c: None if c is None else c.repeat_interleave(K + 1)  # noqa: E731
            ctl = CC.controls_on(top_k, top_p, min_p, V, B, x.device).repeat_interleave(K + 1)
            T = temperature.to(torch.float32).repeat_interleave(K + 1)[:, None]
            z = x.to(torch.float32) / T
            S = CC.kept(z, rep(top_k), rep(top_p), rep(min_p))
            ts = torch.where(ctl, CC.masked_argmax(s, S), ts)
        t = torch.where(sampled_rows(temperature, B, K), ts, t)
    return t.view(B, K + 1)


def reference(logits: torch.Tensor, draft_tokens: torch.Tensor,
              temperature: torch.Tensor | None = None, seeds: torch.Tensor | None = None,
              positions: torch.Tensor | None = None, top_k: torch.Tensor | None = None,
              top_p: torch.Tensor | None = None,
              min_p: torch.Tensor | None = None) -> VerifyResult:
    B, K = draft_tokens.shape
    return accept(target_tokens(logits, B, K, temperature, seeds, positions, top_k, top_p,
                                min_p), draft_tokens)


# --- kernels ---------------------------------------------------------------------------
@triton.jit
def write_accept(t, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr, b, K,
                 KP1: tl.constexpr, FILL: tl.constexpr = -1):
    """The accept logic of request b on its target tokens `t` (int32 [KP1], entries past
    K unused) and drafts `d` (int64 [KP1]): write tokens (FILL after m), accept_len,
    bonus and select_index; return m. A draft outside [0, V) never equals a target token
    (compared in int64)."""
    j = tl.arange(0, KP1)
    row0 = b.to(tl.int64) * (K + 1)
    miss = (j < K) & (d != t.to(tl.int64))
    m = tl.min(tl.where(miss, j, K), 0)
    tl.store(tokens_ptr + row0 + j, tl.where(j <= m, t, FILL), mask=j <= K)
    tl.store(accept_ptr + b, m.to(tl.int32))
    tl.store(bonus_ptr + b, tl.sum(tl.where(j == m, t, 0), 0).to(tl.int32))
    tl.store(select_ptr + b, row0 + m)
    return m


@triton.jit
def _verify_finalize(acc_ptr, cnt_ptr, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr,
                     b, K, KP1: tl.constexpr, seq, sg_draft_ptr, sg_index_ptr, sg_lens_ptr,
                     sg_seq_ptr, SGLANG: tl.constexpr):
    """The last program of request b: read its K+1 argmaxes, accept against the drafts
    `d` (int64 [KP1], loaded up front), write, reset. SGLANG: write SGLang's layout
    instead of `tokens` (see `launch_verify`); `seq` is seq_lens[b], loaded up front."""
    j = tl.arange(0, KP1)
    in_row = j <= K
    row0 = b.to(tl.int64) * (K + 1)
    packed = tl.atomic_xchg(acc_ptr + row0 + j, tl.full([KP1], PACKED_EMPTY, tl.int64),
                            sem="relaxed",
                            mask=in_row)
    t = unpack_index(packed)
    if SGLANG:
        m = write_accept(t, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr, b, K, KP1, 0)
        keep = j <= m
        tl.store(sg_draft_ptr + row0 + j, tl.where(keep, t, 0).to(tl.int64), mask=in_row)
        tl.store(sg_index_ptr + row0 + j, tl.where(keep, row0 + j, -1).to(tl.int32),
                 mask=in_row)
        tl.store(sg_lens_ptr + b, m + 1)
        tl.store(sg_seq_ptr + b, seq + (m + 1).to(seq.dtype))
    else:
        write_accept(t, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr, b, K, KP1)
    tl.store(cnt_ptr + b, 0)


@triton.jit
def _verify_kernel(logits_ptr, draft_ptr, tokens_ptr, accept_ptr, bonus_ptr, select_ptr,
                   acc_ptr, cnt_ptr, temp_ptr, seed_ptr, pos_ptr, V, K, stride_b, stride_j,
                   stride_db, stride_dk, stride_t, stride_s, stride_p, n_split, tiles_per,
                   seq_ptr, stride_seq, sg_draft_ptr, sg_index_ptr, sg_lens_ptr, sg_seq_ptr,
                   BLOCK_V: tl.constexpr, KP1: tl.constexpr, UNROLL: tl.constexpr,
                   VEC: tl.constexpr, SAMPLED: tl.constexpr, EXACT: tl.constexpr,
                   MAXC: tl.constexpr, PDL: tl.constexpr, SGLANG: tl.constexpr):
    C.pdl_enter(PDL)
    pid = tl.program_id(0)
    per_req = (K + 1) * n_split
    b = pid // per_req
    rem = pid - b * per_req
    j = rem // n_split
    lo = (rem - j * n_split) * tiles_per * BLOCK_V
    hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
    row_ptr = logits_ptr + b.to(tl.int64) * stride_b + j.to(tl.int64) * stride_j
    # the drafts are loaded before the scan (a few L2 hits per program), so the last
    # program's accept step waits on no memory but the stage-2 slots
    jd = tl.arange(0, KP1)
    d = tl.load(draft_ptr + b.to(tl.int64) * stride_db + jd * stride_dk, mask=jd < K,
                other=-1).to(tl.int64)
    seq = 0
    if SGLANG:    # seq_lens[b], for the finisher's new_seq_lens (also off its path)
        seq = tl.load(seq_ptr + b.to(tl.int64) * stride_seq)
    if SAMPLED:
        # per request: temperature > 0 samples (0, negatives and NaN stay greedy)
        T = tl.load(temp_ptr + b.to(tl.int64) * stride_t).to(tl.float32)
        if T > 0:
            seed = tl.load(seed_ptr + b.to(tl.int64) * stride_s).to(tl.int64)
            pos = tl.load(pos_ptr + b.to(tl.int64) * stride_p).to(tl.int64)
            ctr = (pos + j).to(tl.uint32)          # Philox counter word 1: low 32 bits
            packed = sampled_chunk_packed(row_ptr, lo, hi, tiles_per, T, seed, ctr,
                                          BLOCK_V, EXACT, MAXC, UNROLL == 2)
        else:
            packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC)
    else:
        packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC)
    C.pdl_release(PDL)
    row = b.to(tl.int64) * (K + 1) + j
    arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + b)
    if arrived == per_req - 1:
        _verify_finalize(acc_ptr, cnt_ptr, d, tokens_ptr, accept_ptr, bonus_ptr, select_ptr,
                         b, K, KP1, seq, sg_draft_ptr, sg_index_ptr, sg_lens_ptr, sg_seq_ptr,
                         SGLANG)


@triton.jit
def _controls_verify_kernel(logits_ptr, draft_ptr, tokens_ptr, accept_ptr, bonus_ptr,
                            select_ptr, acc_ptr, cnt_ptr, thr_ptr, cand_ptr, comp_ptr,
                            rcnt_ptr, st_ptr, temp_ptr, seed_ptr, pos_ptr, topk_ptr, topp_ptr,
                            minp_ptr, V, K, stride_b, stride_j, stride_db, stride_dk,
                            stride_t, stride_s, stride_p, stride_k, stride_tp, stride_mp,
                            n_split, tiles_per, t_split, t_tiles, IDB, seq_ptr, stride_seq,
                            sg_draft_ptr, sg_index_ptr, sg_lens_ptr, sg_seq_ptr,
                            BLOCK_V: tl.constexpr, KP1: tl.constexpr, UNROLL: tl.constexpr,
                            VEC: tl.constexpr, EXACT: tl.constexpr, MAXC: tl.constexpr,
                            HAS_K: tl.constexpr, HAS_P: tl.constexpr, HAS_M: tl.constexpr,
                            CAPK: tl.constexpr, SUBN: tl.constexpr, NCN: tl.constexpr,
                            MN: tl.constexpr, SEL_BLOCK: tl.constexpr,
                            PHASES: tl.constexpr, PCHECK: tl.constexpr,
                            TBLOCKS: tl.constexpr, LB: tl.constexpr,
                            SGLANG: tl.constexpr):
    """`_verify_kernel` with the sampling controls, one launch: TBLOCKS * R * t_split
    threshold programs (blocks of R * t_split, chunks of t_tiles tiles: phase 0, with
    PCHECK the two blocks of the candidate check, then PHASES search blocks), then
    R * n_split scan programs (chunks of tiles_per tiles). Each row's request falls in
    one of four paths:

    * candidate (sampled, top_k on and at most CAPK): each scan program puts its
      chunk's CAPK largest pk (`_controls_core.chunk_top_packed`) in cand; the row's
      last program (row counter rcnt) applies the controls to the row's CAPK largest
      and samples among the kept ids (`candidates_packed`);
    * check (sampled, top_p on and top_k off, PCHECK): after phase 0, the candidate
      check (`_threshold_core.best_program` / `check_program`, chunk lists in cand)
      publishes the token into the row's slot and P = SKIP, whereupon the row's scan
      programs only count in; where no candidate is kept, it goes on as a threshold row;
    * threshold (sampled, another control on): the row's phase-0 programs find its
      pk range (`pk_range`, folded in scratch), the last of them (row counter rcnt)
      applies min_p and opens the search of P (`_threshold_core`), which the row's
      programs of phases 1 .. PHASES carry on; P lands in thr[row]. The row's scan
      programs wait for it (they come later in launch order, so those they wait on are
      running or done: the interpreter runs programs in order) and sample over pk >= P
      (exact scores);
    * plain (greedy, or every control off): scanned exactly as without controls.

    The finishing program of a request puts its thresholds back to rest. SGLANG: the
    finish writes SGLang's layout as `_verify_kernel`'s does."""
    pid = tl.program_id(0)
    R = tl.num_programs(0) // (TBLOCKS * t_split + n_split)
    if pid < TBLOCKS * R * t_split:
        f = pid // (R * t_split)
        pid = pid - f * R * t_split
        r = pid // t_split
        b64 = (r // (K + 1)).to(tl.int64)
        T = tl.load(temp_ptr + b64 * stride_t).to(tl.float32)
        k, p, mp, on = CC.load_controls(topk_ptr, topp_ptr, minp_ptr, b64, stride_k,
                                        stride_tp, stride_mp, V, True, HAS_K, HAS_P, HAS_M)
        if (T > 0) & on & ~CC.small_k(k, V, CAPK):
            chunk = pid - r * t_split
            j = r - b64 * (K + 1)
            row_ptr = logits_ptr + b64 * stride_b + j * stride_j
            lo = chunk * t_tiles * BLOCK_V
            hi = tl.minimum(lo + t_tiles * BLOCK_V, V)
            st = st_ptr + r.to(tl.int64) * TC.ROW
            seed = tl.load(seed_ptr + b64 * stride_s).to(tl.int64)
            ctr = (tl.load(pos_ptr + b64 * stride_p).to(tl.int64) + j).to(tl.uint32)
            TC.threshold_program(f, st, thr_ptr + r, rcnt_ptr + r, acc_ptr + 2 * R + r,
                                 acc_ptr + 3 * R + r, row_ptr, lo, hi, V, T, k, p, mp, IDB,
                                 t_split, acc_ptr + r, cand_ptr + r * n_split * CAPK, chunk,
                                 2 * t_tiles, seed, ctr, PHASES, LB, SEL_BLOCK, PCHECK,
                                 BLOCK_V // 2)
    else:
        pid = pid - TBLOCKS * R * t_split
        per_req = (K + 1) * n_split
        b = pid // per_req
        rem = pid - b * per_req
        j = rem // n_split
        chunk = rem - j * n_split
        lo = chunk * tiles_per * BLOCK_V
        hi = tl.minimum(lo + tiles_per * BLOCK_V, V)
        b64 = b.to(tl.int64)
        row_ptr = logits_ptr + b64 * stride_b + j.to(tl.int64) * stride_j
        jd = tl.arange(0, KP1)
        d = tl.load(draft_ptr + b64 * stride_db + jd * stride_dk, mask=jd < K,
                    other=-1).to(tl.int64)
        row = b64 * (K + 1) + j
        seq = 0
        if SGLANG:
            seq = tl.load(seq_ptr + b64 * stride_seq)
        T = tl.load(temp_ptr + b64 * stride_t).to(tl.float32)
        k, p, mp, on = CC.load_controls(topk_ptr, topp_ptr, minp_ptr, b64, stride_k,
                                        stride_tp, stride_mp, V, True, HAS_K, HAS_P, HAS_M)
        small = (T > 0) & CC.small_k(k, V, CAPK)
        if small:
            slot = row * n_split + chunk
            top = CC.chunk_top_packed(row_ptr, lo, hi, T, IDB, comp_ptr + slot * NCN, CAPK,
                                      SUBN, NCN)
            tl.store(cand_ptr + slot * CAPK + tl.arange(0, CAPK), top)
            tl.debug_barrier()             # every thread's stores before the release
            if tl.atomic_add(rcnt_ptr + row, 1, sem="acq_rel") == n_split - 1:
                seed = tl.load(seed_ptr + b64 * stride_s).to(tl.int64)
                pos = tl.load(pos_ptr + b64 * stride_p).to(tl.int64)
                packed = CC.candidates_packed(cand_ptr + row * n_split * CAPK, n_split,
                                              row_ptr, T, seed, (pos + j).to(tl.uint32), k,
                                              p, mp, IDB, comp_ptr + row * n_split * NCN,
                                              HAS_P, HAS_M, CAPK, MN)
                tl.store(rcnt_ptr + row, 0)
                if publish_packed(packed, acc_ptr + row, cnt_ptr + b) == K:
                    _verify_finalize(acc_ptr, cnt_ptr, d, tokens_ptr, accept_ptr, bonus_ptr,
                                     select_ptr, b, K, KP1, seq, sg_draft_ptr, sg_index_ptr,
                                     sg_lens_ptr, sg_seq_ptr, SGLANG)
        else:
            if T > 0:
                seed = tl.load(seed_ptr + b64 * stride_s).to(tl.int64)
                pos = tl.load(pos_ptr + b64 * stride_p).to(tl.int64)
                ctr = (pos + j).to(tl.uint32)
                if on:
                    # wait for the row's threshold program (never PACKED_EMPTY once set)
                    P = tl.atomic_max(thr_ptr + row, PACKED_EMPTY, sem="acquire")
                    while P == PACKED_EMPTY:
                        P = tl.atomic_max(thr_ptr + row, PACKED_EMPTY, sem="acquire")
                    if P >= TC.SKIP:           # the candidate check published the token
                        packed = tl.full([], PACKED_EMPTY, tl.int64)
                    elif EXACT:
                        packed = CC.restricted_chunk_packed(row_ptr, lo, hi, tiles_per, T,
                                                            seed, ctr, P, IDB, BLOCK_V)
                    else:
                        # in half tiles: the pk and the bound need more registers an
                        # id than the plain scan, whose occupancy they would set
                        packed = CC.restricted_filtered_packed(row_ptr, lo, hi, 2 * tiles_per,
                                                               T, seed, ctr, P, IDB,
                                                               BLOCK_V // 2, MAXC)
                else:
                    packed = sampled_chunk_packed(row_ptr, lo, hi, tiles_per, T, seed, ctr,
                                                  BLOCK_V, EXACT, MAXC, UNROLL == 2)
            else:
                packed = chunk_argmax_packed(row_ptr, lo, hi, tiles_per, BLOCK_V, UNROLL, VEC)
            arrived = publish_packed(packed, acc_ptr + row, cnt_ptr + b)
            if arrived == per_req - 1:
                _verify_finalize(acc_ptr, cnt_ptr, d, tokens_ptr, accept_ptr, bonus_ptr,
                                 select_ptr, b, K, KP1, seq, sg_draft_ptr, sg_index_ptr,
                                 sg_lens_ptr, sg_seq_ptr, SGLANG)
                tl.store(thr_ptr + b64 * (K + 1) + jd, PACKED_EMPTY, mask=jd <= K)


# --- search space and heuristic ----------------------------------------------------------
# The split-argmax space, plus EXACT for sampled rows: 0 = the filtered scan (exact
# fallback), 1 = the exact scan only. (For sampled rows UNROLL=2 means: prefetch the next
# tile during this tile's arithmetic.) Same outputs; EXACT=1 is ~4x the arithmetic, so the
# constraint keeps the tuner off it: it is there for explicit `config={"EXACT": 1}`
# (A/B runs, tests, and a switch should the filtered scan ever need turning off).
SPACE = {**SPLIT_SPACE, "EXACT": (0, 1)}


def constraint(config: dict, key: dict) -> bool:
    """The tuner's prune. Performance only (register pressure, repeats of one launch, the
    exact scan kept out of the search): every config of SPACE gives the same bits, so an
    explicit config need only be in SPACE."""
    if not split_constraint(config, key["V"]) or config.get("EXACT", 0) != 0:
        return False
    if key.get("mode", "greedy") == "greedy":
        return True
    # sampled (with or without controls): at most 32 ids per thread (registers)
    return config["BLOCK_V"] <= 32 * 32 * config["num_warps"]


def heuristic(key: dict, device: torch.device) -> dict:
    rows = key["B"] * (key["K"] + 1)
    if key.get("mode", "greedy") == "greedy":
        return {**split_heuristic(key["dtype"], key["V"], rows, C.sm_count(device)),
                "EXACT": 0}
    return sampled_heuristic(key["V"], rows, C.sm_count(device))


def sampled_heuristic(V: int, rows: int, sms: int) -> dict:
    """The config for `rows` sampled rows of V ids. Sampled rows are issue-bound (~23
    instructions an id), so what matters is how many programs share each SM's issue
    slots and how evenly the last ones end. Below 8 rows (and up to 16 below V=65536):
    2048-id tiles on 4 warps, the next tile's loads issued before this tile's arithmetic
    (UNROLL=2), ~16 chunks an SM. Beyond those, one tile a step (UNROLL=1) and fewer,
    longer programs: below V=65536 1024-id tiles on 4 warps, about 4 programs an SM;
    from V=65536 2048-id tiles on 8 warps, about 2 programs an SM up to 64 rows, then
    4 programs a row up to 8 an SM. SPLIT is the nearest power of two. Measured basis:
    docs/performance.md, section "The filtered Gumbel scan"."""
    if rows < 8 or (V < 65536 and rows <= 16):
        block, warps, unroll = 2048, 4, 2
        split = C.next_pow2(C.cdiv(16 * sms, rows))
    else:
        if V < 65536:
            block, warps, programs = 1024, 4, 4 * sms
        else:
            block, warps = 2048, 8
            programs = 2 * sms if rows <= 64 else min(8 * sms, 4 * rows)
        unroll = 1
        split = C.nearest_pow2(programs / rows)
    split = min(split, 128, C.next_pow2(C.cdiv(V, block)))
    return {"BLOCK_V": block, "SPLIT": split, "num_warps": warps, "num_stages": 1,
            "UNROLL": unroll, "EXACT": 0}


def tune_key(dtype: torch.dtype, V: int, B: int, K: int, sampled: bool = False,
             controls: bool = False) -> dict:
    """The dispatch key. Mode "controls": sampled with the sampling controls passed
    (`launch_controls`, a kernel of its own cost; its heuristic is the sampled one)."""
    mode = ("controls" if controls else "sampled") if sampled else "greedy"
    return {"dtype": C._dtype_name(dtype), "mode": mode, "V": int(V), "B": int(B),
            "K": int(K)}


# --- launcher --------------------------------------------------------------------------
_OUT_NAMES = tuple(f"out.{f}" for f in VerifyResult._fields)


def validate(logits, draft_tokens, out, name="logits"):
    """Host-side checks of the arguments (`name`: what the caller calls the logits);
    returns (B, K, V, stride_b, stride_j, out), out allocated when None. Devices are
    checked against the logits' (the first tensor argument), naming the one that differs."""
    C.check_tensor(name, logits, dtypes=C.FLOAT_DTYPES, ndim=(2, 3))
    device = logits.device
    C.check_tensor("draft_tokens", draft_tokens, dtypes=C.INDEX_DTYPES, ndim=2,
                   device=device)
    C.check_runnable(name, logits)       # after the device checks: mixed devices
    C.check_logits_rows(name, logits)
    B, K = draft_tokens.shape
    check_draft_width("draft_tokens", draft_tokens)
    V = logits.shape[-1]
    if logits.dim() == 2:
        if logits.shape[0] != B * (K + 1):
            raise ValueError(f"{name}: expected {B * (K + 1)} rows (B*(K+1) with B={B}, "
                             f"K={K} from draft_tokens), got shape {tuple(logits.shape)}")
        stride_b, stride_j = (K + 1) * logits.stride(0), logits.stride(0)
    else:
        if tuple(logits.shape[:2]) != (B, K + 1):
            raise ValueError(f"{name}: expected shape ({B}, {K + 1}, V) from draft_tokens "
                             f"[B={B}, K={K}], got {tuple(logits.shape)}")
        stride_b, stride_j = logits.stride(0), logits.stride(1)
    return B, K, V, stride_b, stride_j, validate_out(out, B, K, device)


def check_draft_width(name: str, drafts: torch.Tensor, tokens: int | None = None) -> None:
    """A request's K drafts: K + 1 tokens (`tokens`, when the caller counts them
    otherwise) are one block of the finishing program (`KP1`), at most Triton's largest
    block."""
    n = drafts.shape[1] + 1 if tokens is None else tokens
    if n > C.MAX_BLOCK:
        raise ValueError(f"{name}: expected K + 1 <= {C.MAX_BLOCK} tokens a request (one "
                         f"Triton block of the finishing program), got shape "
                         f"{tuple(drafts.shape)}")


def validate_out(out, B: int, K: int, device: torch.device) -> VerifyResult:
    """`out=`: a VerifyResult of buffers of the right shapes and dtypes on `device`, or
    None (then allocated)."""
    if out is None:
        return VerifyResult(
            torch.empty((B, K + 1), dtype=torch.int32, device=device),
            torch.empty((B,), dtype=torch.int32, device=device),
            torch.empty((B,), dtype=torch.int32, device=device),
            torch.empty((B,), dtype=torch.int64, device=device))
    if not isinstance(out, tuple) or len(out) != 4:
        raise TypeError("out: expected a VerifyResult (tokens, accept_len, bonus, "
                        f"select_index) of tensors, got {type(out).__name__}")
    out = VerifyResult(*out)
    C.check_out("out.tokens", out.tokens, (B, K + 1), torch.int32, device)
    C.check_out("out.accept_len", out.accept_len, (B,), torch.int32, device)
    C.check_out("out.bonus", out.bonus, (B,), torch.int32, device)
    C.check_out("out.select_index", out.select_index, (B,), torch.int64, device)
    return out


def check_out_overlap(out: VerifyResult, logits, draft_tokens, sampling) -> None:
    """out= buffers share no memory with the inputs or with each other (storage ranges
    only: no value is read)."""
    reads = [("logits", logits), ("draft_tokens", draft_tokens)]
    if sampling is not None:
        reads += zip(("temperature", "seeds", "positions"), sampling, strict=True)
    C.check_no_overlap(zip(_OUT_NAMES, out, strict=True), reads)


SAMPLING_NAMES = ("temperature", "seeds", "positions")


def validate_sampling(temperature, seeds, positions, B, device, names=SAMPLING_NAMES):
    """Per-request sampling inputs: temperature float [B], seeds and positions integer
    [B], any stride, on `device` (values are not read). Returns (temperature, seeds,
    positions), or None without temperature; seeds/positions alone are a mistake (they
    only feed sampled rows), not something to drop. `names`: what the caller calls the
    three arguments (an adapter's own names), for the errors."""
    tn, sn, pn = names
    if temperature is None:
        for name, t in ((sn, seeds), (pn, positions)):
            if t is not None:
                raise ValueError(f"{name}: expected None without {tn} ({sn} and {pn} only "
                                 f"feed sampled rows), got {name} without {tn}")
        return None
    C.check_tensor(tn, temperature, dtypes=C.FLOAT_DTYPES, ndim=1, device=device)
    if temperature.shape[0] != B:
        raise ValueError(f"{tn}: expected shape ({B},) (one per request), got "
                         f"{tuple(temperature.shape)}")
    for name, t, what in ((sn, seeds, "per-request Philox seeds"),
                          (pn, positions, "absolute position of input 0")):
        if t is None:
            raise ValueError(f"{name}: required when {tn} is given (int64 [{B}], "
                             f"{what}), got None")
        C.check_tensor(name, t, dtypes=C.INDEX_DTYPES, ndim=1, device=device)
        if t.shape[0] != B:
            raise ValueError(f"{name}: expected shape ({B},) (one per request), got "
                             f"{tuple(t.shape)}")
    return temperature, seeds, positions


def sampling_args(sampling, like):
    """The kernel arguments of `validate_sampling`'s result: (temperature, seeds,
    positions, their three strides); without sampling `like` three times (never read:
    SAMPLED=False) and zero strides."""
    if sampling is None:
        return like, like, like, 0, 0, 0
    temp, seeds, pos = sampling
    return temp, seeds, pos, temp.stride(0), seeds.stride(0), pos.stride(0)


def sglang_args(sglang, like) -> tuple:
    """The kernel arguments of `launch_verify`'s `sglang` tensors: (seq_lens, its stride,
    draft_tokens, accept_index, accept_lens, new_seq_lens); without them `like` (never
    read: SGLANG=False) and a zero stride."""
    if sglang is None:
        return like, 0, like, like, like, like
    seq, sg_draft, sg_index, sg_lens, sg_seq = sglang
    return seq, seq.stride(0), sg_draft, sg_index, sg_lens, sg_seq


def launch_verify(logits: torch.Tensor, draft_tokens: torch.Tensor, out: VerifyResult,
                  cfg: dict, B: int, K: int, V: int, stride_b: int, stride_j: int,
                  sampling: tuple | None = None, sglang: tuple | None = None) -> None:
    """Launch on validated tensors (B >= 1). `sampling`: (temperature, seeds, positions)
    or None (greedy). `sglang`: None, or the tensors of SGLang's layout of the same
    answer, written by the finishing programs in the same launch (`recipes.compat.sglang`):
    (seq_lens [B] int32/int64 any stride, draft_tokens int64 [B*(K+1)], accept_index
    int32 [B*(K+1)], accept_lens int32 [B], new_seq_lens [B] in seq_lens' dtype). Then
    out.tokens receives SGLang's `predict` (0 instead of -1 after m) and the three
    [B] fields of `out` are num_correct_drafts, bonus_tokens and select_index."""
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    acc, cnt = C.WORKSPACE.get(logits.device, B * (K + 1), B)
    temp, seeds, pos, st, ss, sp = sampling_args(sampling, logits)
    seq, stride_seq, sg_draft, sg_index, sg_lens, sg_seq = sglang_args(sglang, logits)
    pdl = C.pdl(logits.device, B * (K + 1) * split)
    args = (logits, draft_tokens, out.tokens, out.accept_len, out.bonus, out.select_index,
            acc, cnt, temp, seeds, pos, V, K, stride_b, stride_j, draft_tokens.stride(0),
            draft_tokens.stride(1), st, ss, sp, split, tiles_per,
            seq, stride_seq, sg_draft, sg_index, sg_lens, sg_seq)
    meta = dict(BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"], KP1=C.next_pow2(K + 1),
                VEC=lane_vec(logits.element_size(), cfg["BLOCK_V"], cfg["num_warps"]),
                SAMPLED=sampling is not None, EXACT=cfg.get("EXACT", 0), MAXC=MAXC,
                PDL=pdl, SGLANG=sglang is not None, num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"], launch_pdl=pdl > 0)
    if sglang is not None:
        # SGLang's epilogue gets the plain kernel's registers, so a config keeps the
        # plain kernel's programs an SM (`_registers`); the adapter's own table
        # (`sglang_target_verify`) is timed with this cap
        cap = matching_cap(_verify_kernel, args, meta, {"SGLANG": False}, logits.device)
        if cap is not None:
            meta["maxnreg"] = cap
    _verify_kernel[(B * (K + 1) * split,)](*args, **meta)


def resolve_config(config: dict | None, key: dict, device: torch.device,
                   tables: bool = True) -> dict:
    return C.resolve_config(TUNING, config, key, device, tables)


CONTROL_NAMES = ("top_k", "top_p", "min_p")


def validate_controls(top_k, top_p, min_p, sampling, B: int, device, names=CONTROL_NAMES,
                      temperature_name: str = "temperature"):
    """The sampling controls: top_k int32/int64 [B], top_p and min_p float32 [B], any
    stride, on `device`, only with temperature (values are not read). Returns
    (top_k, top_p, min_p) or None when none is given. `names`, `temperature_name`: what
    the caller calls them, for the errors."""
    given = [(n, t) for n, t in zip(names, (top_k, top_p, min_p), strict=True)
             if t is not None]
    if not given:
        return None
    if sampling is None:
        raise ValueError(f"{given[0][0]}: expected None without {temperature_name} (the "
                         f"sampling controls only apply to sampled rows), got {given[0][0]} "
                         f"without {temperature_name}")
    for name, t in given:
        dtypes = C.INDEX_DTYPES if name == names[0] else (torch.float32,)
        C.check_tensor(name, t, dtypes=dtypes, ndim=1, device=device)
        if t.shape[0] != B:
            raise ValueError(f"{name}: expected shape ({B},) (one per request), got "
                             f"{tuple(t.shape)}")
    return top_k, top_p, min_p


def threshold_plan(V: int, block: int, split: int, tiles_per: int, R: int, sms: int):
    """(chunks a row, tiles a chunk) of the controls launch's threshold programs. Every
    block of them is R * chunks programs, and rows that need no threshold leave them
    idle, each still a program to schedule: where the scan's chunks fill more than
    4 programs an SM, the threshold programs take fewer, longer chunks, about one
    program an SM in each block (P does not depend on the chunks: integer sums)."""
    if R * split <= 4 * sms:
        return split, tiles_per
    return split_plan(V, block, C.cdiv(sms, R))


def launch_controls(logits, draft_tokens, out, cfg, B, K, V, stride_b, stride_j, sampling,
                    controls, sglang: tuple | None = None) -> None:
    """One launch of `_controls_verify_kernel`. Scratch in the split-reduction
    workspace, all resting at PACKED_EMPTY / 0: after the R row slots, R thresholds,
    R row maxima and R row minima (complemented), then with top_k or top_p CAP candidate
    slots a scan program (top_p's candidate check uses the first TP.C) and with top_k
    NC compaction slots; after the B request counters, R row counters. With top_k or
    top_p, the threshold search's row states (`_common.SEARCH`, resting at 0) and
    TC.NPH search phases; with top_p, the candidate check's two blocks. `sglang`:
    SGLang's layout of the answer, as in `launch_verify`."""
    split, tiles_per = split_plan(V, cfg["BLOCK_V"], cfg["SPLIT"])
    R = B * (K + 1)
    has_k, has_p = controls[0] is not None, controls[1] is not None
    n_cand = CC.CAP * R * split if has_k or has_p else 0
    acc, cnt = C.WORKSPACE.get(logits.device, 4 * R + n_cand + has_k * CC.NC * R * split,
                               B + R)
    thr = acc[R:2 * R]
    cand = acc[4 * R:4 * R + n_cand]
    comp = acc[4 * R + n_cand:]
    phases = TC.NPH if has_k or has_p else 0
    blocks = 1 + phases + 2 * has_p
    t_split, t_tiles = threshold_plan(V, cfg["BLOCK_V"], split, tiles_per, R,
                                      C.sm_count(logits.device))
    search = C.SEARCH.get(logits.device, TC.state_size(R, phases), 1)[0] if phases else acc
    temp, seeds, pos, st, ss, sp = sampling_args(sampling, logits)
    ts, strides, flags = CC.control_args(controls, temp)
    _controls_verify_kernel[((blocks * t_split + split) * R,)](
        logits, draft_tokens, out.tokens, out.accept_len, out.bonus, out.select_index,
        acc, cnt, thr, cand, comp, cnt[B:], search, temp, seeds, pos, *ts, V, K, stride_b,
        stride_j, draft_tokens.stride(0), draft_tokens.stride(1), st, ss, sp, *strides, split,
        tiles_per, t_split, t_tiles, CC.id_bits(V), *sglang_args(sglang, logits),
        BLOCK_V=cfg["BLOCK_V"], UNROLL=cfg["UNROLL"], KP1=C.next_pow2(K + 1),
        VEC=lane_vec(logits.element_size(), cfg["BLOCK_V"], cfg["num_warps"]),
        EXACT=cfg.get("EXACT", 0), MAXC=MAXC, **flags, CAPK=CC.CAP,
        SUBN=min(CC.SUB, cfg["BLOCK_V"]), NCN=CC.NC, MN=CC.MN,
        SEL_BLOCK=256 * cfg["num_warps"], PHASES=phases, PCHECK=has_p, TBLOCKS=blocks,
        LB=32 * cfg["num_warps"], SGLANG=sglang is not None, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])


def chain_verify(logits: torch.Tensor, draft_tokens: torch.Tensor, *,
                 temperature: torch.Tensor | None = None, top_k: torch.Tensor | None = None,
                 top_p: torch.Tensor | None = None, min_p: torch.Tensor | None = None,
                 seeds: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                 out: VerifyResult | None = None, config: dict | None = None) -> VerifyResult:
    """Verify top-1 drafts against target logits in one launch; see the module doc.
    With `temperature` (float [B]), requests with temperature > 0 sample their target
    tokens (Gumbel-max on the Philox stream of `seeds`/`positions`, both integer [B]);
    the others stay greedy, in the same launch. `top_k`/`top_p`/`min_p` ([B], only with
    temperature): the sampling controls (`_controls_core`; one launch, see
    `launch_controls`)."""
    given = out is not None
    B, K, V, stride_b, stride_j, out = validate(logits, draft_tokens, out)
    sampling = validate_sampling(temperature, seeds, positions, B, logits.device)
    controls = validate_controls(top_k, top_p, min_p, sampling, B, logits.device)
    if given:
        check_out_overlap(out, logits, draft_tokens, sampling)
        if controls is not None:
            C.check_no_overlap(zip(_OUT_NAMES, out, strict=True),
                               [(n, t) for n, t in zip(CONTROL_NAMES, controls, strict=True)
                                if t is not None])
    if B == 0:
        return out
    cfg = resolve_config(config, tune_key(logits.dtype, V, B, K, sampling is not None,
                                          controls is not None), logits.device)
    if controls is not None:
        launch_controls(logits, draft_tokens, out, cfg, B, K, V, stride_b, stride_j,
                        sampling, controls)
    else:
        launch_verify(logits, draft_tokens, out, cfg, B, K, V, stride_b, stride_j, sampling)
    return out


chain_verify.reference = reference


# --- what dispatch knows (read by the autotuner too) ---------------------------------
TUNING = Tuning(
    name=NAME, space=SPACE, heuristic=heuristic, constraint=constraint,
    sources=(_verify_kernel, _verify_finalize, chunk_argmax_packed, publish_packed,
             launch_verify, GC, _controls_verify_kernel, launch_controls, CC, TC, TP))
