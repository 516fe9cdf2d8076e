"""Compare "ours" between two benchmark runs, case by case, per suite.

Usage: python tools/compare_bench.py OLD NEW [OUTFILE]
OLD and NEW: a directory holding bench-<suite>.json files, or git:REV:DIR for the files
committed at REV (e.g. git:HEAD~3:results/h200). Prints, for every suite in both, the
geometric mean of new/old over the cases both measured, the count of cases more than 5%
slower and faster, and the four largest slow-downs.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autotune.bench import ours_time  # noqa: E402

SUITES = ("argmax", "chain_verify", "chain_verify_sampled", "copy_inputs", "draft_tail",
          "relay", "verify_metadata")


def load(where: str, suite: str):
    if where.startswith("git:"):
        _, rev, d = where.split(":", 2)
        try:
            text = subprocess.check_output(["git", "show", f"{rev}:{d}/bench-{suite}.json"],
                                           stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            return None
        return json.loads(text)
    p = Path(where) / f"bench-{suite}.json"
    return json.loads(p.read_text()) if p.exists() else None


def ours(cases) -> dict:
    """{label: ours} with the statistic BENCH.md reports (`bench.ours_time`)."""
    return {json.dumps(c["label"], sort_keys=True): ours_time(c)
            for c in cases if ours_time(c) is not None}


def main(old: str, new: str) -> list[str]:
    lines = [f"# ours, new/old: old = {old}, new = {new}"]
    for suite in SUITES:
        a, b = load(old, suite), load(new, suite)
        if a is None or b is None:
            continue
        oa, ob = ours(a["cases"]), ours(b["cases"])
        both = [(ob[k] / oa[k], k, oa[k], ob[k]) for k in ob if k in oa]
        if not both:
            continue
        g = math.exp(sum(math.log(r) for r, *_ in both) / len(both))
        lines.append(f"{suite}: {len(both)} cases, geomean {g:.3f}; "
                     f"> 5% slower: {sum(r > 1.05 for r, *_ in both)}, "
                     f"> 5% faster: {sum(r < 0.95 for r, *_ in both)}")
        for r, k, x, y in sorted(both, reverse=True)[:4]:
            lines.append(f"    {r:.2f}  {k}  {x:.2f} -> {y:.2f} us")
    return lines


if __name__ == "__main__":
    out = main(sys.argv[1], sys.argv[2])
    text = "\n".join(out) + "\n"
    if len(sys.argv) > 3:
        Path(sys.argv[3]).write_text(text)
    print(text, end="")
