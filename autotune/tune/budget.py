"""The time budget: how much of every key's grid a tune can measure (its coverage).

One fraction for all keys: each key measures the first `ceil(fraction * grid)` configs of
its order (at least one, the heuristic's; at most `--trials`), so a smaller budget lowers
every key's coverage alike and never skips a recipe. The fraction is the largest that the
cost model says fits the time left:

    max(keys left x per-key cost + configs left x per-config cost
          + binaries not yet loaded x per-load cost,
        binaries left x per-binary compile / workers + one key's work) + RESERVE_S
      <= time left

(the compile pool works beside the measuring process, which waits when it gets ahead:
the run ends with the slower of the two, and the last binaries still have a key's
configs and finalisation after them).
Per-key cost: inputs, references, the final re-timing, torch's timing, the table write.
Per-config cost: a host part (check, graph capture, bookkeeping) of a config whose
binaries the measuring process holds already, plus the GPU part of its timing, estimated
from the key's bytes (`gpu_seconds`). Per-load cost: what a binary's first use in the
measuring process adds to its config (Triton loads it: 25-40 ms on the H200, three times
a config's own cost; binaries are shared between keys and configs, so late in a run most
configs load none, and one mean over all configs prices them too high). Each starts from
a guess (`GUESS`, on the high side) and moves to the mean of what the run measured, the
guess counting as `PRIOR` measurements on a GPU: the first keys are the smallest (B=1,
R=1) and cheaper than the mean; after the first alone (argmax R=1: 39 configs in 0.9 s)
a fresh tune's plan rose from 40% to 95% of every grid, its first keys measured most of
theirs, and the run ended at 40%.
The fraction is planned again as keys finish (`Coverage`), so the keys left take what
an early estimate got wrong either way.

Keys already measured are planned too, as a key's shortfall: at fraction f a finished key
whose measured prefix of its order is shorter than f of its grid still owes those configs
and its fixed cost once more (the run's top-up pass measures them at the end, fewest
first); one measured that far owes nothing. So an estimate that was high early (the
first configs of a run load every binary for the first time) does not leave the first
keys at a lower coverage than the last.

The GUESS figures, for one H200 host (16 cores): a search timing of a few-us kernel is a
graph capture of 20-32 launches (~1-2 ms of Python), ~3 ms of warm-up and replays behind a
1 ms GPU sleep, and a check of two input sets (~0.5 ms): ~8 ms with the bookkeeping, taken
as 10 ms. A key's fixed part (inputs, references, 3 rounds of re-timing 3 candidates,
torch's timing): ~0.3 s, taken as 0.5 s. One Triton binary: 0.5-2 s on one core, taken as
1 s (workers compile them side by side, and one found in Triton's cache takes ~10 ms).
"""
from __future__ import annotations

import math
import time

from .search import fraction_configs

GUESS = {"cuda": {"config_s": 0.010, "key_s": 0.5, "binary_s": 1.0, "load_s": 0.04},
         "cpu": {"config_s": 1.0, "key_s": 3.0, "binary_s": 0.0, "load_s": 0.0}}
PRIOR = {"cuda": {"key_s": 8, "config_s": 100, "load_s": 50},   # measurements each
         "cpu": {}}                                                # guess counts as
RESERVE_S = 8.0            # the end of a run: the last table, the report, the exit
BANDWIDTH = 2.5e12         # bytes/s a timed kernel is taken to move (the GPU part)
FRACTIONS = [i / 20 for i in range(20, -1, -1)]   # 1.0, 0.95, ..., 0.05, 0 (one config)


def gpu_seconds(nbytes: int, states: int, reps: int, calls: int | None = None) -> float:
    """GPU time of one search timing: (reps + warm-up and capture) replays of a graph of
    max(states, ~200 us worth, at most 20) calls of a kernel moving `nbytes`."""
    us = 2.0 + nbytes / BANDWIDTH * 1e6
    if calls is None:
        calls = max(states, min(20, math.ceil(200.0 / us)))
    return (reps + 5) * calls * us * 1e-6


class CostModel:
    """Per-key, per-config, per-load and per-binary costs: a guess until measured, then
    the mean of the measurements and the guess's `prior` weight."""

    def __init__(self, kind: str, workers: int):
        g = GUESS[kind]
        self.kind, self.workers = kind, workers
        self.guess = dict(g)
        self.prior = dict(PRIOR[kind])
        self.host_s: list[float] = []      # per config that loaded no binary, less its
                                           # GPU estimate
        self.loaded_host: list[tuple[float, int]] = []   # (the same, binaries loaded) of
                                                         # the others
        self.key_s: list[float] = []
        self.binary_mean: float | None = None

    def _mean(self, name: str, total: float, n: float) -> float:
        """The measured mean, the guess counting as `prior[name]` measurements."""
        w = self.prior.get(name, 0)
        if n + w <= 0:
            return self.guess.get(name, 0.0)
        return (total + w * self.guess.get(name, 0.0)) / (n + w)

    def per_key(self) -> float:
        return self._mean("key_s", sum(self.key_s), len(self.key_s))

    def per_config_host(self) -> float:
        return self._mean("config_s", sum(self.host_s), len(self.host_s))

    def per_binary(self) -> float:
        return self.binary_mean if self.binary_mean is not None else self.guess["binary_s"]

    def per_load(self) -> float:
        """What a binary's first use adds to its config's host time: the configs that
        loaded binaries, over the per-config cost, shared by the binaries they loaded."""
        extra = sum(h for h, _ in self.loaded_host) - \
            len(self.loaded_host) * self.per_config_host()
        return max(0.0, self._mean("load_s", extra, sum(n for _, n in self.loaded_host)))

    def observe_config(self, seconds: float, gpu_s: float, loads: int = 0) -> None:
        """A measured config: its seconds, its GPU estimate and how many binaries its
        check loaded into the measuring process."""
        host = max(0.0, seconds - gpu_s)
        if loads > 0:
            self.loaded_host.append((host, loads))
        else:
            self.host_s.append(host)

    def observe_key(self, seconds: float) -> None:
        self.key_s.append(seconds)

    def observe_binaries(self, mean_s: float | None) -> None:
        if mean_s is not None:
            self.binary_mean = mean_s

    def as_dict(self) -> dict:
        return {"per_config_host_s": round(self.per_config_host(), 4),
                "per_load_s": round(self.per_load(), 4),
                "per_key_s": round(self.per_key(), 3),
                "per_binary_s": round(self.per_binary(), 3), "workers": self.workers,
                "measured": {"configs": len(self.host_s) + len(self.loaded_host),
                             "configs_loading": len(self.loaded_host),
                             "keys": len(self.key_s)}}


class OrderBins(list):
    """A key's binaries, one set per config of its order, with the union of each prefix
    cached: the plan prices a handful of fractions after every key, over every key."""

    def __init__(self, sets):
        super().__init__(sets)
        self._prefix: dict = {}

    def prefix(self, n: int) -> frozenset:
        u = self._prefix.get(n)
        if u is None:
            u = self._prefix[n] = frozenset().union(*self[:n])
        return u


def prefix_bins(order_bins, n: int):
    """The binaries of the first `n` configs (an `OrderBins` or a list of sets)."""
    if isinstance(order_bins, OrderBins):
        return order_bins.prefix(n)
    return set().union(*order_bins[:n])


class Coverage:
    """Plans the fraction for the keys, each given as (grid size, `done`: done[n] = how
    many of the first n configs of its order the store holds already, GPU seconds of one
    of its configs, the binaries of its order's configs as a list of sets[, finished]);
    a finished key costs nothing where it holds the fraction's configs already.
    `compiled(bid)` says whether a binary needs no more compiling (None: none does);
    `loaded` is the set of binaries the measuring process holds (None: loads are not
    priced)."""

    def __init__(self, budget_s: float | None, started: float, model: CostModel, *,
                 cap: int | None = None, exhaustive: bool = False, clock=time.monotonic):
        self.end = started + budget_s if budget_s else None
        self.model, self.cap, self.exhaustive, self.clock = model, cap, exhaustive, clock
        self.fraction = 1.0
        self.history: list = []           # (seconds into the run, fraction, estimate)
        self.started = started

    def left(self) -> float:
        return math.inf if self.end is None else self.end - self.clock()

    def estimate(self, jobs, fraction: float, compiled, loaded=None) -> float:
        m = self.model
        host = m.per_config_host()     # a mean over every config measured: once, not a key
        conf_s, bins, keys = 0.0, set(), 0
        for grid, done, gpu_s, order_bins, *finished in jobs:
            n = fraction_configs(grid, fraction, self.cap)
            owed = max(0, n - done[n])
            if finished and finished[0] and not owed:
                continue
            keys += 1
            conf_s += owed * (host + gpu_s)
            if compiled is not None or loaded is not None:
                bins.update(prefix_bins(order_bins, n))
        if not keys:
            return RESERVE_S
        todo = sum(1 for b in bins if not compiled(b)) if compiled is not None else 0
        if loaded is not None:
            conf_s += m.per_load() * len(bins.difference(loaded))
        main_s = keys * m.per_key() + conf_s
        if not m.workers or not todo:
            return main_s + RESERVE_S
        comp_s = todo * m.per_binary() / m.workers + m.per_key() + conf_s / keys
        return max(main_s, comp_s) + RESERVE_S

    def plan(self, jobs, compiled, loaded=None) -> float:
        """The largest fraction in FRACTIONS whose estimate fits the time left (1.0
        without a budget or with --exhaustive; 0, one config a key, when none fits)."""
        jobs = list(jobs)
        if self.exhaustive or self.end is None:
            f, est = 1.0, None
        else:
            left = self.left()
            lo, hi = 0, len(FRACTIONS) - 1          # FRACTIONS falls: find the first fit
            if self.estimate(jobs, FRACTIONS[hi], compiled, loaded) > left:
                lo = hi
            while lo < hi:
                mid = (lo + hi) // 2
                if self.estimate(jobs, FRACTIONS[mid], compiled, loaded) <= left:
                    hi = mid
                else:
                    lo = mid + 1
            f = FRACTIONS[lo]
            est = self.estimate(jobs, f, compiled, loaded)
        self.fraction = f
        self.history.append((round(self.clock() - self.started, 1), f,
                             None if est is None else round(est, 1)))
        return f

    def limit(self, grid: int) -> int:
        """Configs a key of `grid` configs measures at the current fraction."""
        if self.exhaustive:
            return grid
        return fraction_configs(grid, self.fraction, self.cap)
