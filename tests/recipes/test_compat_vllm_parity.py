"""recipes.compat.vllm against a real vLLM 0.33.0 installation: greedy outputs bit for
bit, the same batches through both functions: on the GPU vLLM's kernels compiled, on the
CPU the same kernels under the Triton interpreter.

Without an importable vLLM every test here is skipped, saying so. `python -m pytest
tests/recipes/test_compat_vllm_parity.py` on a machine with vLLM runs them (its
dependencies, without its CUDA-only ones, are enough for the CPU run).
"""
import importlib.util
import types

import pytest
import torch

from recipes.compat.vllm import mrv2, v1
from tests.helpers import ON_GPU
from tests.recipes.test_compat_vllm import mrv2_batch, v1_batch

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: parity with vLLM's own rejection samplers is not "
                "checked here (tests/recipes/test_compat_vllm.py checks a torch model of them)",
                allow_module_level=True)


def _import_vllm_triton():
    """vLLM turns its Triton kernels into placeholders where no GPU driver is active; the
    interpreter needs none, so on the CPU vLLM is shown an active driver while
    `vllm.triton_utils` decides."""
    if ON_GPU:
        return
    from triton.backends import backends
    driver = backends["nvidia"].driver
    was = driver.is_active
    driver.is_active = staticmethod(lambda: True)
    try:
        importlib.import_module("vllm.triton_utils")
    finally:
        driver.is_active = was


_import_vllm_triton()
V1_REF = pytest.importorskip("vllm.v1.sample.rejection_sampler",
                             reason="vllm.v1.sample.rejection_sampler does not import")
M2_REF = pytest.importorskip("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils",
                             reason="vLLM's model-runner v2 sampler does not import")
GREEDY = types.SimpleNamespace(all_greedy=True, all_random=False, temperature=None,
                               top_k=None, top_p=None, generators={}, max_num_logprobs=None)
CASES = [[3, 0, 2, 1, 3], [3] * 64, [0, 0, 1], [2, 3, 1, 0] * 16]
if not ON_GPU:      # the interpreter: fewer and smaller batches
    CASES = [[3, 0, 2, 1, 3], [0, 0, 1], [2, 3, 1, 0] * 4]


def mrv2_args(nd, V, device, hard=False):
    x, ds, cu, pos, idx, eidx, elp = mrv2_batch(nd, V, torch.bfloat16, device, seed=len(nd),
                                                idt=torch.int32, hard=hard)
    S = len(nd) + 3
    temp = torch.zeros(S, device=device)
    seed = torch.arange(S, device=device, dtype=torch.int64)
    return x, cu, (x, None, ds, cu, pos.to(torch.int64), idx, eidx, elp, temp, seed, max(nd))


def mrv2_differing(want, got, width):
    """The requests whose sampled tokens (up to the longer count) or counts differ."""
    (ws, wn), (gs, gn) = want, got
    keep = torch.arange(width, device=ws.device)[None, :] < torch.maximum(wn, gn)[:, None].long()
    diff = (torch.where(keep, gs, -1) != torch.where(keep, ws, -1)).any(1) | (gn != wn)
    return set(diff.nonzero().flatten().tolist())


@pytest.mark.parametrize("nd", CASES, ids=lambda nd: f"B{len(nd)}")
@pytest.mark.parametrize("V", [4096, 151936])
def test_v1_greedy_equals_vllm(device, nd, V):
    d, cu, x, bonus = v1_batch(nd, V, torch.bfloat16, device, seed=len(nd), idt=torch.int32)
    want = V1_REF.rejection_sample(d, nd, max(nd), cu, None, x, bonus, GREEDY)
    got = v1.rejection_sample(d, nd, max(nd), cu, None, x, bonus, GREEDY)
    assert torch.equal(got, want)


@pytest.mark.parametrize("nd", CASES, ids=lambda nd: f"B{len(nd)}")
@pytest.mark.parametrize("V", [4096, 151936])
def test_mrv2_greedy_equals_vllm(device, nd, V):
    _, _, args = mrv2_args(nd, V, device)
    assert mrv2_differing(M2_REF.rejection_sample(*args), mrv2.rejection_sample(*args),
                          max(nd) + 1) == set()


@pytest.mark.parametrize("V", [4096, 151936])
def test_hard_rows_against_vllm(device, V):
    """The argmax corner cases (ties across blocks, -0.0, +-inf, all -inf, NaN): v1 (its
    target argmax is torch.argmax) equal on every request; MRv2 equal on every request
    whose logits hold no NaN, the one difference its docstring states."""
    nd = [3, 0, 2, 1, 3, 2, 1, 3, 3]
    d, cu, x, bonus = v1_batch(nd, V, torch.bfloat16, device, seed=9, idt=torch.int32,
                               hard=True)
    assert torch.equal(v1.rejection_sample(d, nd, max(nd), cu, None, x, bonus, GREEDY),
                       V1_REF.rejection_sample(d, nd, max(nd), cu, None, x, bonus, GREEDY))
    x, cu, args = mrv2_args(nd, V, device, hard=True)
    nan = {b for b in range(len(nd)) if x[int(cu[b]):int(cu[b + 1])].isnan().any()}
    assert nan, "the hard rows hold a NaN request"
    differ = mrv2_differing(M2_REF.rejection_sample(*args), mrv2.rejection_sample(*args),
                            max(nd) + 1)
    assert differ <= nan, f"requests {sorted(differ - nan)} differ without a NaN"
