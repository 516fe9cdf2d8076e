"""The search over one key's space with Optuna, independent of how a config is measured
(a GPU measurement in `tune`, a lookup of recorded times in `quality`'s replay).

A study's trials are configs. Parameters whose choices are increasing numbers (block
sizes, splits, warps, stages) are suggested as an ordinal index (`suggest_int` over the
positions), so the sampler sees that 2048 lies between 1024 and 4096; any other parameter
is categorical. The sampler (`GridTPE`) is a seeded multivariate TPE with constant liar
(several workers on one study do not all propose the same config) that proposes only
configs the static constraint admits; `OrderSampler` walks a fixed order (exhaustive
measurements of `autotune quality`).

Each trial ends in one of these statuses (`status` in the trial's user attribute `tune`):
  ok         measured; value = p50 microseconds (state COMPLETE)
  wrong      outputs differ from `reference`: state FAIL, never chosen
  error      failed to compile, out of resources, or raised: state PRUNED
  invalid    the static constraint rejects it: PRUNED, nothing run
  duplicate  an already finished config: the earlier result is reused (memoised), nothing
             run; COMPLETE with the same value, or FAIL/PRUNED like the original
Only `ok`, `wrong` and `error` trials count as evaluated (they ran the kernel).
"""
from __future__ import annotations

import json
import math
import os
import socket
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable

import optuna
from optuna.trial import TrialState

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

EVALUATED = ("ok", "wrong", "error")


class WrongOutput(Exception):
    """A config's outputs differ from the reference (the trial is recorded as failed)."""


class TunerFatal(RuntimeError):
    """The device cannot go on (e.g. a sticky CUDA error): stop the tune."""


@dataclass
class Outcome:
    status: str                  # "ok" | "wrong" | "error"
    value: float | None = None   # p50 microseconds when ok
    p20: float | None = None
    p80: float | None = None
    error: str | None = None


def is_ordinal(choices) -> bool:
    vals = list(choices)
    if len(vals) < 2:
        return False
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
        return False
    return all(a < b for a, b in zip(vals, vals[1:], strict=False))


class Encoding:
    """Space <-> Optuna parameters."""

    def __init__(self, space: dict):
        self.space = {k: tuple(v) for k, v in space.items()}
        self.ordinal = {k: is_ordinal(v) for k, v in self.space.items()}

    def suggest(self, trial) -> dict:
        cfg = {}
        for name, choices in self.space.items():
            if len(choices) == 1:
                cfg[name] = choices[0]
            elif self.ordinal[name]:
                cfg[name] = choices[trial.suggest_int(name, 0, len(choices) - 1)]
            else:
                cfg[name] = trial.suggest_categorical(name, choices)
        return cfg

    def params(self, cfg: dict) -> dict | None:
        """Optuna params for a config (for enqueueing); None if not in the space."""
        out = {}
        for name, choices in self.space.items():
            v = cfg.get(name)
            if v not in choices:
                return None
            if len(choices) == 1:
                continue
            out[name] = choices.index(v) if self.ordinal[name] else v
        return out

    def distributions(self) -> dict:
        from optuna.distributions import CategoricalDistribution, IntDistribution
        out = {}
        for name, choices in self.space.items():
            if len(choices) == 1:
                continue
            out[name] = (IntDistribution(0, len(choices) - 1) if self.ordinal[name]
                         else CategoricalDistribution(choices))
        return out

    def config(self, params: dict) -> dict:
        cfg = {}
        for name, choices in self.space.items():
            if len(choices) == 1:
                cfg[name] = choices[0]
            elif self.ordinal[name]:
                cfg[name] = choices[int(params[name])]
            else:
                cfg[name] = params[name]
        return cfg


def config_id(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def make_sampler(seed: int, grid: list[dict], enc: Encoding) -> "GridTPE":
    """The sampler `tune` and `quality` use (`grid`: the configs the constraint admits)."""
    return GridTPE(enc, grid, seed=seed)


class GridTPE(optuna.samplers.BaseSampler):
    """Multivariate TPE (seeded, constant liar) that only proposes configs of the grid
    (the configs the static constraint admits), preferring ones not yet run.

    Start-up trials are drawn uniformly from the grid's unseen configs (not from the
    product of the choices, most of which a constraint may reject). After that, TPE
    proposes; a proposal outside the grid or already run is redrawn (TPE's candidates are
    random draws from its good-config density), up to `redraws` times, then an unseen
    grid config is taken at random. Invalid configs therefore never become trials.
    Every `local_every`-th proposal is instead an unseen neighbour (one parameter one
    step away) of one of the three best configs so far, a little hill-climbing that
    helped on simulated rugged grids. Once `tpe_until` of the grid has been tried (an
    exhaustive study's tail), unseen configs are taken at random without asking TPE.
    When every config of the grid is held by a trial, `exhausted` turns true (the search
    stops)."""

    def __init__(self, enc: Encoding, grid: list[dict], *, seed: int = 0,
                 n_startup: int | None = None, redraws: int = 16, tpe_until: float = 0.6,
                 local_every: int = 4):
        import random as _random

        self.enc = enc
        self.grid = {config_id(c): c for c in grid}
        self.n_startup = n_startup if n_startup is not None else \
            max(4, min(10, len(grid) // 20))
        self.redraws = redraws
        self.tpe_until = tpe_until
        self.local_every = local_every
        self._proposals = 0
        self.exhausted = False
        self.rng = _random.Random(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.tpe = optuna.samplers.TPESampler(
                seed=seed, multivariate=True, constant_liar=True, n_startup_trials=0)
        self._random = optuna.samplers.RandomSampler(seed=seed)

    def reseed_rng(self) -> None:
        self.tpe.reseed_rng()
        self._random.reseed_rng()

    def infer_relative_search_space(self, study, trial):
        return self.enc.distributions()

    def _held(self, study, trial) -> tuple[set, int]:
        held, n = set(), 0
        for t in study.get_trials(deepcopy=False):
            if t.number == trial.number or t.state == TrialState.WAITING:
                continue
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                n += 1
            if t.params:
                try:
                    held.add(config_id(self.enc.config(t.params)))
                except (KeyError, IndexError, TypeError):
                    pass
        return held, n

    def _local(self, snap, held: set) -> dict | None:
        """An unseen grid neighbour (one parameter one step away) of the best configs."""
        done = sorted((t for t in snap.get_trials(states=(TrialState.COMPLETE,))
                       if t.value is not None), key=lambda t: t.value)
        seen_best = set()
        for t in done[:3]:
            try:
                best = self.enc.config(t.params)
            except (KeyError, IndexError, TypeError):
                continue
            if config_id(best) in seen_best:
                continue
            seen_best.add(config_id(best))
            nbrs = []
            for name, choices in self.enc.space.items():
                if len(choices) < 2:
                    continue
                i = choices.index(best[name])
                steps = (i - 1, i + 1) if self.enc.ordinal[name] else range(len(choices))
                for j in steps:
                    if 0 <= j < len(choices) and j != i:
                        c = {**best, name: choices[j]}
                        cid = config_id(c)
                        if cid in self.grid and cid not in held:
                            nbrs.append(c)
            if nbrs:
                return self.enc.params(self.rng.choice(nbrs))
        return None

    def _unseen(self, held: set) -> dict:
        free = [cid for cid in self.grid if cid not in held]
        if not free:
            self.exhausted = True
            return self.enc.params(self.grid[self.rng.choice(list(self.grid))])
        return self.enc.params(self.grid[self.rng.choice(free)])

    def sample_relative(self, study, trial, search_space):
        if not search_space or not self.grid:
            return {}
        snap = _Snapshot(study, study.get_trials(deepcopy=False))
        held, n_done = self._held(snap, trial)
        if n_done < self.n_startup or \
                sum(c in held for c in self.grid) >= self.tpe_until * len(self.grid):
            return self._unseen(held)
        self._proposals += 1
        if self.local_every and self._proposals % self.local_every == 0:
            p = self._local(snap, held)
            if p is not None:
                return p
        for _ in range(self.redraws):
            p = self.tpe.sample_relative(snap, trial, search_space)
            if not p:
                break
            try:
                cid = config_id(self.enc.config(p))
            except (KeyError, IndexError, TypeError):
                continue
            if cid in self.grid and cid not in held:
                return p
        return self._unseen(held)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial):
        self.tpe.before_trial(study, trial)

    def after_trial(self, study, trial, state, values):
        self.tpe.after_trial(study, trial, state, values)


class _NoSystemAttrWrites:
    """Storage proxy: TPE's constant liar writes each proposal's relative params as a
    system attribute so other workers see them before the params are set; here the
    params are set right after sampling, so the redraws need not cost a write each."""

    def __init__(self, storage):
        self._storage = storage

    def set_trial_system_attr(self, *args, **kwargs):
        return None

    def __getattr__(self, name):
        return getattr(self._storage, name)


class _Snapshot:
    """A study seen through one read of its trials (TPE with constant liar otherwise reads
    every trial from the storage at each proposal)."""

    def __init__(self, study, trials):
        self._study = study
        self._trials = list(trials)
        self._storage = _NoSystemAttrWrites(study._storage)

    def _get_trials(self, deepcopy=False, states=None, use_cache=False):
        if states is None:
            return list(self._trials)
        return [t for t in self._trials if t.state in states]

    def get_trials(self, deepcopy=False, states=None):
        return self._get_trials(deepcopy, states)

    @property
    def trials(self):
        return list(self._trials)

    def __getattr__(self, name):
        return getattr(self._study, name)


class OrderSampler(optuna.samplers.BaseSampler):
    """Exhaustive search without a queue: each new trial takes the first config of `order`
    that no trial of the study holds yet (running, or finished having run; a trial that
    died without a result does not hold its config, so it is retried). Worker i takes
    the i-th free one, so concurrent workers rarely collide. When every config is held,
    `exhausted` turns true and trials fall back to random (memoised) proposals."""

    def __init__(self, enc: Encoding, order: list[dict], seed: int = 0, stride: int = 0):
        self.enc = enc
        self.order = [(config_id(c), enc.params(c)) for c in order]
        self.order = [(cid, p) for cid, p in self.order if p is not None]
        self.stride = stride
        self.exhausted = False
        self._random = optuna.samplers.RandomSampler(seed=seed)

    def infer_relative_search_space(self, study, trial):
        return self.enc.distributions()

    def sample_relative(self, study, trial, search_space):
        held = set()
        for t in study.get_trials(deepcopy=False):
            if t.number == trial.number:
                continue
            if t.state == TrialState.FAIL and info(t).get("status") not in EVALUATED:
                continue          # died (stale heartbeat): its config is free again
            if t.state == TrialState.RUNNING and not t.params:
                continue
            try:
                held.add(config_id(self.enc.config({**t.params})))
            except (KeyError, IndexError, TypeError):
                continue
        free = [p for cid, p in self.order if cid not in held]
        if not free:
            self.exhausted = True
            return {}
        return dict(free[min(self.stride, len(free) - 1)])

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._random.sample_independent(study, trial, param_name, param_distribution)


def worker_id(index: int | None = None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}" + (f":w{index}" if index is not None else "")


ATTR = "tune"    # one user attribute per trial (one store write): {status, config, ...}


def info(t) -> dict:
    """What the tuner recorded on a trial: status, config, config_id, worker, p20_us,
    p80_us, error, duplicate_of ({} for a trial that never got that far)."""
    v = t.user_attrs.get(ATTR)
    return v if isinstance(v, dict) else {}


@dataclass
class StudyCounts:
    evaluated: int = 0           # distinct configs that ran
    ok: int = 0
    wrong: int = 0
    errors: int = 0
    proposals: int = 0           # finished trials of any kind
    by_worker: dict = field(default_factory=dict)


class View:
    """What one process knows of a study: per config the first evaluated trial (for
    memoising duplicates) and the counts. Refreshed from the store at most every
    `refresh_s` seconds (other workers' trials), and updated at once with our own."""

    def __init__(self, study, refresh_s: float = 1.0):
        self.study = study
        self.refresh_s = refresh_s
        self.last = -1e9
        self.refresh()

    def refresh(self) -> None:
        self.memo = {}                 # config_id -> (state, value, status, number)
        c = StudyCounts()
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.WAITING, TrialState.RUNNING):
                continue
            c.proposals += 1
            d = info(t)
            st = d.get("status")
            if st not in EVALUATED:
                continue
            cid = d.get("config_id")
            if cid in self.memo:
                continue
            self.memo[cid] = (t.state, t.value, st, t.number)
            self._count(c, st, d.get("worker", "?"))
        self.counts = c
        self.last = time.monotonic()

    @staticmethod
    def _count(c: StudyCounts, st: str, w: str) -> None:
        c.evaluated += 1
        c.ok += st == "ok"
        c.wrong += st == "wrong"
        c.errors += st == "error"
        c.by_worker[w] = c.by_worker.get(w, 0) + 1

    def maybe_refresh(self) -> None:
        """Refresh when stale; at every trial once other workers are seen (so that
        together they stop close to the target)."""
        shared = len(self.counts.by_worker) > 1
        if shared or time.monotonic() - self.last >= self.refresh_s:
            self.refresh()

    def record(self, cid: str, state, value, st: str, number: int, worker: str) -> None:
        c = self.counts
        c.proposals += 1
        if st in EVALUATED and cid not in self.memo:
            self.memo[cid] = (state, value, st, number)
            self._count(c, st, worker)


def study_counts(study) -> StudyCounts:
    return View(study).counts


def ok_trials(study) -> list:
    """COMPLETE, measured (not duplicate) trials, fastest first, one per config."""
    best = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        d = info(t)
        if d.get("status") != "ok" or t.value is None:
            continue
        cid = d.get("config_id")
        if cid not in best or t.value < best[cid].value:
            best[cid] = t
    return sorted(best.values(), key=lambda t: t.value)


def wrong_configs(study) -> list[dict]:
    out, seen = [], set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)):
        d = info(t)
        if d.get("status") == "wrong" and d.get("config_id") not in seen:
            seen.add(d.get("config_id"))
            out.append(d.get("config"))
    return out


def search(study, enc: Encoding, admits: Callable[[dict], bool],
           evaluate: Callable[[dict], Outcome], *, target: int, grid_size: int,
           deadline: float | None = None, worker: str = "",
           on_trial: Callable[[str, dict, Outcome | None], None] | None = None,
           max_proposals: int | None = None, refresh_s: float = 1.0,
           until: Callable[[], bool] | None = None) -> StudyCounts:
    """Run trials on `study` until `target` distinct configs have been evaluated (by all
    workers together), the sampler has handed out every config of the grid (its
    `exhausted`), or `deadline` (time.monotonic()) passes, after at
    least one evaluated config, or `until()` says so. Returns the study's counts."""
    max_proposals = max_proposals or (10 * target + 100)
    view = View(study, refresh_s)

    def done(c: StudyCounts) -> bool:
        if c.evaluated >= min(target, grid_size) or c.proposals >= max_proposals:
            return True
        if getattr(study.sampler, "exhausted", False):
            return True
        if until is not None and until():
            return True
        return deadline is not None and time.monotonic() >= deadline and c.evaluated > 0

    if done(view.counts):
        return view.counts

    def objective(trial):
        cfg = enc.suggest(trial)
        cid = config_id(cfg)
        rec = {"config": cfg, "config_id": cid, "worker": worker}
        recorded = False
        try:
            if not admits(cfg):
                rec["status"] = "invalid"
                if on_trial:
                    on_trial("invalid", cfg, None)
                raise optuna.TrialPruned("rejected by the static constraint")
            prev = view.memo.get(cid)
            if prev is not None:
                state, value, st, number = prev
                rec["status"] = "duplicate"
                rec["duplicate_of"] = number
                if on_trial:
                    on_trial("duplicate", cfg, None)
                if state == TrialState.COMPLETE:
                    return value
                if st == "wrong":
                    raise WrongOutput(f"config {cfg} (same as trial {number})")
                raise optuna.TrialPruned(f"same as trial {number}")
            out = evaluate(cfg)
            rec["status"] = out.status
            if out.error:
                rec["error"] = out.error[:500]
            if out.p20 is not None:
                rec["p20_us"], rec["p80_us"] = out.p20, out.p80
            if on_trial:
                on_trial(out.status, cfg, out)
            state = {"ok": TrialState.COMPLETE, "wrong": TrialState.FAIL}.get(
                out.status, TrialState.PRUNED)
            view.record(cid, state, out.value, out.status, trial.number, worker)
            recorded = True
            if out.status == "ok":
                return out.value
            if out.status == "wrong":
                raise WrongOutput(f"config {cfg}: outputs differ from the reference")
            raise optuna.TrialPruned(out.error or "error")
        finally:
            trial.set_user_attr(ATTR, rec)
            if not recorded:
                view.record(cid, None, None, rec.get("status", ""), trial.number, worker)

    def stop_when_done(st, _trial):
        view.maybe_refresh()
        if done(view.counts):
            st.stop()

    while True:
        timeout = None if deadline is None else max(0.001, deadline - time.monotonic())
        try:
            study.optimize(objective, timeout=timeout, catch=(WrongOutput,),
                           callbacks=[stop_when_done])
            break
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as exc:
            # SQLite has no row locks: two workers may pop the same enqueued trial; the
            # one that finishes second cannot update it ("Cannot tell a COMPLETE trial",
            # UpdateFinishedTrialError). The other did the work: go on.
            if isinstance(exc, ValueError) and "Cannot tell" not in str(exc):
                raise
            view.refresh()
            if done(view.counts):
                break
    view.refresh()
    return view.counts


def target_trials(grid_size: int, trials: int | None, frac: float) -> int:
    """Configs a sampled study evaluates: `trials`, else `frac` of the grid (at least 8)."""
    if trials:
        return max(1, min(grid_size, trials))
    return max(1, min(grid_size, max(8, math.ceil(frac * grid_size))))
