"""The tuner end to end: search, checking against the reference, failures, resume, CLI."""
import json
import os
import re
import signal
import subprocess
import time

import optuna
import pytest
import torch
from autotune_util import PY, REPO, fake_fixture, subprocess_env  # noqa: F401

from autotune.search import EVALUATED, Encoding, Outcome, config_id, info, make_sampler, search
from autotune.store import open_storage
from autotune.tuner import Options, tune
from recipes import _common
from recipes import tables as dispatch

optuna.logging.set_verbosity(optuna.logging.ERROR)
KEY = {"dtype": "float32", "N": 256}


def _opts(tmp_path, **kw):
    # no compile-ahead: on a GPU host it calls run() for configs it only compiles, which
    # would count as evaluations in the tests that record run() calls
    base = dict(recipes=["fake_scale"], package="fake_tunables", preset="smoke",
                results=str(tmp_path), progress=False, budget_s=0, seed=0,
                precompile_threads=0)
    base.update(kw)
    return Options(**base)


def _study(tmp_path, recipe="fake_scale", slug=None):
    if slug is None:
        slug = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()
    st = open_storage(f"sqlite:///{tmp_path}/{slug}/studies.db")
    names = [s.study_name for s in optuna.get_all_study_summaries(st)
             if f":{recipe}[" in s.study_name]
    assert len(names) == 1, names
    return optuna.load_study(study_name=names[0], storage=st)


def _table(tmp_path, recipe="fake_scale"):
    slug = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()
    return json.loads((tmp_path / slug / f"{recipe}.json").read_text())


def test_exhaustive_tune_checks_every_config(tmp_path, fake, capsys):
    """Every config runs; the wrong one (the fastest) is recorded as failed and reported,
    the raising one is pruned without stopping the tune; the table never holds either."""
    summary = tune(_opts(tmp_path, exhaustive=True))
    assert summary["interpreter"] == (not torch.cuda.is_available())
    study = _study(tmp_path)
    grid = fake.SCALE.configs(KEY)
    by_status = {}
    for t in study.trials:
        d = info(t)
        by_status.setdefault(d.get("status"), []).append((t.state, d.get("config")))
    assert sum(len(by_status.get(s, [])) for s in EVALUATED) == len(grid)
    assert by_status["wrong"] == [(optuna.trial.TrialState.FAIL, fake.WRONG)]
    assert by_status["error"] == [(optuna.trial.TrialState.PRUNED, fake.RAISES)]
    assert "out of resource" in next(info(t)["error"] for t in study.trials
                                     if info(t).get("status") == "error")
    err = capsys.readouterr().err
    assert "WRONG OUTPUT" in err
    # the key's line: configs run and the seconds the key took
    assert re.search(r"fake_scale\[N=256,dtype=float32\]: .*\[18/18 configs, 1 WRONG, "
                     r"\d+\.\d s\]", err), err
    tab = _table(tmp_path)
    (e,) = tab["entries"]
    assert e["key"] == KEY and e["mode"] == "exhaustive" and e["grid"] == len(grid)
    chosen = {k: e["config"][k] for k in fake.SPACE}
    assert chosen not in (fake.WRONG, fake.RAISES)
    assert fake.SCALE.admits(e["config"], KEY)
    assert e["wrong_configs"] == [fake.WRONG]
    assert e["trials"] == {"evaluated": len(grid), "wrong": 1, "errors": 1,
                           "proposals": len(study.trials)}
    for f in ("p20_us", "p50_us", "p80_us", "heuristic_p50_us", "torch_p50_us"):
        assert e[f] > 0, f
    assert e["p20_us"] <= e["p50_us"] <= e["p80_us"]
    assert e["heuristic_config"] == fake.heuristic(KEY, None)
    h = tab["header"]
    assert h["space_hash"] == fake.SCALE.space_hash()
    assert h["source_hash"] == fake.SCALE.source_hash()
    assert h["interpreter"] == (not torch.cuda.is_available())


def test_retune_keeps_a_faster_config_of_the_table_it_rewrites(tmp_path, fake, capsys):
    """A re-tune re-times the config the old table holds for the key with its own
    candidates: a shorter search does not replace a faster entry, and a wrong config in
    the old table is re-checked and never kept."""
    fast = {"BLOCK": 256, "W": 2, "S": 1}
    orig = fake.SCALE.run

    def run(x, cfg):          # every config but `fast` pays 2 ms: the timing is decisive
        if {k: cfg[k] for k in fake.SPACE} != fast:
            time.sleep(0.002)
        return orig(x, cfg)

    slug = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()
    path = tmp_path / slug / "fake_scale.json"

    def retune_with_table_config(cfg):
        tab = _table(tmp_path)
        tab["entries"][0]["config"].update(cfg)      # as an earlier tune could have left
        path.write_text(json.dumps(tab))
        (tmp_path / slug / "studies.db").unlink()    # a fresh search: the heuristic only
        tune(_opts(tmp_path, trials=1))
        (e,) = _table(tmp_path)["entries"]
        return e

    sources = fake.SCALE.sources
    fake.SCALE.run = run
    try:
        tune(_opts(tmp_path, trials=1))
        (e,) = _table(tmp_path)["entries"]
        assert {k: e["config"][k] for k in fake.SPACE} == fake.heuristic(KEY, None)
        assert e["chosen_from"] == "search" and e["previous_config"] is None
        capsys.readouterr()
        e = retune_with_table_config(fast)
        assert {k: e["config"][k] for k in fake.SPACE} == fast
        assert e["chosen_from"] == "previous table" and e["previous_config"] == fast
        assert e["previous_p50_us"] == e["p50_us"]
        assert e["p50_us"] < e["heuristic_p50_us"]
        assert "the previous table's config, re-timed" in capsys.readouterr().err
        e = retune_with_table_config(fake.WRONG)
        assert {k: e["config"][k] for k in fake.SPACE} == fake.heuristic(KEY, None)
        assert e["chosen_from"] == "search" and e["previous_p50_us"] is None
        assert "failed in the final check" in capsys.readouterr().err
        # other kernels (a new source hash): the first key's rewrite drops the other
        # keys' old entries, yet every key is still offered its old config
        two = {"N": [128, 256]}
        (tmp_path / slug / "studies.db").unlink()
        tune(_opts(tmp_path, trials=1, overrides=two))
        tab = _table(tmp_path)
        assert len(tab["entries"]) == 2
        for e in tab["entries"]:
            e["config"].update(fast if e["key"]["N"] == 256 else {"BLOCK": 128, "W": 2})
        path.write_text(json.dumps(tab))
        (tmp_path / slug / "studies.db").unlink()
        fake.SCALE.sources = (*fake.SCALE.sources, _opts)       # the kernels changed
        tune(_opts(tmp_path, trials=1, overrides=two))
        tab = _table(tmp_path)
        assert tab["header"]["source_hash"] == fake.SCALE.source_hash()
        prev = {e["key"]["N"]: e["previous_config"] for e in tab["entries"]}
        assert prev[256] == fast and prev[128]["BLOCK"] == 128, prev
    finally:
        fake.SCALE.run, fake.SCALE.sources = orig, sources


def test_sampled_tune_resumes_from_the_store(tmp_path, fake):
    """A second run continues the same study: no finished trial is run again."""
    calls = []
    orig = fake.SCALE.run
    fake.SCALE.run = lambda x, cfg: (calls.append(config_id(
        {k: cfg[k] for k in fake.SPACE})), orig(x, cfg))[1]
    try:
        tune(_opts(tmp_path, trials=4))
        s1 = _study(tmp_path)
        first = {info(t)["config_id"]: t.number for t in s1.trials
                 if info(t).get("status") in EVALUATED}
        assert len(first) == 4
        # the heuristic's config was the first trial
        assert s1.trials[0].params == Encoding(fake.SPACE).params(fake.heuristic(KEY, None))
        calls.clear()
        tune(_opts(tmp_path, trials=7))
        s2 = _study(tmp_path)
        ev = [info(t)["config_id"] for t in s2.trials if info(t).get("status") in EVALUATED]
        assert len(ev) == len(set(ev)) == 7
        assert {c: n for c, n in ((info(t).get("config_id"), t.number) for t in s2.trials)
                if c in first} == first
        searched = [c for c in calls if c not in first]
        assert len(set(searched)) == 3, "the second run evaluated only the 3 new configs"
    finally:
        fake.SCALE.run = orig


def test_search_memoises_duplicates(fake):
    enc = Encoding(fake.SPACE)
    grid = fake.SCALE.configs(KEY)
    study = optuna.create_study(sampler=make_sampler(0, grid, enc))
    cfg = {"BLOCK": 64, "W": 2, "S": 1}
    for _ in range(3):
        study.enqueue_trial(enc.params(cfg))
    study.enqueue_trial(enc.params(fake.WRONG))
    study.enqueue_trial(enc.params(fake.WRONG))
    seen = []

    def evaluate(c):
        seen.append(config_id(c))
        if c == fake.WRONG:
            return Outcome("wrong")
        return Outcome("ok", 5.0, 4.0, 6.0)

    c = search(study, enc, lambda c: fake.SCALE.admits(c, KEY), evaluate, target=3,
               grid_size=len(grid))
    assert seen[:2] == [config_id(cfg), config_id(fake.WRONG)]
    assert len(seen) == 3 and len(set(seen)) == 3
    assert c.evaluated == 3 and c.wrong == 1
    states = [(t.state.name, info(t)["status"]) for t in study.trials[:5]]
    assert states == [("COMPLETE", "ok"), ("COMPLETE", "duplicate"), ("COMPLETE", "duplicate"),
                      ("FAIL", "wrong"), ("FAIL", "duplicate")]
    assert [t.value for t in study.trials[:3]] == [5.0, 5.0, 5.0]


def test_sampler_only_proposes_grid_configs(fake):
    enc = Encoding(fake.SPACE)
    key = {"dtype": "float32", "N": 64}
    grid = fake.SCALE.configs(key)
    study = optuna.create_study(sampler=make_sampler(3, grid, enc))
    proposed = []

    def evaluate(c):
        proposed.append(c)
        return Outcome("ok", float(fake._work(c)), 0.0, 0.0)

    search(study, enc, lambda c: fake.SCALE.admits(c, key), evaluate, target=len(grid),
           grid_size=len(grid))
    assert sorted(map(config_id, proposed)) == sorted(map(config_id, grid))
    assert all(info(t)["status"] != "invalid" for t in study.trials)


def test_budget_cuts_a_key_but_keeps_one_trial(tmp_path, fake):
    tune(_opts(tmp_path, trials=18, budget_s=0.01))
    s = _study(tmp_path)
    n = sum(info(t).get("status") in EVALUATED for t in s.trials)
    assert 1 <= n < 18
    assert _table(tmp_path)["entries"][0]["trials"]["evaluated"] == n


def _progress(db_dir):
    """(finished evaluated trials, a trial is mid-evaluation: RUNNING, its params set and
    no result recorded yet)

    search() records a trial's result (user attr `tune`) a few ms before Optuna tells the
    trial: a RUNNING trial that has one is finishing, so it counts as neither. Counted as
    both, it let the test kill the tune after that tell and before the next trial was
    created, leaving no RUNNING trial to retry."""
    try:
        trials = _study(db_dir, "fake_slow", "cpu-interpreter").trials
    except Exception:  # noqa: BLE001 - not created yet
        return 0, False
    done = sum(t.state.is_finished() and info(t).get("status") in EVALUATED for t in trials)
    running = any(t.state == optuna.trial.TrialState.RUNNING and t.params and not info(t)
                  for t in trials)
    return done, running


@pytest.mark.skipif(os.name != "posix", reason="needs POSIX signals")
def test_killed_tune_resumes(tmp_path):
    """SIGKILL a tune mid-trial; the next run keeps every finished trial, retries the
    trial the dead process left running (heartbeat), and completes the study."""
    cmd = [PY, "-m", "autotune", "tune", "--package", "fake_tunables", "--recipe",
           "fake_slow", "--trials", "6", "--results", str(tmp_path), "--no-progress",
           "--heartbeat-s", "1", "--grace-s", "2", "--budget-s", "0"]
    env = subprocess_env(FAKE_SLOW_S="1.0", SPEC_TUNE_DEVICE="cpu")
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    try:
        while True:
            n, running = _progress(tmp_path)
            if n >= 2 and running:
                # stop the tune and look again: the trial may have finished since that
                # read, and what the store holds while the tune is stopped is exactly what
                # the SIGKILL leaves (committed writes only)
                os.killpg(p.pid, signal.SIGSTOP)
                n, running = _progress(tmp_path)
                if n >= 2 and running:
                    break
                os.killpg(p.pid, signal.SIGCONT)
            assert p.poll() is None, p.stdout.read().decode()[-3000:]
            assert time.time() - t0 < 120, "the first tune made no progress"
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)           # in the middle of a trial
    finally:
        if p.poll() is None:                       # a failed wait: never leave it stopped
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    s = _study(tmp_path, "fake_slow", "cpu-interpreter")
    done_before = {t.number: info(t)["config_id"] for t in s.trials
                   if info(t).get("status") in EVALUATED}
    assert 2 <= len(done_before) < 6
    (stale,) = [t for t in s.trials if t.state == optuna.trial.TrialState.RUNNING]
    time.sleep(2.5)                        # past the grace period
    r = subprocess.run(cmd, cwd=REPO, env={**env, "FAKE_SLOW_S": "0.05"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    s = _study(tmp_path, "fake_slow", "cpu-interpreter")
    after = {t.number: info(t).get("config_id") for t in s.trials}
    assert all(after[n] == c for n, c in done_before.items()), "finished trials changed"
    ev = [info(t)["config_id"] for t in s.trials if info(t).get("status") in EVALUATED]
    assert len(ev) == len(set(ev)) >= 6, "a config ran twice or the study is incomplete"
    assert s.trials[stale.number].state == optuna.trial.TrialState.FAIL   # marked stale
    retried = [t for t in s.trials if t.number > stale.number and t.params == stale.params]
    assert retried and info(retried[0]).get("status") in EVALUATED, "stale trial not retried"
    assert (tmp_path / "cpu-interpreter" / "fake_slow.json").exists()


@pytest.mark.skipif(_common.interpreter_numpy_problem() is not None,
                    reason="the CPU smoke tune runs the Triton interpreter: "
                           f"{_common.interpreter_numpy_problem()}")
def test_cli_smoke_tune_of_every_recipe(tmp_path):
    """`python -m autotune tune` with no GPU: the smoke keys of every registered recipe,
    under the interpreter, into results/cpu-interpreter/, labelled; then show/report."""
    env = subprocess_env(SPEC_TUNE_DEVICE="cpu")
    r = subprocess.run([PY, "-m", "autotune", "tune", "--results", str(tmp_path),
                        "--trials", "2", "--final-reps", "1", "--no-progress"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "wrote" in r.stderr and " s" in r.stderr.splitlines()[-1]   # elapsed time
    import autotune.registry as reg
    reg.load_recipes("recipes")
    real = sorted(n for n in reg.tunables() if not n.startswith("fake_"))
    out = tmp_path / "cpu-interpreter"
    for name in real:
        tab = json.loads((out / f"{name}.json").read_text())
        assert tab["header"]["interpreter"] is True, name
        assert "INTERPRETER" in tab["header"]["label"]
        assert tab["entries"] and all(e["trials"]["wrong"] == 0 for e in tab["entries"]), name
        assert tab["entries"][0]["key"] in reg.tunables()[name].default_keys("smoke")
    s = subprocess.run([PY, "-m", "autotune", "show", "--results", str(tmp_path), "--slug",
                        "cpu-interpreter"], cwd=REPO, env=env, capture_output=True, text=True)
    assert s.returncode == 0 and all(n in s.stdout for n in real)
    s = subprocess.run([PY, "-m", "autotune", "report", "--results", str(tmp_path), "--slug",
                        "cpu-interpreter"], cwd=REPO, env=env, capture_output=True, text=True)
    assert s.returncode == 0 and (out / "tuning.md").exists()
    assert "INTERPRETER SMOKE TUNE" in (out / "tuning.md").read_text()


def test_quality_report_smoke(tmp_path, fake):
    from autotune.quality import quality
    path = quality(_opts(tmp_path, budget_s=None), n_keys=2, seeds=2, min_grid=4,
                   max_grid=100)
    text = path.read_text()
    assert "Tuner quality" in text and "fake_scale" in text
    data = json.loads(path.with_suffix(".json").read_text())
    assert data["n_keys"] == 1 and data["keys"][0]["grid"] == 18
    k = data["keys"][0]
    assert k["measured"] == 18 and len(k["replays"]) == 2
    assert all(r["trials_to_goal"] is None or 1 <= r["trials_to_goal"] <= 18
               for r in k["replays"])


def test_quality_counts_only_complete_grids(tmp_path, fake, monkeypatch, capsys):
    """A key whose estimated cost does not fit is not started; one cut by the budget's hard
    stop is listed as incomplete and left out of the verdict; a later run resumes it."""
    from autotune import quality as Q
    monkeypatch.setenv("FAKE_SLOW_S", "0.05")
    for kind in ("cpu", "cuda"):            # the same guess on either device
        monkeypatch.setitem(Q.SECONDS_PER_CONFIG, kind, 0.5)

    def run(budget_s):
        path = Q.quality(_opts(tmp_path, recipes=["fake_slow"], budget_s=budget_s),
                         n_keys=2, seeds=1, min_grid=4, max_grid=100)
        return path.read_text(), json.loads(path.with_suffix(".json").read_text())

    text, data = run(0.3)                  # 18 configs x 0.5 s (the guess above) > 0.3 s
    assert "fake_slow[N=256,dtype=float32]: not started" in capsys.readouterr().err
    (inc,) = data["incomplete"]
    assert data["n_keys"] == 0 and inc["measured"] == 0 and inc["grid"] == 18
    # 18 configs x 0.5 s + 1 replay x 1 s
    assert inc["why"].startswith("not started: 18 configs need ~10 s")
    assert "0 of 18 configs measured (not started" in text
    for kind in ("cpu", "cuda"):                             # now it is started ...
        monkeypatch.setitem(Q.SECONDS_PER_CONFIG, kind, 0.0)
    monkeypatch.setattr(Q, "REPLAY_S", 0.0)
    text, data = run(0.3)                  # ... and cut: each config takes >= 0.1 s
    (inc,) = data["incomplete"]
    assert 1 <= inc["measured"] < 18 and data["keys"] == []
    assert inc["why"] == "cut by the end of the budget"
    assert "Incomplete" in text and "0 of 0 complete keys" in text and "NOT MET" in text
    text, data = run(0)                    # no budget: the grid is completed
    assert data["incomplete"] == [] and data["n_keys"] == 1
    (k,) = data["keys"]
    assert k["measured"] == 18 and k["heuristic"]["note"] is None
    assert k["heuristic"]["us"] > 0


def _quality_row(reached: bool) -> dict:
    rep = {"seed": 0, "trials_to_goal": 3 if reached else None, "evaluated": 30,
           "best_at_budget_us": 1.0, "ratio_at_budget": 1.0, "budget": 10}
    return {"recipe": "r", "key": {"N": 1}, "grid": 30, "measured": 30, "optimum_us": 1.0,
            "optimum_config": {}, "heuristic": {"us": None, "note": "outside the grid"},
            "replays": [rep], "budget": 10}


@pytest.mark.parametrize("complete,reached,verdict", [(10, 9, "MET"), (10, 8, "NOT MET"),
                                                      (9, 9, "NOT MET")])
def test_quality_verdict_needs_ten_complete_keys(complete, reached, verdict):
    from autotune.quality import _report
    rows = [_quality_row(i < reached) for i in range(complete)]
    incomplete = [{"recipe": "r", "key": {"N": 2}, "grid": 40, "measured": 7,
                   "why": "cut by the end of the budget"}]
    doc = _report(rows, incomplete, torch.device("cpu"), "cpu-interpreter", Options(),
                  1, 0.03, 1.0)
    assert doc["json"]["verdict"] == verdict and doc["json"]["n_keys"] == complete
    md = doc["markdown"]
    assert f"**{reached} of {complete} complete keys**" in md and f"**{verdict}**" in md
    assert "`N=2`: 7 of 40 configs measured (cut by the end of the budget)" in md
    assert "- (outside the grid)" in md


def test_quality_heuristic_outside_the_grid(fake):
    from autotune.quality import _heuristic_time
    from autotune.tuner import Job
    job = Job(fake.SCALE, KEY, fake.SCALE.configs(KEY), True, 18, "s")
    assert _heuristic_time(job, {"BLOCK": 32, "W": 4, "S": 1}, {}) == {
        "us": None, "note": "outside the grid"}
    heur = fake.heuristic(KEY, None)
    assert _heuristic_time(job, heur, {config_id(heur): ("error", None)}) == {
        "us": None, "note": "error"}


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
    assert "autotune/bench.py" in capsys.readouterr().err
