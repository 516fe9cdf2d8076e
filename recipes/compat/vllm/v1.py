"""vLLM v1's `rejection_sample` (vllm/v1/sample/rejection_sampler.py, vLLM 0.33.0) on
spec-cookbook's ragged verify kernel: one launch, greedy and sampled requests together.

The switch, in `vllm/v1/sample/rejection_sampler.py`'s caller:

    # output_token_ids = rejection_sample(
    from recipes.compat.vllm.v1 import rejection_sample
    output_token_ids = rejection_sample(...)        # same arguments, same output

and for sampled batches, with the temperature, top-k and top-p in the same launches
(`RejectionSampler.forward` then skips `apply_sampling_constraints`):

    output_token_ids = rejection_sample(..., seeds=seeds, positions=positions,
                                        apply_temperature=True)

What it returns, as vLLM's does: int32 [B, max_spec_len + 1], B = len(num_draft_tokens).
Request b owns the draft rows [cu[b-1], cu[b]) of `target_logits` [num_tokens, V] and of
`draft_token_ids` [num_tokens] (`cu_num_draft_tokens`, inclusive ends; cu[-1] = 0), n_b
of them; with t[b, j] the target token of its row j and m_b its leading drafts equal to
them, row b holds t[b, 0..m_b] (the accepted drafts, then the target's token where the
first draft missed), or, when every draft is accepted, the n_b drafts and then
`bonus_token_ids[b]`; -1 (PLACEHOLDER_TOKEN_ID) everywhere else. A request with no
draft gets [bonus, -1, ...]. Drafts outside [0, V) (vLLM's -1 padding) never match.

* Greedy requests (`sampling_metadata.all_greedy`, or temperature[b] > 0 false):
  t[b, j] = argmax of the row, torch's argmax (vLLM's `target_logits.argmax(dim=-1)`):
  equal to vLLM bit for bit, NaN included (the first NaN wins).
* Sampled requests (temperature[b] > 0): t[b, j] is the Gumbel-max sample of
  `recipes.chain_verify` over the row as given (vLLM divides `target_logits` by the
  temperature and applies top-k/top-p before this call; `apply_temperature=True` makes
  the kernel divide and apply them instead, below), keyed by `seeds[b]` and counter
  `positions[b] + j`.
  Accepting the matching prefix of these samples is exact speculative sampling for a
  draft that puts probability 1 on its token, as vLLM's `draft_probs=None` path
  (n-gram, EAGLE/MTP top-1 drafts) assumes: vLLM accepts with probability p(d) and
  resamples from p with d removed, which is the distribution of t given t != d. So rows
  are equal to vLLM's in distribution, not in bits (vLLM draws from torch generators).

Beyond vLLM (keyword-only): `seeds` and `positions` (int64 [B], required when a request
samples): v1 passes no device-side seeds (its `sampling_metadata.generators` are host
torch.Generators, its uniform draws and exponentials come from them), so the engine
passes per-request seeds (e.g. SamplingParams.seed, else one random int64 drawn when
the request is added) and the position of each request's last committed token (its
`num_computed_tokens`): the stream then depends on (seed, position, id) only, the same
under any batch. `out=` int32 [B, max_spec_len + 1] (with it, the call allocates
nothing), `config=` (`_ragged`'s space, table `vllm_ragged_verify`),
`apply_temperature=` (above).

Where ours differs (everything else is vLLM's bit for bit on greedy requests):

* `draft_probs` (a full draft distribution) with a sampled request raises
  NotImplementedError: its residual max(p - q, 0) is not a Gumbel-max of the target
  row. (Greedy batches ignore draft_probs, as vLLM does.) `synthetic_mode` and
  `fly_window_size` raise NotImplementedError; `use_fp64_gumbel` has no effect (our
  float32 stream is exact in distribution).
* Temperatures that are negative or NaN stay greedy (vLLM: greedy only at exactly 0).
* Out-of-range values never read or write out of bounds: boundaries are clamped to
  [0, num_tokens] and made monotone (`_ragged`); a request with more than max_spec_len
  drafts (vLLM writes past its row) is verified on its first max_spec_len.
* Top-k/top-p with `apply_temperature=True`: `sampling_metadata.top_k` and `top_p`
  (per request; vLLM's off values, top_k = V and top_p = 1, keep everything) are served
  by chain_verify's sampling controls instead of vLLM's sort-based
  `apply_top_k_top_p`: a threshold launch over the draft rows (`_ragged`'s
  `_select_kernel`), then the verify launch restricted to the kept ids; no copy or
  filtered version of the logits. Kept sets as the spec's: top-k ties go to the lower
  ids (vLLM keeps every id tied with the k-th value), the top-p prefix by the spec's
  float64 rule (vLLM: float32 cumulative sums of the sorted softmax). v1's rejection
  sampler applies no min-p to draft rows (min-p is a logits processor of the bonus
  row's sampler), so this adapter takes none. Pass None for a control no request of
  the batch uses (the host knows: `sampling_metadata.top_k is None`) to keep one
  launch. With `apply_temperature=False` the controls are vLLM's to apply before the
  call (`apply_sampling_constraints`), as today.

Checked: tests/recipes/test_compat_vllm.py against a plain-torch statement of vLLM's kernels
(greedy bit for bit: ragged batches, empty requests, -1 and out-of-vocabulary drafts,
NaN rows, out=, B = 0/1/odd, int32/int64), one launch counted, and the sampled rows'
statistics (chi-square over seeds); tests/recipes/test_compat_vllm_controls.py with
top-k/top-p against `reference` (chain_verify's semantics row by row, the spec's
tolerances), ragged and empty requests, out=, the launch count and the statistics;
tests/recipes/test_compat_vllm_parity.py against vLLM 0.33.0's own function where vLLM is
installed (greedy, bit for bit, the argmax corner cases included; compiled on CUDA, under
the Triton interpreter on the CPU).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from ... import _common as C
from ...chain_verify import validate_controls
from . import _ragged as RG

# sampling_metadata's controls as the errors name them (v1 carries no min_p: vLLM applies
# it as a logits processor to the bonus row only)
CONTROL_NAMES = ("sampling_metadata.top_k", "sampling_metadata.top_p", "min_p")


def _validate(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
              draft_probs, target_logits, bonus_token_ids, sampling_metadata,
              synthetic_mode, synthetic_conditional_rates, fly_window_size, seeds,
              positions, apply_temperature):
    """Host-side checks; returns (B, N, V, bonus [B] view, sampling or None, controls or
    None)."""
    if synthetic_mode or synthetic_conditional_rates is not None:
        raise NotImplementedError(
            "synthetic_mode/synthetic_conditional_rates: vLLM's synthetic acceptance is "
            "not modelled by recipes.compat.vllm.v1; got synthetic_mode="
            f"{synthetic_mode!r}")
    if fly_window_size is not None:
        raise NotImplementedError(f"fly_window_size: FLy verification is not modelled by "
                                  f"recipes.compat.vllm.v1; got {fly_window_size!r}")
    x = target_logits
    C.check_tensor("target_logits", x, dtypes=C.FLOAT_DTYPES, ndim=2)
    dev = x.device
    C.check_tensor("draft_token_ids", draft_token_ids, dtypes=C.INDEX_DTYPES, ndim=1,
                   device=dev)
    C.check_tensor("cu_num_draft_tokens", cu_num_draft_tokens, dtypes=C.INDEX_DTYPES,
                   ndim=1, device=dev)
    C.check_logits_rows("target_logits", x)
    N, V = x.shape
    if draft_token_ids.shape[0] != N:
        raise ValueError(f"draft_token_ids: expected shape ({N},) (one per target_logits "
                         f"row), got {tuple(draft_token_ids.shape)}")
    if not isinstance(num_draft_tokens, Sequence):
        raise TypeError(f"num_draft_tokens: expected a list of ints (one per request), got "
                        f"{type(num_draft_tokens).__name__}")
    B = len(num_draft_tokens)
    if cu_num_draft_tokens.shape[0] != B:
        raise ValueError(f"cu_num_draft_tokens: expected shape ({B},) (len(num_draft_tokens)"
                         f"), got {tuple(cu_num_draft_tokens.shape)}")
    C.check_int("max_spec_len", max_spec_len, 0, C.MAX_BLOCK - 1,
                why="a request's max_spec_len + 1 tokens are one Triton block")
    C.check_tensor("bonus_token_ids", bonus_token_ids, dtypes=C.INDEX_DTYPES, ndim=(1, 2),
                   device=dev)
    if tuple(bonus_token_ids.shape) not in ((B, 1), (B,)):
        raise ValueError(f"bonus_token_ids: expected shape ({B}, 1), got "
                         f"{tuple(bonus_token_ids.shape)}")
    bonus = bonus_token_ids.reshape(B) if bonus_token_ids.dim() == 1 \
        else bonus_token_ids[:, 0]
    if draft_probs is not None:
        C.check_tensor("draft_probs", draft_probs, dtypes=C.FLOAT_DTYPES, ndim=2, device=dev)
        if tuple(draft_probs.shape) != (N, V):
            raise ValueError(f"draft_probs: expected shape ({N}, {V}) like target_logits, "
                             f"got {tuple(draft_probs.shape)}")
    for attr in ("all_greedy", "temperature"):
        if not hasattr(sampling_metadata, attr):
            raise TypeError(f"sampling_metadata: expected vLLM's SamplingMetadata (with "
                            f"{attr}), got {type(sampling_metadata).__name__}")
    if sampling_metadata.all_greedy:
        return B, N, V, bonus, None, None
    if draft_probs is not None:
        raise NotImplementedError(
            "draft_probs: sampled requests are verified by Gumbel-max sampling, exact for "
            "drafts that put probability 1 on their token (draft_probs=None); a full draft "
            "distribution needs vLLM's residual resampling: keep vLLM's rejection_sample "
            "for such drafters")
    temp = sampling_metadata.temperature
    C.check_tensor("sampling_metadata.temperature", temp, dtypes=C.FLOAT_DTYPES, ndim=1,
                   device=dev)
    if temp.shape[0] != B:
        raise ValueError(f"sampling_metadata.temperature: expected shape ({B},), got "
                         f"{tuple(temp.shape)}")
    for name, t, what in (("seeds", seeds, "per-request Philox seeds"),
                          ("positions", positions, "position of each request's last "
                                                   "committed token")):
        if t is None:
            raise ValueError(f"{name}: required when a request samples (int64 [{B}], "
                             f"{what}; vLLM v1 carries no device-side seeds), got None")
        C.check_tensor(name, t, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
        if t.shape[0] != B:
            raise ValueError(f"{name}: expected shape ({B},), got {tuple(t.shape)}")
    sampling = (temp, seeds, positions)
    controls = None
    if apply_temperature:       # else vLLM's apply_sampling_constraints applied them
        controls = validate_controls(
            getattr(sampling_metadata, "top_k", None),
            getattr(sampling_metadata, "top_p", None), None, sampling, B, dev,
            names=CONTROL_NAMES, temperature_name="sampling_metadata.temperature")
    return B, N, V, bonus, sampling, controls


def rejection_sample(draft_token_ids: torch.Tensor, num_draft_tokens: Sequence[int],
                     max_spec_len: int, cu_num_draft_tokens: torch.Tensor,
                     draft_probs: torch.Tensor | None, target_logits: torch.Tensor,
                     bonus_token_ids: torch.Tensor, sampling_metadata,
                     synthetic_mode: bool = False,
                     synthetic_conditional_rates: torch.Tensor | None = None,
                     use_fp64_gumbel: bool = False, fly_window_size: int | None = None,
                     fly_entropy_threshold: float | None = None, fly_entropy_top_k: int = 3,
                     *, seeds: torch.Tensor | None = None,
                     positions: torch.Tensor | None = None, apply_temperature: bool = False,
                     out: torch.Tensor | None = None, config: dict | None = None
                     ) -> torch.Tensor:
    """vLLM v1's rejection sampling of a ragged batch in one launch (module doc):
    int32 [B, max_spec_len + 1], -1 placeholders."""
    B, N, V, bonus, sampling, controls = _validate(
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
        target_logits, bonus_token_ids, sampling_metadata, synthetic_mode,
        synthetic_conditional_rates, fly_window_size, seeds, positions, apply_temperature)
    W, dev = int(max_spec_len) + 1, target_logits.device          # (checked: an integer)
    C.check_runnable("target_logits", target_logits)   # the kernel's; not the reference's
    if out is None:
        out = torch.empty((B, W), dtype=torch.int32, device=dev)
    else:
        C.check_out("out", out, (B, W), torch.int32, dev)
        reads = [("target_logits", target_logits), ("draft_token_ids", draft_token_ids),
                 ("cu_num_draft_tokens", cu_num_draft_tokens),
                 ("bonus_token_ids", bonus_token_ids)]
        if sampling is not None:
            reads += zip(("sampling_metadata.temperature", "seeds", "positions"), sampling,
                         strict=True)
        if controls is not None:
            reads += [(n, t) for n, t in zip(CONTROL_NAMES, controls, strict=True)
                      if t is not None]
        C.check_no_overlap([("out", out)], reads)
    if B == 0:
        return out
    cfg = RG.resolve_config(config, target_logits.dtype, V, N, sampling is not None, dev)
    RG.launch(target_logits, cu_num_draft_tokens, draft_token_ids, out, cfg, B=B, width=W,
              maxrows=W - 1, v1=True, bonus=bonus, sampling=sampling,
              apply_temperature=apply_temperature, controls=controls)
    return out


def reference(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
              draft_probs, target_logits, bonus_token_ids, sampling_metadata,
              synthetic_mode=False, synthetic_conditional_rates=None,
              use_fp64_gumbel=False, fly_window_size=None, fly_entropy_threshold=None,
              fly_entropy_top_k=3, *, seeds=None, positions=None,
              apply_temperature=False) -> torch.Tensor:
    """`rejection_sample` in plain torch (request by request): its exact output, sampled
    rows included (the Gumbel-max samples of `recipes.chain_verify`'s stream)."""
    B, N, V, bonus, sampling, controls = _validate(
        draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
        target_logits, bonus_token_ids, sampling_metadata, synthetic_mode,
        synthetic_conditional_rates, fly_window_size, seeds, positions, apply_temperature)
    out = torch.full((B, max_spec_len + 1), -1, dtype=torch.int32)
    x = target_logits.cpu()
    for b, (s, e) in enumerate(RG.spans(cu_num_draft_tokens.cpu(), N, lead0=True)):
        n = min(e - s, max_spec_len)
        rows = torch.arange(s, s + n)
        if sampling is None:
            t = RG.target_rows(x, rows)
        else:
            temp, sd, pos = (v.cpu() for v in sampling)
            ctl = None if controls is None else [None if c is None else c.cpu()[b].expand(n)
                                                 for c in controls]
            t = RG.target_rows(x, rows, temp[b].expand(n), sd[b].expand(n),
                               pos[b].to(torch.int64) + torch.arange(n), apply_temperature,
                               ctl)
        d = draft_token_ids.cpu()[s:s + n].to(torch.int64)
        m = RG.accept_len(t, d)
        k = min(m + 1, n)
        out[b, :k] = t[:k].to(torch.int32)
        if m == n:
            out[b, n] = bonus[b].cpu().to(torch.int32)
    return out.to(target_logits.device)


rejection_sample.reference = reference

__all__ = ["rejection_sample", "reference"]
