"""Human views of the tuned tables: `autotune show` (terminal: the last tune's report,
the tables dispatch reads and from where, then the tables) and `autotune report`
(markdown)."""
from __future__ import annotations

from pathlib import Path

from recipes._configs import MIN_GAIN, Entry, gains_enough, results_root
from recipes._tuning import key_str

from .tables import FORMAT, read_table

_SKIP = {"key", "config", "heuristic_config", "wrong_configs", "study"}


def _tables(root: Path | None, slug: str, recipes: list[str] | None, extra=()):
    """The tuned tables of a results folder, then the files of `extra` not among them:
    the JSON files that say they are a table (the folder also holds benchmark and quality
    reports); a table that cannot be read is reported, not skipped."""
    import json

    folder = Path(root or results_root()) / slug
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    seen = {p.resolve() for p in paths}
    paths += [p for p in extra if p.resolve() not in seen]
    for p in paths:
        if p.name.startswith(".") or (recipes and p.stem not in recipes):
            continue
        try:
            doc = json.loads(p.read_text())
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                continue        # a report, not a table
        except Exception:  # noqa: BLE001 - a damaged file: read_table says why below
            pass
        try:
            yield p, read_table(p), None
        except Exception as exc:  # noqa: BLE001
            yield p, None, f"{type(exc).__name__}: {exc}"


def _cfg(c: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in c.items())


def _key(k) -> str:
    return key_str(k) if isinstance(k, dict) else repr(k)


def _f(x, nd=2):
    """A number to `nd` places; None as '-'; anything else (a damaged table's field) as
    its repr, so that a table shows whatever it holds."""
    if x is None:
        return "-"
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.{nd}f}"
    return repr(x)


def _dict(x) -> dict:
    """A field that should be an object: itself, or {} where a damaged table has
    something else."""
    return x if isinstance(x, dict) else {}


def _rows(data: dict):
    """The table's entries as display rows; an entry whose fields cannot be shown gives
    a row saying so, not an error."""
    space = list(_dict(_dict(data.get("header")).get("space")))
    for e in data["entries"]:
        try:
            yield _row(e, space)
        except Exception as exc:  # noqa: BLE001 - a damaged entry is shown as such
            yield ["?", f"unreadable entry ({type(exc).__name__}: {exc})"] + \
                [""] * (len(HEAD) - 2)


def _row(e: dict, space: list) -> list:
    cfg = e["config"]
    shown = {k: cfg[k] for k in space if k in cfg} if space else cfg
    tr = _dict(e.get("trials"))
    return [key_str(e["key"]), _cfg(shown), _f(e.get("p50_us")),
            f"{_f(e.get('p20_us'))}-{_f(e.get('p80_us'))}",
            _f(e.get("heuristic_p50_us")), _f(e.get("speedup_vs_heuristic"), 2),
            _f(e.get("torch_p50_us")), _f(e.get("speedup_vs_torch"), 2),
            f"{tr.get('evaluated', '?')}/{e.get('grid', '?')}"
            + (f" WRONG:{tr['wrong']}" if tr.get("wrong") else ""),
            _entry_note(e)]


def _entry_note(e: dict) -> str:
    """Where the config came from, and whether dispatch runs it (`gains_enough`)."""
    src = e.get("chosen_from")
    note = _CHOSEN.get(src, str(src or "")) if isinstance(src, (str, type(None))) \
        else repr(src)
    if not gains_enough(Entry.from_json(e)):
        note += f" (gain < {MIN_GAIN:.0%}: dispatch runs the heuristic)"
    return note


_CHOSEN = {"search": "search", "heuristic": "heuristic kept",
           "previous table": "previous table's"}


HEAD = ["key", "config", "p50 us", "p20-p80", "heuristic us", "x heur", "torch us",
        "x torch", "configs run", "entry"]


def tune_report_text(root, slug: str) -> list[str]:
    """The last tune's report (results/<slug>/tune-report.json), in a few lines."""
    import json

    path = Path(root or results_root()) / slug / "tune-report.json"
    if not path.is_file():
        return [f"no tune report at {path}"]
    try:
        return _report_lines(path, json.loads(path.read_text()))
    except Exception as exc:  # noqa: BLE001 - a damaged report is shown as such
        return [f"{path}: unreadable ({type(exc).__name__}: {exc})"]


def _report_lines(path: Path, r: dict) -> list[str]:
    keys = r.get("keys") or []
    cut = [k for k in keys if k.get("measured", 0) < k.get("admitted", 0)]
    frac = coverage(keys)
    state = "complete" if r.get("complete") else (
        "interrupted" if r.get("interrupted") else "incomplete")
    out = [f"== tune report ({path}) ==",
           f"   {r.get('date')}: {state}, {r.get('wall_s')} s wall"
           + (" (fresh: no earlier table)" if r.get("fresh") else "")
           + f", budget {r.get('budget_s')} s; {len(keys)} of {r.get('keys_planned')} keys, "
           f"{r.get('configs_measured')} configs measured"
           + (f"; {coverage_text(keys)}" if frac else "")
           + (f" ({len(cut)} keys not measured in full, {sum(f >= 0.5 for f in frac)} "
              "at half or more)" if cut else "")]
    ph = r.get("phases") or {}
    if ph:
        out.append("   time: " + ", ".join(f"{k} {v:.1f} s" for k, v in ph.items()
                                        if v >= 0.05))
    comp = (r.get("compile") or {})
    pool = comp.get("pool")
    if pool:
        out.append(f"   compile pool: {pool['workers']} processes, {pool['binaries']} "
                   f"binaries ({pool['compiled']} compiled, {pool['from_cache']} from "
                   f"Triton's cache, {pool['failed']} failed), {pool['worker_s']} worker-s; "
                   f"measuring process loaded {comp.get('loaded')} "
                   f"({comp.get('not_from_pool', '-')} not from the pool), compiled "
                   f"{comp.get('compiled_in_process')} itself")
    costs = comp.get("config_costs") or {}
    if costs:
        out.append("   a config: " + "; ".join(
            f"{tag} {c['check_ms']:.2f} ms check + {c['timing_ms']:.2f} ms timing "
            f"({c['configs']})" for tag, c in costs.items()))
    by_recipe = comp.get("config_costs_by_recipe") or {}
    if by_recipe:
        out.append("   by recipe: " + "; ".join(
            f"{r} {c['check_ms'] + c['timing_ms']:.1f} ms ({c['configs']}, {c['loads']} "
            "loads)" for r, c in by_recipe.items()))
    compiled = comp.get("compiled_in_process_by_kernel") or {}
    if compiled:
        out.append("   compiled in the measuring process: " + ", ".join(
            f"{k} {n}" for k, n in compiled.items()))
    return out


def coverage(keys: list[dict]) -> list[float]:
    """Per key of a tune report (`keys` rows), the configs measured (in this run or read
    from the store) over the configs its grid admits."""
    return [k["measured"] / k["admitted"] for k in keys if k.get("admitted")]


def coverage_text(keys: list[dict]) -> str | None:
    """The coverage figure of a tune, the one its last line and `show` print: the range
    over its keys of `coverage` (not the planned fraction, which a --trials cap or a
    budget cut leaves unmet)."""
    frac = coverage(keys)
    return f"coverage {_range(frac)} of each grid" if frac else None


def _range(xs) -> str:
    lo, hi = min(xs), max(xs)
    return f"{lo:.0%}" if round(lo, 2) == round(hi, 2) else f"{lo:.0%}-{hi:.0%}"


def tables_in_use(slug: str, recipes: list[str] | None = None) -> dict:
    """Recipe -> (the table file dispatch reads for it on GPU `slug`, wherever it comes
    from, or None; entries used) or the exception that says why it cannot tell."""
    from recipes import _configs as dispatch

    from .registry import tunables

    known = tunables()
    out: dict = {}
    for name in recipes or list(known):
        try:
            out[name] = dispatch.table_in_use(slug, known[name].tuning)
        except Exception as exc:  # noqa: BLE001 - shown, not raised
            out[name] = exc
    return out


def dispatch_text(slug: str, recipes: list[str] | None = None, used=None) -> list[str]:
    """Which table dispatch reads for each recipe on GPU `slug`, and the folders it
    looks in (`recipes._configs.search_roots`, first usable table wins)."""
    from recipes import _configs as dispatch

    used = tables_in_use(slug, recipes) if used is None else used
    out = [f"== dispatch on GPU {slug!r}: tables are looked up in "
           + ", then ".join(str(r) for r in dispatch.search_roots()) + " =="]
    for name, got in used.items():
        if isinstance(got, Exception):
            out.append(f"   {name}: cannot tell ({type(got).__name__}: {got})")
            continue
        path, n = got
        out.append(f"   {name}: " + (f"{path} ({n} entries used)" if path is not None
                                     else "no table: heuristic configs"))
    return out


def show_text(root, slug: str, recipes: list[str] | None = None,
              dispatch: bool = False) -> str:
    try:
        from tabulate import tabulate
    except ImportError:  # pragma: no cover
        tabulate = None
    out = []
    in_use: list = []
    if dispatch:
        import warnings
        out += tune_report_text(root, slug) + [""]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            used = tables_in_use(slug, recipes)
            out += dispatch_text(slug, recipes, used)
        out += [f"   note: {w.message}" for w in caught] + [""]
        in_use = [u[0] for u in used.values()
                  if not isinstance(u, Exception) and u[0] is not None]
    found = False
    for p, data, err in _tables(root, slug, recipes, in_use):
        found = True
        if err:
            out.append(f"{p}: unreadable ({err})")
            continue
        h = _dict(data.get("header"))
        out.append(f"== {data.get('recipe', p.stem)} on {h.get('gpu')} ({p}) ==")
        if h.get("interpreter"):
            out.append(f"   {h.get('label', 'interpreter smoke tune')}")
        out.append(f"   torch {h.get('torch')}, Triton {h.get('triton')}, {h.get('date')}; "
                   f"space {h.get('space_hash')}, source {h.get('source_hash')}")
        rows = list(_rows(data))
        if tabulate:
            out.append(tabulate(rows, headers=HEAD, disable_numparse=True))
        else:
            out += ["  ".join(HEAD)] + ["  ".join(r) for r in rows]
        out.append("")
    if not found:
        out.append(f"no tuned tables under {Path(root or results_root()) / slug}"
                   + (" nor in use by dispatch" if dispatch else ""))
    return "\n".join(out)


def report_markdown(root, slug: str, recipes: list[str] | None = None) -> str:
    lines = [f"# Tuned tables: results/{slug}", ""]
    first = True
    for p, data, err in _tables(root, slug, recipes):
        if err:
            lines += [f"## {p.stem}", "", f"Unreadable: {err}", ""]
            continue
        h = _dict(data.get("header"))
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
        wrong = [(e["key"], c) for e in data["entries"]
                 for c in e.get("wrong_configs") or [] if isinstance(c, dict)]
        if wrong:
            lines += ["", "Configs whose outputs differed from the reference (never chosen):"]
            lines += [f"- `{_key(k)}`: `{_cfg(c)}`" for k, c in wrong]
        lines.append("")
    if first:
        lines.append("No tables.")
    return "\n".join(lines)
