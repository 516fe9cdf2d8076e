"""Human views of the tuned tables: `autotune show` (terminal) and `autotune report`
(markdown)."""
from __future__ import annotations

from pathlib import Path

from recipes.tables import results_root

from .registry import key_str
from .tables import FORMAT, read_table

_SKIP = {"key", "config", "heuristic_config", "wrong_configs", "study"}


def _tables(root: Path | None, slug: str, recipes: list[str] | None):
    """The tuned tables of a results folder: its JSON files that say they are one (the
    folder also holds benchmark and quality reports); a table that cannot be read is
    reported, not skipped."""
    import json

    folder = Path(root or results_root()) / slug
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    for p in paths:
        if p.name.startswith(".") or (recipes and p.stem not in recipes):
            continue
        try:
            if json.loads(p.read_text()).get("format") != FORMAT:
                continue
        except Exception:  # noqa: BLE001 - a damaged file: read_table says why below
            pass
        try:
            yield p, read_table(p), None
        except Exception as exc:  # noqa: BLE001
            yield p, None, f"{type(exc).__name__}: {exc}"


def _cfg(c: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in c.items())


def _f(x, nd=2):
    return "-" if x is None else f"{x:.{nd}f}"


def _rows(data: dict):
    space = list((data.get("header") or {}).get("space") or {})
    for e in data["entries"]:
        cfg = e["config"]
        shown = {k: cfg[k] for k in space if k in cfg} if space else cfg
        tr = e.get("trials") or {}
        yield [key_str(e["key"]), _cfg(shown), _f(e.get("p50_us")),
               f"{_f(e.get('p20_us'))}-{_f(e.get('p80_us'))}",
               _f(e.get("heuristic_p50_us")), _f(e.get("speedup_vs_heuristic"), 2),
               _f(e.get("torch_p50_us")), _f(e.get("speedup_vs_torch"), 2),
               f"{tr.get('evaluated', '?')}/{e.get('grid', '?')} {e.get('mode', '')}"
               + (" (budget)" if e.get("budget_cut") else "")
               + (f" WRONG:{tr['wrong']}" if tr.get("wrong") else "")
               + (" (kept the previous table's)" if e.get("chosen_from") == "previous table"
                  else "")]


HEAD = ["key", "config", "p50 us", "p20-p80", "heuristic us", "x heur", "torch us",
        "x torch", "configs run"]


def show_text(root, slug: str, recipes: list[str] | None = None) -> str:
    try:
        from tabulate import tabulate
    except ImportError:  # pragma: no cover
        tabulate = None
    out = []
    found = False
    for p, data, err in _tables(root, slug, recipes):
        found = True
        if err:
            out.append(f"{p}: unreadable ({err})")
            continue
        h = data.get("header") or {}
        out.append(f"== {data.get('recipe', p.stem)} on {h.get('gpu')} ({p}) ==")
        if h.get("interpreter"):
            out.append("   " + h.get("label", "interpreter smoke tune"))
        out.append(f"   torch {h.get('torch')}, Triton {h.get('triton')}, {h.get('date')}; "
                   f"space {h.get('space_hash')}, source {h.get('source_hash')}")
        rows = list(_rows(data))
        if tabulate:
            out.append(tabulate(rows, headers=HEAD, disable_numparse=True))
        else:
            out += ["  ".join(HEAD)] + ["  ".join(r) for r in rows]
        out.append("")
    if not found:
        out.append(f"no tuned tables under {Path(root or results_root()) / slug}")
    return "\n".join(out)


def report_markdown(root, slug: str, recipes: list[str] | None = None) -> str:
    lines = [f"# Tuned tables: results/{slug}", ""]
    first = True
    for p, data, err in _tables(root, slug, recipes):
        if err:
            lines += [f"## {p.stem}", "", f"Unreadable: {err}", ""]
            continue
        h = data.get("header") or {}
        if first:
            lines += [f"GPU: {h.get('gpu')} ({h.get('sm_count')} SMs); torch {h.get('torch')}, "
                      f"Triton {h.get('triton')}, Optuna {h.get('optuna')}. "
                      f"Timing: {h.get('timing')}.", ""]
            if h.get("interpreter"):
                lines += [f"**{h.get('label')}**", ""]
            first = False
        lines += [f"## {data.get('recipe', p.stem)}", "",
                  f"Tuned {h.get('date')}; source hash `{h.get('source_hash')}`, space hash "
                  f"`{h.get('space_hash')}`.", "",
                  "| " + " | ".join(HEAD) + " |",
                  "|" + "|".join("---" if i < 2 else "---:" for i in range(len(HEAD))) + "|"]
        for r in _rows(data):
            lines.append("| `" + r[0] + "` | " + " | ".join(r[1:]) + " |")
        wrong = [(e["key"], c) for e in data["entries"] for c in e.get("wrong_configs") or []]
        if wrong:
            lines += ["", "Configs whose outputs differed from the reference (never chosen):"]
            lines += [f"- `{key_str(k)}`: `{_cfg(c)}`" for k, c in wrong]
        lines.append("")
    if first:
        lines.append("No tables.")
    return "\n".join(lines)
