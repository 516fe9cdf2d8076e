"""Dispatch from tuned tables: `results/<gpu-slug>/<recipe>.json`.

A recipe asks `lookup(recipe, key, device)` at call time. The table of the device's GPU
is read once per process; the exact key wins, else the nearest tuned key (same
categorical fields, e.g. dtype; nearest in log2 space over the numeric ones, and within
a factor of about 2 in every numeric field: `MAX_FIELD_LOG2`), else None and the recipe
uses its heuristic. The factor-2 limit is measured: on the H200 bench of 2026-11-29 the
unlimited nearest key ran configs tuned for other batch sizes or vocabularies up to 2x
slower than the heuristic (draft_tail B=1 V=151936 given B=1 V=32000's config: 0.75x;
verify_metadata B=64 page 1 given B=1's: 0.50x; results/h200/NOTES.md). A missing
table is silent; an unreadable or corrupt one warns once and is treated as missing.
Nothing here ever raises into a call.
Tables made under the Triton interpreter (`results/cpu-interpreter/`, or any table whose
header says `"interpreter": true`) are never used on a GPU.

When the recipe is registered (`autotune.registry`), its table is checked against it: a
table whose `header.space_hash` is not the hash of the recipe's current space is ignored
with one warning (the space changed since it was tuned), and entries whose config the
current space does not admit (a value outside the choices, or rejected by the static
constraint for that entry's key) are dropped with one warning. The table format is
documented in `autotune/tables.py`.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import warnings
from pathlib import Path

import torch

RESULTS_ENV = "SPEC_COOKBOOK_RESULTS"
INTERPRETER_SLUG = "cpu-interpreter"


def results_root() -> Path:
    env = os.environ.get(RESULTS_ENV)
    return Path(env) if env else Path(__file__).resolve().parent.parent / "results"


def gpu_slug(device: torch.device | None = None) -> str:
    """'NVIDIA H200' -> 'h200'; CPU (interpreter) -> 'cpu-interpreter'."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type != "cuda":
        return INTERPRETER_SLUG
    name = torch.cuda.get_device_name(device)
    name = re.sub(r"^(nvidia|amd)\s+", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


_TABLES: dict = {}        # (slug, recipe) -> {"entries": [(key, config)]}
_WARNED: set = set()


def _warn_once(tag, msg: str) -> None:
    if tag not in _WARNED:
        _WARNED.add(tag)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


def load_table(path: Path) -> dict:
    """Parse a table file; raises ValueError on anything malformed."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise ValueError("no 'entries' list")
    for e in data["entries"]:
        if not isinstance(e, dict) or not isinstance(e.get("key"), dict) \
                or not isinstance(e.get("config"), dict):
            raise ValueError("an entry lacks a 'key' or 'config' object")
    return data


def _checked_entries(slug: str, recipe: str, path: Path, data: dict) -> list:
    """(key, config) pairs of a parsed table that the registered recipe can use."""
    tk = (slug, recipe)
    header = data.get("header")
    header = header if isinstance(header, dict) else {}
    if header.get("interpreter") and slug != INTERPRETER_SLUG:
        _warn_once(tk, f"spec-cookbook: ignoring the tuned table {path}: it was made under "
                       "the Triton interpreter; using heuristic configs")
        return []
    entries = [(e["key"], e["config"]) for e in data["entries"]]
    try:
        from autotune.registry import tunables
        tunable = tunables().get(recipe)
    except Exception:  # noqa: BLE001
        tunable = None
    if tunable is None:
        return entries
    want = tunable.space_hash()
    if header.get("space_hash") != want:
        _warn_once(tk, f"spec-cookbook: ignoring the tuned table {path}: it was tuned over "
                       f"another search space (space hash {header.get('space_hash')!r}, "
                       f"the recipe's is {want!r}); re-run `python -m autotune tune "
                       f"--recipe {recipe}`; using heuristic configs")
        return []
    good = [(k, c) for k, c in entries if tunable.admits(c, k)]
    if len(good) != len(entries):
        _warn_once(tk, f"spec-cookbook: ignoring {len(entries) - len(good)} of "
                       f"{len(entries)} entries of the tuned table {path}: their config is "
                       f"not valid in {recipe}'s current search space")
    return good


def _table(slug: str, recipe: str):
    tk = (slug, recipe)
    t = _TABLES.get(tk)
    if t is None:
        entries = []
        path = results_root() / slug / f"{recipe}.json"
        if path.exists():
            try:
                entries = _checked_entries(slug, recipe, path, load_table(path))
            except Exception as exc:  # noqa: BLE001 - any damage means "no table"
                _warn_once(tk, f"spec-cookbook: ignoring the tuned table {path} "
                               f"({type(exc).__name__}: {exc}); using heuristic configs")
                entries = []
        t = _TABLES[tk] = {"entries": entries}
    return t


def clear_cache() -> None:
    _TABLES.clear()
    _WARNED.clear()
    _RESOLVED.clear()


# A tuned config is used for another key only if every numeric field is within this
# distance in log2(x + 1) (about a factor of 2): farther, the heuristic is the better bet.
MAX_FIELD_LOG2 = 1.0


def key_distance(a: dict, b: dict, max_field: float = math.inf) -> float:
    """inf unless the categorical fields agree and every numeric field is within
    `max_field` in log2(x + 1); else the L1 distance in that space."""
    if set(a) != set(b):
        return math.inf
    d = 0.0
    for f, va in a.items():
        vb = b[f]
        if isinstance(va, (int, float)) and not isinstance(va, bool) \
                and isinstance(vb, (int, float)) and not isinstance(vb, bool):
            df = abs(math.log2(max(va, 0) + 1) - math.log2(max(vb, 0) + 1))
            if df > max_field:
                return math.inf
            d += df
        elif va != vb:
            return math.inf
    return d


def nearest(entries, key: dict, max_field: float = MAX_FIELD_LOG2):
    """The config of the entry nearest to `key` (`key_distance`), None if none is near."""
    best, best_d = None, math.inf
    for k, cfg in entries:
        d = key_distance(key, k, max_field)
        if d < best_d:
            best, best_d = cfg, d
    return best


def lookup(recipe: str, key: dict, device: torch.device):
    """The tuned config for `key` on `device`'s GPU (exact key, else nearest), or None.
    Only CUDA devices have tables; under the interpreter this is always None."""
    if device.type != "cuda":
        return None
    try:
        slug = gpu_slug(device)
    except Exception as exc:  # noqa: BLE001 - dispatch never fails a call
        _warn_once((recipe, "lookup"), f"spec-cookbook: tuned-table lookup failed for "
                                       f"{recipe} ({exc}); using heuristic configs")
        return None
    return lookup_slug(slug, recipe, key)


def lookup_slug(slug: str, recipe: str, key: dict):
    """`lookup` for the tables of `results/<slug>/` (what tests and tools call)."""
    try:
        # no cache of its own: `resolve` caches what a call runs (bounded), and a lookup
        # is a scan of a few dozen entries
        t = _table(slug, recipe)
        return nearest(t["entries"], key) if t["entries"] else None
    except Exception as exc:  # noqa: BLE001 - dispatch never fails a call
        _warn_once((recipe, "lookup"), f"spec-cookbook: tuned-table lookup failed for "
                                       f"{recipe} ({exc}); using heuristic configs")
        return None


# --- what a call with config=None runs: cached, traceable, overridable -----------------
_RESOLVED: dict = {}      # (recipe, device type, index, heuristic, key items) -> config
_RESOLVED_MAX = 4096
_FORCE_HEURISTIC = False
_TRACE: list | None = None


def resolve(recipe: str, key: dict, heuristic, device: torch.device) -> dict:
    """The config a `config=None` call runs: the tuned config of the nearest key for
    `device`'s GPU (`lookup`), else `heuristic(key, device)`. Cached per (recipe, device,
    heuristic, key), so a repeated call costs one dict lookup; `clear_cache()` forgets.
    Returns the cached dict itself: callers copy it before changing it."""
    if _FORCE_HEURISTIC or _TRACE is not None:
        return _resolve_now(recipe, key, heuristic, device)
    try:
        ck = (recipe, device.type, device.index, heuristic, tuple(key.items()))
        cfg = _RESOLVED.get(ck)
    except TypeError:                       # an unhashable key value: no caching
        return _resolve_now(recipe, key, heuristic, device)
    if cfg is None:
        cfg = _resolve_now(recipe, key, heuristic, device)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[ck] = cfg
    return cfg


def _resolve_now(recipe, key, heuristic, device) -> dict:
    tuned = None if _FORCE_HEURISTIC else lookup(recipe, key, device)
    if _TRACE is not None:
        _TRACE.append((recipe, dict(key), None if tuned is None else dict(tuned)))
    return dict(tuned) if tuned is not None else heuristic(key, device)


@contextlib.contextmanager
def heuristic_only():
    """Inside, `config=None` calls run the heuristic config, as if no table existed (the
    benchmarks' "tuned against heuristic" comparison)."""
    global _FORCE_HEURISTIC
    prev, _FORCE_HEURISTIC = _FORCE_HEURISTIC, True
    try:
        yield
    finally:
        _FORCE_HEURISTIC = prev


@contextlib.contextmanager
def trace_configs():
    """Inside, every `config=None` resolution is appended to the yielded list as
    (recipe, key, tuned config or None)."""
    global _TRACE
    prev, _TRACE = _TRACE, []
    try:
        yield _TRACE
    finally:
        _TRACE = prev
