"""`python -m autotune quality`: how good is the tuner's search? For a set of keys, measure
every config of the space (the exhaustive optimum), then replay the tuner's Optuna search
(same sampler, heuristic enqueued first, duplicates memoised) over those measured times
with several seeds (`--seed` * 101 + replay), and report how many trials it needed to come within
3% of the optimum and what it found with the trial count `tune` uses (30% of the grid).

Writes `results/<gpu-slug>/tuner-quality.md` and `.json`.

Why a replay: a search is a sequence of configs; scoring it against one exhaustive
measurement of every config makes the Optuna result and the optimum comparable without
re-measurement noise, and lets several seeds be tried for the cost of one measurement.
The exhaustive measurements are studies in the same store (`exhaustive:` names), so a
killed `quality` run resumes.

Keys: up to `n_keys` (default 12) of the recipes' default "gpu" keys whose constrained
grid has between `min_grid` and `max_grid` configs, taken in turn from each recipe. The
defaults, 30..120, pick small grids so that at least `MIN_KEYS` complete ones fit the
budget: the 12 default keys hold ~900 configs, the first 10 ~710, and an H200 measured
~0.3 s a config (compiling included) in an earlier run.

Budget (`--budget-s`, default 300 s on a GPU, none on CPU) bounds the run from the
choice of keys on (start-up and imports come before it). Keys are taken one after
another: the grid is measured to its end once started (only the budget's end stops it:
a hard stop), then the replays run (CPU only, about a second per seed). A key is
started only if its estimated cost (its configs x the seconds per config measured so
far, plus its replays' time measured so far) fits the time left, else it is passed over
(a later, smaller one may fit). Only keys whose grid was measured completely count: the
others are listed as incomplete and left out of the verdict, which is MET when at least
`MIN_KEYS` complete keys were measured and at least 90% of them came within 3% of their
optimum with at most the trials `tune` runs (30% of the grid).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import statistics
import sys
import time
from pathlib import Path

from recipes.tables import gpu_slug

from .registry import key_str
from .search import (
    EVALUATED,
    Encoding,
    Outcome,
    config_id,
    info,
    make_sampler,
    search,
    study_counts,
    target_trials,
)
from .tables import _versions, device_info, write_json_atomic, write_text_atomic
from .tuner import (
    Job,
    Measurer,
    Options,
    Progress,
    _heuristic,
    open_store,
    prepare,
    quiet_optuna,
    resolve,
    results_dir,
    select_device,
    select_tunables,
)


def _spread(items: list) -> list:
    """Reorder so that any prefix is spread over the list: first, last, middle, ..."""
    n = len(items)
    if n <= 2:
        return list(items)
    order, seen = [], set()
    for idx in [0, n - 1]:
        order.append(idx)
        seen.add(idx)
    segs = [(0, n - 1)]
    while len(order) < n and segs:
        nxt = []
        for a, b in segs:
            m = (a + b) // 2
            if m not in seen:
                seen.add(m)
                order.append(m)
            if m - a > 1:
                nxt.append((a, m))
            if b - m > 1:
                nxt.append((m, b))
        segs = nxt
    order += [i for i in range(n) if i not in seen]
    return [items[i] for i in order]


def choose_keys(tunables, preset: str, n_keys: int, min_grid: int, max_grid: int):
    """Up to n_keys (tunable, key, grid) spread across recipes and over each recipe's keys."""
    per = []
    for t in tunables:
        cands = []
        for k in t.default_keys(preset):
            g = t.configs(k)
            if min_grid <= len(g) <= max_grid:
                cands.append((t, k, g))
        if cands:
            per.append(_spread(cands))
    out = []
    i = 0
    while len(out) < n_keys and any(i < len(p) for p in per):
        for p in per:
            if i < len(p) and len(out) < n_keys:
                out.append(p[i])
        i += 1
    return out


def measured_times(study) -> dict:
    """config_id -> (status, p50 or None) over the evaluated trials of a study."""
    out = {}
    for t in study.get_trials(deepcopy=False):
        d = info(t)
        if d.get("status") in EVALUATED and d.get("config_id") not in out:
            out[d["config_id"]] = (d["status"], t.value if d["status"] == "ok" else None)
    return out


def replay(t, key, grid, measured: dict, heur: dict | None, *, seed: int, frac: float,
           within: float) -> dict:
    """One seeded run of the tuner's sampled search over recorded times."""
    import optuna

    enc = Encoding(t.space)
    ok = [v for st, v in measured.values() if st == "ok"]
    opt = min(ok)
    goal = opt * (1.0 + within)
    n_grid = len(grid)
    budget = target_trials(n_grid, None, frac)
    study = optuna.create_study(direction="minimize",
                                sampler=make_sampler(seed, grid, enc))
    if heur is not None and t.admits(heur, key):
        p = enc.params(heur)
        if p is not None:
            study.enqueue_trial(p)
    traj = []

    def evaluate(cfg):
        st, v = measured.get(config_id(cfg), ("error", None))
        if st == "ok":
            return Outcome("ok", v, v, v)
        return Outcome(st, error="not measured" if st == "error" else None)

    def on_trial(status, cfg, out):
        if status in EVALUATED:
            traj.append(out.value if status == "ok" else math.inf)

    def reached() -> bool:
        return len(traj) >= budget and bool(traj) and min(traj) <= goal

    search(study, enc, lambda c: t.admits(c, key), evaluate, target=n_grid,
           grid_size=n_grid, on_trial=on_trial, until=reached,
           max_proposals=20 * n_grid + 200)
    best, to_goal = math.inf, None
    for i, v in enumerate(traj, 1):
        best = min(best, v)
        if to_goal is None and best <= goal:
            to_goal = i
    at_budget = min(traj[:budget]) if traj else math.inf
    return {"seed": seed, "trials_to_goal": to_goal, "evaluated": len(traj),
            "best_at_budget_us": at_budget, "ratio_at_budget": at_budget / opt,
            "budget": budget}


BUDGET_S = 300.0          # default measuring budget on a GPU (none on CPU)
MIN_KEYS = 10             # complete keys the verdict needs
SHARE_OK = 0.9            # ... of which this fraction must reach the goal
# seconds per config of an exhaustive grid before any is measured (then the measured
# mean): building inputs, compiling and timing, amortised (H200: ~0.3 s)
SECONDS_PER_CONFIG = {"cuda": 0.35, "cpu": 0.5}
REPLAY_S = 1.0            # seconds per replay (one seed) before one is timed


class GridPacer:
    """Which exhaustive grids to start within `seconds` (None or 0: no limit). A grid is
    started only if its estimated cost fits the time left: its configs x seconds per
    config, plus the time a key takes after its grid (its replays); each the mean
    measured so far, or `per_config_s` / `per_key_s` until then. A started grid runs to
    its end or to `end`, the hard stop. `clock` is injectable (tests)."""

    def __init__(self, seconds: float | None, per_config_s: float, per_key_s: float = 0.0,
                 *, clock=time.monotonic):
        self.clock = clock
        self.end = clock() + seconds if seconds else None
        self.per_config_s0, self.per_key_s0 = per_config_s, per_key_s
        self.seconds, self.configs = 0.0, 0
        self.after_s: list[float] = []

    @property
    def per_config_s(self) -> float:
        return self.seconds / self.configs if self.configs else self.per_config_s0

    @property
    def per_key_s(self) -> float:
        return sum(self.after_s) / len(self.after_s) if self.after_s else self.per_key_s0

    def left(self) -> float:
        return math.inf if self.end is None else self.end - self.clock()

    def estimate(self, n_configs: int) -> float:
        return n_configs * self.per_config_s + self.per_key_s

    def fits(self, n_configs: int) -> bool:
        return self.estimate(n_configs) <= self.left()

    def measured(self, seconds: float, n_configs: int) -> None:
        """A grid's measuring took `seconds` for `n_configs` new configs."""
        if n_configs > 0:
            self.seconds += seconds
            self.configs += n_configs

    def after_grid(self, seconds: float) -> None:
        """A key's work after its grid (its replays) took `seconds`."""
        self.after_s.append(seconds)


def grid_coverage(grid: list[dict], measured: dict) -> int:
    """How many configs of `grid` have an evaluated trial in `measured`."""
    return sum(config_id(c) in measured for c in grid)


def quality(opts: Options, *, n_keys: int = 12, seeds: int = 5, within: float = 0.03,
            min_grid: int = 30, max_grid: int = 120, measure: bool = True,
            out: str | None = None) -> Path:
    t0 = time.monotonic()
    device = select_device()
    cuda = device.type == "cuda"
    asked = opts.budget_s
    opts = resolve(opts, device)
    # tune's default budget does not apply here; 0: none
    opts.budget_s = (BUDGET_S if cuda else None) if asked is None else (asked or None)
    quiet_optuna()
    slug = gpu_slug(device)
    tunables = select_tunables(opts)
    chosen = choose_keys(tunables, opts.preset, n_keys, min_grid, max_grid)
    if not chosen:
        raise SystemExit("autotune quality: no key with a grid of "
                         f"{min_grid}..{max_grid} configs in preset {opts.preset!r}")
    storage = open_store(opts, slug)
    from .store import study_name

    jobs = [Job(t, k, g, True, len(g),
                study_name(slug, t.name, k, t.space_hash(), t.source_hash(), "exhaustive"),
                sampler="order")
            for t, k, g in chosen]
    print(f"autotune quality: up to {len(jobs)} keys, exhaustive over "
          f"{sum(len(j.grid) for j in jobs)} configs on {device_info(device)['gpu']}; "
          f"budget {opts.budget_s or 'none'} s", file=sys.stderr)
    pacer = GridPacer(opts.budget_s, SECONDS_PER_CONFIG["cuda" if cuda else "cpu"],
                      REPLAY_S * seeds)
    progress = Progress(sum(len(j.grid) for j in jobs), opts.progress, "exhaustive")
    pc = None
    if measure and cuda and opts.precompile_threads:
        from .precompile import Precompiler
        pc = Precompiler(opts.precompile_threads, max_per_job=10**6)
    rows, incomplete = [], []
    try:
        for j in jobs:
            study = prepare(j, storage, opts, device)
            why = _measure(j, study, opts, device, pacer, progress, pc) if measure else \
                "not measured in this run (--no-measure)"
            r0 = time.monotonic()
            row = _replays(j, study, device, opts, seeds, within)
            if "replays" in row:
                rows.append(row)
                pacer.after_grid(time.monotonic() - r0)
            else:
                incomplete.append({**row, "why": row.get("why") or why})
    finally:
        if pc is not None:
            pc.close()   # cancel queued compiles, or exit would wait for them
        progress.close()
    doc = _report(rows, incomplete, device, slug, opts, seeds, within,
                  time.monotonic() - t0)
    root = results_dir(opts) / slug
    md_path = Path(out) if out else root / "tuner-quality.md"
    write_text_atomic(md_path, doc["markdown"])
    write_json_atomic(md_path.with_suffix(".json"), doc["json"])
    print(doc["markdown"])
    print(f"autotune quality: wrote {md_path} in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)
    return md_path


def _measure(j: Job, study, opts: Options, device, pacer: GridPacer, progress,
             pc) -> str:
    """Measure what the store lacks of the key's grid if it fits the budget (`pacer`);
    returns why the grid may still be incomplete."""
    from .tuner import _search_job, exhaustive_order

    before = study_counts(study).evaluated
    left = len(j.grid) - before
    progress.update(min(before, len(j.grid)))
    if left <= 0:
        return "measured in an earlier run"
    if not pacer.fits(left):
        why = (f"not started: {left} configs need ~{pacer.estimate(left):.0f} s, "
               f"{max(0.0, pacer.left()):.0f} s were left")
        progress.write(f"autotune quality: {j.label}: {why}")
        progress.shrink(left)
        return why
    k0 = time.monotonic()
    progress.describe(j.label)
    m = Measurer(j.tunable, j.key, device, opts)
    if pc is not None:
        pc.submit(j, m.states[0], exhaustive_order(j, opts, device))
    _search_job(j, study, m, opts, pacer.end, "quality", progress)
    pacer.measured(time.monotonic() - k0, study_counts(study).evaluated - before)
    if m.unguarded:
        progress.write(f"autotune quality: {j.label}: {m.unguarded} timings not shown "
                       "free of host stalls (autotune.timing.time_graph)")
    return "cut by the end of the budget"


def _replays(j: Job, study, device, opts: Options, seeds: int, within: float) -> dict:
    """The key's report row: with its replays when its whole grid was measured, else
    what was measured (and "why" when the grid was but no config was correct)."""
    measured = measured_times(study)
    ok = [v for st, v in measured.values() if st == "ok"]
    done = grid_coverage(j.grid, measured)
    row = {"recipe": j.tunable.name, "key": j.key, "grid": len(j.grid), "measured": done}
    if done < len(j.grid) or not ok:
        return {**row, "why": None if done < len(j.grid) else
                "no config gave correct outputs"}
    heur = _heuristic(j, device)
    heur = {k: heur[k] for k in j.tunable.space if k in heur} if heur else None
    opt_cid = min((cid for cid, (st, v) in measured.items() if st == "ok"),
                  key=lambda c: measured[c][1])
    reps = [replay(j.tunable, j.key, j.grid, measured, heur, seed=opts.seed * 101 + s,
                   frac=opts.frac, within=within) for s in range(seeds)]
    return {**row, "optimum_us": min(ok), "optimum_config": json.loads(opt_cid),
            "heuristic": _heuristic_time(j, heur, measured), "replays": reps,
            "budget": reps[0]["budget"]}


def _heuristic_time(j: Job, heur: dict | None, measured: dict) -> dict:
    """The heuristic's config as the exhaustive measurement saw it: {"us": p50 or None,
    "note": None, "outside the grid", "no heuristic", or its trial's status}."""
    if heur is None:
        return {"us": None, "note": "no heuristic"}
    if not j.tunable.admits(heur, j.key):
        return {"us": None, "note": "outside the grid"}
    st, v = measured.get(config_id(heur), ("not measured", None))
    return {"us": v, "note": None if st == "ok" else st}


def _med(xs):
    return statistics.median(xs) if xs else None


def _report(rows, incomplete, device, slug, opts, seeds, within, elapsed) -> dict:
    info_d = device_info(device)
    ver = _versions()
    pct = round(within * 100)
    lines = [f"# Tuner quality on {info_d['gpu']}", ""]
    if info_d["interpreter"]:
        lines += ["**INTERPRETER SMOKE RUN**: times are the Triton interpreter's wall clock "
                  "on a CPU; this checks the machinery, not the tuner's quality on a GPU.", ""]
    lines += [
        f"Date {_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()}; "
        f"torch {ver['torch']}, Triton {ver['triton']}, Optuna {ver['optuna']}; "
        f"{len(rows)} complete keys ({len(incomplete)} incomplete, left out); {seeds} seeds "
        f"per key; budget {opts.budget_s or 'none'} s; {elapsed:.0f} s in all.",
        "",
        "Method: every config the static constraint admits was measured once "
        "(CUDA-graph replay median, as `tune` times a trial); the exhaustive optimum is the "
        "fastest. The tuner's sampled search (seeded multivariate TPE restricted to the "
        "configs the constraint admits, with some local moves around the best; heuristic "
        "config enqueued first; duplicate proposals memoised) was then replayed over those "
        "measurements. *Trials* count distinct configs run; duplicates and configs the "
        "constraint rejects cost no kernel run and are not counted. *Budget* is what "
        f"`tune` runs for a sampled key: {round(opts.frac * 100)}% of the grid. Only keys "
        "whose whole grid was measured are in the table and the verdict. The heuristic's "
        "time is its config's measurement in the grid.",
        "",
        f"| recipe | key | grid | optimum (us) | heuristic (us) | Optuna at budget (us) | "
        f"ratio | trials to within {pct}% (median / max of seeds) | % of grid | budget |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    passed, keys_json = 0, []
    for r in rows:
        reps = r["replays"]
        tg = [x["trials_to_goal"] for x in reps]
        found = [x for x in tg if x is not None]
        med = _med([x if x is not None else math.inf for x in tg])
        worst = max(x if x is not None else math.inf for x in tg)
        ratio = _med([x["ratio_at_budget"] for x in reps])
        at_budget = _med([x["best_at_budget_us"] for x in reps])
        ok = med is not None and med <= r["budget"]
        passed += ok
        pct_grid = (med / r["grid"] * 100) if med not in (None, math.inf) else math.inf
        h = r["heuristic"]
        lines.append(
            f"| {r['recipe']} | `{key_str(r['key'])}` | {r['grid']}"
            + f" | {r['optimum_us']:.2f} | "
            + (f"{h['us']:.2f}" if h["us"] is not None else "-")
            + (f" ({h['note']})" if h["note"] else "")
            + f" | {at_budget:.2f} | {ratio:.3f} | "
            + (f"{med:g} / {worst:g}" if found else "not reached")
            + f" | {pct_grid:.0f}% | {r['budget']} |")
        keys_json.append({**r, "trials_to_goal_median": None if med == math.inf else med,
                          "within_goal_at_budget": ok})
    n = len(rows)
    frac_ok = passed / n if n else 0.0
    verdict = "MET" if n >= MIN_KEYS and frac_ok >= SHARE_OK else "NOT MET"
    if incomplete:
        lines += ["", "Incomplete (grid not measured completely: left out of the verdict):",
                  ""]
        lines += [f"* {r['recipe']} `{key_str(r['key'])}`: {r['measured']} of {r['grid']} "
                  f"configs measured ({r['why']})" for r in incomplete]
    lines += [
        "",
        f"**{passed} of {n} complete keys** ({frac_ok:.0%}) came within {pct}% of the "
        f"exhaustive optimum with at most {round(opts.frac * 100)}% of the grid's trials "
        f"(median over seeds). Target: at least {SHARE_OK:.0%} of at least {MIN_KEYS} "
        f"complete keys: **{verdict}**.",
        "",
        "Notes: the optimum is the minimum of single measurements, so it is biased a little "
        "low (it is the luckiest of many); a config within noise of it may be reported "
        f"above {pct}%. Re-create: `python -m autotune quality` (resumes its exhaustive "
        "studies from the store, so a second run completes more keys).",
        ""]
    js = {"gpu": info_d["gpu"], "slug": slug, "versions": ver, "seeds": seeds,
          "within": within, "frac": opts.frac, "budget_s": opts.budget_s,
          "keys": keys_json, "incomplete": incomplete, "passed": passed,
          "n_keys": n, "verdict": verdict}
    return {"markdown": "\n".join(lines), "json": js}
