"""The tuner end to end: measuring and checking against the reference, failures, the final
rule, no_slower_at, resume (killed, Ctrl-C), a damaged store, the report, the CLI."""
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

from autotune.timing import Timing
from autotune.tune.options import Options
from autotune.tune.run import tune
from autotune.tune.search import EVALUATED, Encoding, Result, config_id, info
from autotune.tune.store import JOURNAL, Store, StoreError
from recipes import _common
from recipes import _configs as dispatch

optuna.logging.set_verbosity(optuna.logging.ERROR)
KEY = {"dtype": "float32", "N": 256}
SLUG = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()


def _opts(tmp_path, **kw):
    base = dict(recipes=["fake_scale"], package="fake_tunables", preset="smoke",
                results=str(tmp_path), progress=False, budget_s=0, seed=0,
                compile_workers=0)
    base.update(kw)
    return Options(**base)


def _trials(tmp_path, recipe="fake_scale", slug=SLUG):
    """Every trial the store holds for the recipe's studies."""
    st = Store(None, tmp_path, slug).storage
    out = []
    for s in st.get_all_studies():
        if f":{recipe}[" in s.study_name:
            out += optuna.load_study(study_name=s.study_name, storage=st).trials
    return out


def _table(tmp_path, recipe="fake_scale"):
    return json.loads((tmp_path / SLUG / f"{recipe}.json").read_text())


def _report(tmp_path):
    return json.loads((tmp_path / SLUG / "tune-report.json").read_text())


def test_exhaustive_tune_checks_every_config(tmp_path, fake, capsys):
    """Every config runs; the wrong one (the fastest) is recorded as failed and reported,
    the raising one is pruned without stopping the tune; the table never holds either;
    the store holds finished trials only."""
    summary = tune(_opts(tmp_path, exhaustive=True))
    assert summary["interpreter"] == (not torch.cuda.is_available())
    trials = _trials(tmp_path)
    grid = fake.SCALE.configs(KEY)
    assert {t.state for t in trials} <= {optuna.trial.TrialState.COMPLETE,
                                         optuna.trial.TrialState.FAIL,
                                         optuna.trial.TrialState.PRUNED}
    by_status = {}
    for t in trials:
        d = info(t)
        by_status.setdefault(d.get("status"), []).append((t.state, d.get("config")))
    assert sum(len(by_status.get(s, [])) for s in EVALUATED) == len(grid) == len(trials)
    assert by_status["wrong"] == [(optuna.trial.TrialState.FAIL, fake.WRONG)]
    assert by_status["error"] == [(optuna.trial.TrialState.PRUNED, fake.RAISES)]
    assert "out of resource" in next(info(t)["error"] for t in trials
                                     if info(t).get("status") == "error")
    err = capsys.readouterr().err
    assert "WRONG OUTPUT" in err
    assert re.search(r"fake_scale\[N=256,dtype=float32\]: .*\[18/18 configs, 1 WRONG, "
                     r"\d+\.\d s\]", err), err
    tab = _table(tmp_path)
    (e,) = tab["entries"]
    assert e["key"] == KEY and e["mode"] == "exhaustive" and e["grid"] == len(grid)
    chosen = {k: e["config"][k] for k in fake.SPACE}
    assert chosen not in (fake.WRONG, fake.RAISES)
    assert fake.SCALE.admits(e["config"], KEY)
    assert e["wrong_configs"] == [fake.WRONG]
    assert e["trials"] == {"evaluated": len(grid), "wrong": 1, "errors": 1}
    for f in ("p20_us", "p50_us", "p80_us", "heuristic_p50_us", "torch_p50_us"):
        assert e[f] > 0, f
    assert e["p20_us"] <= e["p50_us"] <= e["p80_us"]
    assert e["heuristic_config"] == fake.heuristic(KEY, None)
    assert e["chosen_from"] in ("search", "heuristic") and e["no_slower_at"] == []
    h = tab["header"]
    assert h["space_hash"] == fake.SCALE.space_hash()
    assert h["source_hash"] == fake.SCALE.source_hash()
    assert h["interpreter"] == (not torch.cuda.is_available())
    # the report: one key, all of its grid, where the time went
    r = _report(tmp_path)
    assert r["complete"] and not r["interrupted"] and r["fresh"] is True
    assert r["wall_s"] > 0 and r["configs_measured"] == 18
    (k,) = r["keys"]
    assert (k["recipe"], k["key"], k["admitted"], k["measured"]) == ("fake_scale", KEY, 18, 18)
    assert k["best_us"] == e["best_p50_us"] and k["heuristic_us"] == e["heuristic_p50_us"]
    for phase in ("startup", "plan", "inputs", "check", "timing", "final", "write", "other"):
        assert phase in r["phases"], phase
    assert sum(r["phases"].values()) == pytest.approx(r["wall_s"], abs=0.2)
    tune(_opts(tmp_path, trials=1))
    assert _report(tmp_path)["fresh"] is False            # a table was there this time


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

    path = tmp_path / SLUG / "fake_scale.json"

    def retune_with_table_config(cfg):
        tab = _table(tmp_path)
        tab["entries"][0]["config"].update(cfg)      # as an earlier tune could have left
        path.write_text(json.dumps(tab))
        (tmp_path / SLUG / JOURNAL).unlink()         # a fresh search: the heuristic only
        tune(_opts(tmp_path, trials=1))
        (e,) = _table(tmp_path)["entries"]
        return e

    sources = fake.SCALE.sources
    fake.SCALE.run = run
    try:
        tune(_opts(tmp_path, trials=1))
        (e,) = _table(tmp_path)["entries"]
        assert {k: e["config"][k] for k in fake.SPACE} == fake.heuristic(KEY, None)
        assert e["chosen_from"] == "heuristic" and e["previous_config"] is None
        capsys.readouterr()
        e = retune_with_table_config(fast)
        assert {k: e["config"][k] for k in fake.SPACE} == fast
        assert e["chosen_from"] == "previous table" and e["previous_config"] == fast
        assert e["previous_p50_us"] == e["p50_us"]
        assert e["p50_us"] < e["heuristic_p50_us"]
        assert "the previous table's config, re-timed" in capsys.readouterr().err
        e = retune_with_table_config(fake.WRONG)
        assert {k: e["config"][k] for k in fake.SPACE} == fake.heuristic(KEY, None)
        assert e["chosen_from"] == "heuristic" and e["previous_p50_us"] is None
        assert "failed in the final check" in capsys.readouterr().err
        # other kernels (a new source hash): the first key's rewrite drops the other
        # keys' old entries, yet every key is still offered its old config
        two = {"N": [128, 256]}
        (tmp_path / SLUG / JOURNAL).unlink()
        tune(_opts(tmp_path, trials=1, overrides=two))
        tab = _table(tmp_path)
        assert len(tab["entries"]) == 2
        for e in tab["entries"]:
            e["config"].update(fast if e["key"]["N"] == 256 else {"BLOCK": 128, "W": 2})
        path.write_text(json.dumps(tab))
        (tmp_path / SLUG / JOURNAL).unlink()
        fake.SCALE.tuning.sources = (*fake.SCALE.sources, _opts)       # the kernels changed
        tune(_opts(tmp_path, trials=1, overrides=two))
        tab = _table(tmp_path)
        assert tab["header"]["source_hash"] == fake.SCALE.source_hash()
        prev = {e["key"]["N"]: e["previous_config"] for e in tab["entries"]}
        assert prev[256] == fast and prev[128]["BLOCK"] == 128, prev
    finally:
        fake.SCALE.run, fake.SCALE.tuning.sources = orig, sources


class _ScriptedMeasurer:
    """Stands in for a Measurer in `finalize`: each config's samples per round come
    from `rounds[config_id]` (a list of per-round medians), on a 'GPU' (3 rounds)."""

    def __init__(self, rounds):
        self.rounds = {k: list(v) for k, v in rounds.items()}
        self.cuda, self.final_reps, self.device = True, 5, torch.device("cpu")
        self.log = []             # "time" and "relocate", in call order

    def relocate(self):
        self.log.append("relocate")

    def check(self, cfg, phase="check"):
        return True, None

    def time(self, cfg, reps, phase="timing"):
        self.log.append("time")
        v = self.rounds[config_id(cfg)].pop(0)
        return Timing([v] * reps)

    def time_torch(self):
        return None, None

    def health(self):
        pass


@pytest.mark.parametrize("best,heur,chosen", [
    ([9.8, 9.8, 9.8], [10.0, 10.0, 10.0], "search"),      # 2% faster in every round
    ([9.8, 10.1, 9.8], [10.0, 10.0, 10.0], "heuristic"),  # slower in one round
    ([9.97, 9.97, 9.97], [10.0, 10.0, 10.0], "heuristic"),  # 0.3%: under MIN_GAIN
    ([9.85, 9.85, 9.85], [10.0, 10.0, 10.0], "heuristic"),  # 1.5%: under MIN_GAIN
    ([9.7, 9.7, 9.7], [9.8, 10.2, 10.0], "heuristic"),    # 3% gain, 4% heuristic spread
    ([9.0, 9.0, 9.0], [9.8, 10.2, 10.0], "search"),       # 10% gain beats the spread
    ([5.0, 5.0, 5.0], [500, 1100, 535], "search"),        # 100x: a slowed round cannot hide it
    ([9.7, 9.7, 9.7], [10.0, 10.0, 10.5], "heuristic"),   # 3.1% speed-up, 5% round spread
])
def test_final_rule_keeps_the_heuristic_unless_beaten_beyond_noise(fake, best, heur, chosen):
    from autotune.tune.plan import Job
    from autotune.tune.write import finalize

    h = fake.heuristic(KEY, None)
    b = {"BLOCK": 256, "W": 2, "S": 1}
    grid = fake.SCALE.configs(KEY)
    job = Job(fake.SCALE, KEY, grid, "study", h, order=grid, limit=len(grid))
    results = {config_id(b): Result("ok", 9.0, config=b),
               config_id(h): Result("ok", 10.0, config=h)}
    m = _ScriptedMeasurer({config_id(b): best, config_id(h): heur})
    e = finalize(job, m, results, top=1, planned=len(grid), log=lambda s: None)
    assert e["chosen_from"] == chosen
    assert {k: e["config"][k] for k in fake.SPACE} == (b if chosen == "search" else h)
    assert e["best_config"] == b and e["heuristic_p50_us"] == pytest.approx(
        sorted(heur)[1])
    # each round after the first on input sets at new addresses
    assert m.log == ["time", "time", "relocate"] * 2 + ["time", "time"]


def test_relocate_moves_every_input_set_and_keeps_it():
    """`Measurer.relocate`: the same values and strides at other addresses."""
    from autotune.registry import get
    from autotune.tune.measure import Measurer, tensors

    t = get("draft_tail")
    key = t.default_keys("smoke")[0]
    m = Measurer(t, key, torch.device("cpu"))
    before = [list(tensors(s)) for s in m.states]
    m.relocate()
    for old, new in zip(before, [list(tensors(s)) for s in m.states], strict=True):
        assert len(old) == len(new) > 0
        for a, b in zip(old, new, strict=True):
            assert a.data_ptr() != b.data_ptr() and a.stride() == b.stride()
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("searched,chosen", [
    (9.0, "search"),        # the search saw 10% too
    (9.85, "heuristic"),    # the search saw 1.5%: under MIN_GAIN
    (10.3, "heuristic"),    # the search saw it slower
    (None, "search"),       # the search never measured the heuristic: the final decides
])
def test_a_gain_must_show_in_the_search_too(fake, searched, chosen):
    """The final re-timing alone does not replace the heuristic: the search's own
    measurements of the two must show the gain as well."""
    from autotune.tune.plan import Job
    from autotune.tune.write import finalize

    h = fake.heuristic(KEY, None)
    b = {"BLOCK": 256, "W": 2, "S": 1}
    grid = fake.SCALE.configs(KEY)
    job = Job(fake.SCALE, KEY, grid, "study", h, order=grid, limit=len(grid))
    results = {config_id(b): Result("ok", searched or 9.0, config=b)}
    if searched is not None:
        results[config_id(h)] = Result("ok", 10.0, config=h)
    m = _ScriptedMeasurer({config_id(b): [9.0] * 3, config_id(h): [10.0] * 3})
    e = finalize(job, m, results, top=2, planned=len(grid), log=lambda s: None)
    assert e["chosen_from"] == chosen
    assert e["search_gain_vs_heuristic"] == (
        None if searched is None else pytest.approx((10.0 - searched) / 10.0, abs=1e-4))


def test_no_slower_at_lists_keys_where_the_config_held_up(fake):
    from autotune.tune.write import no_slower_at

    h = {"BLOCK": 64, "W": 2, "S": 1}
    c = {"BLOCK": 128, "W": 2, "S": 1}
    keys = {n: {"dtype": "float32", "N": n} for n in (64, 128, 256, 512)}
    ks = {n: f"N={n},dtype=float32" for n in keys}
    entries = {ks[128]: {"key": keys[128], "config": {**c, "extra": 1}},
               ks[256]: {"key": keys[256], "config": h},
               ks[512]: {"key": keys[512], "config": c}}
    res = {ks[128]: {config_id(h): Result("ok", 5.0), config_id(c): Result("ok", 4.0)},
           ks[256]: {config_id(h): Result("ok", 5.0), config_id(c): Result("ok", 5.04)},
           ks[512]: {config_id(h): Result("ok", 5.0), config_id(c): Result("ok", 5.2)}}
    heur = {k: h for k in ks.values()}
    no_slower_at(entries, res, heur, fake.SPACE)
    # c: within 1% of the heuristic at 256, 4% slower at 512; N=64 is not a tuned key
    assert entries[ks[128]]["no_slower_at"] == [keys[256]]
    # the heuristic's config is the heuristic everywhere
    assert entries[ks[256]]["no_slower_at"] == [keys[128], keys[512]]
    assert entries[ks[512]]["no_slower_at"] == [keys[128], keys[256]]
    # a config not measured at a key, or against a heuristic that failed there, or that
    # failed itself, is not listed
    res[ks[256]].pop(config_id(c))
    res[ks[128]][config_id(h)] = Result("error")
    no_slower_at(entries, res, heur, fake.SPACE)
    assert entries[ks[512]]["no_slower_at"] == []
    assert entries[ks[256]]["no_slower_at"] == [keys[512]]


def test_tables_carry_no_slower_at_from_the_run(tmp_path, fake, results_env):
    """Two keys measured in full: each entry lists the other key when its config was
    measured there no slower than that key's heuristic (1%), as dispatch reads it."""
    tune(_opts(tmp_path, exhaustive=True, overrides={"N": [128, 256]}))
    tab = _table(tmp_path)
    st = Store(None, tmp_path, SLUG)
    by = {}
    for s in st.storage.get_all_studies():
        by[re.search(r"\[(.*?)\]", s.study_name).group(1)] = st.results(s.study_name)
    for e in tab["entries"]:
        other = [x for x in tab["entries"] if x is not e][0]
        okey = ",".join(f"{k}={other['key'][k]}" for k in sorted(other["key"]))
        r = by[okey]
        mine = r.get(config_id({k: e["config"][k] for k in fake.SPACE}))
        heur = r[config_id(fake.heuristic(other["key"], None))]
        held = mine is not None and mine.status == "ok" and mine.p50 <= heur.p50 * 1.01
        assert (other["key"] in e["no_slower_at"]) == held


@pytest.fixture
def results_env(monkeypatch):
    dispatch.clear_cache()
    yield
    dispatch.clear_cache()


def test_a_heuristic_outside_the_grid_is_the_baseline_and_gets_no_entry(tmp_path, fake):
    """The constraint rejects the heuristic's config: the search cannot measure it, the
    final re-timing still holds it as the baseline, and the table gets an entry only for
    a config that beats it."""
    rejected = {"BLOCK": 32, "W": 4, "S": 1}              # BLOCK < 32 * W
    assert not fake.SCALE.admits(rejected, KEY)
    orig_h, orig_run = fake.SCALE.heuristic, fake.SCALE.run
    fast = {"cfg": rejected}

    def run(x, cfg):   # every config but `fast["cfg"]` runs its work 40 times more: slower
        y = orig_run(x, cfg)   # in wall-clock (CPU) and in graph replays (GPU) alike
        if {k: cfg[k] for k in fake.SPACE} != fast["cfg"]:
            for _ in range(40):
                y = orig_run(x, cfg)
        return y

    fake.SCALE.tuning.heuristic, fake.SCALE.run = (lambda key, device: dict(rejected)), run
    try:
        tune(_opts(tmp_path, trials=3))
        assert not (tmp_path / SLUG / "fake_scale.json").exists()
        (row,) = _report(tmp_path)["keys"]
        assert row["chosen_from"] == "heuristic" and row["measured"] == 3
        assert rejected not in [info(t)["config"] for t in _trials(tmp_path)]
        fast["cfg"] = {"BLOCK": 256, "W": 2, "S": 1}
        (tmp_path / SLUG / JOURNAL).unlink()
        tune(_opts(tmp_path, exhaustive=True))
        (e,) = _table(tmp_path)["entries"]
        assert {k: e["config"][k] for k in fake.SPACE} == fast["cfg"]
        assert e["chosen_from"] == "search" and e["heuristic_p50_us"] > e["p50_us"]
    finally:
        fake.SCALE.tuning.heuristic, fake.SCALE.run = orig_h, orig_run


def test_resume_measures_only_what_the_store_lacks(tmp_path, fake):
    calls = []
    orig = fake.SCALE.run
    fake.SCALE.run = lambda x, cfg: (calls.append(config_id(
        {k: cfg[k] for k in fake.SPACE})), orig(x, cfg))[1]
    try:
        tune(_opts(tmp_path, trials=4))
        first = {info(t)["config_id"] for t in _trials(tmp_path)}
        assert len(first) == 4
        order = [info(t)["config"] for t in _trials(tmp_path)]
        assert order[0] == fake.heuristic(KEY, None)        # the heuristic first
        calls.clear()
        tune(_opts(tmp_path, trials=7))
        ev = [info(t)["config_id"] for t in _trials(tmp_path)]
        assert len(ev) == len(set(ev)) == 7 and first <= set(ev)
        searched = set(calls) - first
        assert len(searched) == 3, "the second run measured only the 3 new configs"
    finally:
        fake.SCALE.run = orig


def test_budget_cuts_a_key_but_keeps_one_config(tmp_path, fake):
    tune(_opts(tmp_path, budget_s=0.01))
    n = len(_trials(tmp_path))
    assert n == 1
    e = _table(tmp_path)["entries"][0]
    assert e["trials"]["evaluated"] == 1 and e["chosen_from"] == "heuristic"
    assert _report(tmp_path)["coverage"]["fraction"] == 0.0


def test_keys_measured_before_the_estimate_fell_are_topped_up(tmp_path, fake, monkeypatch):
    """The first plan prices configs at the cost model's guess (set to 1 s each here, on
    either device), so the first key gets part of its grid; once measured costs replace
    the guess the other keys get all of theirs, and the top-up pass brings the first key
    up to them."""
    from autotune.tune import budget
    for kind in ("cuda", "cpu"):
        monkeypatch.setitem(budget.GUESS, kind, {"config_s": 1.0, "key_s": 3.0,
                                                 "binary_s": 0.0})
    tune(_opts(tmp_path, preset="gpu", budget_s=40, trials=100))
    rep = _report(tmp_path)
    fractions = [f for _, f, _ in rep["coverage"]["history"]]
    assert fractions[0] < 1.0 and fractions[-1] == 1.0
    rows = rep["keys"]
    assert len(rows) == 4 and len({tuple(sorted(r["key"].items())) for r in rows}) == 4
    assert all(r["measured"] == r["admitted"] == r["planned"] for r in rows), rows
    assert len(_trials(tmp_path)) == sum(r["admitted"] for r in rows)   # none twice
    first = rows[0]
    assert first["key"] == {"dtype": "float32", "N": 64}
    assert first["seconds"] > 0 and rep["complete"] is True


def _store_trials(db_dir):
    try:
        return _trials(db_dir, "fake_slow", "cpu-interpreter")
    except Exception:  # noqa: BLE001 - not created yet
        return []


TUNE_SLOW = ["-m", "autotune", "tune", "--package", "fake_tunables", "--recipe", "fake_slow",
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
    rc = cli.main(["tune", "--package", "fake_tunables", "--recipe", "fake_scale",
                   "--results", str(tmp_path), "--no-progress"])
    assert rc == 2 and f"rm {path}" in capsys.readouterr().err


def test_encoding_and_sampler_follow_the_order_and_readiness(fake):
    from autotune.tune.search import KeySearch, Outcome

    grid = fake.SCALE.configs(KEY)
    order = sorted(grid, key=config_id)
    not_ready = {config_id(order[0]), config_id(order[1])}
    ks = KeySearch(fake.SPACE, order, limit=4,
                   ready=lambda c: config_id(c) not in not_ready,
                   resumed={config_id(order[2]): Result("ok", 1.0, config=order[2])})
    seen = []
    while ks.left():
        trial, cfg = ks.ask()
        seen.append(cfg)
        ks.tell(trial, cfg, Outcome("ok", 2.0, 2.0, 2.0))
        not_ready.clear()                     # compiled meanwhile
    # the first ready config first, the resumed one never, nothing past the limit
    assert seen == [order[3], order[0], order[1]]
    assert ks.ask() is None and ks.counts()["evaluated"] == 4
    assert Encoding(fake.SPACE).params(seen[0]) == ks.study.trials[1].params


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


def test_quality_report_smoke(tmp_path, fake):
    from autotune.quality import quality
    path = quality(_opts(tmp_path, budget_s=None), n_keys=2, seeds=2, min_grid=4,
                   max_grid=100)
    text = path.read_text()
    assert "Tuner quality" in text and "fake_scale" in text
    data = json.loads(path.with_suffix(".json").read_text())
    assert data["n_keys"] == 1 and data["keys"][0]["grid"] == 18
    k = data["keys"][0]
    assert k["measured"] == 18 and len(k["replays"]) == 2 and k["budget"] == 9
    assert all(r["trials_to_goal"] is None or 1 <= r["trials_to_goal"] <= 18
               for r in k["replays"])
    # the same study as tune's: a tune now finds the whole grid measured
    tune(_opts(tmp_path))
    assert _report(tmp_path)["keys"][0]["measured"] == 18


def test_quality_counts_only_complete_grids(tmp_path, fake, monkeypatch, capsys):
    """A key whose estimated cost does not fit is not started; one cut by the budget's hard
    stop is listed as incomplete and left out of the verdict; a later run resumes it."""
    from autotune import quality as Q
    monkeypatch.setenv("FAKE_SLOW_S", "0.05")
    for kind in ("cpu", "cuda"):            # the same guess on either device
        monkeypatch.setitem(Q.SECONDS_PER_CONFIG, kind, 0.5)

    def run(budget_s):
        path = Q.quality(_opts(tmp_path, recipes=["fake_slow"], budget_s=budget_s,
                               started=time.monotonic()),
                         n_keys=2, seeds=1, min_grid=4, max_grid=100)
        return path.read_text(), json.loads(path.with_suffix(".json").read_text())

    text, data = run(0.3)                  # 18 configs x 0.5 s (the guess above) > 0.3 s
    assert "fake_slow[N=256,dtype=float32]: not started" in capsys.readouterr().err
    (inc,) = data["incomplete"]
    assert data["n_keys"] == 0 and inc["measured"] == 0 and inc["grid"] == 18
    assert inc["why"].startswith("not started: 18 configs need ~9 s")
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


@pytest.mark.parametrize("complete,reached,verdict", [(12, 11, "MET"), (12, 10, "NOT MET"),
                                                      (11, 11, "NOT MET")])
def test_quality_verdict_needs_twelve_complete_keys(complete, reached, verdict):
    from autotune.quality import render_report
    rows = [_quality_row(i < reached) for i in range(complete)]
    incomplete = [{"recipe": "r", "key": {"N": 2}, "grid": 40, "measured": 7,
                   "why": "cut by the end of the budget"}]
    doc = render_report(rows, incomplete, torch.device("cpu"), "cpu-interpreter", Options(),
                        1, 0.03, 0.5, 1.0, grids=(30, 60),
                        command="python -m autotune quality --max-grid 60")
    assert doc["json"]["verdict"] == verdict and doc["json"]["n_keys"] == complete
    assert doc["json"]["grid_range"] == [30, 60]
    md = doc["markdown"]
    assert "whose grid has 30-60 configs" in md
    assert "made by `python -m autotune quality --max-grid 60`" in md
    assert f"**{reached} of {complete} complete keys**" in md and f"**{verdict}**" in md
    assert "`N=2`: 7 of 40 configs measured (cut by the end of the budget)" in md
    assert "- (outside the grid)" in md


def test_quality_replay_walks_the_tuners_order(fake):
    from autotune.quality import heuristic_time, replay
    from autotune.tune.plan import Job

    grid = fake.SCALE.configs(KEY)
    heur = fake.heuristic(KEY, None)
    job = Job(fake.SCALE, KEY, grid, "s", heur)
    times = {config_id(c): Result("ok", 10.0 + i, config=c) for i, c in enumerate(grid)}
    times[config_id(heur)] = Result("ok", 5.0, config=heur)      # the heuristic is best
    r = replay(job, times, seed=1, frac=0.5, within=0.03)
    assert r["trials_to_goal"] == 1 and r["ratio_at_budget"] == 1.0 and r["budget"] == 9
    assert heuristic_time(job, times) == {"us": 5.0, "note": None}
    assert heuristic_time(Job(fake.SCALE, KEY, grid, "s", None), times) == {
        "us": None, "note": "outside the grid"}
    times[config_id(heur)] = Result("error")
    assert heuristic_time(job, times) == {"us": None, "note": "error"}


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


class _FakePool:
    """A compile pool that compiles one queued binary (in its priority order) every
    fourth pump, and at once what the measuring side waits for."""

    def __init__(self):
        from autotune.tune.compile import PoolStats
        self.stats = PoolStats(workers=2)
        self.status, self.order, self.waited = {}, [], []
        self.pumps = 0

    def add(self, binaries):
        for b in binaries:
            self.status.setdefault(b, "queued")
            self.stats.probed += 1

    def prioritize(self, ordered):
        self.order = list(dict.fromkeys(ordered))

    def _compile(self, b):
        if self.status[b] == "queued":
            self.status[b] = "done"
            self.stats.compiled += 1
            self.stats.cpu_s += 0.5

    def pump(self):
        self.pumps += 1
        nxt = next((b for b in self.order if self.status[b] == "queued"), None)
        if nxt is not None and self.pumps % 4 == 0:
            self._compile(nxt)

    def wait(self, bids, timeout=1.0):
        self.waited.append(list(bids))
        for b in bids:
            self._compile(b)

    def ready(self, bids):
        return all(self.status.get(b) != "queued" for b in bids)

    def compiled(self, bid):
        return self.status.get(bid) == "done"

    def left(self):
        return sum(s == "queued" for s in self.status.values())

    def close(self):
        pass


def test_measuring_follows_the_compile_pool(tmp_path, fake, monkeypatch):
    """The run with a compile pool, on stand-ins: each config's binaries come from the
    probe, the pool gets the planned configs first in measurement order, a config is
    measured once its binaries are compiled (a later ready one first), and the report
    has the pool's numbers and the wait."""
    from autotune.tune import run as R

    pool = _FakePool()
    monkeypatch.setattr(R, "start_pool", lambda *a, **k: pool)

    def probe(run, inputs, configs):                 # configs share binaries by BLOCK
        per = {config_id(c): [f"B{c['BLOCK']}"] for c in configs}
        return per, {b[0]: b[0] for b in per.values()}

    monkeypatch.setattr(R, "probe", probe)
    uncompiled = []
    orig = fake.SCALE.run

    def run(x, cfg):
        if not pool.compiled(f"B{cfg['BLOCK']}"):
            uncompiled.append(cfg)
        return orig(x, cfg)

    fake.SCALE.run = run
    try:
        tune(_opts(tmp_path, trials=8))
    finally:
        fake.SCALE.run = orig
    heur = fake.heuristic(KEY, None)
    assert pool.order[0] == f"B{heur['BLOCK']}"      # the heuristic's binary goes first
    assert pool.waited and not uncompiled            # it waited rather than run one early
    measured = [info(t)["config"] for t in _trials(tmp_path)]
    assert len(measured) == 8
    r = _report(tmp_path)
    assert r["compile"]["pool"]["binaries"] == 4 and r["compile"]["pool"]["workers"] == 2
    assert "compile_wait" in r["phases"]


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


def test_quality_retimes_the_optimum_and_the_picks(fake):
    """`retime` times the optimum and each seed's pick again together; the verdict then
    rests on the re-timed ratio, not on the single measurements' lucky optimum."""
    from autotune.quality import render_report, retime

    opt, pick = {"BLOCK": 256, "W": 2, "S": 1}, {"BLOCK": 64, "W": 2, "S": 1}
    row = {**_quality_row(False), "optimum_config": opt, "optimum_us": 1.0}
    row["replays"] = [{**row["replays"][0], "best_at_budget_config": pick,
                       "ratio_at_budget": 1.05}]

    class M:
        final_reps, cuda, timed = 3, False, []

        def pace(self, us):
            pass

        def time(self, cfg, reps, phase):
            self.timed.append((config_id(cfg), phase))
            return Timing([1.0 if cfg == opt else 1.02] * reps)

    m = M()
    retime(row, lambda: m, rounds=2)
    assert len(m.timed) == 4 and {p for _, p in m.timed} == {"final"}
    assert row["replays"][0]["retimed_ratio"] == pytest.approx(1.02)
    doc = render_report([row] * 12, [], torch.device("cpu"), "cpu-interpreter", Options(),
                        1, 0.03, 0.5, 1.0)
    assert doc["json"]["verdict"] == "MET" and doc["json"]["passed_single_measurements"] == 0
    assert "| 1.050 | 1.020 |" in doc["markdown"]
    same = {**row, "replays": [{**row["replays"][0], "best_at_budget_config": opt}]}
    m.timed.clear()
    retime(same, lambda: m, rounds=2)                # the pick is the optimum: no timing
    assert m.timed == [] and same["replays"][0]["retimed_ratio"] == 1.0
