"""Test harness: CUDA when a GPU is present, else the Triton interpreter on the CPU.

The interpreter is chosen when `triton.jit` decorates, so TRITON_INTERPRET=1 must be set
before any recipe is imported; this file runs first. `SPEC_TEST_DEVICE=cpu|cuda`
forces one.
"""
import os

import pytest

_forced = os.environ.get("SPEC_TEST_DEVICE")
try:
    import torch
    _has_cuda = torch.cuda.is_available()
except Exception:  # noqa: BLE001
    _has_cuda = False
DEVICE = _forced or ("cuda" if _has_cuda else "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

ON_GPU = DEVICE == "cuda"


@pytest.fixture(scope="session")
def device():
    import torch
    return torch.device(DEVICE)


def pytest_report_header(config):
    mode = "compiled Triton kernels on CUDA" if ON_GPU else "Triton interpreter on CPU"
    return f"spec-cookbook tests: {mode}"
