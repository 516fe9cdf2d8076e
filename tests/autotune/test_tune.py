"""The tuner end to end: measuring and checking against the reference, failures, the final
rule, no_slower_at, resume, the budget, the compile pool, the report. (From the command
line: test_tune_cli.py; the quality check: test_quality.py.)"""
import json
import re
import time

import optuna
import pytest
import torch

from autotune.timing import Timing
from autotune.tune.main import tune
from autotune.tune.search import EVALUATED, Result, config_id, info
from autotune.tune.store import JOURNAL, Store
from recipes import _configs as dispatch
from tests.autotune.autotune_util import fake_fixture, tune_options  # noqa: F401

optuna.logging.set_verbosity(optuna.logging.ERROR)
KEY = {"dtype": "float32", "N": 256}
SLUG = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()


_opts = tune_options


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

