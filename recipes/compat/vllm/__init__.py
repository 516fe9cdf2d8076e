"""vLLM 0.33.0's rejection samplers on spec-cookbook's kernels: `v1.rejection_sample`
(vllm/v1/sample/rejection_sampler.py) and `mrv2.rejection_sample` (model-runner v2,
vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py); both verify ragged batches
in one launch (`_ragged`)."""
from . import mrv2, v1

__all__ = ["v1", "mrv2"]
