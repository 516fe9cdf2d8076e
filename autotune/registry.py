"""The one registry of what the tuner and the benchmarks work on, without knowing any
recipe by name.

Each module of `autotune/suites/` (one a recipe) lists its `TUNABLES` (a recipe's
dispatch facts, its `TUNING`, paired with the harness that runs it on synthetic inputs:
`autotune.declare.Tunable`) and its benchmark `SUITES`; the registry imports them on
first use. Callers may `register` more (tests register throw-away tunables).
"""
from __future__ import annotations

import importlib
import pkgutil

from . import suites
from .declare import BenchSuite, Tunable

_LIBRARY: dict[str, Tunable] = {}
_BENCHES: dict[str, BenchSuite] = {}
_EXTRA: dict[str, Tunable] = {}
_LOADED: list = []


def _load() -> None:
    """Import every module of `autotune.suites` and collect its TUNABLES and SUITES."""
    if _LOADED:
        return
    _LOADED.append(True)
    for info in pkgutil.iter_modules(suites.__path__):
        mod = importlib.import_module(f"{suites.__name__}.{info.name}")
        for t in getattr(mod, "TUNABLES", ()):
            _LIBRARY[t.name] = t
        for s in getattr(mod, "SUITES", ()):
            _BENCHES.setdefault(s.name, s)


def register(t: Tunable) -> Tunable:
    """Add a tunable besides the library's (a user's own kernel, a test's)."""
    _EXTRA[t.name] = t
    return t


def unregister(name: str) -> None:
    _EXTRA.pop(name, None)


def load_recipes(package: str = "recipes") -> None:
    """Import `package`: the library's recipes, or a module that `register`s its own
    tunables when imported (the CLI's `--package`)."""
    importlib.import_module(package)


def tunables() -> dict[str, Tunable]:
    """The library's tunables (read on first use) and any registered ones, by name."""
    _load()
    return {**_LIBRARY, **_EXTRA}


def get(name: str) -> Tunable | None:
    """The tunable of table `name`, or None."""
    return tunables().get(name)


def register_bench(s: BenchSuite) -> BenchSuite:
    _BENCHES[s.name] = s
    return s


def benches() -> dict[str, BenchSuite]:
    """Every suite of `autotune.suites` (imported on first use) and any registered one."""
    _load()
    return dict(_BENCHES)
