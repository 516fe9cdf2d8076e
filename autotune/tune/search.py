"""The search over one key's grid with Optuna: which config is measured next.

The grid is the configs the recipe's static constraint admits for the key. It is walked
in one fixed order, chosen so that a budget that stops a key part-way leaves the configs
most likely to win measured (`order_configs`): the heuristic's config first (dispatch's
fallback, and what every other config has to beat), then the config the table being
rewritten holds for the key, then the rest by their distance from the heuristic's config
(in steps along each parameter's choices), ties in a seeded random order. The heuristic
is the measured rule of thumb of each recipe, so the optimum is usually a few steps away
from it (`autotune quality` measures how far, over whole grids).

Each key has an Optuna study whose sampler (`GridOrderSampler`) proposes the first config
of that order, within the part of the grid the budget plans for the key, that no trial
holds yet and whose kernels are compiled (so the measurement loop never waits for the
compile pool while a later config is ready). The study lives in memory while the key is
measured (`KeySearch`: an ask/tell costs well under a millisecond there) and every
finished trial goes to the durable store (`autotune.tune.store`), from which a later run
resumes: a config the store holds is never measured again.

Trials record one user attribute `tune` (`info`): status, config, config_id, worker,
p20_us/p80_us, error. Statuses:
  ok     measured; value = p50 microseconds (state COMPLETE)
  wrong  outputs differ from the reference: state FAIL, never chosen
  error  failed to compile, out of resources, or raised: state PRUNED
"""
from __future__ import annotations

import json
import math
import random
import warnings
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState, create_trial

warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

EVALUATED = ("ok", "wrong", "error")
ATTR = "tune"          # the one user attribute of a trial
STATES = {"ok": TrialState.COMPLETE, "wrong": TrialState.FAIL, "error": TrialState.PRUNED}


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
    """Space <-> Optuna parameters. Parameters whose choices are increasing numbers are
    an index over the choices (an ordinal: 2048 lies between 1024 and 4096); others are
    categorical; single-choice parameters are not Optuna parameters at all."""

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
        """Optuna params for a config; None if it is not in the space."""
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

    def steps(self, a: dict, b: dict) -> int:
        """Distance between two configs of the space: index steps along each ordinal
        parameter, 1 for each other parameter that differs."""
        d = 0
        for name, choices in self.space.items():
            if a[name] == b[name]:
                continue
            if self.ordinal[name]:
                d += abs(choices.index(a[name]) - choices.index(b[name]))
            else:
                d += 1
        return d


def config_id(cfg: dict) -> str:
    return json.dumps(cfg, sort_keys=True, default=str)


def space_config(cfg: dict, space: dict) -> dict:
    """The parameters of `space` from a config (a heuristic's may hold more fields)."""
    return {k: cfg[k] for k in space}


def order_configs(grid: list[dict], space: dict, heuristic: dict | None, *, seed: int,
                  first: tuple = ()) -> list[dict]:
    """The grid in the order a key is measured: `first` (configs of the grid, e.g. the
    heuristic's and the previous table's; others dropped), then the rest by their
    distance from `heuristic` (`Encoding.steps`), ties in the order of a
    `random.Random(seed)` shuffle."""
    enc = Encoding(space)
    ids = {config_id(c): c for c in grid}
    head, seen = [], set()
    for c in first:
        if c is None or enc.params(c) is None:
            continue
        cid = config_id(space_config(c, space))
        if cid in ids and cid not in seen:
            seen.add(cid)
            head.append(ids[cid])
    rest = [c for c in grid if config_id(c) not in seen]
    tie = list(range(len(rest)))
    random.Random(seed).shuffle(tie)
    if heuristic is not None and enc.params(heuristic) is not None:
        h = space_config(heuristic, space)
        dist = [enc.steps(c, h) for c in rest]
    else:
        dist = [0] * len(rest)
    rank = sorted(range(len(rest)), key=lambda i: (dist[i], tie[i]))
    return head + [rest[i] for i in rank]


class GridOrderSampler(optuna.samplers.BaseSampler):
    """Proposes configs in a fixed order (`order_configs`): the first of the first
    `limit` that no trial holds and `ready(config)` accepts, else the first not held.
    `held` is kept by the sampler itself (the study is one process's), so a proposal
    costs no read of the study's trials."""

    def __init__(self, enc: Encoding, order: list[dict], *, limit: int | None = None,
                 ready=None, seed: int = 0):
        self.enc = enc
        self.order = [(config_id(c), c) for c in order]
        self.limit = len(self.order) if limit is None else limit
        self.ready = ready
        self.held: set = set()
        self._random = optuna.samplers.RandomSampler(seed=seed)

    def hold(self, cid: str) -> None:
        self.held.add(cid)

    def planned(self) -> list:
        return self.order[: self.limit]

    def left(self) -> int:
        return sum(cid not in self.held for cid, _ in self.planned())

    def next(self) -> tuple[str, dict] | None:
        free = [(cid, c) for cid, c in self.planned() if cid not in self.held]
        if not free:
            return None
        if self.ready is not None:
            for cid, c in free:
                if self.ready(c):
                    return cid, c
        return free[0]

    def infer_relative_search_space(self, study, trial):
        return self.enc.distributions()

    def sample_relative(self, study, trial, search_space):
        nxt = self.next()
        if nxt is None:
            return {}
        self.hold(nxt[0])
        return self.enc.params(nxt[1]) if search_space else {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._random.sample_independent(study, trial, param_name, param_distribution)


def info(t) -> dict:
    """What the tuner recorded on a trial ({} for a trial without it)."""
    v = t.user_attrs.get(ATTR)
    return v if isinstance(v, dict) else {}


@dataclass
class Result:
    """One config's measurement at one key."""
    status: str
    p50: float | None = None
    p20: float | None = None
    p80: float | None = None
    error: str | None = None
    config: dict | None = None


def results_of(trials) -> dict:
    """config_id -> Result of the first evaluated trial of each config."""
    out = {}
    for t in trials:
        d = info(t)
        st, cid = d.get("status"), d.get("config_id")
        if st not in EVALUATED or cid is None or cid in out:
            continue
        out[cid] = Result(st, t.value if st == "ok" else None, d.get("p20_us"),
                          d.get("p80_us"), d.get("error"), d.get("config"))
    return out


def frozen_trial(enc: Encoding, cfg: dict, out: Outcome, worker: str):
    """The finished trial of a measurement, as the store keeps it."""
    rec = {"status": out.status, "config": cfg, "config_id": config_id(cfg), "worker": worker}
    if out.error:
        rec["error"] = out.error[:500]
    if out.p20 is not None:
        rec["p20_us"], rec["p80_us"] = out.p20, out.p80
    return create_trial(state=STATES[out.status],
                        value=out.value if out.status == "ok" else None,
                        params=enc.params(cfg), distributions=enc.distributions(),
                        user_attrs={ATTR: rec})


class KeySearch:
    """One key's search: an in-memory Optuna study driven by ask/tell through a
    `GridOrderSampler`; `resumed` (config_id -> Result, from the store) counts as done.
    `results` holds every config measured so far, resumed ones included."""

    def __init__(self, space: dict, order: list[dict], *, limit: int, ready=None,
                 resumed: dict | None = None, worker: str = "", seed: int = 0):
        self.enc = Encoding(space)
        self.worker = worker
        self.sampler = GridOrderSampler(self.enc, order, limit=limit, ready=ready, seed=seed)
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        self.study = optuna.create_study(direction="minimize", sampler=self.sampler)
        self.results = dict(resumed or {})
        known = [(cid, r) for cid, r in self.results.items() if r.config is not None]
        if known:
            self.study.add_trials([frozen_trial(self.enc, r.config, Outcome(
                r.status, r.p50, r.p20, r.p80, r.error), self.worker) for _, r in known])
        for cid in self.results:
            self.sampler.hold(cid)

    def left(self) -> int:
        """Planned configs not measured yet."""
        return self.sampler.left()

    def peek(self) -> dict | None:
        nxt = self.sampler.next()
        return None if nxt is None else nxt[1]

    def ask(self):
        """(trial, config) of the next planned config, or None when none is left."""
        if self.sampler.next() is None:
            return None
        trial = self.study.ask()
        return trial, self.enc.suggest(trial)

    def tell(self, trial, cfg: dict, out: Outcome):
        """Record a measurement; returns its trial as the store keeps it."""
        ft = frozen_trial(self.enc, cfg, out, self.worker)
        trial.set_user_attr(ATTR, ft.user_attrs[ATTR])
        self.study.tell(trial, out.value if out.status == "ok" else None,
                        state=STATES[out.status])
        self.results[config_id(cfg)] = Result(out.status, out.value, out.p20, out.p80,
                                              out.error, cfg)
        return ft

    def counts(self) -> dict:
        st = [r.status for r in self.results.values()]
        return {"evaluated": len(st), "wrong": st.count("wrong"), "errors": st.count("error")}


def best_ok(results: dict, n: int) -> list[tuple[str, Result]]:
    """The `n` fastest correct configs of `results`."""
    ok = [(cid, r) for cid, r in results.items() if r.status == "ok" and r.p50 is not None]
    ok.sort(key=lambda cr: cr[1].p50)
    return ok[:n]


def fraction_configs(grid_size: int, fraction: float, cap: int | None = None) -> int:
    """Configs a key measures at coverage `fraction` of its grid (at least one: the
    heuristic's), at most `cap`."""
    n = max(1, min(grid_size, math.ceil(fraction * grid_size - 1e-9)))
    return min(n, cap) if cap else n
