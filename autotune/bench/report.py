"""The markdown: BENCH.md (run header, how to read, headline, per-suite tables and plots),
bench-<suite>.md and OVERHEAD.md, all rebuilt from the JSON of an output folder
(`render`), so a page can be re-rendered without a GPU. Each page opens with the GPU,
versions, date and command of the run that measured it (`autotune.provenance`).

Tables are generic over the cases' label fields: one column per field, then ours (the
primary timing), its noise, ours back to back, every other variant, ours' speedup over
each peer, the fraction of copy bandwidth, against a same-size copy, and tuned against
heuristic config.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from autotune.provenance import NOT_RECORDED, line, of, versions_text

from . import plots
from .results import (
    HEURISTIC,
    back_to_back_time,
    error_text,
    geomean,
    load,
    noise,
    ours_time,
    p50,
    peers,
    primary_regime,
    read_json,
    suite_header,
    vs_copy,
)

METHOD = """\
How to read: times are medians in microseconds per call. "ours" and "torch graph" are
CUDA-graph replays, each call behind a plain kernel: the graph holds n x [a one-element
torch op, the call] and the time is its replay minus that of a graph of the n ops alone,
per call. That is how an engine calls these kernels, right after its lm_head GEMM.
"ours back to back" is the same calls with nothing in between. Our launches are made
without programmatic dependent launch (PDL), the default; "ours, PDL on" (some suites)
is the same call with PDL (`recipes.pdl_on`), behind the plain kernel (where it cannot
start early, as the GEMM does not release it) and back to back (where each launch
overlaps the call before it). A graph holds up
to 20 calls, more when there are more input sets, over up to 32 rotating input sets: a
case whose sets together exceed twice the L2 is read from DRAM, smaller ones can be
served from L2, and one whose 32 sets would all fit in the L2 (the small-batch cases)
rotates over 4 and is L2-resident, as the tuner times it. "torch eager" is
plain back-to-back calls timed with CUDA events (launch gaps included). "ours" is timed
twice (first and last); the table shows the lower median and the difference between the
two as noise. "x vs P" is P's time over ours (above 1: ours is faster). "copy-BW" is the
case's fewest bytes moved / our time / the copy bandwidth above. "same-size copy" is the
time a copy kernel (behind the same plain kernel) takes to move the case's bytes (the
copy curve, measured in this run from 16 KiB to 1 GiB a side) over ours: small moves
cannot reach the asymptotic bandwidth (launch and ramp), so this is the fair yardstick
there. "tuned vs heuristic": the heuristic config's time over the tuned config's, for
the cases where this GPU's tuned table picks a different config ("same config": it
picks the heuristic's; empty: no tuned table)."""

BACK_TO_BACK_NOTE = ("*Timed by an earlier bench, calls back to back in the graph (not "
                     "behind a plain kernel): \"ours\" here is the back-to-back time.*")


# --- cells --------------------------------------------------------------------------------
def fmt_us(v) -> str:
    if v is None:
        return ""
    if v < 10:
        return f"{v:.2f}"
    if v < 100:
        return f"{v:.1f}"
    return f"{v:.0f}"


def _x(v) -> str:
    return "" if v is None else f"{v:.2f}x"


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def _cell_err(e: dict, name: str) -> str:
    return "error" if name in e["errors"] or "make" in e["errors"] else ""


def _tuned_cell(e: dict, o) -> str:
    st = e.get("tuned", "none")
    if st == "same":
        return "same config"
    if st == "differs":
        h = p50(e, HEURISTIC)
        return _x(h / o) if h and o else "differs"
    return ""


def _ratios(res: dict, peer: str | None) -> list[float]:
    out = []
    if peer is None:
        return out
    for e in res["cases"]:
        o, p = ours_time(e), p50(e, peer)
        if o and p:
            out.append(p / o)
    return out


def _span(vals) -> str:
    vals = [v for v in vals if v]
    return f"{fmt_us(min(vals))}-{fmt_us(max(vals))}" if vals else ""


def table(head, rows) -> str:
    """A GitHub markdown table (tabulate's, or a plain one where tabulate is missing)."""
    try:
        from tabulate import tabulate
    except ImportError:
        cells = [[str(c) for c in head]] + [[str(c) for c in r] for r in rows]
        w = [max(len(r[i]) for r in cells) for i in range(len(head))]
        line = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"
                for r in cells]
        return "\n".join([line[0], "|" + "|".join("-" * (x + 2) for x in w) + "|"]
                         + line[1:])
    return tabulate(rows, headers=head, tablefmt="github", disable_numparse=True)


# --- tables -------------------------------------------------------------------------------
def suite_rows(res: dict, copy_bw: float | None, curve=None) -> tuple[list[str], list[list]]:
    """The suite table: label fields, ours, noise, ours back to back, every other
    variant, speedups over each peer, fraction of copy bandwidth, against a same-size
    copy, tuned vs heuristic."""
    fields = []
    for e in res["cases"]:
        for f in e["label"]:
            if f not in fields:
                fields.append(f)
    eager, graph, others = peers(res)
    variants = [v for v in (eager, graph) if v] + others
    peer_names = [v["name"] for v in res["variants"] if v["peer"]]
    b2b = primary_regime(res) == "behind"
    head = fields + ["ours us", "noise"] + (["ours back to back us"] if b2b else []) \
        + [f"{v} us" for v in variants] + [f"x vs {p}" for p in peer_names] \
        + ["copy-BW"] + (["same-size copy"] if curve else []) + ["tuned vs heuristic"]
    rows = []
    for e in res["cases"]:
        o = ours_time(e)
        row = [e["label"].get(f, "") for f in fields]
        row += [fmt_us(o) if o is not None else _cell_err(e, "ours"), _pct(noise(e))]
        if b2b:
            row.append(fmt_us(back_to_back_time(e)))
        row += [fmt_us(p50(e, v)) if p50(e, v) is not None else _cell_err(e, v)
                for v in variants]
        row += [_x(p50(e, p) / o) if o and p50(e, p) else "" for p in peer_names]
        bw = e["bytes"] / (o * 1e-6) / copy_bw if o and copy_bw else None
        row.append(_pct(bw))
        if curve:
            row.append(_pct(vs_copy(e, curve)))
        row.append(_tuned_cell(e, o))
        rows.append(row)
    return head, rows


def headline_rows(results: list[dict], copy_bw: float | None, curve=None):
    head = ["recipe", "cases", "ours us (min-max)", "back to back us (min-max)",
            "x vs torch eager: geomean (min-max)", "x vs torch graph: geomean (min-max)",
            "copy-BW: median (max)"] \
        + (["same-size copy: median (max)"] if curve else []) + ["tuned vs heuristic"]
    rows = []
    for res in results:
        eager, graph, _ = peers(res)
        old = primary_regime(res) != "behind"          # an earlier bench's file
        cells = [res["suite"] + (" *" if old else ""),
                 str(len(res["cases"])) + ("" if res["complete"] else " (cut)")]
        cells.append(_span(ours_time(e) for e in res["cases"]))
        cells.append(_span(back_to_back_time(e) for e in res["cases"])
                     if primary_regime(res) == "behind" else "")
        for peer in (eager, graph):
            r = _ratios(res, peer)
            cells.append(f"{_x(geomean(r))} ({_x(min(r))}-{_x(max(r))})" if r else "")
        bws = [e["bytes"] / (ours_time(e) * 1e-6) / copy_bw for e in res["cases"]
               if ours_time(e) and copy_bw]
        cells.append(f"{_pct(statistics.median(bws))} ({_pct(max(bws))})" if bws else "")
        if curve:
            vc = [v for v in (vs_copy(e, curve) for e in res["cases"]) if v]
            cells.append(f"{_pct(statistics.median(vc))} ({_pct(max(vc))})" if vc else "")
        gains = [p50(e, HEURISTIC) / ours_time(e) for e in res["cases"]
                 if e.get("tuned") == "differs" and p50(e, HEURISTIC) and ours_time(e)]
        tuned = sum(1 for e in res["cases"] if e.get("tuned") in ("same", "differs"))
        if gains:
            cells.append(f"{_x(geomean(gains))} geomean over {len(gains)} cases "
                         f"({tuned} tuned)")
        elif tuned:
            cells.append(f"same config ({tuned} tuned)")
        else:
            cells.append("no tuned table")
        rows.append(cells)
    return head, rows


def header_md(h: dict) -> str:
    """The run's header as a list: its provenance (`autotune.provenance`), the GPU's
    size, the preset, and the copy ceiling and curve."""
    bw = h.get("copy_bandwidth_Bps")
    curve = h.get("copy_curve")
    size = ", ".join(x for x in (f"{h['sm_count']} SMs" if h.get("sm_count") else "",
                                 f"L2 {h['l2_bytes'] >> 20} MiB" if h.get("l2_bytes") else "")
                     if x)
    lines = [
        f"- GPU: **{h.get('gpu') or NOT_RECORDED}**" + (f", {size}" if size else "")
        + (" (a functional check, not a benchmark)" if h.get("device_type") == "cpu" else ""),
        f"- {versions_text(h)}",
        f"- date: {h.get('date') or NOT_RECORDED}; preset: {h.get('preset')}; "
        f"run time: {h.get('seconds', '?')} s",
        f"- copy bandwidth (the ceiling): {bw / 1e12:.3f} TB/s, measured by a "
        f"{h.get('copy_bytes', 1 << 30) >> 20} MiB "
        f"{'device' if h.get('device_type') == 'cuda' else 'host'} copy "
        "(bytes read + written / time)" if bw else
        "- copy bandwidth: not measured",
        f"- copy curve (the same-size copy column): {len(curve)} sizes, "
        f"{curve[0][1]:.2f} us for {curve[0][0] >> 10} KiB moved to "
        f"{curve[-1][1]:.0f} us for {curve[-1][0] >> 30} GiB"
        if curve else "- copy curve: not measured",
        "- command: " + (f"`{h['command']}`" if h.get("command") else NOT_RECORDED),
    ]
    return "\n".join(lines)


def _error_md(errors) -> list[str]:
    if not errors:
        return []
    lines = ["Errors:", ""]
    for label, k, v in errors[:50]:
        lines.append(f"- {label} {k}: `{v}`")
    return lines + [""]


def overhead_md(ov: dict) -> str:
    h = ov.get("header") or {}
    head = ["recipe", "case", "ours: host us/call", "of which our Python",
            "Triton launch + rest", "ours + sync us", "torch eager: host us/call",
            "torch eager + sync us"]
    dated = len({r.get("date") for r in ov["rows"]}) > 1     # rows from several runs
    if dated:
        head.append("measured")
    rows = []
    for r in ov["rows"]:
        if "error" in r and "ours_host_us" not in r:
            rows.append([r["suite"], "", "error: " + r["error"]] + [""] * 5
                        + ([r.get("date")] if dated else []))
            continue
        lab = " ".join(f"{k}={v}" for k, v in (r.get("label") or {}).items())
        rest = r["ours_host_us"] - r["ours_python_us"]
        rows.append([r["suite"], lab, fmt_us(r["ours_host_us"]), fmt_us(r["ours_python_us"]),
                     fmt_us(rest), fmt_us(r["ours_sync_us"]), fmt_us(r.get("torch_host_us")),
                     fmt_us(r.get("torch_sync_us"))] + ([r.get("date")] if dated else []))
    bare = ov.get("bare_triton_launch_us")
    gpu = h.get("gpu", "?")
    text = [f"# Eager call overhead: {gpu}", "",
            f"{line(h)}.", "",
            "Host wall time per call of each recipe's public function on the smoke "
            f"preset's tiny inputs ({ov.get('calls')} calls, median of 5 rounds), with "
            "`out=` buffers given (no allocation). \"host us/call\": back-to-back calls "
            "without synchronising (the Python + launch cost an eager engine pays per "
            "call; the GPU work is shorter, so this is what bounds eager throughput). "
            "\"of which our Python\": the same calls with every Triton launch turned into "
            "a no-op (validation, config dispatch, workspace). \"Triton launch + rest\": "
            "the difference (Triton's launcher: argument binding, specialisation key, "
            "driver launch). \"+ sync\": a device synchronisation after every call "
            "(latency of one call end to end). Under a CUDA graph none of this is paid.",
            "", table(head, rows), ""]
    if bare is not None:
        text += [f"A bare Triton launch (a one-store kernel with three arguments) costs "
                 f"{fmt_us(bare)} us of host time per call on this machine: the floor of "
                 "any Triton launcher.", ""]
    if h.get("device_type") == "cpu":
        text += ["*Measured under the Triton interpreter on a CPU: meaningless as "
                 "numbers, written only as a functional check.*", ""]
    return "\n".join(text)


# --- the pages ----------------------------------------------------------------------------
def _other_run(res: dict, header: dict) -> str | None:
    """"an earlier" / "a later" when the suite was measured by another run than the
    page's, else None."""
    date = res.get("date")
    if not date or date == header.get("date"):
        return None
    return "a later" if date > header.get("date", "") else "an earlier"


def _suite_md(res: dict, out: Path, copy_bw, curve) -> list[str]:
    """A suite's notes and plot (the table comes after)."""
    md = []
    if primary_regime(res) == "graph":
        md += [BACK_TO_BACK_NOTE, ""]
    if res.get("notes"):
        md += [res["notes"], ""]
    if res.get("error"):
        md += [f"*No cases: {res['error']}*", ""]
    if not res["complete"]:
        md += ["*Stopped by the time cap: some cases were not run.*", ""]
    png = out / f"bench-{res['suite']}.png"
    try:
        if plots.plot_suite(res, copy_bw, png, curve):
            md += [f"![{res['suite']}](bench-{res['suite']}.png)", ""]
    except ImportError as exc:
        md += [f"*(no plot: {error_text(exc)}; re-render with matplotlib installed)*", ""]
    except Exception as exc:  # noqa: BLE001 - a plot failure leaves the tables
        md += [f"*(plot failed: {error_text(exc)})*", ""]
    return md


def _suite_page_head(res: dict, header: dict) -> list[str]:
    """bench-<suite>.md's header: the run that measured the suite, and where that is not
    the run that measured the copy ceiling and curve, that one too."""
    md = [f"## {res['title']}", "", f"Measured: {line(suite_header(res, header))}.", ""]
    if _other_run(res, header):
        md += [f"Copy ceiling and curve (the copy-BW and same-size copy columns): "
               f"{line(of(header))} (BENCH.md).", ""]
    return md


def _bench_section_head(res: dict, header: dict) -> list[str]:
    """The suite's title in BENCH.md, and which run measured it when not the page's."""
    md = [f"## {res['title']}", ""]
    when = _other_run(res, header)
    if when:
        md += [f"*Measured by {when} run: {line(suite_header(res, header))}. Its copy-BW "
               "and same-size copy columns use this page's copy ceiling and curve.*", ""]
    return md


def render(out: Path) -> None:
    """Write BENCH.md, bench-<suite>.md/.png and OVERHEAD.md from the JSON in `out`."""
    out = Path(out)
    header, results = load(out)
    copy_bw = header.get("copy_bandwidth_Bps")
    curve = header.get("copy_curve")
    parts = [f"# spec-cookbook benchmarks: {header.get('gpu', out.name)}", "",
             header_md(header), "", METHOD, ""]
    if results:
        parts += ["## Headline", "", table(*headline_rows(results, copy_bw, curve)), ""]
    for res in results:
        head, rows = suite_rows(res, copy_bw, curve)
        md = _suite_md(res, out, copy_bw, curve)
        errors = [(e["label"], k, v) for e in res["cases"] for k, v in e["errors"].items()]
        tab = table(head, rows) if rows else "*(no cases)*"
        (out / f"bench-{res['suite']}.md").write_text(
            "\n".join(_suite_page_head(res, header) + md + [tab, ""] + _error_md(errors))
            + "\n")
        parts += _bench_section_head(res, header) + md + [
            f"<details><summary>All cases ({len(rows)})</summary>", "", tab, "",
            "</details>", ""]
        parts += _error_md(errors)
    ov = read_json(out / "overhead.json")
    if ov:
        (out / "OVERHEAD.md").write_text(overhead_md(ov))
        parts += ["## Eager call overhead", "", "See [OVERHEAD.md](OVERHEAD.md).", ""]
    if header or results:              # (an --overhead-only run has no BENCH.md of its own)
        (out / "BENCH.md").write_text("\n".join(parts).rstrip() + "\n")
