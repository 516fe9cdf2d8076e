"""SGLang's top-1 (chain) speculative helpers, on spec-cookbook's kernels.

The three functions below have the names, arguments and output tuples of SGLang's
EAGLE top-1 fast path (module `python/sglang/kernels/ops/speculative/topk1.py` of
sgl-project/sglang, the version read for this adapter; called from `eagle_worker_v2` and
`eagle_target_verify`), so an engine can switch by changing an import:

    # from sglang.kernels.ops.speculative.topk1 import (
    from recipes.compat.sglang import (
        draft_extend_topk1_postprocess, draft_topk1_postprocess,
        target_verify_topk1_postprocess, TargetVerifyTopk1Output)

What each returns (B requests, N = K+1 verify tokens per request, V vocabulary):

* `target_verify_topk1_postprocess(next_token_logits [B*N, V], candidates [B, N],
  retrieve_index [B, N], retrieve_next_token [B, N], seq_lens [B])` ->
  `TargetVerifyTopk1Output(predict, num_correct_drafts, accept_lens, accept_index,
  bonus_tokens, new_seq_lens, select_index, draft_tokens)`. `candidates[b, 0]` is the
  request's last committed token and `candidates[b, 1:]` its K drafts; with
  t[b, j] = argmax of logits row b*N + j and m[b] = the number of leading drafts equal to
  their target token (`recipes.chain_verify`):
    predict      int32 [B*N]  t[b, j] at b*N + j for j <= m[b], 0 after
    num_correct_drafts int32 [B]  m[b]
    accept_lens  int32 [B]    m[b] + 1
    accept_index int32 [B, N] b*N + j for j <= m[b], -1 after
    bonus_tokens int32 [B]    t[b, m[b]]
    new_seq_lens [B]          seq_lens + m + 1, in seq_lens' dtype
    select_index int64 [B]    b*N + m[b]
    draft_tokens int64 [B*N]  predict, widened (older SGLang called it draft_input_ids;
                              that name works as an alias attribute)
  Two launches: `chain_verify` (every row's argmax fused with the accept logic) and one
  small kernel that lays the results out as above.
* `draft_topk1_postprocess(next_token_logits [B, V], positions [B], draft_tokens=None,
  draft_token_column=0)` -> `(topk_p float32 [B, 1] all 1.0, topk_index int64 [B, 1])`;
  in place: `positions += 1`, `draft_tokens[:, draft_token_column] = topk_index[:, 0]`.
  Without `draft_tokens`, `draft_token_column` is not used (as in SGLang, whose EAGLE
  worker passes the step's column whether or not it materialises the chain). One
  launch (`draft_tail`).
* `draft_extend_topk1_postprocess(next_token_logits [R, V], row_indices int64 [B],
  hidden_states=None, dsa_topk_indices=None)` -> `(topk_p [B, 1], topk_index [B, 1],
  hidden_states[row_indices] or None, dsa_topk_indices[row_indices] or None)`: the
  selected rows are reduced in place (never copied out). One launch (`draft_tail`), plus
  one `relay_gather` launch when `dsa_topk_indices` is given.

Where the semantics differ from SGLang's (everything else is equal bit for bit):

* NaN. SGLang's reduction replaces NaN by -1e30 (in float32, inside its kernel; its
  engine also runs `sanitize_nan_logits`, `nan_to_num(nan=-1e30, posinf=1e30,
  neginf=-1e30)`, before verification when SGLANG_SANITIZE_NAN_LOGITS is on), so a NaN
  loses to any number above -1e30. Ours follows torch.argmax: NaN is larger than every
  number, the first NaN of a row wins. To reproduce SGLang's answer, sanitize first, in
  float32: `torch.where(x.isnan(), -1e30, x.float())` (in float16, -1e30 rounds to -inf,
  which can lose a tie that SGLang's -1e30 would win against -inf).
* Tree layout. SGLang's verifier walks `retrieve_next_token` from node 0 and reads
  `retrieve_index`; its top-1 path always builds the chain layout
  (`retrieve_index[b, j] = b*N + j`, `retrieve_next_token[b, j] = j + 1`, -1 for the last),
  which is what ours computes. Both tensors are checked for shape only and never read:
  another layout gives the chain's answer, not the walk's.
* Simulated acceptance (`num_simulated_accept_tokens > 0`, SGLang's benchmarking aid) is
  not modelled: it raises NotImplementedError.
* Validation raises ValueError/TypeError naming the argument (SGLang asserts); in-place
  buffers (`positions`, `draft_tokens`) that share memory with each other or with the
  logits raise ValueError (SGLang: unspecified results). Accepted
  beyond SGLang: CPU tensors under the Triton interpreter, int32 `candidates`, 3-D logits
  [B, N, V] for the verifier, negative `draft_token_column` (from the end), strided
  `seq_lens`/`positions`/`draft_tokens`. Narrower: `positions` must be int64.
* Out-of-range `row_indices` (SGLang: undefined) read the nearest valid row for the
  argmax and the hidden rows (`draft_tail` clamps) and zeros for the DSA rows
  (`relay_gather`); they never read out of bounds.
* `hidden_states` must be a float tensor (SGLang also copies integer rows); it may have
  more rows than the logits (only the first R are addressable), as in SGLang.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _common as C


class TargetVerifyTopk1Output(NamedTuple):
    predict: torch.Tensor             # int32 [B*N]
    num_correct_drafts: torch.Tensor  # int32 [B]
    accept_lens: torch.Tensor         # int32 [B]
    accept_index: torch.Tensor        # int32 [B, N]
    bonus_tokens: torch.Tensor        # int32 [B]
    new_seq_lens: torch.Tensor        # [B], seq_lens' dtype
    select_index: torch.Tensor        # int64 [B]
    draft_tokens: torch.Tensor        # int64 [B*N]

    @property
    def draft_input_ids(self) -> torch.Tensor:
        """The older SGLang name of `draft_tokens`."""
        return self.draft_tokens


# --- the layout kernel of the verifier -------------------------------------------------
@triton.jit
def _layout_kernel(tokens_ptr, m_ptr, seq_ptr, predict_ptr, draft_ptr, accept_index_ptr,
                   accept_lens_ptr, new_seq_ptr, B, N, stride_seq,
                   BLOCK_B: tl.constexpr, NP: tl.constexpr):
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    j = tl.arange(0, NP)
    in_b = b < B
    m = tl.load(m_ptr + b, mask=in_b, other=0)
    flat = b[:, None].to(tl.int64) * N + j[None, :]
    cell = in_b[:, None] & (j[None, :] < N)
    t = tl.load(tokens_ptr + flat, mask=cell, other=0)
    keep = j[None, :] <= m[:, None]
    pred = tl.where(keep, t, 0)
    tl.store(predict_ptr + flat, pred, mask=cell)
    tl.store(draft_ptr + flat, pred.to(tl.int64), mask=cell)
    tl.store(accept_index_ptr + flat, tl.where(keep, flat, -1).to(tl.int32), mask=cell)
    tl.store(accept_lens_ptr + b, m + 1, mask=in_b)
    seq = tl.load(seq_ptr + b.to(tl.int64) * stride_seq, mask=in_b, other=0)
    tl.store(new_seq_ptr + b, seq + (m + 1).to(seq.dtype), mask=in_b)


def _layout_block(B: int) -> int:
    return min(64, max(2, C.next_pow2(B)))      # (>= 2: no 1-wide aranges)


# --- validation ------------------------------------------------------------------------
def _check_verify_args(next_token_logits, candidates, retrieve_index, retrieve_next_token,
                       seq_lens):
    C.check_tensor("next_token_logits", next_token_logits, dtypes=C.FLOAT_DTYPES,
                   ndim=(2, 3))
    dev = next_token_logits.device
    C.check_tensor("candidates", candidates, dtypes=C.INDEX_DTYPES, ndim=2, device=dev)
    B, N = candidates.shape
    if N < 1:
        raise ValueError(f"candidates: expected [B, N] with N >= 1 (the committed token "
                         f"and N-1 drafts), got shape {tuple(candidates.shape)}")
    lead = tuple(next_token_logits.shape[:-1])
    if lead != (B * N,) and lead != (B, N):
        raise ValueError(f"next_token_logits: expected [B*N, V] = [{B * N}, V] (or "
                         f"[{B}, {N}, V]) from candidates [B={B}, N={N}], got shape "
                         f"{tuple(next_token_logits.shape)}")
    for name, t in (("retrieve_index", retrieve_index),
                    ("retrieve_next_token", retrieve_next_token)):
        C.check_tensor(name, t, dtypes=C.INDEX_DTYPES, device=dev)
        if tuple(t.shape) != (B, N):
            raise ValueError(f"{name}: expected shape ({B}, {N}) like candidates, got "
                             f"{tuple(t.shape)}")
    C.check_tensor("seq_lens", seq_lens, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    if seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens: expected shape ({B},), got {tuple(seq_lens.shape)}")
    return B, N


def target_verify_topk1_is_supported(next_token_logits: torch.Tensor,
                                     candidates: torch.Tensor,
                                     retrieve_index: torch.Tensor,
                                     retrieve_next_token: torch.Tensor,
                                     seq_lens: torch.Tensor) -> bool:
    """True when `target_verify_topk1_postprocess` accepts these tensors (shapes, dtypes,
    devices; values are never read). Unlike SGLang's, CPU tensors under the Triton
    interpreter are supported too."""
    try:
        _check_verify_args(next_token_logits, candidates, retrieve_index,
                           retrieve_next_token, seq_lens)
        C.check_runnable("next_token_logits", next_token_logits)
        C.check_logits_rows("next_token_logits", next_token_logits)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


# --- the three helpers -----------------------------------------------------------------
def target_verify_topk1_postprocess(next_token_logits: torch.Tensor,
                                    candidates: torch.Tensor,
                                    retrieve_index: torch.Tensor,
                                    retrieve_next_token: torch.Tensor,
                                    seq_lens: torch.Tensor, *,
                                    num_simulated_accept_tokens: int = 0,
                                    use_real_draft_tokens: bool = False
                                    ) -> TargetVerifyTopk1Output:
    """Greedy top-1 verification of B chains of N = K+1 tokens (see the module doc)."""
    from .. import chain_verify

    if num_simulated_accept_tokens or use_real_draft_tokens:
        raise NotImplementedError(
            "num_simulated_accept_tokens/use_real_draft_tokens: SGLang's simulated "
            "acceptance is not modelled by recipes.compat.sglang; got "
            f"num_simulated_accept_tokens={num_simulated_accept_tokens!r}, "
            f"use_real_draft_tokens={use_real_draft_tokens!r}")
    B, N = _check_verify_args(next_token_logits, candidates, retrieve_index,
                              retrieve_next_token, seq_lens)
    r = chain_verify(next_token_logits, candidates[:, 1:])
    dev = candidates.device
    out = TargetVerifyTopk1Output(
        predict=torch.empty((B * N,), dtype=torch.int32, device=dev),
        num_correct_drafts=r.accept_len,
        accept_lens=torch.empty((B,), dtype=torch.int32, device=dev),
        accept_index=torch.empty((B, N), dtype=torch.int32, device=dev),
        bonus_tokens=r.bonus,
        new_seq_lens=torch.empty((B,), dtype=seq_lens.dtype, device=dev),
        select_index=r.select_index,
        draft_tokens=torch.empty((B * N,), dtype=torch.int64, device=dev))
    if B == 0:
        return out
    block = _layout_block(B)
    _layout_kernel[(C.cdiv(B, block),)](
        r.tokens, r.accept_len, seq_lens, out.predict, out.draft_tokens, out.accept_index,
        out.accept_lens, out.new_seq_lens, B, N, seq_lens.stride(0),
        BLOCK_B=block, NP=max(2, C.next_pow2(N)), num_warps=1 if block * N <= 256 else 4)
    return out


def draft_topk1_postprocess(next_token_logits: torch.Tensor, positions: torch.Tensor,
                            draft_tokens: torch.Tensor | None = None,
                            draft_token_column: int = 0
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax of each draft row; `positions += 1`; optionally
    `draft_tokens[:, draft_token_column] = argmax` (the column is unused without
    draft_tokens, as in SGLang). Returns (topk_p float32 [B, 1] of ones, topk_index
    int64 [B, 1])."""
    from .. import draft_tail

    C.check_tensor("next_token_logits", next_token_logits, dtypes=C.FLOAT_DTYPES, ndim=2)
    if draft_tokens is None:
        r = draft_tail(next_token_logits, positions=positions)
    else:
        r = draft_tail(next_token_logits, positions=positions, draft_tokens=draft_tokens,
                       column=draft_token_column)
    return r.probs.unsqueeze(1), r.tokens.unsqueeze(1)


def draft_extend_topk1_postprocess(next_token_logits: torch.Tensor,
                                   row_indices: torch.Tensor,
                                   hidden_states: torch.Tensor | None = None,
                                   dsa_topk_indices: torch.Tensor | None = None
                                   ) -> tuple[torch.Tensor, torch.Tensor,
                                              torch.Tensor | None, torch.Tensor | None]:
    """Argmax of the selected rows `next_token_logits[row_indices]` (read in place) and the
    matching rows of `hidden_states` and `dsa_topk_indices`. Returns (topk_p [B, 1],
    topk_index [B, 1], selected hidden [B, H] or None, selected dsa [B, D] or None)."""
    from .. import draft_tail, relay_gather

    C.check_tensor("next_token_logits", next_token_logits, dtypes=C.FLOAT_DTYPES, ndim=2)
    dev = next_token_logits.device
    C.check_tensor("row_indices", row_indices, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    R = next_token_logits.shape[0]
    hidden = hidden_states
    if hidden is not None:
        C.check_tensor("hidden_states", hidden, ndim=2, device=dev)
        if hidden.shape[0] < R:
            raise ValueError(f"hidden_states: expected at least {R} rows (one per logits "
                             f"row), got shape {tuple(hidden.shape)}")
        hidden = hidden[:R]
    r = draft_tail(next_token_logits, rows=row_indices, hidden=hidden)
    dsa = None
    if dsa_topk_indices is not None:
        C.check_tensor("dsa_topk_indices", dsa_topk_indices, ndim=2, device=dev)
        if dsa_topk_indices.shape[0] < R:
            raise ValueError(f"dsa_topk_indices: expected at least {R} rows (one per logits "
                             f"row), got shape {tuple(dsa_topk_indices.shape)}")
        B = row_indices.shape[0]
        dsa = torch.empty((B, dsa_topk_indices.shape[1]), dtype=dsa_topk_indices.dtype,
                          device=row_indices.device)
        # only the first R rows are addressable, as for hidden_states: an index outside
        # [0, R) gathers zeros (relay_gather's rule), never a row past the logits
        relay_gather(row_indices, [(dsa_topk_indices[:R], dsa)])
    return r.probs.unsqueeze(1), r.tokens.unsqueeze(1), r.hidden, dsa


__all__ = ["TargetVerifyTopk1Output", "target_verify_topk1_postprocess",
           "target_verify_topk1_is_supported", "draft_topk1_postprocess",
           "draft_extend_topk1_postprocess"]
