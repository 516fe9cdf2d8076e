"""Two benchmark runs side by side: what a kernel change did, config for config.

    python -m autotune.bench.compare BASE NEW [--suite NAME]...

BASE and NEW are bench output folders (`BENCH.json` and `bench-<suite>.json`), e.g. a
committed `results/<gpu>` exported from an earlier revision (`make bench-compare
BASE=<rev>` does that) and the working tree's. A retune after a kernel change moves
the tuned configs, so "ours" alone mixes the change with the tables; the comparison
keeps the cases whose config is the same on both sides:

* "heuristic config": the variant timed with the heuristic's config, in every case
  where both runs timed it and the heuristic picked the same config on both sides;
* "same tuned config": ours, where every tuned config of the case is the same in both;
* "no table entry": ours, where neither run dispatched a table entry (the case records
  no config): the heuristic's config, the same on both sides only if the heuristic's
  code is.

Per suite and batch class (B, or argmax's R: <= 8, 16-32, >= 64) it prints the
geometric mean of NEW / BASE, its range and the case count; then every such case.
A suite whose kernels did not change is the control: its ratios show the run-to-run
drift.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.provenance import line, of

from .results import HEURISTIC, geomean, load, ours_time, p50

VARIANTS = ("heuristic config", "same tuned config", "no table entry")
CLASSES = (("B <= 8", 0, 8), ("B 16-32", 9, 32), ("B >= 64", 33, None))


def batch_class(label: dict) -> str:
    b = label.get("B", label.get("R"))
    if not isinstance(b, int):
        return "all"
    return next(name for name, lo, hi in CLASSES if b >= lo and (hi is None or b <= hi))


def _configs(entry: dict, field: str):
    return [(c.get("recipe"), json.dumps(c.get(field), sort_keys=True))
            for c in entry.get("configs") or []]


def case_ratios(base: dict, new: dict) -> list[tuple[str, str, dict, float, float]]:
    """(variant, class, label, base us, new us) for each comparable case of one suite."""
    by_label = {json.dumps(e["label"], sort_keys=True): e for e in base["cases"]}
    rows = []
    for e in new["cases"]:
        b = by_label.get(json.dumps(e["label"], sort_keys=True))
        if b is None:
            continue
        cls = batch_class(e["label"])
        ob, on = ours_time(b), ours_time(e)
        if not e.get("configs") or not b.get("configs"):
            if ob and on and not e.get("configs") and not b.get("configs"):
                rows.append(("no table entry", cls, e["label"], ob, on))
            continue
        hb, hn = p50(b, HEURISTIC), p50(e, HEURISTIC)
        if hb and hn and _configs(b, "heuristic") == _configs(e, "heuristic"):
            rows.append(("heuristic config", cls, e["label"], hb, hn))
        if ob and on and _configs(b, "tuned") == _configs(e, "tuned"):
            rows.append(("same tuned config", cls, e["label"], ob, on))
    return rows


def _run_line(name: str, header: dict) -> str:
    return f"{name}: {line(of(header))}"


def report(base_dir: Path, new_dir: Path, suites: list[str] | None = None,
           base_name: str | None = None) -> str:
    hb, rb = load(base_dir)
    hn, rn = load(new_dir)
    base = {r["suite"]: r for r in rb}
    lines = [_run_line(f"base {base_name or base_dir}", hb), _run_line(f"new  {new_dir}", hn),
             "ratio = new / base of the median per call, us (lower is faster)", ""]
    detail = []
    for res in rn:
        name = res["suite"]
        if name not in base or (suites and name not in suites):
            continue
        if res.get("date") is not None and base[name].get("date") == res.get("date"):
            lines.append(f"{name:22s} the same run on both sides: not compared")
            continue
        rows = case_ratios(base[name], res)
        if not rows:
            lines.append(f"{name:22s} no case with the same config on both sides")
        for variant in VARIANTS:
            for cls in [c[0] for c in CLASSES] + ["all"]:
                r = [n / o for v, c, _, o, n in rows if v == variant and c == cls]
                if r:
                    lines.append(f"{name:22s} {variant:18s} {cls:8s} geomean "
                                 f"{geomean(r):.3f}  range {min(r):.2f}-{max(r):.2f}  "
                                 f"n={len(r)}")
        detail += [f"  {name} {v}: {' '.join(f'{k}={x}' for k, x in lab.items())}: "
                   f"{o:.2f} -> {n:.2f} us ({(n / o - 1) * 100:+.1f}%)"
                   for v, _, lab, o, n in rows]
    return "\n".join(lines + ["", "cases:"] + detail) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.bench.compare",
                                description="Compare two bench runs config for config.")
    p.add_argument("base", type=Path, help="the earlier run's output folder")
    p.add_argument("new", type=Path, help="the later run's output folder")
    p.add_argument("--suite", action="append", default=[], metavar="NAME",
                   help="only this suite (repeat or comma-separate; default: all in both)")
    p.add_argument("--base-name", default=None, metavar="TEXT",
                   help="what to call the base run in the report (default: its folder)")
    args = p.parse_args(argv)
    for d in (args.base, args.new):
        if not (d / "BENCH.json").is_file():
            p.error(f"{d}: expected a bench output folder with BENCH.json; none there")
    suites = [s for a in args.suite for s in a.split(",") if s] or None
    if suites:
        both = ({r["suite"] for r in load(args.base)[1]}
                & {r["suite"] for r in load(args.new)[1]})
        missing = sorted(set(suites) - both)
        if missing:
            p.error(f"--suite: expected suites benched in both runs ({', '.join(sorted(both))}),"
                    f" got {', '.join(missing)}")
    print(report(args.base, args.new, suites, args.base_name), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
