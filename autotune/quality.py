"""`python -m autotune quality`: how good is the tuner's search? For a set of keys, measure
every config the constraint admits (the exhaustive optimum), then replay the tuner's
search over those measured times with several seeds (`--seed` * 101 + replay): the
order `tune` measures a key's grid in (`autotune.tune.search.order_configs`: the
heuristic's config, then the others by their distance from it, ties in a seeded order),
cut where a tune of the default keys stops at the least (`--frac`, half the grid), and
report how many configs it needed to come within 3% of the optimum and what it had at
that cut. The optimum and each replay's pick at the cut are then timed again, together
(`retime`): a key passes when the re-timed pick is within 3% of the re-timed optimum.

Writes `results/<gpu-slug>/tuner-quality.md` and `.json`.

Why a replay: a search is a sequence of configs; scoring it against one exhaustive
measurement of every config makes the search's result and the optimum comparable without
re-measurement noise, and lets several seeds be tried for the cost of one measurement.
The measurements are those of `tune`'s own studies (same store, same study per key): a
key a tune measured part of needs only the rest, and a killed `quality` run resumes.

Keys: up to `n_keys` (default 14) of the recipes' default "gpu" keys whose grid has
between `min_grid` and `max_grid` configs (default 30..200), taken in turn from each
recipe and spread over each recipe's keys.

Budget (`--budget-s`, default 300 s on a GPU, none on CPU) bounds the run from the process
start. Keys are taken one after another: a grid is measured to its end once started (only
the budget's end stops it: a hard stop), then the replays run (CPU only, milliseconds). A
key is started only if its estimated cost (the configs it lacks x the seconds per config
measured so far, first `SECONDS_PER_CONFIG`) fits the time left, else it is passed over
(a later, smaller one may fit). Only keys whose grid was measured completely count: the
others are listed as incomplete and left out of the verdict, which is MET when at least
`MIN_KEYS` complete keys were measured and at least 90% of them came within 3% of their
optimum within the cut (re-timed).
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

from recipes._tuning import key_str

from .provenance import header, versions_text
from .tables import device_info, versions, write_json_atomic, write_text_atomic
from .tune.budget import GUESS
from .tune.device import select_device
from .tune.measure import Measurer, error_text
from .tune.options import Options, resolve, results_dir
from .tune.phases import Phases
from .tune.plan import Job, heuristic_config, reorder, select_tunables
from .tune.run import Progress, Session
from .tune.search import config_id, fraction_configs, order_configs
from .tune.store import study_name
from .tune.write import ROUNDS


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


def replay(job: Job, results: dict, *, seed: int, frac: float, within: float) -> dict:
    """One seeded run of the tuner's order over recorded times (`results`: config_id ->
    Result of a completely measured grid)."""
    order = order_configs(job.grid, job.tunable.space, job.heuristic, seed=seed,
                          first=(job.heuristic,))
    ok = [r.p50 for r in results.values() if r.status == "ok"]
    opt = min(ok)
    goal = opt * (1.0 + within)
    budget = fraction_configs(len(job.grid), frac)
    traj = []
    for c in order:
        r = results.get(config_id(c))
        traj.append(r.p50 if r is not None and r.status == "ok" else math.inf)
    best, to_goal = math.inf, None
    for i, v in enumerate(traj, 1):
        best = min(best, v)
        if to_goal is None and best <= goal:
            to_goal = i
    at_budget = min(traj[:budget])
    pick = order[traj.index(at_budget)]
    return {"seed": seed, "trials_to_goal": to_goal, "evaluated": len(traj),
            "best_at_budget_us": at_budget, "ratio_at_budget": at_budget / opt,
            "budget": budget, "best_at_budget_config": dict(pick)}


def retime(row: dict, measurer, rounds: int) -> None:
    """Time the exhaustive optimum and each replay's pick at the budget again, together,
    in `rounds` interleaved rounds of `final_reps` replays (as `tune`'s final re-timing
    compares its candidates), and add each replay's "retimed_ratio" (pick / optimum, on
    the medians of all rounds) and the row's "retimed_us". A single measurement of each
    config ranks configs within its noise by luck: the optimum is the luckiest of the
    grid. `measurer()`: a Measurer of the key, made only when a pick differs from the
    optimum."""
    cfgs = {config_id(row["optimum_config"]): row["optimum_config"]}
    for r in row["replays"]:
        cfgs.setdefault(config_id(r["best_at_budget_config"]), r["best_at_budget_config"])
    samples: dict = {cid: [] for cid in cfgs}
    if len(cfgs) > 1:
        m = measurer()
        m.pace(row["optimum_us"])
        for _ in range(rounds):
            for cid, c in cfgs.items():
                samples[cid] += m.time(c, m.final_reps, phase="final").samples
    us = {cid: statistics.median(x) if x else row["optimum_us"] for cid, x in samples.items()}
    opt = us[config_id(row["optimum_config"])]
    row["retimed_us"] = {cid: round(v, 4) for cid, v in us.items()}
    for r in row["replays"]:
        r["retimed_ratio"] = us[config_id(r["best_at_budget_config"])] / opt


BUDGET_S = 300.0          # default budget on a GPU (none on CPU)
MIN_KEYS = 12             # complete keys the verdict needs
SHARE_OK = 0.9            # ... of which this fraction must reach the goal
# seconds per config of a grid before any is measured (then the measured mean): the
# tune's own first guess, and its per-key cost spread over a grid of ~100
SECONDS_PER_CONFIG = {k: g["config_s"] + g["key_s"] / 100 for k, g in GUESS.items()}
REPLAY_S = 0.05           # seconds a key's replays take, before they are timed


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


def grid_coverage(grid: list[dict], results: dict) -> int:
    """How many configs of `grid` have an evaluated trial in `results`."""
    return sum(config_id(c) in results for c in grid)


def quality(opts: Options, *, n_keys: int = 14, seeds: int = 5, within: float = 0.03,
            frac: float = 0.5, min_grid: int = 30, max_grid: int = 200,
            measure: bool = True, out: str | None = None,
            command: str | None = None) -> Path:
    device = select_device()
    cuda = device.type == "cuda"
    asked = opts.budget_s
    opts = resolve(opts, device)
    # tune's default budget does not apply here; 0: none
    opts.budget_s = (BUDGET_S if cuda else None) if asked is None else (asked or None)
    from recipes._configs import gpu_slug

    slug = gpu_slug(device)
    tunables = select_tunables(opts)
    chosen = choose_keys(tunables, opts.preset, n_keys, min_grid, max_grid)
    if not chosen:
        raise SystemExit("autotune quality: no key with a grid of "
                         f"{min_grid}..{max_grid} configs in preset {opts.preset!r}")
    jobs = []
    for t, k, g in chosen:
        j = Job(t, k, g, study_name(slug, t.name, k, t.space_hash(), t.study_hash()),
                heuristic_config(t, k, device))
        reorder(j, opts.seed)
        jobs.append(j)
    progress = Progress(sum(len(j.grid) for j in jobs), opts.progress, "exhaustive")
    phases = Phases()
    session = Session(opts, device, slug, phases, progress)
    progress.write(f"autotune quality: up to {len(jobs)} keys, exhaustive over "
                   f"{sum(len(j.grid) for j in jobs)} configs on {device_info(device)['gpu']}; "
                   f"store {session.store.where}; budget {opts.budget_s or 'none'} s")
    left = None if not opts.budget_s else opts.budget_s - (time.monotonic() - opts.started)
    pacer = GridPacer(None if left is None else max(left, 1e-3),
                      SECONDS_PER_CONFIG["cuda" if cuda else "cpu"], REPLAY_S)
    rows, incomplete = [], []
    try:
        if measure:
            session.prepare(jobs)
            session.prioritize(jobs, lambda g: g)
        for j in jobs:
            why = _measure(j, session, pacer, progress) if measure else \
                "not measured in this run (--no-measure)"
            r0 = time.monotonic()
            row = _replays(j, session.store.results(j.study), opts, seeds, within, frac)
            if "replays" in row:
                _retime_row(j, row, opts, device, phases, progress)
                rows.append(row)
                pacer.after_grid(time.monotonic() - r0)
            else:
                incomplete.append({**row, "why": row.get("why") or why})
    finally:
        session.close()
        progress.close()
    doc = render_report(rows, incomplete, device, slug, opts, seeds, within, frac,
                        time.monotonic() - opts.started, grids=(min_grid, max_grid),
                        command=command)
    root = results_dir(opts) / slug
    md_path = Path(out) if out else root / "tuner-quality.md"
    write_text_atomic(md_path, doc["markdown"])
    write_json_atomic(md_path.with_suffix(".json"), doc["json"])
    print(doc["markdown"])
    print(f"autotune quality: wrote {md_path} in {time.monotonic() - opts.started:.1f} s",
          file=sys.stderr)
    return md_path


def _measure(j: Job, session: Session, pacer: GridPacer, progress) -> str:
    """Measure what the store lacks of the key's grid if it fits the budget (`pacer`);
    returns why the grid may still be incomplete."""
    before = len(session.store.results(j.study))
    left = len(j.grid) - before
    progress.update(min(before, len(j.grid)))
    if left <= 0:
        return "measured in an earlier run"
    if not pacer.fits(left):
        why = (f"not started: {left} configs need ~{pacer.estimate(left):.0f} s, "
               f"{max(0.0, pacer.left()):.0f} s were left")
        progress.write(f"autotune quality: {j.label}: {why}")
        return why
    k0 = time.monotonic()
    progress.describe(j.label)
    ks, m, _, _ = session.measure(j, len(j.grid), deadline=pacer.end,
                                  on_trial=lambda *a: progress.update(1))
    pacer.measured(time.monotonic() - k0, len(ks.results) - before)
    if m.unguarded:
        progress.write(f"autotune quality: {j.label}: {m.unguarded} timings not shown "
                       "free of host stalls (autotune.timing.time_graph)")
    return "cut by the end of the budget"


def _retime_row(j: Job, row: dict, opts: Options, device, phases, progress) -> None:
    """`retime` the row's configs on a fresh Measurer of the key; a failure is noted in
    the row ("retime_error"), whose verdict then rests on the single measurements."""
    try:
        retime(row, lambda: Measurer(j.tunable, j.key, device, seed=opts.seed,
                                     final_reps=opts.final_reps, phases=phases),
               ROUNDS["cuda" if device.type == "cuda" else "cpu"])
    except Exception as exc:  # noqa: BLE001 - the row keeps its single measurements
        row["retime_error"] = error_text(exc)
        progress.write(f"autotune quality: {j.label}: re-timing failed ({row['retime_error']})")


def _replays(j: Job, results: dict, opts: Options, seeds: int, within: float,
             frac: float) -> dict:
    """The key's report row: with its replays when its whole grid was measured, else
    what was measured (and "why" when the grid was but no config was correct)."""
    ok = [r.p50 for r in results.values() if r.status == "ok"]
    done = grid_coverage(j.grid, results)
    row = {"recipe": j.tunable.name, "key": j.key, "grid": len(j.grid), "measured": done}
    if done < len(j.grid) or not ok:
        return {**row, "why": None if done < len(j.grid) else
                "no config gave correct outputs"}
    opt_cid = min((cid for cid, r in results.items() if r.status == "ok"),
                  key=lambda c: results[c].p50)
    reps = [replay(j, results, seed=opts.seed * 101 + s, frac=frac, within=within)
            for s in range(seeds)]
    return {**row, "optimum_us": min(ok), "optimum_config": json.loads(opt_cid),
            "heuristic": heuristic_time(j, results), "replays": reps,
            "budget": reps[0]["budget"]}


def heuristic_time(j: Job, results: dict) -> dict:
    """The heuristic's config as the exhaustive measurement saw it: {"us": p50 or None,
    "note": None, "outside the grid" (or no heuristic), or its trial's status}."""
    if not j.admitted:
        return {"us": None, "note": "outside the grid"}
    r = results.get(config_id(j.heuristic))
    if r is None:
        return {"us": None, "note": "not measured"}
    return {"us": r.p50, "note": None if r.status == "ok" else r.status}


def _med(xs):
    return statistics.median(xs) if xs else None


def render_report(rows, incomplete, device, slug, opts, seeds, within, frac, elapsed,
                  grids: tuple[int, int] = (30, 200), command: str | None = None) -> dict:
    info_d = device_info(device)
    head = header(device, command)
    optuna = versions()["optuna"]
    pct = round(within * 100)
    lines = [f"# Tuner quality on {info_d['gpu']}", ""]
    if info_d["interpreter"]:
        lines += ["**INTERPRETER SMOKE RUN**: times are the Triton interpreter's wall clock "
                  "on a CPU; this checks the machinery, not the tuner's quality on a GPU.", ""]
    lines += [
        f"Date {head['date']}; {versions_text(head)}, Optuna {optuna}; "
        f"{len(rows)} complete keys ({len(incomplete)} incomplete, left out), chosen among "
        f"the default keys whose grid has {grids[0]}-{grids[1]} configs; {seeds} seeds "
        f"per key; budget {opts.budget_s or 'none'} s; {elapsed:.0f} s in all"
        + (f"; made by `{command}`." if command else "."),
        "",
        "Method: every config the static constraint admits was measured once "
        "(CUDA-graph replay median, as `tune` times a config; `tune`'s own measurements "
        "where it made them); the exhaustive optimum is the fastest. The tuner's search "
        "(its order: the heuristic's config, then the others by their distance from it in "
        "steps along each parameter's choices, ties in a seeded order) was then replayed "
        "over those measurements. *Trials* count configs measured. *Budget* is where a "
        f"tune of the default keys stops at the least: {round(frac * 100)}% of the grid. "
        "Only keys whose whole grid was measured are in the table and the verdict. The "
        "heuristic's time is its config's measurement in the grid. *Ratio* is the search's "
        "best at the budget over the optimum, as measured once each. A single measurement "
        "ranks configs within its noise by luck, and the optimum is the luckiest of the "
        "grid, so the optimum and each seed's pick at the budget were then timed again "
        "together, in interleaved rounds as `tune`'s final re-timing compares its "
        "candidates: *re-timed ratio* (median over seeds). A key passes when that is "
        f"within {pct}% (where a re-timing failed: when the median seed came within {pct}% "
        "by the budget on the single measurements).",
        "",
        f"| recipe | key | grid | optimum (us) | heuristic (us) | search at budget (us) | "
        f"ratio | re-timed ratio | trials to within {pct}% (median / max of seeds) | "
        "% of grid | budget |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    passed, single, keys_json = 0, 0, []
    for r in rows:
        reps = r["replays"]
        tg = [x["trials_to_goal"] for x in reps]
        found = [x for x in tg if x is not None]
        med = _med([x if x is not None else math.inf for x in tg])
        worst = max(x if x is not None else math.inf for x in tg)
        ratio = _med([x["ratio_at_budget"] for x in reps])
        at_budget = _med([x["best_at_budget_us"] for x in reps])
        retimed = [x["retimed_ratio"] for x in reps if "retimed_ratio" in x]
        rt = _med(retimed) if retimed and len(retimed) == len(reps) else None
        # the verdict compares re-timed configs where they were; else single measurements
        single_ok = med is not None and med <= r["budget"]
        ok = rt <= 1.0 + within + 1e-9 if rt is not None else single_ok
        passed += ok
        single += single_ok
        pct_grid = (med / r["grid"] * 100) if med not in (None, math.inf) else math.inf
        h = r["heuristic"]
        lines.append(
            f"| {r['recipe']} | `{key_str(r['key'])}` | {r['grid']}"
            + f" | {r['optimum_us']:.2f} | "
            + (f"{h['us']:.2f}" if h["us"] is not None else "-")
            + (f" ({h['note']})" if h["note"] else "")
            + f" | {at_budget:.2f} | {ratio:.3f} | "
            + (f"{rt:.3f}" if rt is not None else "-") + " | "
            + (f"{med:g} / {worst:g}" if found else "not reached")
            + f" | {pct_grid:.0f}% | {r['budget']} |")
        keys_json.append({**r, "trials_to_goal_median": None if med == math.inf else med,
                          "retimed_ratio_median": rt, "within_goal_at_budget": ok})
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
        f"exhaustive optimum with at most {round(frac * 100)}% of the grid's configs "
        f"(re-timed, median over seeds). Target: at least {SHARE_OK:.0%} of at least "
        f"{MIN_KEYS} complete keys: **{verdict}**. On the single measurements alone "
        f"({single} of {n} within {pct}% by the budget).",
        "",
        "Re-create: `python -m autotune quality` (resumes its exhaustive studies from the "
        "store, so a second run completes more keys).",
        ""]
    js = {**head, "optuna": optuna, "slug": slug, "seeds": seeds,
          "within": within, "frac": frac, "budget_s": opts.budget_s,
          "grid_range": list(grids),
          "keys": keys_json, "incomplete": incomplete, "passed": passed,
          "passed_single_measurements": single,
          "n_keys": n, "verdict": verdict}
    return {"markdown": "\n".join(lines), "json": js}
