"""Reading tuned tables and picking a call's config: `<root>/<gpu-slug>/<recipe>.json`.

Where tables are found, first match wins (`search_roots`):
  1. the user's folder (`user_root`): `$SPEC_COOKBOOK_RESULTS` if set; else, in a source
     checkout, its `results/`; else a per-user cache folder
     (`$XDG_CACHE_HOME/spec-cookbook/results`, by default `~/.cache/...`). Tunes and
     benchmarks write here, so a user's own tune overrides what shipped;
  2. the tables shipped with the package (`shipped_root`): `recipes/results/` in an
     installed wheel, `results/` of a source checkout.

A recipe asks `resolve(tuning, key, device)` at call time (`tuning`: its `TUNING`,
`recipes/_tuning.py`). The table of the device's GPU is read once per process; the exact
key wins, else, for a key between nearby tuned keys in every field (never beyond them),
a nearby tuned key whose config the table records as measured no slower than the
heuristic at this key's tuned neighbours and whose heuristic config is this key's
(`nearest`), else the heuristic. Either way a tuned config is used only where the table
records it at least `MIN_GAIN` faster than the heuristic at its own key. A table is
ignored, with one warning, when it was made under the interpreter (on a GPU), over
another search space, or for kernel source that has changed since
(`header.source_hash`); entries whose config the current space does not admit are
dropped with one warning. A table that cannot be used warns once and gives way to the
next root's (a damaged user table to the shipped one). A GPU with no table folder in any
root warns once, naming `make tune`; one recipe's missing table is silent. Nothing here
ever raises into a call. The format is documented in `autotune/tables.py`, which writes
it.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

from ._tuning import Tuning, key_str

RESULTS_ENV = "SPEC_COOKBOOK_RESULTS"
INTERPRETER_SLUG = "cpu-interpreter"
_PKG = Path(__file__).resolve().parent


def _checkout_results() -> Path | None:
    """`results/` of the source checkout this package is imported from, or None."""
    top = _PKG.parent
    if (top / "pyproject.toml").is_file() and (top / "results").is_dir():
        return top / "results"
    return None


def shipped_root() -> Path | None:
    """The tables that came with the package: package data of a wheel, or a checkout's."""
    if (_PKG / "results").is_dir():
        return _PKG / "results"
    return _checkout_results()


def user_root() -> Path:
    """Where this user's tunes and benchmarks write (and what dispatch reads first)."""
    env = os.environ.get(RESULTS_ENV)
    if env:
        return Path(env)
    checkout = _checkout_results()
    if checkout is not None:
        return checkout
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "spec-cookbook" / "results"


def results_root() -> Path:
    """The folder results are written to: `user_root()`."""
    return user_root()


def search_roots() -> list[Path]:
    roots = [user_root()]
    shipped = shipped_root()
    if shipped is not None and shipped.resolve() != roots[0].resolve():
        roots.append(shipped)
    return roots


def table_files(slug: str, recipe: str) -> list[Path]:
    """Every table file for (`slug`, `recipe`), in the order dispatch tries them: a root's
    table that cannot be used (damaged, stale) gives way to the next root's."""
    return [p for p in (root / slug / f"{recipe}.json" for root in search_roots())
            if p.is_file()]


def find_table(slug: str, recipe: str) -> Path | None:
    """The first table file for (`slug`, `recipe`) (`table_files`), or None."""
    files = table_files(slug, recipe)
    return files[0] if files else None


def has_tables(slug: str) -> bool:
    """Whether any root holds a table folder for GPU `slug`."""
    return any((root / slug).is_dir() for root in search_roots())


# A model name: a letter or two and 2-4 digits, maybe one letter (h200, a100, b200, l40s,
# gh200). Tables are per model: its variants (H200 NVL, H200 SXM, A100-SXM4-80GB) share
# them, as a config valid on one runs on all and the heuristics read the SM count.
_MODEL = re.compile(r"[a-z]{1,2}\d{2,4}[a-z]?")


def slug_of(name: str) -> str:
    """A GPU name's table folder: 'NVIDIA H200', 'NVIDIA H200 NVL', 'H200 SXM' -> 'h200';
    'NVIDIA A100-SXM4-80GB' -> 'a100'; a name that starts with no model name, its words
    in lower case joined by '-' ('NVIDIA GeForce RTX 4090' -> 'geforce-rtx-4090')."""
    name = re.sub(r"^(nvidia|amd)\s+", "", name.strip(), flags=re.I)
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    first = slug.split("-")[0]
    return first if _MODEL.fullmatch(first) else slug or "gpu"


def gpu_slug(device: torch.device | None = None) -> str:
    """The table folder of `device`'s GPU (`slug_of` its name); CPU (interpreter) ->
    'cpu-interpreter'."""
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type != "cuda":
        return INTERPRETER_SLUG
    return slug_of(torch.cuda.get_device_name(device))


_TABLES: dict = {}        # (slug, recipe) -> {"entries": [Entry], "path": Path | None}
_WARNED: set = set()


def _warn_once(tag, msg: str) -> None:
    if tag not in _WARNED:
        _WARNED.add(tag)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)


class Entry(NamedTuple):
    """A table entry as dispatch uses it (the JSON entry's fields of the same names;
    `autotune/tables.py` documents them)."""
    key: dict
    config: dict
    no_slower_at: frozenset = frozenset()   # key strings where `config` was measured no
    #                                         slower than the heuristic there
    heuristic_config: dict | None = None    # the heuristic's config at `key`, if recorded
    speedup_vs_heuristic: float | None = None   # `config`'s recorded speedup over it

    @classmethod
    def from_json(cls, e: dict) -> Entry:
        """The entry of a parsed table entry (fields of the wrong type read as absent)."""
        heur, speedup = e.get("heuristic_config"), e.get("speedup_vs_heuristic")
        return cls(e["key"], e["config"],
                   frozenset(key_str(k) for k in e.get("no_slower_at") or ()
                             if isinstance(k, dict)),
                   heur if isinstance(heur, dict) else None,
                   speedup if _numeric(speedup) else None)


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


class _Unusable(Exception):
    """A table that dispatch ignores as a whole; the message says why."""


def _checked_entries(slug: str, tuning: Tuning, path: Path, data: dict) -> list:
    """The usable entries of a parsed table (`Entry`); raises _Unusable for a table made
    under the interpreter (on a GPU), over another search space or for other kernel
    source. Entries whose config the space does not admit are dropped with a warning."""
    recipe = tuning.name
    header = data.get("header")
    header = header if isinstance(header, dict) else {}
    if header.get("interpreter") and slug != INTERPRETER_SLUG:
        raise _Unusable("it was made under the Triton interpreter")
    entries = [Entry.from_json(e) for e in data["entries"]]
    retune = f"re-run `python -m autotune tune --recipe {recipe}`"
    want = tuning.space_hash()
    if header.get("space_hash") != want:
        raise _Unusable(f"it was tuned over another search space (space hash "
                        f"{header.get('space_hash')!r}, the recipe's is {want!r}); {retune}")
    src = tuning.source_hash()
    if header.get("source_hash") != src:
        raise _Unusable(f"it was tuned for other kernel source (source hash "
                        f"{header.get('source_hash')!r}, the recipe's is {src!r}); {retune}")
    good = [e for e in entries if tuning.admits(e.config, e.key)]
    if len(good) != len(entries):
        _warn_once(("entries", str(path)),
                   f"spec-cookbook: ignoring {len(entries) - len(good)} of {len(entries)} "
                   f"entries of the tuned table {path}: their config is not valid in "
                   f"{recipe}'s current search space")
    return good


def _table(slug: str, tuning: Tuning):
    """The entries dispatch uses for (`slug`, `tuning`) and their file: the first table
    file (`table_files`) that can be used; one that cannot warns once and gives way to
    the next. A GPU with no table folder at all warns once, naming `make tune`."""
    tk = (slug, tuning.name)
    t = _TABLES.get(tk)
    if t is None:
        t = {"entries": [], "path": None}
        files = table_files(slug, tuning.name)
        for i, path in enumerate(files):
            then = (f"using {files[i + 1]} instead" if i + 1 < len(files)
                    else "using heuristic configs")
            try:
                t = {"entries": _checked_entries(slug, tuning, path, load_table(path)),
                     "path": path}
                break
            except _Unusable as exc:
                why = str(exc)
            except Exception as exc:  # noqa: BLE001 - any damage means "not this table"
                why = f"{type(exc).__name__}: {exc}"
            _warn_once(("table", str(path)),
                       f"spec-cookbook: ignoring the tuned table {path} ({why}); {then}")
        if not files and slug != INTERPRETER_SLUG and not has_tables(slug):
            _warn_once(("gpu", slug),
                       f"spec-cookbook: no tuned tables for this GPU ({slug!r}) in "
                       f"{', '.join(str(r) for r in search_roots())}; every recipe runs "
                       "its heuristic configs. `make tune` in a source checkout (or "
                       "`python -m autotune tune`) tunes them for this GPU.")
        _TABLES[tk] = t
    return t


def table_in_use(slug: str, tuning: Tuning) -> tuple[Path | None, int]:
    """(the file dispatch reads for this GPU and recipe, how many entries it uses)."""
    t = _table(slug, tuning)
    return t["path"], len(t["entries"])


def clear_cache() -> None:
    _TABLES.clear()
    _WARNED.clear()
    _RESOLVED.clear()


# A tuned config is used for another key only if every numeric field is within this
# distance in log2(x + 1) (about a factor of 2): farther, the heuristic is the better bet.
MAX_FIELD_LOG2 = 1.0


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def key_distance(a: dict, b: dict, max_field: float = math.inf) -> float:
    """inf unless the categorical fields agree and every numeric field is within
    `max_field` in log2(x + 1); else the L1 distance in that space."""
    if set(a) != set(b):
        return math.inf
    d = 0.0
    for f, va in a.items():
        vb = b[f]
        if _numeric(va) and _numeric(vb):
            df = abs(math.log2(max(va, 0) + 1) - math.log2(max(vb, 0) + 1))
            if df > max_field:
                return math.inf
            d += df
        elif va != vb:
            return math.inf
    return d


def inside_tuned(entries, key: dict) -> bool:
    """Whether every numeric field of `key` lies within the values that the tuned keys
    of `entries` of its kind (same fields, same categorical values) span in that field.
    A key between tuned keys interpolates; one beyond them extrapolates (K = 1 or 4 where
    only K = 3 was tuned), and there borrowed configs were measured slower than the
    heuristic; so was one lent from near keys on one side only (V = 129280 from
    V = 151936, the next tuned vocabulary below being 32000): `nearest` asks this of the
    near keys (docs/performance.md, Dispatch)."""
    kin = [e.key for e in entries if set(e.key) == set(key)
           and all(_numeric(v) or e.key[f] == v for f, v in key.items())]
    return bool(kin) and all(
        min(k[f] for k in kin) <= v <= max(k[f] for k in kin)
        for f, v in key.items() if _numeric(v))


# A tuned config replaces the heuristic's, at its own key or lent, only where the tune
# recorded it at least this much faster there: two processes' timings of one config
# differ by up to 1.5% (the tune's and the benchmark's on the H200), so a smaller gain
# is not one a call can count on. The tuner applies the same bar (autotune.tune.write).
MIN_GAIN = 0.02


def gains_enough(entry: Entry) -> bool:
    """Whether an entry's config may replace the heuristic (`MIN_GAIN`): it is the
    heuristic's, or no heuristic or speedup was recorded (older tables), or its recorded
    speedup is at least 1 + MIN_GAIN."""
    heur, speedup = entry.heuristic_config, entry.speedup_vs_heuristic
    if heur is None or speedup is None or dict(entry.config) == dict(heur):
        return True
    return speedup >= 1.0 + MIN_GAIN - 1e-9


def nearest(entries, key: dict, max_field: float = MAX_FIELD_LOG2, heuristic=None):
    """The config to run at `key`: the exact entry's; else, for a key inside the span of
    the tuned keys within `max_field` of it (`key_distance`) in every numeric field
    (`inside_tuned` over those near keys: tuned keys on both sides, near), that of the
    nearest such entry whose config was measured no slower than the heuristic
    at every other tuned key near `key` (its `no_slower_at`), where there are at least
    two, and, given `heuristic` (the heuristic's config at `key`), whose own key had that
    same heuristic config: the measurements compared the lent config with the config
    `key` would otherwise run. Either way only a config that `gains_enough` at its own
    key. Else None (the heuristic). `entries`: `Entry`s."""
    near = []
    for e in entries:
        d = key_distance(key, e.key, max_field)
        if d == 0:
            return e.config if gains_enough(e) else None
        if d < math.inf:
            near.append((d, e))
    near.sort(key=lambda de: de[0])
    if len(near) < 2 or not inside_tuned([e for _, e in near], key):
        return None
    names = [key_str(e.key) for _, e in near]
    for _, e in near:
        own = key_str(e.key)
        if heuristic is not None and e.heuristic_config != dict(heuristic):
            continue
        if not gains_enough(e):
            continue
        if all(n == own or n in e.no_slower_at for n in names):
            return e.config
    return None


def lookup(tuning: Tuning, key: dict, device: torch.device, heuristic=None):
    """The tuned config for `key` on `device`'s GPU (exact key, else nearest; `heuristic`:
    the heuristic's config at `key`, see `nearest`), or None. Only CUDA devices have
    tables; under the interpreter this is always None."""
    if device.type != "cuda":
        return None
    try:
        slug = gpu_slug(device)
    except Exception as exc:  # noqa: BLE001 - dispatch never fails a call
        _warn_once((tuning.name, "lookup"), f"spec-cookbook: tuned-table lookup failed "
                                            f"for {tuning.name} ({exc}); using heuristic "
                                            "configs")
        return None
    return lookup_slug(slug, tuning, key, heuristic)


def lookup_slug(slug: str, tuning: Tuning, key: dict, heuristic=None):
    """`lookup` for the tables of GPU `slug` (what tests and tools call)."""
    try:
        # no cache of its own: `resolve` caches what a call runs (bounded), and a lookup
        # is a scan of a few dozen entries
        t = _table(slug, tuning)
        return nearest(t["entries"], key, heuristic=heuristic) if t["entries"] else None
    except Exception as exc:  # noqa: BLE001 - dispatch never fails a call
        _warn_once((tuning.name, "lookup"), f"spec-cookbook: tuned-table lookup failed "
                                            f"for {tuning.name} ({exc}); using heuristic "
                                            "configs")
        return None


# --- what a call with config=None runs: cached, traceable, overridable -----------------
_RESOLVED: dict = {}      # (tuning, device type, index, key items) -> config
_RESOLVED_MAX = 4096
_FORCE_HEURISTIC = False
_TRACE: list | None = None


def resolve(tuning: Tuning, key: dict, device: torch.device) -> dict:
    """The config a `config=None` call runs: the tuned config of the nearest key for
    `device`'s GPU (`lookup`), else `tuning.heuristic(key, device)`. Cached per (tuning,
    device, key), so a repeated call costs one dict lookup; `clear_cache()` forgets.
    Returns the cached dict itself: callers copy it before changing it."""
    if _FORCE_HEURISTIC or _TRACE is not None:
        return _resolve_now(tuning, key, device)
    try:
        ck = (tuning, device.type, device.index, tuple(key.items()))
        cfg = _RESOLVED.get(ck)
    except TypeError:                       # an unhashable key value: no caching
        return _resolve_now(tuning, key, device)
    if cfg is None:
        cfg = _resolve_now(tuning, key, device)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[ck] = cfg
    return cfg


def _resolve_now(tuning: Tuning, key, device) -> dict:
    fallback = tuning.heuristic(key, device)
    tuned = None if _FORCE_HEURISTIC else lookup(tuning, key, device, fallback)
    if _TRACE is not None:
        _TRACE.append((tuning.name, dict(key), None if tuned is None else dict(tuned)))
    return dict(tuned) if tuned is not None else fallback


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
