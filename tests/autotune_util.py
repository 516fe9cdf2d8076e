"""Shared pieces of the autotuner tests (not a test module)."""
import importlib
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


@pytest.fixture(name="fake")
def fake_fixture():
    """The fake tunables, registered for the test and unregistered after it."""
    mod = importlib.import_module("fake_tunables")
    mod.register_all()
    yield mod
    mod.unregister_all()


def subprocess_env(**extra) -> dict:
    """Environment for `python -m autotune ...` subprocesses that can load fake_tunables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("SPEC_TUNE_DEVICE", os.environ.get("SPEC_TUNE_DEVICE", ""))
    env.update({k: str(v) for k, v in extra.items()})
    if env.get("SPEC_TUNE_DEVICE") == "cpu":
        # the CPU smoke path exactly as CI runs it, also on a GPU host: the subprocess sees
        # no GPU, so nothing in it (recipes, torch, the tuner) takes a CUDA branch
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


PY = sys.executable
