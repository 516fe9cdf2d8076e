"""vLLM model-runner v2's `rejection_sample` (vllm/v1/worker/gpu/spec_decode/
rejection_sampler_utils.py, vLLM 0.33.0) on spec-cookbook's ragged verify kernel: one
launch where vLLM runs four (greedy) or six (sampled).

The switch, in `vllm/v1/worker/gpu/spec_decode/rejection_sampler.py`:

    # from vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils import (
    from recipes.compat.vllm.mrv2 import (
        rejection_sample)                            # same arguments, same outputs

and, to fold temperature, min-p, top-k and top-p into the verify (`_verify` then passes
the raw logits instead of `apply_sampling_params`' processed copy, with the state
tables): `rejection_sample(..., apply_temperature=True, top_k=..., top_p=...,
min_p=...)`.

What it returns, as vLLM's does: (sampled int64 [R, K + 1], num_sampled int32 [R]),
R = len(cu_num_logits) - 1, K = num_speculative_steps. Request b owns the logits rows
[cu[b], cu[b+1]) of `target_logits` [num_logits, V]: a row per draft, then the bonus
row; `draft_sampled[cu[b] + j + 1]` is its draft j (`draft_sampled[cu[b]]`, its last
committed token, is not read). With t[b, j] the target token of row j and m_b the
leading drafts equal to them, `sampled[b, :m_b + 1] = t[b, :m_b + 1]` (the accepted
drafts, then the token of the first row whose draft missed, or of the bonus row) and
`num_sampled[b] = m_b + 1`. Drafts outside [0, V) (vLLM's -1 placeholders) never match.

* Greedy requests (temperature[idx_mapping[b]] > 0 false): t = argmax of the row with
  torch's rules.
* Sampled requests: t is the Gumbel-max sample of `recipes.chain_verify` over the row as
  given (vLLM's `apply_sampling_params` has divided by the temperature and applied
  min-p/top-k/top-p already; `apply_temperature=True` makes the kernel divide instead),
  keyed by vLLM's own per-request seed, `seed[idx_mapping[b]]`, with the row's position
  `pos[row]` as the counter (vLLM keys its draws by the same (seed, pos)). For drafts
  that put probability 1 on their token (vLLM's `draft_logits=None`) this is exact
  speculative sampling: vLLM accepts d with probability p(d) and resamples from p with d
  removed, which is the distribution of t given t != d; the bonus row is a sample of p.
  Equal to vLLM's in distribution, not in bits (vLLM's noise is its murmur3 stream).

Beyond vLLM (keyword-only): `out=` (sampled, num_sampled) preallocated (with both, no
allocation), `config=` (`_ragged`'s space, table `vllm_ragged_verify`),
`apply_temperature=` (above), and `all_greedy=True`: the engine knows that every request
is greedy (its host-side temperatures say so), so the sampled code is not compiled into
the launch and the greedy config is used; outputs are then those of temperature 0
everywhere.

Where ours differs from vLLM:

* NaN. vLLM's argmax is a per-block max whose block maxima have NaN replaced by -inf, so
  a NaN loses to the numbers of other blocks and within a block depends on Triton's
  reduction order. Ours follows torch.argmax: the first NaN of a row wins. NaN-free
  greedy rows are equal bit for bit (ties to the lowest id, -0.0 == +0.0).
* Entries of `sampled` past num_sampled: vLLM leaves them unwritten (torch.empty); ours
  writes -1.
* `draft_logits` (non-top-1 drafters), `synthetic_conditional_rates`,
  `use_block_verification`, watermarking (`contexts`/`watermarking`/`watermark_key`) and
  `fly_window_size > 0` raise NotImplementedError; `use_fp64` has no effect (our float32
  stream is exact in distribution). `expanded_idx_mapping` and `expanded_local_pos`
  restate `idx_mapping` and `cu_num_logits`: checked for shape, not read.
* Temperatures that are negative or NaN stay greedy (vLLM: greedy only at exactly 0).
* Out-of-range values never read or write out of bounds: boundaries are clamped to
  [0, num_logits] and made monotone (`_ragged`); a request with no row gets
  num_sampled 0; one with more than K drafts (vLLM writes past its row) is verified on
  its first K; an idx_mapping entry outside the state tables reads as greedy.
* Controls with `apply_temperature=True`: `top_k`/`top_p`/`min_p` (per state like
  `temperature`, vLLM's `sampling_states.top_k/top_p/min_p.gpu`; off values keep
  everything: top_k <= 0 or >= V, top_p >= 1, min_p <= 0) are served by chain_verify's
  sampling controls in vLLM's own order (min-p, then top-k, then top-p over z = logit /
  T): a threshold launch over the rows (`_ragged`'s `_select_kernel`), then the verify
  launch restricted to the kept ids; no processed copy of the logits. Kept sets as the
  spec's: top-k ties go to the lower ids (vLLM keeps every id tied with the k-th
  value), the top-p prefix by the spec's float64 rule. Pass None for a control no
  request of the batch uses (vLLM knows it on the host, `get_top_k_top_p`) to keep one
  launch.

Checked: tests/recipes/test_compat_vllm.py against a plain-torch statement of vLLM's kernels
(greedy bit for bit on NaN-free rows: ragged batches, 0-draft requests, -1 and
out-of-vocabulary drafts, out=, B = 0/1/odd, int32/int64), one launch counted, and the
sampled rows' statistics (chi-square over seeds); tests/recipes/
test_compat_vllm_controls.py with min-p/top-k/top-p against `reference` (chain_verify's
semantics row by row, the spec's tolerances), ragged and empty requests, states out of
the tables, out=, the launch count and the statistics;
tests/recipes/test_compat_vllm_parity.py against vLLM 0.33.0's own function where vLLM is
installed (greedy, bit for bit; on the argmax corner cases only the requests holding a
NaN differ; compiled on CUDA, under the Triton interpreter on the CPU).
"""
from __future__ import annotations

import inspect

import torch

from ... import _common as C
from ...chain_verify import validate_controls
from . import _ragged as RG


def _validate(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
              expanded_idx_mapping, expanded_local_pos, temperature, seed,
              num_speculative_steps, synthetic_conditional_rates, use_block_verification,
              contexts, watermarking, watermark_key, fly_window_size, top_k, top_p, min_p,
              apply_temperature):
    """Host-side checks; returns (R, N, V, K, controls or None)."""
    for name, v, off in (("draft_logits", draft_logits, None),
                         ("synthetic_conditional_rates", synthetic_conditional_rates, None),
                         ("use_block_verification", use_block_verification, False),
                         ("contexts", contexts, None), ("watermarking", watermarking, None),
                         ("watermark_key", watermark_key, None)):
        if (bool(v) if off is False else v is not None):
            what = ("a full draft distribution needs vLLM's residual resampling; our "
                    "Gumbel-max verification is exact only for top-1 drafts "
                    "(draft_logits=None)") if name == "draft_logits" else \
                "not modelled by recipes.compat.vllm.mrv2"
            got = type(v).__name__ if isinstance(v, torch.Tensor) else repr(v)
            raise NotImplementedError(f"{name}: {what}; got {got}")
    if fly_window_size:
        raise NotImplementedError(f"fly_window_size: FLy verification is not modelled by "
                                  f"recipes.compat.vllm.mrv2; got {fly_window_size!r}")
    x = target_logits
    C.check_tensor("target_logits", x, dtypes=C.FLOAT_DTYPES, ndim=2)
    dev = x.device
    N, V = x.shape
    C.check_tensor("cu_num_logits", cu_num_logits, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    if cu_num_logits.shape[0] < 1:
        raise ValueError("cu_num_logits: expected [num_reqs + 1] with at least one entry, "
                         f"got shape {tuple(cu_num_logits.shape)}")
    R = cu_num_logits.shape[0] - 1
    for name, t, n in (("draft_sampled", draft_sampled, N), ("pos", pos, N),
                       ("idx_mapping", idx_mapping, R),
                       ("expanded_idx_mapping", expanded_idx_mapping, N),
                       ("expanded_local_pos", expanded_local_pos, N)):
        C.check_tensor(name, t, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
        if t.shape[0] != n:
            raise ValueError(f"{name}: expected shape ({n},), got {tuple(t.shape)}")
    C.check_tensor("temperature", temperature, dtypes=C.FLOAT_DTYPES, ndim=1, device=dev)
    C.check_tensor("seed", seed, dtypes=C.INDEX_DTYPES, ndim=1, device=dev)
    if seed.shape != temperature.shape:
        raise ValueError(f"seed: expected shape {tuple(temperature.shape)} like temperature "
                         f"(one per request state), got {tuple(seed.shape)}")
    C.check_logits_rows("target_logits", x)
    K = C.check_int("num_speculative_steps", num_speculative_steps, 0, C.MAX_BLOCK - 1,
                    why="a request's K + 1 tokens are one Triton block")
    given = [n for n, v in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p))
             if v is not None]
    if given and not apply_temperature:
        raise ValueError(f"{'/'.join(given)}: expected None with apply_temperature="
                         "False (the processed logits carry them already), got "
                         f"{'/'.join(given)}")
    # per state, like the temperature (shape-checked against it)
    controls = validate_controls(top_k, top_p, min_p, temperature, temperature.shape[0],
                                 dev)
    return R, N, V, K, controls


# the call's arguments that `_validate` checks, by name (the two entry points share it)
_VALIDATED = tuple(inspect.signature(_validate).parameters)


def _outputs(out, R, K, dev):
    if out is None:
        return (torch.empty((R, K + 1), dtype=torch.int64, device=dev),
                torch.empty((R,), dtype=torch.int32, device=dev))
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"out: expected a (sampled, num_sampled) pair of tensors, got "
                        f"{type(out).__name__}")
    C.check_out("out.sampled", out[0], (R, K + 1), torch.int64, dev)
    C.check_out("out.num_sampled", out[1], (R,), torch.int32, dev)
    return out[0], out[1]


def rejection_sample(target_logits: torch.Tensor, draft_logits: torch.Tensor | None,
                     draft_sampled: torch.Tensor, cu_num_logits: torch.Tensor,
                     pos: torch.Tensor, idx_mapping: torch.Tensor,
                     expanded_idx_mapping: torch.Tensor, expanded_local_pos: torch.Tensor,
                     temperature: torch.Tensor, seed: torch.Tensor,
                     num_speculative_steps: int,
                     synthetic_conditional_rates: torch.Tensor | None = None,
                     use_fp64: bool = False, use_block_verification: bool = False,
                     contexts: torch.Tensor | None = None,
                     watermarking: torch.Tensor | None = None,
                     watermarking_skip_mask: torch.Tensor | None = None,
                     watermark_key: int | None = None, fly_window_size: int = 0,
                     fly_entropy_threshold: float = 0.3, fly_entropy_top_k: int = 3, *,
                     all_greedy: bool = False, apply_temperature: bool = False,
                     top_k: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
                     min_p: torch.Tensor | None = None, out: tuple | None = None,
                     config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM model-runner v2's rejection sampling of a ragged batch in one launch (module
    doc): (sampled int64 [R, K + 1], num_sampled int32 [R])."""
    R, N, V, K, controls = _validate(**{n: v for n, v in locals().items()
                                        if n in _VALIDATED})
    C.check_runnable("target_logits", target_logits)   # the kernel's; not the reference's
    dev = target_logits.device
    given = out is not None
    sampled, num = _outputs(out, R, K, dev)
    if given:
        C.check_no_overlap(
            [("out.sampled", sampled), ("out.num_sampled", num)],
            [("target_logits", target_logits), ("draft_sampled", draft_sampled),
             ("cu_num_logits", cu_num_logits), ("pos", pos), ("idx_mapping", idx_mapping),
             ("temperature", temperature), ("seed", seed),
             *[(n, t) for n, t in (("top_k", top_k), ("top_p", top_p), ("min_p", min_p))
               if t is not None]])
    if R == 0:
        return sampled, num
    sampling = None if all_greedy else (temperature, seed, pos)
    cfg = RG.resolve_config(config, target_logits.dtype, V, N, sampling is not None, dev)
    RG.launch(target_logits, cu_num_logits, draft_sampled, sampled, cfg, B=R, width=K + 1,
              maxrows=K + 1, v1=False, num=num, sampling=sampling,
              idx_mapping=None if all_greedy else idx_mapping, row_pos=True,
              apply_temperature=apply_temperature, n_state=temperature.shape[0],
              controls=None if all_greedy else controls)
    return sampled, num


def reference(target_logits, draft_logits, draft_sampled, cu_num_logits, pos, idx_mapping,
              expanded_idx_mapping, expanded_local_pos, temperature, seed,
              num_speculative_steps, synthetic_conditional_rates=None, use_fp64=False,
              use_block_verification=False, contexts=None, watermarking=None,
              watermarking_skip_mask=None, watermark_key=None, fly_window_size=0,
              fly_entropy_threshold=0.3, fly_entropy_top_k=3, *, all_greedy=False,
              apply_temperature=False, top_k=None, top_p=None, min_p=None):
    """`rejection_sample` in plain torch (request by request): its exact outputs, sampled
    rows included (the Gumbel-max samples of `recipes.chain_verify`'s stream)."""
    R, N, V, K, controls = _validate(**{n: v for n, v in locals().items()
                                        if n in _VALIDATED})
    sampled = torch.full((R, K + 1), -1, dtype=torch.int64)
    num = torch.zeros(R, dtype=torch.int32)
    x, ds, ps = target_logits.cpu(), draft_sampled.cpu(), pos.cpu()
    S = temperature.shape[0]
    for b, (s, e) in enumerate(RG.spans(cu_num_logits.cpu(), N, lead0=False)):
        L = min(e - s, K + 1)
        rows = torch.arange(s, s + L)
        q = int(idx_mapping[b])
        if all_greedy:
            t = RG.target_rows(x, rows)
        else:
            T = temperature.cpu()[q] if 0 <= q < S else torch.tensor(0.0)
            sd = seed.cpu()[q] if 0 <= q < S else torch.tensor(0)
            ctl = None if controls is None or not 0 <= q < S else [
                None if c is None else c.cpu()[q].expand(L) for c in controls]
            t = RG.target_rows(x, rows, T.expand(L), sd.expand(L), ps[s:s + L],
                               apply_temperature, ctl)
        n = max(L - 1, 0)
        m = RG.accept_len(t, ds[s + 1:s + 1 + n].to(torch.int64))
        k = min(m + 1, L)
        sampled[b, :k] = t[:k]
        num[b] = k
    return sampled.to(target_logits.device), num.to(target_logits.device)


rejection_sample.reference = reference

__all__ = ["rejection_sample", "reference"]
