"""tools/gpu_pass.sh with a stand-in interpreter in place of a GPU host: a retune cut
short still replaces the tables it wrote, and the summary names the rest; the probe step
keeps the probe's table."""
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# answers the pass's three questions (CUDA visible, the GPU's slug, the tune) as a GPU
# host whose tune is interrupted after writing the table of its first recipe
FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in
  "-c import torch"*) exit 0 ;;
  *gpu_slug*) echo h200 ;;
  "-m autotune tune"*)
    while [ $# -gt 0 ]; do [ "$1" = --results ] && dir=$2; shift; done
    mkdir -p "$dir/h200"
    echo '{"fresh": true}' >"$dir/h200/chain_verify.json"
    echo '{}' >"$dir/h200/tune-report.json"
    echo "autotune: interrupted"; exit 130 ;;
  "tools/controls_probe.py --jobs "*" 1 8 64")
    echo "warm-up: 15 calls in 40 s" >&2; echo "B=1 temperature only: 5.90 us" >&2
    printf '| case | B=1 us |\n|---|---|\n| temperature only | 5.90 |\n' ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


@pytest.mark.skipif(shutil.which("bash") is None, reason="tools/gpu_pass.sh needs bash")
def test_interrupted_retune_keeps_the_tables_it_wrote(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "gpu_pass.sh", tmp_path / "tools")
    for r in ("chain_verify", "draft_tail"):
        (tmp_path / "results" / "h200").mkdir(parents=True, exist_ok=True)
        (tmp_path / "results" / "h200" / f"{r}.json").write_text('{"stale": true}')
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PYTHON": str(py), "RETUNE_RECIPES": "chain_verify,draft_tail"}
    got = subprocess.run(["bash", "tools/gpu_pass.sh", "--out", "log", "retune"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert got.returncode == 1, got.stdout + got.stderr
    tables = tmp_path / "results" / "h200"
    assert (tables / "chain_verify.json").read_text().strip() == '{"fresh": true}'
    assert (tables / "draft_tail.json").read_text() == '{"stale": true}'
    summary = (tmp_path / "log" / "summary.txt").read_text()
    assert "retune: rc=130" in summary
    assert "tables replaced: chain_verify; not written: draft_tail" in summary
    assert (tmp_path / "log" / "retune-chain_verify-draft_tail-report.json").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="tools/gpu_pass.sh needs bash")
def test_probe_step_keeps_the_table(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "gpu_pass.sh", tmp_path / "tools")
    py = tmp_path / "python"
    py.write_text(FAKE_PYTHON)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    got = subprocess.run(["bash", "tools/gpu_pass.sh", "--out", "log", "probe"], cwd=tmp_path,
                         env={**os.environ, "PYTHON": str(py)}, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    table = (tmp_path / "log" / "controls-probe.md").read_text().splitlines()
    assert table == ["| case | B=1 us |", "|---|---|", "| temperature only | 5.90 |"]
    assert "probe: rc=0" in (tmp_path / "log" / "summary.txt").read_text()
