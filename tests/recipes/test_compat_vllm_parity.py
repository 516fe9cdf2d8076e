"""recipes.compat.vllm against a real vLLM 0.33.0 installation, on the GPU: greedy
outputs bit for bit (NaN-free logits), the same batches through both functions.

vLLM's kernels need CUDA; without an importable vLLM or without a GPU every test here is
skipped, and the skip reason says which. `python -m pytest tests/recipes/test_compat_vllm_parity.py`
on a machine with both runs them.
"""
import importlib.util
import types

import pytest
import torch

from recipes.compat.vllm import mrv2, v1
from tests.recipes.test_compat_vllm import mrv2_batch, v1_batch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: parity with vLLM's own rejection samplers is not "
                "checked here (tests/recipes/test_compat_vllm.py checks a torch model of them)",
                allow_module_level=True)
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: vLLM's rejection samplers run only on the GPU",
                allow_module_level=True)

V1_REF = pytest.importorskip("vllm.v1.sample.rejection_sampler",
                             reason="vllm.v1.sample.rejection_sampler does not import")
M2_REF = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
                             reason="vLLM's model-runner v2 sampler does not import")
CASES = [[3, 0, 2, 1, 3], [3] * 64, [0, 0, 1], [2, 3, 1, 0] * 16]


@pytest.mark.parametrize("nd", CASES, ids=lambda nd: f"B{len(nd)}")
@pytest.mark.parametrize("V", [4096, 151936])
def test_v1_greedy_equals_vllm(nd, V):
    d, cu, x, bonus = v1_batch(nd, V, torch.bfloat16, "cuda", seed=len(nd), idt=torch.int32)
    meta = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
                                 top_k=None, top_p=None, generators={}, max_num_logprobs=None)
    want = V1_REF.rejection_sample(d, nd, max(nd), cu, None, x, bonus, meta)
    got = v1.rejection_sample(d, nd, max(nd), cu, None, x, bonus, meta)
    assert torch.equal(got, want)


@pytest.mark.parametrize("nd", CASES, ids=lambda nd: f"B{len(nd)}")
@pytest.mark.parametrize("V", [4096, 151936])
def test_mrv2_greedy_equals_vllm(nd, V):
    x, ds, cu, pos, idx, eidx, elp = mrv2_batch(nd, V, torch.bfloat16, "cuda", seed=len(nd),
                                                idt=torch.int32)
    S = len(nd) + 3
    temp = torch.zeros(S, device="cuda")
    seed = torch.arange(S, device="cuda", dtype=torch.int64)
    args = (x, None, ds, cu, pos.to(torch.int64), idx, eidx, elp, temp, seed, max(nd))
    ws, wn = M2_REF.rejection_sample(*args)
    gs, gn = mrv2.rejection_sample(*args)
    assert torch.equal(gn, wn)
    keep = torch.arange(max(nd) + 1, device="cuda")[None, :] < wn[:, None].long()
    assert torch.equal(torch.where(keep, gs, -1), torch.where(keep, ws, -1))
