"""The end of a key: its table entry (`finalize`), the keys where each entry's config was
measured no slower than that key's heuristic (`no_slower_at`), and the files a tune
writes: the tables (`autotune.tables.update_table`) and `tune-report.json`.

An entry's config is the heuristic's unless the best config the search measured beats it
beyond the noise of the same run (a heuristic the constraint rejects gets no entry: the
key keeps it through dispatch's fallback): the best `top` configs, the heuristic's and
the config the table being rewritten holds for the key are re-checked and re-timed
together, in `ROUNDS` interleaved rounds (drift hits them alike), each round after the
first on input sets at new addresses (`Measurer.relocate`: a gain that holds at one
placement only is no gain). The best beats the heuristic when it is faster in every
round, its speed-up (heuristic / best, medians of all rounds) is larger than the noise
(the largest ratio between two round medians of either config; ratios, so that a
round slowed by another process cannot hide a config many times faster), and its gain
is at least dispatch's `MIN_GAIN` (2%:
smaller gains do not survive another process's timing), and when the search's own
measurements of the two show that gain too (`search_gain`): two measurements at
different moments must agree. On the H200 a final re-timing once
put a heuristic 6.6% behind a config that the search had measured 0.6% ahead of it, and
the benchmark then ran that config 2% slower than the heuristic.
So a tune never leaves a key slower than its heuristic, and a re-tune never leaves it
slower than the table it rewrites, beyond that noise.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from recipes._configs import MIN_GAIN
from recipes._tuning import key_str

from ..tables import FORMAT, table_path, update_table, write_json_atomic
from ..timing import Timing
from .measure import Measurer, error_text
from .plan import Job
from .search import best_ok, config_id, space_config

ROUNDS = {"cuda": 3, "cpu": 1}
NO_SLOWER_TOL = 0.01     # measured within 1% of the heuristic counts as no slower
REPORT = "tune-report.json"
REPORT_FORMAT = "spec-cookbook/tune-report/1"


def _r(x, nd=3):
    return None if x is None else round(float(x), nd)


def finalize(job: Job, m: Measurer, results: dict, *, top: int, planned: int,
             log=print) -> dict | None:
    """The key's entry from its measured configs `results` (config_id -> Result), or
    None when no correct config is left (dispatch keeps the heuristic)."""
    t, key = job.tunable, job.key
    cands: list = []          # (config, source), heuristic first

    def add(cfg, source, baseline=False):
        if cfg is not None and (baseline or t.admits(cfg, key)) and \
                config_id(cfg) not in {config_id(c) for c, _ in cands}:
            cands.append((space_config(cfg, t.space), source))

    add(job.heuristic, "heuristic", baseline=True)
    for _cid, r in best_ok(results, max(1, top)):
        add(r.config, "search")
    add(job.previous, "previous table")
    if not cands:
        log(f"autotune: {job.label}: no correct config to record (dispatch keeps the "
            "heuristic)")
        return None
    live = []
    for c, src in cands:
        ok, err = m.check(c, phase="final")
        if ok:
            live.append((c, src))
        else:
            log(f"autotune: {job.label}: config {c} failed in the final check: "
                f"{err or 'outputs differ from the reference'}")
    rounds = ROUNDS["cuda" if m.cuda else "cpu"]
    per_round = {config_id(c): [] for c, _ in live}
    for r in range(rounds):               # interleaved, so drift hits every candidate alike
        if r:
            m.relocate()
        for c, _src in list(live):
            cid = config_id(c)
            try:
                per_round[cid].append(m.time(c, m.final_reps, phase="final").samples)
            except Exception as exc:  # noqa: BLE001
                m.health()
                log(f"autotune: {job.label}: config {c} failed in the final timing: "
                    f"{error_text(exc)}")
                live = [(x, s) for x, s in live if config_id(x) != cid]
    stats = {cid: Timing([x for rnd in rs for x in rnd]) for cid, rs in per_round.items()
             if rs and cid in {config_id(c) for c, _ in live}}
    if not stats:
        log(f"autotune: {job.label}: no correct config to record (dispatch keeps the "
            "heuristic)")
        return None
    med = {cid: [statistics.median(rnd) for rnd in per_round[cid]] for cid in stats}
    best_c, best_src = min(((c, s) for c, s in live if config_id(c) in stats),
                           key=lambda cs: stats[config_id(cs[0])].p50)
    hid = config_id(job.heuristic) if job.heuristic is not None else None
    chosen, src, noise, searched = best_c, best_src, None, None
    if hid in stats and config_id(best_c) != hid:
        b = config_id(best_c)
        noise = max(_spread(med[c]) for c in (b, hid))
        gain = (stats[hid].p50 - stats[b].p50) / stats[hid].p50
        wins = all(x < y for x, y in zip(med[b], med[hid], strict=True))
        searched = search_gain(results, b, hid)
        beyond = stats[hid].p50 / stats[b].p50 - 1 > noise
        if not (wins and beyond and gain >= MIN_GAIN - 1e-9) \
                or (searched is not None and searched < MIN_GAIN - 1e-9):
            chosen, src = job.heuristic, "heuristic"
    cid = config_id(chosen)
    tm = stats[cid]
    h = stats.get(hid)
    torch_us, torch_mode = m.time_torch()
    heur_full = _heuristic_full(t, key, m.device)
    prev = stats.get(config_id(job.previous)) if job.previous is not None else None
    counts = _counts(results)
    return {
        "key": dict(key), "config": {**heur_full, **chosen},
        "admitted": t.admits(chosen, key),     # False: the heuristic kept, outside the grid
        "p20_us": _r(tm.p20), "p50_us": _r(tm.p50), "p80_us": _r(tm.p80),
        "heuristic_config": heur_full or None,
        "heuristic_p50_us": _r(h.p50) if h else None,
        "best_config": best_c, "best_p50_us": _r(stats[config_id(best_c)].p50),
        "noise": _r(noise, 4),
        "torch_p50_us": _r(torch_us), "torch_timing": torch_mode,
        "speedup_vs_heuristic": _r(h.p50 / tm.p50, 3) if h and tm.p50 > 0 else None,
        "search_gain_vs_heuristic": _r(searched, 4),
        "speedup_vs_torch": _r(torch_us / tm.p50, 3) if torch_us and tm.p50 > 0 else None,
        "mode": "exhaustive" if counts["evaluated"] >= len(job.grid) else "sampled",
        "grid": len(job.grid), "target": planned,
        "budget_cut": counts["evaluated"] < len(job.grid),
        "trials": counts,
        "wrong_configs": [r.config for r in results.values() if r.status == "wrong"],
        "chosen_from": src,
        "previous_config": job.previous,
        "previous_p50_us": _r(prev.p50) if prev else None,
        "study": job.study,
        "no_slower_at": [],
    }


def search_gain(results: dict, best: str, heuristic: str) -> float | None:
    """The best config's gain over the heuristic as the search measured them (another
    process moment than the final re-timing), or None where the search did not measure
    both correctly."""
    rb, rh = results.get(best), results.get(heuristic)
    if rb is None or rh is None or rb.status != "ok" or rh.status != "ok" or not rh.p50:
        return None
    return (rh.p50 - rb.p50) / rh.p50


def _spread(round_medians: list) -> float:
    """The largest ratio between two round medians, less one."""
    if len(round_medians) < 2 or min(round_medians) <= 0:
        return 0.0
    return max(round_medians) / min(round_medians) - 1


def _heuristic_full(t, key, device) -> dict:
    try:
        return dict(t.heuristic(key, device))
    except Exception:  # noqa: BLE001 - said when the job was planned
        return {}


def _counts(results: dict) -> dict:
    st = [r.status for r in results.values()]
    return {"evaluated": len(st), "wrong": st.count("wrong"), "errors": st.count("error")}


def no_slower_at(entries: dict, results: dict, heuristics: dict, space: dict,
                 tol: float = NO_SLOWER_TOL) -> None:
    """Fill each entry's `no_slower_at`: the other tuned keys (of `entries`, key_str ->
    entry, one recipe) where the entry's config was measured (`results`, key_str ->
    config_id -> Result) correct and no slower than that key's heuristic (`heuristics`,
    key_str -> config or None) within `tol`; the heuristic's own config counts wherever
    it ran correctly."""
    for ks, e in entries.items():
        c = config_id(space_config(e["config"], space))
        out = []
        for ks2, e2 in entries.items():
            h = heuristics.get(ks2)
            if ks2 == ks or h is None:
                continue
            rc = results.get(ks2, {}).get(c)
            if rc is None or rc.status != "ok":
                continue
            rh = rc if c == config_id(h) else results.get(ks2, {}).get(config_id(h))
            if rh is not None and rh.status == "ok" and rc.p50 <= rh.p50 * (1.0 + tol):
                out.append(dict(e2["key"]))
        e["no_slower_at"] = sorted(out, key=key_str)


def write_table(out_dir: Path, slug: str, tunable, device, entries: list) -> Path:
    path = table_path(out_dir, slug, tunable.name)
    update_table(path, tunable, device, slug, entries)
    return path


def had_tables(out_dir: Path, slug: str) -> bool:
    """Whether results/<slug>/ holds a tuned table (a tune that finds none is "fresh")."""
    import json

    folder = Path(out_dir) / slug
    for p in folder.glob("*.json") if folder.is_dir() else ():
        try:
            if json.loads(p.read_text()).get("format") == FORMAT:
                return True
        except Exception:  # noqa: BLE001 - not a table
            continue
    return False


def write_report(path: Path, doc: dict) -> None:
    """The tune report: `doc`, which opens with the run's header (GPU, versions, date,
    command: `autotune.provenance`), under the report's format name."""
    write_json_atomic(path, {"format": REPORT_FORMAT, **doc})


def key_row(job: Job, entry: dict | None, counts: dict, planned: int, seconds: float) -> dict:
    """A key's line of the tune report."""
    return {"recipe": job.tunable.name, "key": dict(job.key), "admitted": len(job.grid),
            "planned": planned, "measured": counts["evaluated"],
            "wrong": counts["wrong"], "errors": counts["errors"],
            "best_us": entry["best_p50_us"] if entry else None,
            "heuristic_us": entry["heuristic_p50_us"] if entry else None,
            "entry_us": entry["p50_us"] if entry else None,
            "chosen_from": entry["chosen_from"] if entry else None,
            "seconds": round(seconds, 3)}
