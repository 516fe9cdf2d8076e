"""Dispatch from tuned tables: `results/<gpu-slug>/<recipe>.json`.

A recipe asks `lookup(recipe, key, device)` at call time. The table of the device's GPU
is read once per process; the exact key wins, else the nearest tuned key (same
categorical fields, e.g. dtype; nearest in log2 space over the numeric ones), else None
and the recipe uses its heuristic. A missing table is silent; an unreadable or corrupt
one warns once and is treated as missing. Nothing here ever raises into a call.
Tables made under the Triton interpreter (`results/cpu-interpreter/`) are never used.
"""
from __future__ import annotations

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


_TABLES: dict = {}        # (slug, recipe) -> {"keys": [(key, config)], "cache": {}}
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


def _table(slug: str, recipe: str):
    tk = (slug, recipe)
    t = _TABLES.get(tk)
    if t is None:
        entries = []
        path = results_root() / slug / f"{recipe}.json"
        if path.exists():
            try:
                entries = [(e["key"], e["config"]) for e in load_table(path)["entries"]]
            except Exception as exc:  # noqa: BLE001 - any damage means "no table"
                _warn_once(tk, f"spec-cookbook: ignoring the tuned table {path} "
                               f"({type(exc).__name__}: {exc}); using heuristic configs")
                entries = []
        t = _TABLES[tk] = {"entries": entries, "cache": {}}
    return t


def clear_cache() -> None:
    _TABLES.clear()
    _WARNED.clear()


def key_distance(a: dict, b: dict) -> float:
    """inf unless the categorical fields agree; else the L1 distance in log2 space."""
    if set(a) != set(b):
        return math.inf
    d = 0.0
    for f, va in a.items():
        vb = b[f]
        if isinstance(va, (int, float)) and not isinstance(va, bool) \
                and isinstance(vb, (int, float)) and not isinstance(vb, bool):
            d += abs(math.log2(max(va, 0) + 1) - math.log2(max(vb, 0) + 1))
        elif va != vb:
            return math.inf
    return d


def nearest(entries, key: dict):
    best, best_d = None, math.inf
    for k, cfg in entries:
        d = key_distance(key, k)
        if d < best_d:
            best, best_d = cfg, d
    return best


def lookup(recipe: str, key: dict, device: torch.device):
    if device.type != "cuda":
        return None
    try:
        t = _table(gpu_slug(device), recipe)
        ck = tuple(sorted(key.items()))
        if ck not in t["cache"]:
            t["cache"][ck] = nearest(t["entries"], key) if t["entries"] else None
        return t["cache"][ck]
    except Exception as exc:  # noqa: BLE001 - dispatch never fails a call
        _warn_once((recipe, "lookup"), f"spec-cookbook: tuned-table lookup failed for "
                                       f"{recipe} ({exc}); using heuristic configs")
        return None
