"""The benchmark's result files and the statistics read from them.

A run writes, under its output folder, `BENCH.json` (the run header: GPU, versions,
date, copy bandwidth and curve, command, the suites in page order) and one
`bench-<suite>.json` per suite: the header fields of the run that measured it
(`autotune.provenance.FIELDS`), per case the label, the bytes it moves at least, and per
timed variant p20/p50/p80 in microseconds and the timing mode. Variant names the bench
adds to a suite's own: "ours (repeat)" (ours timed a second time, last), "ours (back to
back)" and "ours (heuristic config)".

Timing modes: "behind" (the primary timing of graph variants: each call behind a plain
kernel, `autotune.timing.time_graph(..., behind=...)`), "graph" (calls back to back in a
graph), "eager" (plain calls), "wall" (the interpreter's host clock). Files of runs from
before the primary timing existed have "graph" for "ours": `primary_regime` tells them
apart.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

REPEAT = "ours (repeat)"
BACK_TO_BACK = "ours (back to back)"
HEURISTIC = "ours (heuristic config)"


# --- files --------------------------------------------------------------------------------
def read_json(path: Path):
    """The JSON in `path`, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data) -> None:
    """The reports' JSON, written atomically by the tables' writer."""
    from autotune.tables import write_text_atomic

    write_text_atomic(Path(path), json.dumps(data, indent=1, default=str) + "\n")


def jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def load(out: Path) -> tuple[dict, list[dict]]:
    """(run header, suite results in the header's order) of an output folder."""
    out = Path(out)
    header = read_json(out / "BENCH.json") or {}
    results = [r for r in (read_json(p) for p in sorted(out.glob("bench-*.json"))) if r]
    order = header.get("suites")
    if order:
        results.sort(key=lambda r: order.index(r["suite"]) if r["suite"] in order
                     else len(order))
    return header, results


def suite_header(res: dict, header: dict) -> dict:
    """The header (`autotune.provenance`) of the run that measured a suite: what its file
    records, completed from the run header `header` (BENCH.json) where the file is of
    that run (the same date and command)."""
    from autotune.provenance import of

    own = of(res)
    if own.get("date") == header.get("date") and own.get("command") == header.get("command"):
        return {**of(header), **own}
    return own


def error_text(exc: BaseException) -> str:
    """An exception as one short line, for a report cell."""
    msg = f"{type(exc).__name__}: {exc}".strip()
    return msg.splitlines()[0][:300] if msg else type(exc).__name__


# --- statistics of one case ---------------------------------------------------------------
def p50(entry: dict, name: str):
    t = entry["timings"].get(name)
    return None if t is None else t["p50"]


def ours_time(entry: dict):
    """Ours, the primary timing: the lower of the two runs' medians (the repeat guards
    against a slow first run); None if ours was not timed."""
    vals = [v for v in (p50(entry, "ours"), p50(entry, REPEAT)) if v is not None]
    return min(vals) if vals else None


def back_to_back_time(entry: dict):
    """Ours with calls back to back in the graph (the second column); in a run from before
    the primary timing, that was "ours" itself."""
    t = p50(entry, BACK_TO_BACK)
    if t is None and timing_mode(entry) == "graph":
        return ours_time(entry)
    return t


def timing_mode(entry: dict, name: str = "ours"):
    return (entry["timings"].get(name) or {}).get("mode")


def noise(entry: dict):
    """Relative difference of ours' two medians."""
    a, b = p50(entry, "ours"), p50(entry, REPEAT)
    if a is None or b is None or min(a, b) <= 0:
        return None
    return abs(a - b) / min(a, b)


def primary_regime(res: dict) -> str | None:
    """How a suite's "ours" was timed: "behind" (each call behind a plain kernel), "graph"
    (back to back: a run from before that timing existed), "wall", or None."""
    modes = Counter(timing_mode(e) for e in res["cases"] if timing_mode(e))
    return modes.most_common(1)[0][0] if modes else None


def copy_time_at(curve, nbytes: float):
    """A copy's time (us) for `nbytes` moved, interpolated log-log on the curve; beyond
    its ends, the end point's time (below) or bandwidth (above). None without a curve."""
    if not curve or not nbytes or nbytes <= 0:
        return None
    pts = sorted((float(b), float(t)) for b, t in curve if b > 0 and t > 0)
    if not pts:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        return pts[-1][1] * nbytes / pts[-1][0]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if b0 <= nbytes <= b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + f * math.log(t1 / t0))
    return None


def vs_copy(entry: dict, curve):
    """A same-size copy's time over ours (1.0: as fast as copying the case's bytes)."""
    o, c = ours_time(entry), copy_time_at(curve, entry["bytes"])
    return c / o if o and c else None


def geomean(xs):
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# --- a suite's variants and its plotted slice ---------------------------------------------
def peers(res: dict) -> tuple[str | None, str | None, list[str]]:
    """(eager peer, graph peer, other variants) of a suite."""
    eager = next((v["name"] for v in res["variants"] if v["peer"] and v["eager"]), None)
    graph = next((v["name"] for v in res["variants"] if v["peer"] and not v["eager"]), None)
    others = [v["name"] for v in res["variants"]
              if v["name"] not in ("ours", eager, graph)]
    return eager, graph, others


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plot_spec(labels: list[dict], extra: dict | None = None) -> dict:
    """The plotted slice of a suite: {"x": field, "panel": field or None, "fixed": {field:
    value}}. x: "B", else "R", else the numeric field with the most values; panels: the
    remaining numeric field with the most values; every other field with several values
    is fixed at its most common one. A suite's `extra["plot"]` may set any of the three."""
    over = dict((extra or {}).get("plot") or {})
    fields = []
    for lab in labels:
        for f in lab:
            if f not in fields:
                fields.append(f)
    values = {f: [lab.get(f) for lab in labels if f in lab] for f in fields}
    distinct = {f: list(dict.fromkeys(values[f])) for f in fields}
    numeric = [f for f in fields if all(is_num(v) for v in distinct[f])]
    x = over.get("x")
    if x is None:
        x = next((f for f in ("B", "R") if f in numeric and len(distinct[f]) > 1), None)
    if x is None and numeric:
        x = max(numeric, key=lambda f: len(distinct[f]))
    if "panel" in over:
        panel = over["panel"]
    else:
        cand = [f for f in numeric if f != x and len(distinct[f]) > 1]
        panel = max(cand, key=lambda f: len(distinct[f])) if cand else None
    fixed = {}
    for f in fields:
        if f in (x, panel):
            continue
        if f in (over.get("fixed") or {}):
            fixed[f] = over["fixed"][f]
        elif len(distinct[f]) > 1:
            fixed[f] = Counter(values[f]).most_common(1)[0][0]
    return {"x": x, "panel": panel, "fixed": fixed}


def in_slice(label: dict, spec: dict) -> bool:
    """Whether a case is in the plotted slice: every fixed field the case has holds its
    fixed value (a suite of several ops may give each op its own fields)."""
    return all(label[f] == v for f, v in spec["fixed"].items() if f in label)
