"""The kernels with the most code paths compile for sm_90 on any machine (Triton's
compiler and the ptxas its wheel ships; `tools/compile_check.py`): the interpreter runs
code that the compiler refuses (a module constant that is not tl.constexpr, a failing
layout pass), so the CPU suite compiles them too."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

ROOT = Path(__file__).resolve().parents[2]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.skipif(not PTXAS.exists(), reason="this Triton build ships no ptxas")
def test_controls_and_sampled_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    got = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"), "all"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert got.returncode == 0, got.stderr[-3000:]
    lines = got.stdout.splitlines()
    assert len(lines) == 4 and all("REG:" in ln for ln in lines), got.stdout


@pytest.mark.parametrize("bad, says", [("HAS_K", "KEY=INTEGER"), ("HAS_K=yes", "KEY=INTEGER"),
                                       ("=1", "KEY=INTEGER"),
                                       ("FOO=1", "has no constexpr 'FOO'")])
def test_set_refuses_what_it_cannot_mean(bad, says):
    """`--set` (constexpr overrides, for timing one binary's compile) names what it refuses
    before compiling anything (a subprocess: the tool sets TRITON_INTERPRET=0 for itself)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    got = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check.py"),
                          "controls", "--set", bad], capture_output=True, text=True, env=env,
                         timeout=120)
    assert got.returncode != 0 and says in got.stderr, got.stderr[-2000:]
    assert "REG:" not in got.stdout
