"""The suites' plots: time per call against the plotted slice's x field (`results.plot_spec`:
"B", else "R", else the numeric field with the most values), one panel per value of the
panel field, with ours (the primary timing, and thinner its back-to-back time), the
suite's other variants, the bandwidth floor (bytes / copy ceiling) and the time of a
copy of the same bytes (the run's copy curve)."""
from __future__ import annotations

import math
from pathlib import Path

from .results import (
    back_to_back_time,
    copy_time_at,
    in_slice,
    is_num,
    ours_time,
    p50,
    peers,
    plot_spec,
    primary_regime,
)

_OURS = dict(color="#d62728", lw=2.2, marker="o", ms=4, zorder=5)
_OURS_B2B = dict(color="#d62728", lw=1.0, ls=":", marker=".", ms=3, zorder=4)
_PEER_STYLES = [dict(color="#1f77b4", ls="--", marker="s", ms=3),
                dict(color="#2ca02c", ls=":", marker="^", ms=3),
                dict(color="#9467bd", ls="-.", marker="v", ms=3),
                dict(color="#8c564b", ls="--", marker="d", ms=3)]
B2B_LINE = "ours, back to back"


def _lines(res: dict) -> tuple[list[str], dict, dict]:
    """(line names, name -> style, name -> time of a case) of a suite's plot."""
    eager, graph, others = peers(res)
    names = ["ours"] + ([B2B_LINE] if primary_regime(res) == "behind" else []) \
        + [v for v in (eager, graph) if v] + others
    styles = {"ours": _OURS, B2B_LINE: _OURS_B2B}
    times = {"ours": ours_time, B2B_LINE: back_to_back_time}
    k = 0
    for name in names:
        if name not in styles:
            styles[name] = _PEER_STYLES[k % len(_PEER_STYLES)]
            times[name] = lambda e, name=name: p50(e, name)
            k += 1
    return names, styles, times


def plot_suite(res: dict, copy_bw: float | None, path: Path, curve=None) -> bool:
    """Write the suite's PNG; False when there is nothing to plot."""
    cases = [e for e in res["cases"] if e["timings"]]
    if not cases:
        return False
    spec = plot_spec([e["label"] for e in res["cases"]], res.get("extra"))
    x, panel = spec["x"], spec["panel"]
    sel = [e for e in cases if in_slice(e["label"], spec) and x in e["label"]]
    if not sel:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(e["label"].get(panel) for e in sel)) if panel else [None]
    if panel and all(is_num(p) for p in panels):
        panels.sort()
    ncol = min(3, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.6 * nrow), squeeze=False)
    names, styles, times = _lines(res)
    for k, pv in enumerate(panels):
        ax = axes[k // ncol][k % ncol]
        pts = sorted((e for e in sel if panel is None or e["label"].get(panel) == pv),
                     key=lambda e: e["label"][x])
        xs = [e["label"][x] for e in pts]
        measured = []
        for name in names:
            xy = [(a, b) for a, b in zip(xs, map(times[name], pts), strict=False)
                  if b is not None and b > 0]
            if xy:
                ax.plot(*zip(*xy, strict=False), label=name, **styles[name])
                measured += [b for _, b in xy]
        if copy_bw:
            fl = [(e["label"][x], e["bytes"] / copy_bw * 1e6) for e in pts]
            ax.plot(*zip(*fl, strict=False), color="0.45", ls=(0, (1, 1)), lw=1.2,
                    label="bandwidth floor")
        if curve:
            cp = [(e["label"][x], copy_time_at(curve, e["bytes"])) for e in pts]
            ax.plot(*zip(*cp, strict=False), color="0.3", ls="--", lw=1.0,
                    label="copy of the same bytes")
        if xs and all(is_num(v) and v > 0 for v in xs):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(set(xs)))
            ax.set_xticklabels([str(v) for v in sorted(set(xs))], fontsize=7)
        ax.set_yscale("log")
        if measured:       # the floor may go far below: keep the measured lines readable
            ax.set_ylim(bottom=min(measured) / 4, top=max(measured) * 1.6)
        ax.set_xlabel(x)
        ax.set_ylabel("us per call")
        ax.grid(True, which="both", alpha=0.25)
        ax.set_title(f"{panel} = {pv}" if panel else res["title"], fontsize=10)
        if k == 0:
            ax.legend(fontsize=7)
    for k in range(len(panels), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fixed = ", ".join(f"{f}={v}" for f, v in spec["fixed"].items())
    fig.suptitle(res["title"] + (f" ({fixed})" if fixed else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
