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
  One launch: `chain_verify`'s kernel (every row's argmax fused with the accept logic)
  with its SGLang epilogue, so that the finishing program of each request writes every
  field above (`chain_verify.launch_verify`'s `sglang`).
* `target_verify_topk1_sample_postprocess(...)`: the same fields for a sampled batch,
  from the greedy verifier's arguments plus SGLang's temperatures, top_ks, top_ps and
  min_ps: the softmax, renormalisations and sampling kernel of SGLang's sampled verify
  as one call (its own doc: the switch, the differences, the stream's seeds).
* `draft_topk1_postprocess(next_token_logits [B, V], positions [B], draft_tokens=None,
  draft_token_column=0)` -> `(topk_p float32 [B, 1] all 1.0, topk_index int64 [B, 1])`;
  in place: `positions += 1`, `draft_tokens[:, draft_token_column] = topk_index[:, 0]`.
  Without `draft_tokens`, `draft_token_column` is not used (as in SGLang, whose EAGLE
  worker passes the step's column whether or not it materialises the chain). One
  launch (`draft_tail`).
* `draft_extend_topk1_postprocess(next_token_logits [R, V], row_indices int64 [B],
  hidden_states=None, dsa_topk_indices=None)` -> `(topk_p [B, 1], topk_index [B, 1],
  hidden_states[row_indices] or None, dsa_topk_indices[row_indices] or None)`: the
  selected rows are reduced in place (never copied out). One launch (`draft_tail`'s
  kernel; the DSA rows are moved by copy programs of the same launch,
  `draft_tail.launch_draft_tail`'s `gather`).

Beyond SGLang, each helper takes keyword-only `out=`, its output tuple of preallocated
tensors (a field may be None to have it allocated; with every field given a call
allocates nothing, e.g. inside a step graph; each one must have the field's exact shape
and dtype, be contiguous and on the inputs' device), and `config=`, a launch config of
the kernel it runs (`recipes.chain_verify` or `recipes.draft_tail`). None: for
target_verify the launch's own tuned table, `sglang_target_verify` (`TUNING` below:
chain_verify's space and heuristic, timed with SGLang's epilogue, which changes which
configs are fast), else chain_verify's heuristic; for draft_extend its own table too,
`sglang_draft_extend` (`EXTEND_TUNING`: draft_tail's space, heuristic and keys, timed on
this launch, which has no token map, positions or column; tuned on request, `make tune
TUNE_ARGS="--recipe sglang_draft_extend"`), else, and always with DSA rows, draft_tail's
heuristic; for draft_topk1 its own table, `sglang_draft_topk1` (`TOPK1_TUNING`: the
same, at H = 0, timed on this launch, which has no row indices, token map or hidden rows;
tuned on request too), else draft_tail's heuristic. Outputs never depend on the
config. The epilogue launch is held to the plain kernel's registers where that compiles
without spills (`recipes._registers`).

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
* Validation raises ValueError/TypeError naming the argument by SGLang's name (SGLang
  asserts); in-place buffers (`positions`, `draft_tokens`) that share memory with each
  other or with the logits, or are expanded (stride-0) or otherwise self-overlapping
  views, raise ValueError (SGLang: unspecified results). Accepted
  beyond SGLang: CPU tensors under the Triton interpreter, int32 `candidates`, 3-D logits
  [B, N, V] for the verifier, negative `draft_token_column` (from the end), strided
  `seq_lens`/`positions`/`draft_tokens`. Narrower: `positions` must be int64.
* Out-of-range `row_indices` (SGLang: undefined) read the nearest valid row for the
  argmax and the hidden rows (`draft_tail` clamps) and zeros for the DSA rows
  (`relay_gather`'s rule); they never read out of bounds.
* `hidden_states` must be a float tensor (SGLang also copies integer rows); it may have
  more rows than the logits (only the first R are addressable), as in SGLang.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _common as C
from .._registers import matching_cap, register_cap
from .._tuning import Tuning
from ..chain_verify import SPACE as VERIFY_SPACE
from ..chain_verify import TUNING as CHAIN_VERIFY_TUNING
from ..chain_verify import (
    VerifyResult,
    check_draft_width,
    launch_controls,
    launch_verify,
    validate_controls,
    validate_sampling,
)
from ..chain_verify import constraint as verify_constraint
from ..chain_verify import heuristic as verify_heuristic
from ..chain_verify import reference as verify_reference
from ..chain_verify import resolve_config as verify_resolve_config
from ..chain_verify import tune_key as verify_key
from ..draft_tail import COLUMN_DEFAULT, DraftTail, launch_draft_tail
from ..draft_tail import SPACE as TAIL_SPACE
from ..draft_tail import TUNING as DRAFT_TAIL_TUNING
from ..draft_tail import check_call as check_tail_call
from ..draft_tail import constraint as tail_constraint
from ..draft_tail import heuristic as tail_heuristic
from ..draft_tail import reference as tail_reference
from ..draft_tail import resolve_config as tail_resolve_config
from ..draft_tail import tune_key as tail_key
from ..relay import FIELD_DTYPES
from ..relay import reference_gather as relay_reference_gather


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


# --- validation ------------------------------------------------------------------------
def _check_verify_args(next_token_logits, candidates, retrieve_index, retrieve_next_token,
                       seq_lens):
    """(B, N, logits stride per request, logits stride per row)."""
    C.check_tensor("next_token_logits", next_token_logits, dtypes=C.FLOAT_DTYPES,
                   ndim=(2, 3))
    dev = next_token_logits.device
    C.check_tensor("candidates", candidates, dtypes=C.INDEX_DTYPES, ndim=2, device=dev)
    B, N = candidates.shape
    if N < 1:
        raise ValueError(f"candidates: expected [B, N] with N >= 1 (the committed token "
                         f"and N-1 drafts), got shape {tuple(candidates.shape)}")
    check_draft_width("candidates", candidates, N)
    lead = tuple(next_token_logits.shape[:-1])
    if lead != (B * N,) and lead != (B, N):
        raise ValueError(f"next_token_logits: expected [B*N, V] = [{B * N}, V] (or "
                         f"[{B}, {N}, V]) from candidates [B={B}, N={N}], got shape "
                         f"{tuple(next_token_logits.shape)}")
    C.check_runnable("next_token_logits", next_token_logits)
    C.check_logits_rows("next_token_logits", next_token_logits)
    for name, t in (("retrieve_index", retrieve_index),
                    ("retrieve_next_token", retrieve_next_token)):
        C.check_tensor(name, t, dtypes=C.INDEX_DTYPES, device=dev)
        if tuple(t.shape) != (B, N):
            raise ValueError(f"{name}: expected shape ({B}, {N}) like candidates, got "
                             f"{tuple(t.shape)}")
    C.check_tensor("seq_lens", seq_lens, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    if seq_lens.shape[0] != B:
        raise ValueError(f"seq_lens: expected shape ({B},), got {tuple(seq_lens.shape)}")
    x = next_token_logits
    if x.dim() == 2:
        return B, N, N * x.stride(0), x.stride(0)
    return B, N, x.stride(0), x.stride(1)


def _outputs(out, fields, device, what: str) -> list:
    """The output tensors of a helper: `fields` lists (name, shape, dtype) per output,
    or (name, None, why) for one that is None in this call. `out` None allocates every
    field; else a tuple of len(fields) entries, each a tensor of the field's exact shape
    and dtype (contiguous, on `device`) or None (allocated)."""
    names = ", ".join(f[0] for f in fields)
    if out is None:
        out = (None,) * len(fields)
    elif not isinstance(out, (tuple, list)) or len(out) != len(fields):
        got = type(out).__name__
        if isinstance(out, (tuple, list)):
            got += f" of length {len(out)}"
        raise TypeError(f"out: expected {what} ({names}) of preallocated tensors or None "
                        f"fields, got {got}")
    res = []
    for (name, shape, dtype), t in zip(fields, out, strict=True):
        if shape is None:
            if t is not None:
                raise ValueError(f"out.{name}: expected None ({dtype}), got a tensor of "
                                 f"shape {tuple(t.shape)}")
        elif t is None:
            t = torch.empty(shape, dtype=dtype, device=device)
        else:
            C.check_out(f"out.{name}", t, shape, dtype, device)
        res.append(t)
    return res


def _row_source(name, t, R, device, dtypes):
    """The first R rows of a [>= R, W] tensor gathered by `row_indices` (contiguous
    rows, any row stride), or None."""
    if t is None:
        return None
    C.check_tensor(name, t, dtypes=dtypes, ndim=2, device=device)
    if t.shape[0] < R:
        raise ValueError(f"{name}: expected at least {R} rows (one per next_token_logits "
                         f"row), got shape {tuple(t.shape)}")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name}: expected the last dim to be contiguous (stride 1), got "
                         f"strides {t.stride()}")
    return t[:R]


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
                                    use_real_draft_tokens: bool = False,
                                    out: tuple | None = None, config: dict | None = None
                                    ) -> TargetVerifyTopk1Output:
    """Greedy top-1 verification of B chains of N = K+1 tokens, in one launch (see the
    module doc). out: a TargetVerifyTopk1Output (or 8-tuple) of preallocated fields."""
    if num_simulated_accept_tokens or use_real_draft_tokens:
        raise NotImplementedError(
            "num_simulated_accept_tokens/use_real_draft_tokens: SGLang's simulated "
            "acceptance is not modelled by recipes.compat.sglang; got "
            f"num_simulated_accept_tokens={num_simulated_accept_tokens!r}, "
            f"use_real_draft_tokens={use_real_draft_tokens!r}")
    B, N, stride_b, stride_j = _check_verify_args(
        next_token_logits, candidates, retrieve_index, retrieve_next_token, seq_lens)
    res = _verify_outputs(out, B, N, seq_lens, [("next_token_logits", next_token_logits),
                                                ("candidates", candidates),
                                                ("seq_lens", seq_lens)])
    if B == 0:
        return res
    K, V = N - 1, next_token_logits.shape[-1]
    # this launch's own table (VERIFY_TABLE): SGLang's epilogue changes which of
    # chain_verify's configs are fast, so chain_verify's table is not borrowed
    cfg = C.resolve_config(TUNING, config, verify_key(next_token_logits.dtype, V, B, K),
                           candidates.device)
    fields, layout = _verify_fields(res, seq_lens)
    launch_verify(next_token_logits, candidates[:, 1:], fields, cfg, B, K, V, stride_b,
                  stride_j, sglang=layout)
    return res


# draft_tail's argument names -> draft_topk1_postprocess's, in the errors of the checks
# it shares with draft_tail (`C.renamed`)
_TOPK1_NAMES = {"logits": "next_token_logits", "column": "draft_token_column",
                "out.tokens": "out.topk_index", "out.probs": "out.topk_p"}


def _verify_outputs(out, B: int, N: int, seq_lens, reads) -> TargetVerifyTopk1Output:
    """The verifiers' TargetVerifyTopk1Output: `out`'s fields checked (and none of them
    overlapping the inputs `reads`, (name, tensor) pairs), the missing ones allocated."""
    i32, i64 = torch.int32, torch.int64
    res = TargetVerifyTopk1Output(*_outputs(out, (
        ("predict", (B * N,), i32), ("num_correct_drafts", (B,), i32),
        ("accept_lens", (B,), i32), ("accept_index", (B, N), i32),
        ("bonus_tokens", (B,), i32), ("new_seq_lens", (B,), seq_lens.dtype),
        ("select_index", (B,), i64), ("draft_tokens", (B * N,), i64)),
        seq_lens.device, "a TargetVerifyTopk1Output"))
    if out is not None:
        C.check_no_overlap(zip((f"out.{f}" for f in res._fields), res, strict=True), reads)
    return res


def _verify_fields(res: TargetVerifyTopk1Output, seq_lens) -> tuple:
    """(out, sglang) of `chain_verify`'s launchers for SGLang's fields: the finishing
    programs write predict, num_correct_drafts, bonus_tokens and select_index as the
    VerifyResult and the other four as SGLang's layout (`launch_verify`)."""
    return (VerifyResult(res.predict, res.num_correct_drafts, res.bonus_tokens,
                         res.select_index),
            (seq_lens, res.draft_tokens, res.accept_index, res.accept_lens, res.new_seq_lens))


def draft_topk1_postprocess(next_token_logits: torch.Tensor, positions: torch.Tensor,
                            draft_tokens: torch.Tensor | None = None,
                            draft_token_column: int = 0, *, out: tuple | None = None,
                            config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax of each draft row; `positions += 1`; optionally
    `draft_tokens[:, draft_token_column] = argmax` (the column is unused without
    draft_tokens, as in SGLang). Returns (topk_p float32 [B, 1] of ones, topk_index
    int64 [B, 1]); out: that pair, preallocated."""
    x = next_token_logits
    C.check_tensor("next_token_logits", x, dtypes=C.FLOAT_DTYPES, ndim=2)
    (B, V), dev = x.shape, x.device
    p, idx = _outputs(out, (("topk_p", (B, 1), torch.float32),
                            ("topk_index", (B, 1), torch.int64)),
                      dev, "a (topk_p, topk_index) pair")
    column = COLUMN_DEFAULT if draft_tokens is None else draft_token_column
    try:
        c = check_tail_call(x, None, None, None, positions, draft_tokens, column,
                            DraftTail(idx.view(-1), p.view(-1), None))
    except (TypeError, ValueError) as e:
        raise C.renamed(e, _TOPK1_NAMES) from None
    if B > 0:
        # this launch's own table (TOPK1_TABLE): draft_tail's time a launch with row
        # indices, a token map and hidden rows, which rank configs otherwise
        key = tail_key(x.dtype, V, B, 0)
        cfg = C.pick_config(TOPK1_TUNING, key, dev) if config is None \
            else tail_resolve_config(config, key, dev)
        launch_draft_tail(x, None, None, None, positions, draft_tokens, c.column,
                          c.out.tokens, c.out.probs, None, cfg)
    return p, idx


def draft_extend_topk1_postprocess(next_token_logits: torch.Tensor,
                                   row_indices: torch.Tensor,
                                   hidden_states: torch.Tensor | None = None,
                                   dsa_topk_indices: torch.Tensor | None = None, *,
                                   out: tuple | None = None, config: dict | None = None
                                   ) -> tuple[torch.Tensor, torch.Tensor,
                                              torch.Tensor | None, torch.Tensor | None]:
    """Argmax of the selected rows `next_token_logits[row_indices]` (read in place) and the
    matching rows of `hidden_states` and `dsa_topk_indices`, in one launch. Returns
    (topk_p [B, 1], topk_index [B, 1], selected hidden [B, H] or None, selected dsa
    [B, D] or None); out: that 4-tuple, preallocated (None where the input is None)."""
    x = next_token_logits
    C.check_tensor("next_token_logits", x, dtypes=C.FLOAT_DTYPES, ndim=2)
    dev = x.device
    C.check_runnable("next_token_logits", x)
    C.check_logits_rows("next_token_logits", x)
    C.check_tensor("row_indices", row_indices, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    (R, V), B = x.shape, row_indices.shape[0]
    if B > 0 and R == 0:
        raise ValueError(f"next_token_logits: expected at least one row to select {B} rows "
                         f"from, got shape {tuple(x.shape)}")
    hidden = _row_source("hidden_states", hidden_states, R, dev, C.FLOAT_DTYPES)
    dsa = _row_source("dsa_topk_indices", dsa_topk_indices, R, dev, FIELD_DTYPES)
    side = [(name, None, f"{name} is None") if t is None else
            (name, (B, t.shape[1]), t.dtype)
            for name, t in (("hidden_states", hidden), ("dsa_topk_indices", dsa))]
    p, idx, h_out, d_out = _outputs(out, [("topk_p", (B, 1), torch.float32),
                                          ("topk_index", (B, 1), torch.int64), *side],
                                    dev, "a (topk_p, topk_index, hidden_states, "
                                    "dsa_topk_indices) tuple")
    if out is not None:
        C.check_no_overlap(
            zip(("out.topk_p", "out.topk_index", "out.hidden_states", "out.dsa_topk_indices"),
                (p, idx, h_out, d_out), strict=True),
            [("next_token_logits", x), ("row_indices", row_indices),
             ("hidden_states", hidden), ("dsa_topk_indices", dsa)])
    if B == 0:
        return p, idx, h_out, d_out
    # this launch's own table (EXTEND_TABLE): draft_tail's time a launch with a token
    # map, positions and a draft column, which rank configs otherwise. It is timed
    # without DSA rows, whose copy programs join the grid: with them, the heuristic's
    H = 0 if hidden is None else hidden.shape[1]
    cfg = C.resolve_config(EXTEND_TUNING, config, tail_key(x.dtype, V, B, H), dev,
                           tables=dsa is None)
    launch_draft_tail(x, row_indices, hidden, None, None, None, 0, idx.view(-1), p.view(-1),
                      h_out, cfg, gather=None if dsa is None else (dsa, d_out))
    return p, idx, h_out, d_out


SAMPLED_NAMES = ("temperatures", "seeds", "positions")
CONTROL_NAMES = ("top_ks", "top_ps", "min_ps")


def target_verify_topk1_sample_postprocess(
        next_token_logits: torch.Tensor, candidates: torch.Tensor,
        retrieve_index: torch.Tensor, retrieve_next_token: torch.Tensor,
        seq_lens: torch.Tensor, temperatures: torch.Tensor,
        top_ks: torch.Tensor | None = None, top_ps: torch.Tensor | None = None,
        min_ps: torch.Tensor | None = None, *, seeds: torch.Tensor | None = None,
        positions: torch.Tensor | None = None, out: tuple | None = None,
        config: dict | None = None) -> TargetVerifyTopk1Output:
    """SGLang's sampled chain verification (EAGLE top-1, `tree_topk == 1`) as one call:
    what its verify runs when the batch is not all greedy - softmax(logits /
    temperatures), `top_k_renorm_prob`, `top_p_renorm_prob`, `min_p_renorm_prob`, then
    `tree_speculative_sampling_target_only` with zero draft probabilities - and the
    fields of `target_verify_topk1_postprocess` (module doc) from its answer.

    The switch, where SGLang's top-1 verify takes its fallback for a sampled batch
    (`maybe_eagle_sample_target_verify_topk1` returns None when not is_all_greedy):

        from recipes.compat.sglang import target_verify_topk1_sample_postprocess
        info = batch.sampling_info
        out = target_verify_topk1_sample_postprocess(
            logits, candidates, verify_input.retrieve_index,
            verify_input.retrieve_next_token, batch.seq_lens, info.temperatures,
            info.top_ks if info.need_top_k_sampling else None,
            info.top_ps if info.need_top_p_sampling else None,
            info.min_ps if info.need_min_p_sampling else None,
            seeds=info.sampling_seed)

    Arguments: the greedy verifier's, then SGLang's per-request sampling tensors:
    `temperatures` float [B] or [B, 1] (SGLang's shape), `top_ks` int32/int64 [B],
    `top_ps` and `min_ps` float32 [B]; a control given as None is not applied (SGLang
    knows on the host which its batch needs: pass None for the others and a
    temperature-only batch is one launch; with any control it is chain_verify's
    controls path). Off values keep everything: top_k <= 0 or >= V (SGLang's TOP_K_ALL),
    top_p >= 1, min_p <= 0. Keyword-only, for our random stream (`recipes.chain_verify`):
    `seeds` int64 [B], required (SGLang: `sampling_info.sampling_seed`, or one random
    int64 drawn per request when it is added), and `positions` int64 [B], the absolute
    position of candidates[:, 0]; None takes `seq_lens` (SGLang's verify forward puts
    the chain at positions seq_lens + j). `out=` and `config=` as the greedy verifier's
    (config: chain_verify's space; None: chain_verify's sampled table).

    What it computes: `recipes.chain_verify` with temperature, controls and stream on
    the chain, in SGLang's fields: t[b, j] is the Gumbel-max sample of
    softmax(logits / T) over the kept set of the controls, m[b] the leading drafts equal
    to it, predict/accept_index/num_correct_drafts/accept_lens/bonus_tokens/
    new_seq_lens/select_index/draft_tokens as in the greedy verifier. Requests with
    temperature > 0 false (0, negative, NaN) are greedy; SGLang's greedy requests in a
    sampled batch (temperature 1, top_k 1) get the argmax of the row.

    Where ours differs from SGLang's:

    * Equal in distribution, not in bits: for a draft that puts probability 1 on its
      token, accepting the matching prefix of Gumbel-max samples is exact speculative
      sampling, as SGLang's target-only kernel is at its default acceptance thresholds
      (`speculative_accept_threshold_single/acc` = 1); SGLang draws its coins from
      torch.rand, ours from the (seed, position, id) stream. Relaxed thresholds (< 1)
      are not modelled.
    * The filter order is chain_verify's: min_p, then top_k, then top_p (vLLM's
      order); SGLang applies min_p last, after top_p's renormalisation. The kept sets
      differ only for requests with both top_p < 1 and min_p > 0 (ours takes top_p's
      mass over what min_p kept). Ties at the top-k boundary keep the lower ids (the
      renorm kernels keep every id tied with the k-th value), and the top-p prefix
      follows the spec's float64 rule.
    * NaN: SGLang's softmax of a row with NaN gives NaN probabilities (its engine
      sanitizes NaN logits to -1e30 first when SGLANG_SANITIZE_NAN_LOGITS is on); ours
      keeps the row's NaN ids and emits the first of them. Sanitize first to sample the
      row's numbers.
    * Validation names SGLang's arguments and never reads values (SGLang's
      `torch.all(top_ps == 1.0)` syncs); the tree tensors are checked for shape only,
      as in the greedy verifier.

    Checked: tests/recipes/test_compat_sglang_sampled.py - every field against
    `target_verify_sample_reference` (chain_verify's reference in SGLang's layout, the
    spec's near-tie and threshold tolerances) with and without each control, SGLang's
    greedy requests (temperature 1, top_k 1) against torch.argmax, equality with
    `recipes.chain_verify` on the same inputs, the launch count, out= buffers, B = 0/1/
    odd, and the emitted tokens' distribution (chi-square) against the filtered
    renormalised softmax.
    """
    B, N, stride_b, stride_j = _check_verify_args(
        next_token_logits, candidates, retrieve_index, retrieve_next_token, seq_lens)
    dev = candidates.device
    temp = _per_request(SAMPLED_NAMES[0], temperatures, B, dev)
    sampling = validate_sampling(temp, seeds, seq_lens if positions is None else positions,
                                 B, dev, names=SAMPLED_NAMES)
    controls = validate_controls(top_ks, top_ps, min_ps, sampling, B, dev,
                                 names=CONTROL_NAMES, temperature_name=SAMPLED_NAMES[0])
    reads = [("next_token_logits", next_token_logits), ("candidates", candidates),
             ("seq_lens", seq_lens), *zip(SAMPLED_NAMES, sampling, strict=True),
             *zip(CONTROL_NAMES, controls or (None,) * 3, strict=True)]
    res = _verify_outputs(out, B, N, seq_lens, [(n, t) for n, t in reads if t is not None])
    if B == 0:
        return res
    K, V = N - 1, next_token_logits.shape[-1]
    cfg = verify_resolve_config(config, verify_key(next_token_logits.dtype, V, B, K, True),
                                dev)
    fields, layout = _verify_fields(res, seq_lens)
    drafts = candidates[:, 1:]
    if controls is None:
        launch_verify(next_token_logits, drafts, fields, cfg, B, K, V, stride_b, stride_j,
                      sampling, sglang=layout)
    else:
        launch_controls(next_token_logits, drafts, fields, cfg, B, K, V, stride_b, stride_j,
                        sampling, controls, sglang=layout)
    return res


def _per_request(name: str, t, B: int, device) -> torch.Tensor:
    """A per-request float tensor given as [B] or [B, 1] (SGLang's shape), as [B] (a view;
    values are not read)."""
    C.check_tensor(name, t, dtypes=C.FLOAT_DTYPES, ndim=(1, 2), device=device)
    if tuple(t.shape) not in ((B,), (B, 1)):
        raise ValueError(f"{name}: expected shape ({B},) or ({B}, 1) (one per request of "
                         f"candidates), got {tuple(t.shape)}")
    return t if t.dim() == 1 else t[:, 0]


__all__ = ["TargetVerifyTopk1Output", "target_verify_topk1_postprocess",
           "target_verify_topk1_is_supported", "target_verify_topk1_sample_postprocess",
           "draft_topk1_postprocess", "draft_extend_topk1_postprocess"]


# --- tuning of the target_verify launch -------------------------------------------------
# chain_verify's kernel with SGLang's epilogue, tuned as its own table over chain_verify's
# space, constraint and heuristic, with keys like chain_verify's greedy ones.
VERIFY_TABLE = "sglang_target_verify"


def target_verify_reference(next_token_logits: torch.Tensor, candidates: torch.Tensor,
                            retrieve_index: torch.Tensor, retrieve_next_token: torch.Tensor,
                            seq_lens: torch.Tensor) -> TargetVerifyTopk1Output:
    """`target_verify_topk1_postprocess` in plain torch: `recipes.chain_verify`'s
    reference on the chain layout, in SGLang's fields (the tree tensors are not read)."""
    B, N = candidates.shape
    r = verify_reference(next_token_logits.reshape(B * N, -1), candidates[:, 1:])
    return _sglang_fields(r, candidates, seq_lens)


def target_verify_sample_reference(next_token_logits: torch.Tensor,
                                   candidates: torch.Tensor, retrieve_index: torch.Tensor,
                                   retrieve_next_token: torch.Tensor, seq_lens: torch.Tensor,
                                   temperatures: torch.Tensor, top_ks=None, top_ps=None,
                                   min_ps=None, *, seeds=None,
                                   positions=None) -> TargetVerifyTopk1Output:
    """`target_verify_topk1_sample_postprocess` in plain torch: `recipes.chain_verify`'s
    reference with temperature, controls and stream, in SGLang's fields."""
    B, N = candidates.shape
    r = verify_reference(next_token_logits.reshape(B * N, -1), candidates[:, 1:],
                         temperatures.reshape(B), seeds,
                         seq_lens if positions is None else positions, top_ks, top_ps, min_ps)
    return _sglang_fields(r, candidates, seq_lens)


def _sglang_fields(r: VerifyResult, candidates, seq_lens) -> TargetVerifyTopk1Output:
    """chain_verify's answer `r` in SGLang's fields (the verifiers' module doc)."""
    B, N = candidates.shape
    j = torch.arange(N, device=candidates.device)
    keep = j[None, :] <= r.accept_len[:, None].to(torch.int64)
    rows = torch.arange(B, device=candidates.device)[:, None] * N + j[None, :]
    predict = torch.where(keep, r.tokens, 0).reshape(-1)
    accept_lens = r.accept_len + 1
    return TargetVerifyTopk1Output(
        predict, r.accept_len, accept_lens, torch.where(keep, rows, -1).to(torch.int32),
        r.bonus, seq_lens + accept_lens.to(seq_lens.dtype), r.select_index,
        predict.to(torch.int64))


TUNING = Tuning(
    name=VERIFY_TABLE, space=VERIFY_SPACE, heuristic=verify_heuristic,
    constraint=verify_constraint,
    sources=CHAIN_VERIFY_TUNING.sources + (target_verify_topk1_postprocess, matching_cap,
                                           register_cap))


# --- tuning of the draft_extend launch --------------------------------------------------
# draft_tail's kernel gathering rows and hidden rows with no token map, positions or
# draft column, tuned as its own table over draft_tail's space, constraint, heuristic
# and keys.
EXTEND_TABLE = "sglang_draft_extend"


def draft_extend_reference(next_token_logits: torch.Tensor, row_indices: torch.Tensor,
                           hidden_states: torch.Tensor | None = None,
                           dsa_topk_indices: torch.Tensor | None = None) -> tuple:
    """`draft_extend_topk1_postprocess` in plain torch: `recipes.draft_tail`'s reference
    (row indices clamped into the logits' rows) in SGLang's fields; DSA rows of
    out-of-range indices are zeros (`relay_gather`'s rule)."""
    R = next_token_logits.shape[0]
    r = tail_reference(next_token_logits, row_indices,
                       None if hidden_states is None else hidden_states[:R])
    dsa = None
    if dsa_topk_indices is not None:
        dsa = dsa_topk_indices.new_empty(row_indices.shape[0], dsa_topk_indices.shape[1])
        relay_reference_gather(row_indices, [(dsa_topk_indices[:R], dsa)])
    return r.probs[:, None], r.tokens[:, None], r.hidden, dsa


EXTEND_TUNING = Tuning(
    name=EXTEND_TABLE, space=TAIL_SPACE, heuristic=tail_heuristic, constraint=tail_constraint,
    sources=DRAFT_TAIL_TUNING.sources + (draft_extend_topk1_postprocess,),
    # its launch compiles ~2400 binaries of its own (draft_tail's space, other
    # constexprs): in the default set they would hold a fresh `make tune` of 450 s below
    # half of every grid (docs/performance.md, "The tuner's own measurements")
    on_request=True)


# --- tuning of the draft_topk1 launch ---------------------------------------------------
# draft_tail's kernel over every row, with positions and a draft column and no row
# indices, token map or hidden rows, tuned as its own table over draft_tail's space,
# constraint and heuristic, at draft_tail's batch sizes and vocabularies with H = 0.
TOPK1_TABLE = "sglang_draft_topk1"


def draft_topk1_reference(next_token_logits: torch.Tensor, positions: torch.Tensor,
                          draft_tokens: torch.Tensor | None = None,
                          draft_token_column: int = 0) -> tuple:
    """`draft_topk1_postprocess` in plain torch (draft_tail's reference over every row):
    (topk_p, topk_index); `positions` and the draft column updated in place."""
    r = tail_reference(next_token_logits, positions=positions, draft_tokens=draft_tokens,
                       column=draft_token_column)
    return r.probs[:, None], r.tokens[:, None]


TOPK1_TUNING = Tuning(
    name=TOPK1_TABLE, space=TAIL_SPACE, heuristic=tail_heuristic, constraint=tail_constraint,
    sources=DRAFT_TAIL_TUNING.sources + (draft_topk1_postprocess,),
    # binaries of its own (no rows, map or hidden: other constexprs), like draft_extend's
    on_request=True)

TUNINGS = (TUNING, EXTEND_TUNING, TOPK1_TUNING)     # this module's tuned launches
