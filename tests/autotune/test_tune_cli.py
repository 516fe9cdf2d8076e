"""The tuner from its command line: a killed or interrupted tune resumes, a damaged store
says what to delete, the default set of recipes, the CPU smoke tune of every recipe,
`show`'s report lines."""
import json
import os
import signal
import subprocess
import time

import pytest

from autotune.tune.main import tune
from autotune.tune.options import Options
from autotune.tune.search import info
from autotune.tune.store import JOURNAL, StoreError
from recipes import _common
from tests.autotune.autotune_util import FAKE, PY, REPO, fake_fixture, subprocess_env  # noqa: F401
from tests.autotune.test_tune import SLUG, _opts, _trials


def _store_trials(db_dir):
    try:
        return _trials(db_dir, "fake_slow", "cpu-interpreter")
    except Exception:  # noqa: BLE001 - not created yet
        return []


TUNE_SLOW = ["-m", "autotune", "tune", "--package", FAKE, "--recipe", "fake_slow",
             "--trials", "6", "--no-progress", "--budget-s", "0"]


@pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")
def test_killed_tune_resumes(tmp_path):
    """SIGKILL a tune after a few configs reached the store; the store holds finished
    trials only (nothing RUNNING), and the next run keeps them and completes the key."""
    cmd = [PY, *TUNE_SLOW, "--results", str(tmp_path)]
    env = subprocess_env(FAKE_SLOW_S="0.4", SPEC_TUNE_DEVICE="cpu")
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    try:
        while len(_store_trials(tmp_path)) < 2:
            assert p.poll() is None, p.stdout.read().decode()[-3000:]
            assert time.time() - t0 < 120, "the first tune made no progress"
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    before = {t.number: info(t)["config_id"] for t in _store_trials(tmp_path)}
    assert 2 <= len(before) < 6
    assert all(t.state.is_finished() for t in _store_trials(tmp_path))
    r = subprocess.run(cmd, cwd=REPO, env={**env, "FAKE_SLOW_S": "0.02"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    after = _store_trials(tmp_path)
    assert {t.number: info(t)["config_id"] for t in after if t.number in before} == before
    ev = [info(t)["config_id"] for t in after]
    assert len(ev) == len(set(ev)) == 6, "a config ran twice or the key is incomplete"
    assert (tmp_path / "cpu-interpreter" / "fake_slow.json").exists()


@pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")
def test_ctrl_c_says_how_to_resume_and_keeps_what_was_measured(tmp_path):
    cmd = [PY, *TUNE_SLOW, "--results", str(tmp_path)]
    env = subprocess_env(FAKE_SLOW_S="0.3", SPEC_TUNE_DEVICE="cpu")
    # SIGINT as a terminal delivers it: a shell that runs the tests in the background
    # starts them with SIGINT ignored, and Python then installs no KeyboardInterrupt
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    report = tmp_path / "cpu-interpreter" / "studies.journal"
    while not report.exists() or report.stat().st_size == 0:
        assert p.poll() is None and time.time() - t0 < 120
        time.sleep(0.1)
    time.sleep(1.5)                     # in the middle of a config
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]
    assert "To resume, run the same command again" in err and "fake_slow" in err
    rep = json.loads((tmp_path / "cpu-interpreter" / "tune-report.json").read_text())
    assert rep["interrupted"] is True and rep["complete"] is False
    trials = _store_trials(tmp_path)
    assert trials and all(t.state.is_finished() for t in trials)
    assert "Traceback" not in err


def test_a_damaged_store_says_what_to_delete(tmp_path, fake, capsys):
    from autotune import cli

    path = tmp_path / SLUG / JOURNAL
    path.parent.mkdir(parents=True)
    path.write_text('{"op_code": 0, "worker_id"\n{"op_code": 1}\n')
    with pytest.raises(StoreError) as exc:
        tune(_opts(tmp_path))
    msg = str(exc.value)
    assert str(path) in msg and f"rm {path}" in msg and "delete it" in msg
    rc = cli.main(["tune", "--package", FAKE, "--recipe", "fake_scale",
                   "--results", str(tmp_path), "--no-progress"])
    assert rc == 2 and f"rm {path}" in capsys.readouterr().err


def test_tunables_on_request_are_tuned_only_when_named(capsys):
    """The default set leaves out a tunable declared `on_request` and says so; naming it
    with --recipe tunes it."""
    from autotune.tune.plan import select_tunables

    names = [t.name for t in select_tunables(Options())]
    assert "sglang_target_verify" in names and "sglang_draft_extend" not in names
    assert "sglang_draft_topk1" not in names
    assert ("tuned only when named (--recipe): sglang_draft_extend, sglang_draft_topk1"
            in capsys.readouterr().err)
    assert [t.name for t in select_tunables(Options(recipes=["sglang_draft_extend"]))] == [
        "sglang_draft_extend"]


@pytest.mark.skipif(_common.interpreter_numpy_problem() is not None,
                    reason="the CPU smoke tune runs the Triton interpreter: "
                           f"{_common.interpreter_numpy_problem()}")
def test_cli_smoke_tune_of_every_recipe(tmp_path):
    """`python -m autotune tune` with no GPU, as on a fresh machine (TRITON_INTERPRET not
    set: the command switches the interpreter on itself): the smoke keys of every
    registered recipe into results/cpu-interpreter/, labelled; then show/report."""
    env = subprocess_env(SPEC_TUNE_DEVICE="cpu")
    env.pop("TRITON_INTERPRET", None)
    t0 = time.time()
    r = subprocess.run([PY, "-m", "autotune", "tune", "--results", str(tmp_path),
                        "--no-progress"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert time.time() - t0 < 180
    import autotune.registry as reg
    reg.load_recipes("recipes")
    real = sorted(n for n in reg.tunables() if not n.startswith("fake_"))
    asked = sorted(n for n in real if reg.tunables()[n].on_request)
    assert asked == ["sglang_draft_extend", "sglang_draft_topk1", "vllm_ragged_verify"]
    assert "sglang_target_verify" in real
    assert ("tuned only when named (--recipe): sglang_draft_extend, sglang_draft_topk1, "
            "vllm_ragged_verify" in r.stderr)
    real = [n for n in real if n not in asked]
    assert f"wrote {len(real)} table(s)" in r.stderr
    out = tmp_path / "cpu-interpreter"
    for name in real:
        tab = json.loads((out / f"{name}.json").read_text())
        assert tab["header"]["interpreter"] is True, name
        assert "INTERPRETER" in tab["header"]["label"]
        assert tab["entries"] and all(e["trials"]["wrong"] == 0 and e["trials"]["errors"] == 0
                                      for e in tab["entries"]), name
        assert tab["entries"][0]["key"] in reg.tunables()[name].default_keys("smoke")
    rep = json.loads((out / "tune-report.json").read_text())
    assert rep["complete"] and rep["fresh"] and rep["interpreter"]
    assert {k["recipe"] for k in rep["keys"]} == set(real)
    assert all(1 <= k["measured"] <= 3 for k in rep["keys"])
    s = subprocess.run([PY, "-m", "autotune", "show", "--results", str(tmp_path), "--slug",
                        "cpu-interpreter"], cwd=REPO, env=env, capture_output=True, text=True)
    assert s.returncode == 0 and all(n in s.stdout for n in real)
    assert "== tune report" in s.stdout and "== dispatch on GPU 'cpu-interpreter'" in s.stdout
    s = subprocess.run([PY, "-m", "autotune", "report", "--results", str(tmp_path), "--slug",
                        "cpu-interpreter"], cwd=REPO, env=env, capture_output=True, text=True)
    assert s.returncode == 0 and (out / "tuning.md").exists()
    assert "INTERPRETER SMOKE TUNE" in (out / "tuning.md").read_text()


def test_bench_subcommand_reports_missing_module(monkeypatch, capsys):
    import builtins

    from autotune import cli
    real_import = builtins.__import__

    def fake_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 1 and fromlist and "bench" in fromlist:
            raise ImportError("No module named 'autotune.bench'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert cli.main(["bench", "--preset", "smoke"]) == 2
    assert "autotune/bench/" in capsys.readouterr().err


def test_show_prints_the_half_grid_count_and_a_configs_cost(tmp_path):
    """`python -m autotune show`'s report lines: how many keys reached half their grid
    (the coverage target), what a config cost, split as the tune measured it and by
    recipe, and the binaries the measuring process compiled itself, by kernel."""
    from autotune.views import tune_report_text
    rep = {"date": "d", "complete": True, "wall_s": 1.0, "budget_s": 2.0, "keys_planned": 3,
           "configs_measured": 9,
           "keys": [{"measured": 1, "admitted": 4}, {"measured": 2, "admitted": 4},
                    {"measured": 6, "admitted": 6}],
           "compile": {"pool": {"workers": 2, "binaries": 3, "compiled": 3, "from_cache": 0,
                                "failed": 0, "worker_s": 1.5},
                       "loaded": 2, "not_from_pool": 0, "compiled_in_process": 1,
                       "config_costs": {"cached": {"configs": 7, "check_ms": 1.25,
                                                   "timing_ms": 11.5}},
                       "config_costs_by_recipe": {"relay": {
                           "configs": 9, "check_ms": 150.0, "timing_ms": 20.25,
                           "loads": 2}},
                       "compiled_in_process_by_kernel": {"recipes.relay._relay_kernel": 1}}}
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "tune-report.json").write_text(json.dumps(rep))
    text = "\n".join(tune_report_text(tmp_path, "g"))
    assert "(2 keys not measured in full, 2 at half or more)" in text
    assert "a config: cached 1.25 ms check + 11.50 ms timing (7)" in text
    assert "by recipe: relay 170.2 ms (9, 2 loads)" in text
    assert "compiled in the measuring process: recipes.relay._relay_kernel 1" in text
    assert "measuring process loaded 2 (0 not from the pool), compiled 1 itself" in text

