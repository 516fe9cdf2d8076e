"""Time budgets on a fake clock: `tune`'s coverage (`autotune.tune.budget.Coverage`: one
fraction of every grid, re-planned as keys finish) and `quality`'s choice of which
exhaustive grids to start (`autotune.quality.GridPacer`)."""
import math

import pytest

from autotune.quality import GridPacer
from autotune.tune.budget import RESERVE_S, CostModel, Coverage, OrderBins
from autotune.tune.search import fraction_configs


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _jobs(grids, bins_per_config=1, shared=False, gpu_s=0.0):
    """Planning views: key i's config c runs binary (i, c), or (0, c) when shared."""
    out = []
    for i, g in enumerate(grids):
        order_bins = [{(0 if shared else i, c, b) for b in range(bins_per_config)}
                      for c in range(g)]
        out.append((g, [0] * (g + 1), gpu_s, order_bins))
    return out


def _model(config_s=0.01, key_s=0.5, binary_s=1.0, workers=10):
    m = CostModel("cuda", workers)
    m.guess = {"config_s": config_s, "key_s": key_s, "binary_s": binary_s}
    m.prior = {}                      # the measured means alone (test_guess_weighs_in)
    return m


def test_order_bins_prices_the_same_as_a_list():
    """The run's cached prefix unions give the estimate a plain list of sets gives."""
    clock = Clock()
    cov = Coverage(1000.0, clock(), _model(), clock=clock)
    jobs = _jobs([100, 37, 200], bins_per_config=2, shared=True)
    cached = [(g, done, s, OrderBins(ob)) for g, done, s, ob in jobs]
    odd = lambda b: b[1] % 2 == 1                                   # noqa: E731
    for f in (0.0, 0.05, 0.5, 0.95, 1.0):
        for _ in range(2):                                          # cold, then cached
            assert cov.estimate(cached, f, odd) == cov.estimate(jobs, f, odd)
    ob = cached[1][3]
    assert ob.prefix(3) == {(0, c, b) for c in range(3) for b in range(2)}
    assert ob.prefix(0) == frozenset() and ob.prefix(37) == ob.prefix(99)


def test_the_estimate_is_the_arithmetic_of_the_docstring():
    clock = Clock()
    cov = Coverage(1000.0, clock(), _model(), clock=clock)
    jobs = _jobs([100, 200])
    # max(2 keys x 0.5 s + 300 configs x 10 ms,
    #     300 binaries x 1 s / 10 workers + a key's 0.5 s and 150 configs x 10 ms) + reserve
    assert cov.estimate(jobs, 1.0, lambda b: False) == pytest.approx(32.0 + RESERVE_S)
    # binaries shared by the keys are compiled once
    shared = _jobs([100, 200], shared=True)
    assert cov.estimate(shared, 1.0, lambda b: False) == pytest.approx(22.0 + RESERVE_S)
    # compiled ones cost nothing: the measuring process's own time counts
    assert cov.estimate(jobs, 1.0, lambda b: True) == pytest.approx(1.0 + 3.0 + RESERVE_S)
    assert cov.estimate(jobs, 1.0, None) == pytest.approx(1.0 + 3.0 + RESERVE_S)  # none left
    # half the grids: 50 + 100 configs (and binaries)
    assert cov.estimate(jobs, 0.5, lambda b: False) == pytest.approx(
        15.0 + 0.5 + 0.75 + RESERVE_S)
    # many binaries, few configs: the measuring process waits for the pool
    slow = _model(binary_s=10.0)
    cov2 = Coverage(1000.0, clock(), slow, clock=clock)
    assert cov2.estimate(jobs, 1.0, lambda b: False) == pytest.approx(
        300 + 0.5 + 1.5 + RESERVE_S)
    # configs the store holds already are not measured again (key 0: its first 40)
    done = [min(n, 40) for n in range(101)]
    jobs2 = [(100, done, 0.0, jobs[0][3])]
    assert cov.estimate(jobs2, 1.0, lambda b: True) == pytest.approx(0.5 + 0.6 + RESERVE_S)


def test_binaries_not_yet_loaded_are_priced_once():
    """A binary's first use in the measuring process costs a load once, whichever key
    uses it; binaries loaded already cost nothing; without `loaded` loads are not
    priced."""
    clock = Clock()
    m = _model(binary_s=0.0)
    m.guess["load_s"] = 0.1
    cov = Coverage(1000.0, clock(), m, clock=clock)
    jobs = _jobs([100, 200])
    base = 2 * 0.5 + 300 * 0.01 + RESERVE_S
    assert cov.estimate(jobs, 1.0, None) == pytest.approx(base)
    every = {(i, c, 0) for i in range(2) for c in range(200)}
    assert cov.estimate(jobs, 1.0, None, set()) == pytest.approx(base + 30.0)
    half = {b for b in every if b[1] < 50}
    assert cov.estimate(jobs, 1.0, None, half) == pytest.approx(base + 0.1 * (50 + 150))
    assert cov.estimate(jobs, 1.0, None, every) == pytest.approx(base)
    shared = _jobs([100, 200], shared=True)
    assert cov.estimate(shared, 1.0, None, set()) == pytest.approx(base + 20.0)
    # a plan that prices loads fits less of every grid in the same time
    tight = Coverage(20.0, clock(), m, clock=clock)
    assert tight.plan(jobs, None, set()) < Coverage(
        20.0, clock(), m, clock=clock).plan(jobs, None)


def test_a_configs_cost_leaves_out_the_binaries_it_loaded():
    """Configs that loaded no binary set the per-config cost; those that loaded some set
    what a load adds, shared by the binaries they loaded."""
    m = _model()
    assert m.per_load() == 0.0                       # the test model's guess: none
    for _ in range(10):
        m.observe_config(0.012, 0.0)
    for _ in range(5):
        m.observe_config(0.042, 0.0, loads=1)
    m.observe_config(0.072, 0.0, loads=2)
    assert m.per_config_host() == pytest.approx(0.012)
    assert m.per_load() == pytest.approx(0.03)
    d = m.as_dict()
    assert d["measured"]["configs"] == 16 and d["measured"]["configs_loading"] == 6
    assert d["per_load_s"] == pytest.approx(0.03)


def test_guess_weighs_in_until_measurements_outweigh_it():
    """On a GPU each guess counts as PRIOR measurements: one cheap first key moves the
    per-key cost a little, hundreds of keys set it."""
    from autotune.tune.budget import GUESS, PRIOR
    m = CostModel("cuda", 15)
    g, w = GUESS["cuda"], PRIOR["cuda"]
    assert m.per_key() == g["key_s"] and m.per_config_host() == g["config_s"]
    m.observe_key(0.05)
    assert m.per_key() == pytest.approx((0.05 + w["key_s"] * g["key_s"]) / (1 + w["key_s"]))
    assert m.per_key() > 0.8 * g["key_s"]
    for _ in range(400):
        m.observe_key(0.25)
    assert m.per_key() == pytest.approx(0.25, rel=0.02)
    m.observe_config(0.012, 0.0)
    m.observe_config(0.052, 0.0, loads=1)
    expect_host = (0.012 + w["config_s"] * g["config_s"]) / (1 + w["config_s"])
    assert m.per_config_host() == pytest.approx(expect_host)
    assert m.per_load() == pytest.approx(
        (0.052 - expect_host + w["load_s"] * g["load_s"]) / (1 + w["load_s"]))
    assert CostModel("cpu", 0).prior == {}          # the interpreter's guesses are rough


def test_coverage_falls_evenly_with_the_budget():
    clock = Clock()
    jobs = _jobs([96, 158, 158, 30, 540])
    seen = []
    for budget in (10_000, 150, 90, 60, 40, 20):
        cov = Coverage(budget, clock(), _model(), clock=clock)
        f = cov.plan(jobs, lambda b: False)
        assert cov.estimate(jobs, f, lambda b: False) <= budget or f == 0.0
        limits = [cov.limit(g) for g, *_ in jobs]
        assert limits == [fraction_configs(g, f) for g, *_ in jobs]
        seen.append(f)
    assert seen[0] == 1.0 and seen == sorted(seen, reverse=True) and seen[-1] < 0.2
    # every key keeps at least one config (its heuristic's), whatever the budget
    cov = Coverage(1.0, clock(), _model(), clock=clock)
    assert cov.plan(jobs, lambda b: False) == 0.0
    assert [cov.limit(g) for g, *_ in jobs] == [1] * 5


def test_no_budget_or_exhaustive_measures_everything_and_trials_cap_it():
    clock = Clock()
    jobs = _jobs([96, 158])
    for cov in (Coverage(None, clock(), _model(), clock=clock),
                Coverage(0, clock(), _model(), clock=clock),
                Coverage(1.0, clock(), _model(), exhaustive=True, clock=clock)):
        assert cov.plan(jobs, lambda b: False) == 1.0
        assert cov.limit(96) == 96
    cov = Coverage(None, clock(), _model(), cap=3, clock=clock)
    cov.plan(jobs, lambda b: False)
    assert cov.limit(96) == 3 and cov.limit(2) == 2


def test_replanning_follows_the_measured_costs():
    """Slower configs than guessed: the keys left get less; faster: more."""
    clock = Clock(0.0)
    m = _model(config_s=0.01, binary_s=0.0)
    cov = Coverage(100.0, 0.0, m, clock=clock)
    jobs = _jobs([1000] * 10)
    f0 = cov.plan(jobs, lambda b: True)
    assert 0.5 < f0 <= 1.0
    for _ in range(50):
        m.observe_config(0.05, 0.0)              # 5x the guess
    clock.t = 20.0
    f1 = cov.plan(jobs[2:], lambda b: True)
    assert f1 < f0
    m.host_s = [0.001] * 50                      # 10x faster than guessed
    f2 = cov.plan(jobs[2:], lambda b: True)
    assert f2 == 1.0
    assert [h[1] for h in cov.history] == [f0, f1, f2]


def test_the_gpu_part_of_a_config_counts():
    from autotune.tune.budget import gpu_seconds
    # a 1.6 MB read at 2.5 TB/s: 2.64 us a call; 32 input sets a replay; 25 replays
    assert gpu_seconds(1_600_000, 32, 20) == pytest.approx(25 * 32 * 2.64e-6)
    # a 100 MB read: 42 us a call, 5 calls make the ~200 us replay
    assert gpu_seconds(100_000_000, 1, 20) == pytest.approx(25 * 5 * 42e-6)
    m = _model()
    m.observe_config(0.011, 0.002)
    assert m.per_config_host() == pytest.approx(0.009)      # the GPU part left out


def test_pacer_starts_a_grid_only_if_it_fits():
    clock = Clock()
    p = GridPacer(100.0, per_config_s=0.5, clock=clock)
    assert p.fits(200) and not p.fits(201)
    clock.t += 60.0
    p.measured(60.0, 100)                  # 0.6 s per config measured
    assert p.per_config_s == pytest.approx(0.6)
    assert p.estimate(50) == pytest.approx(30.0)
    assert p.fits(66) and not p.fits(67)   # 40 s left
    p.measured(5.0, 0)                     # nothing new measured: no change
    assert p.per_config_s == pytest.approx(0.6)
    clock.t += 50.0
    assert not p.fits(1) and p.left() < 0
    assert GridPacer(None, 0.5).fits(10**9) and GridPacer(0, 0.5).end is None
    assert GridPacer(None, 0.5).left() == math.inf


def test_pacer_counts_the_time_a_key_takes_after_its_grid():
    clock = Clock()
    p = GridPacer(100.0, per_config_s=0.5, per_key_s=10.0, clock=clock)
    assert p.estimate(100) == pytest.approx(60.0)
    assert p.fits(180) and not p.fits(181)
    p.after_grid(4.0)
    p.after_grid(2.0)                      # the replays' mean replaces the guess
    assert p.estimate(0) == pytest.approx(3.0) and p.fits(194) and not p.fits(195)


def test_keys_run_in_rounds_over_recipes():
    from types import SimpleNamespace

    from autotune.tune.plan import Job, interleave

    def job(name, i):
        return Job(SimpleNamespace(name=name), {"i": i}, [], f"{name}{i}")

    jobs = [job("a", i) for i in range(3)] + [job("b", 0)] + [job("c", i) for i in range(2)]
    order = [(j.tunable.name, j.key["i"]) for j in interleave(jobs)]
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]


def test_finished_keys_count_only_what_they_lack():
    """A finished key that holds the fraction's configs costs nothing; one measured at a
    lower coverage owes the rest of its prefix and its fixed cost again (the top-up)."""
    clock = Clock()
    cov = Coverage(1000.0, clock(), _model(), clock=clock)
    (g, _, gpu_s, bins), = _jobs([100])
    full = (g, list(range(101)), gpu_s, bins, True)            # all 100 measured
    part = (g, [min(n, 20) for n in range(101)], gpu_s, bins, True)    # its first 20
    todo = (*_jobs([100])[0], False)
    compiled = lambda b: True                                      # noqa: E731
    assert cov.estimate([full], 1.0, compiled) == pytest.approx(RESERVE_S)
    assert cov.estimate([part], 1.0, compiled) == pytest.approx(0.5 + 80 * 0.01 + RESERVE_S)
    assert cov.estimate([part], 0.2, compiled) == pytest.approx(RESERVE_S)
    assert cov.estimate([todo, full, part], 1.0, compiled) == pytest.approx(
        2 * 0.5 + 180 * 0.01 + RESERVE_S)
    # a key not finished yet pays its fixed cost even when the store holds its prefix
    held = (g, list(range(101)), gpu_s, bins, False)
    assert cov.estimate([held], 1.0, compiled) == pytest.approx(0.5 + RESERVE_S)
