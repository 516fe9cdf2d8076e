"""Time budgets on a fake clock: `tune`'s shares over keys (`autotune.tuner.Budget`) and
`quality`'s choice of which exhaustive grids to start (`autotune.quality.GridPacer`)."""
import pytest

from autotune.quality import GridPacer
from autotune.tuner import Budget


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_shares_follow_the_weights_after_the_fixed_costs():
    clock = Clock()
    b = Budget(100.0, [1, 2, 1], fixed_s=10.0, clock=clock)
    # (100 s left - 3 keys x 10 s fixed) x 1 / 4
    assert b.share() == pytest.approx(17.5)
    clock.t += 10.0 + 17.5                 # as planned: the rest is shared the same way
    b.finished(27.5, 17.5)
    assert b.fixed_s == pytest.approx(10.0)
    assert b.share() == pytest.approx((72.5 - 20.0) * 2 / 3)


def test_the_fixed_cost_is_the_mean_measured():
    clock = Clock()
    b = Budget(200.0, [5] * 5, fixed_s=4.0, clock=clock)
    assert b.fixed_s == 4.0                # the guess until a key finished
    b.share()
    clock.t += 30.0
    b.finished(30.0, 22.0)                 # 8 s outside the search
    assert b.fixed_s == pytest.approx(8.0)
    b.share()
    clock.t += 20.0
    b.finished(20.0, 18.0)                 # 2 s
    assert b.fixed_s == pytest.approx(5.0)
    # 150 s left, 3 keys: 3 x 5 s set aside, equal weights
    assert b.share() == pytest.approx((150.0 - 15.0) / 3)


def test_a_late_key_gets_no_negative_share():
    clock = Clock()
    b = Budget(10.0, [3, 3], fixed_s=4.0, clock=clock)
    b.share()
    clock.t += 50.0                        # the first key overran the whole budget
    assert b.share() == 0.0
    assert b.next_deadline() is not None and b.next_deadline() >= clock.t   # list empty
    assert Budget(None, [1], 4.0).share() is None
    assert Budget(0, [1], 4.0).next_deadline() is None


def _run(weights, seconds, fixed_true, trial_s, fixed_guess, slow=None):
    """Jobs run the way `tune` runs them: half the fixed cost, the search (one trial at
    least, then until its target or its deadline, checked after each trial, as
    `autotune.search.search` does), the other half. Returns (trials per job, end)."""
    clock = Clock(0.0)
    b = Budget(seconds, weights, fixed_guess, clock=clock)
    trials = []
    for i, w in enumerate(weights):
        k0 = clock.t
        clock.t += fixed_true / 2
        s0 = clock.t
        deadline = b.next_deadline()
        n = 0
        while True:
            clock.t += trial_s * (slow or {}).get(i, 1.0)
            n += 1
            if n >= w or clock.t >= deadline:
                break
        search_s = clock.t - s0
        clock.t += fixed_true / 2
        b.finished(clock.t - k0, search_s)
        trials.append(n)
    return trials, clock.t


def test_the_run_ends_on_time_and_trials_follow_the_weights():
    weights = [100, 300, 200, 100, 300]
    trials, end = _run(weights, 300.0, fixed_true=6.0, trial_s=0.5, fixed_guess=4.0)
    assert end <= 300.0 + 0.5              # the guess was low, the mean fixed it
    assert end >= 290.0                    # and little was left unused
    per_weight = [n / w for n, w in zip(trials, weights, strict=True)]
    assert max(per_weight) / min(per_weight) < 1.25
    assert all(n < w for n, w in zip(trials, weights, strict=True))   # all budget-cut


def test_an_overrun_shrinks_later_shares_but_every_key_gets_a_trial():
    """The second key's one trial takes 20 s (100x what was planned): the keys after it
    get less and the run still ends on time; one of 60 s leaves nothing: the keys after
    it get their first trial each, none gets nothing."""
    weights = [50] * 8
    even, _ = _run(weights, 80.0, fixed_true=4.0, trial_s=0.2, fixed_guess=4.0)
    trials, end = _run(weights, 80.0, fixed_true=4.0, trial_s=0.2, fixed_guess=4.0,
                       slow={1: 100.0})
    assert trials[:2] == [even[0], 1]
    assert all(1 < t < e for t, e in zip(trials[2:], even[2:], strict=True))
    assert end <= 80.0
    trials, end = _run(weights, 80.0, fixed_true=4.0, trial_s=0.2, fixed_guess=4.0,
                       slow={1: 300.0})
    assert trials[:2] == [even[0], 1] and trials[2:] == [1] * 6
    assert end <= 80.0 + 60.0


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


def test_pacer_counts_the_time_a_key_takes_after_its_grid():
    clock = Clock()
    p = GridPacer(100.0, per_config_s=0.5, per_key_s=10.0, clock=clock)
    assert p.estimate(100) == pytest.approx(60.0)
    assert p.fits(180) and not p.fits(181)
    p.after_grid(4.0)
    p.after_grid(2.0)                      # the replays' mean replaces the guess
    assert p.estimate(0) == pytest.approx(3.0) and p.fits(194) and not p.fits(195)


def test_keys_run_in_rounds_over_recipes_and_exhaustive_keys_weigh_as_sampled():
    from types import SimpleNamespace

    from autotune.tuner import Job, Options, interleave, weight

    def job(name, i, grid, exhaustive):
        t = SimpleNamespace(name=name)
        return Job(t, {"i": i}, list(range(grid)), exhaustive,
                   grid if exhaustive else max(8, -(-3 * grid // 10)), f"{name}{i}")

    jobs = [job("a", i, 100, True) for i in range(3)] + [job("b", 0, 300, False)] \
        + [job("c", i, 20, True) for i in range(2)]
    order = [(j.tunable.name, j.key["i"]) for j in interleave(jobs)]
    assert order == [("a", 0), ("b", 0), ("c", 0), ("a", 1), ("c", 1), ("a", 2)]
    opts = Options()
    assert weight(jobs[0], opts) == 30          # exhaustive over 100: weighs 30% of it
    assert weight(jobs[3], opts) == 90          # sampled: its target
    assert weight(jobs[4], opts) == 8           # small grids: at least 8 (target_trials)
