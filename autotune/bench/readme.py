"""The README's benchmark block: the text between the bench:headline markers is replaced by
the run's headline table and one suite's plot. The plotted suite is the first whose
`BenchSuite.extra["readme"]` is true (the first suite when none says so)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .report import headline_rows, table
from .results import load, primary_regime

HEADLINE_START = "<!-- bench:headline:start -->"
HEADLINE_END = "<!-- bench:headline:end -->"


def readme_suite(results: list[dict]) -> str | None:
    """The suite whose plot the README shows."""
    picked = [r["suite"] for r in results if (r.get("extra") or {}).get("readme")]
    return (picked or [r["suite"] for r in results] or [None])[0]


def update_readme(readme: Path, out: Path, plot_suite_name: str | None = None) -> bool:
    """Replace the text between the headline markers of `readme` with the headline table
    and one plot of `out`; False (and nothing written) when the markers are missing."""
    readme, out = Path(readme), Path(out)
    header, results = load(out)
    if not readme.exists() or not results:
        return False
    text = readme.read_text()
    a, b = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if a < 0 or b < a:
        print(f"bench: {readme} has no {HEADLINE_START} ... {HEADLINE_END} block; "
              "not updated", file=sys.stderr)
        return False
    pick = plot_suite_name or readme_suite(results)
    rel = os.path.relpath(out, readme.resolve().parent)
    bw = header.get("copy_bandwidth_Bps")
    block = [HEADLINE_START, "",
             f"{header.get('gpu', out.name)}, torch {header.get('torch')}, triton "
             f"{header.get('triton')}, {header.get('date')}"
             + (f"; copy bandwidth {bw / 1e12:.2f} TB/s" if bw else "")
             + ". Times: each call behind a plain kernel in a CUDA graph (back to back "
             "as a second column)"
             + ("; * : a suite timed by an earlier bench, back to back only (its 'ours' is "
                "that time)" if any(primary_regime(r) != "behind" for r in results) else "")
             + f". Full tables: [{rel}/BENCH.md]({rel}/BENCH.md).", "",
             table(*headline_rows(results, bw, header.get("copy_curve"))), "",
             f"![{pick}]({rel}/bench-{pick}.png)", "", HEADLINE_END]
    readme.write_text(text[:a] + "\n".join(block) + text[b + len(HEADLINE_END):])
    return True
