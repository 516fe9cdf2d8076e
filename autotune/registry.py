"""What the tuner and the benchmarks work on, without knowing any recipe by name.

Tunables are the library's own declarations (`recipes.tuning.Tuning`, one `TUNING` per
recipe module, listed by `recipes.tuning.all_tunings()`), plus any that a caller
registers (tests register throw-away ones). Benchmark suites are declared per recipe
under `autotune/suites/` (one module a recipe, each with a `SUITES` list), as
benchmarks are per op by nature.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recipes import tuning as _lib
from recipes.tuning import Tuning, bits, key_str, outputs_equal  # noqa: F401 (re-exported)

Tunable = Tuning       # the tuner's name for a recipe's declaration


@dataclass
class BenchVariant:
    fn: Callable[[Any], Any]      # state -> None; called inside a graph unless eager
    eager: bool = False           # time plain calls (events), not graph replays
    peer: bool = False            # an alternative we compare against (torch)
    back_to_back: bool = False    # graph calls back to back, not behind the plain kernel


@dataclass
class BenchCase:
    label: dict                              # the shape, e.g. {"B": 1, "K": 3, ...}
    make: Callable[[torch.device, int], Any]  # (device, seed) -> state
    variants: dict[str, BenchVariant]        # "ours", "torch eager", "torch graph", ...
    bytes: int                               # fewest bytes a call moves (for bandwidth)


@dataclass
class BenchSuite:
    name: str                                 # report name: results/<gpu>/bench-<name>.*
    cases: Callable[[str], list[BenchCase]]   # preset ("full" | "quick" | "smoke") -> cases
    title: str = ""
    notes: str = ""
    extra: dict = field(default_factory=dict)


_LIBRARY: dict[str, Tuning] = {}
_BENCHES: dict[str, BenchSuite] = {}
_LOADED_SUITES: list = []


def register(t: Tuning) -> Tuning:
    """Add a tunable besides the library's (tests use throw-away ones); dispatch checks
    its tables too (`recipes.tuning.register`)."""
    return _lib.register(t)


def unregister(name: str) -> None:
    _lib.unregister(name)


def load_recipes(package: str = "recipes") -> None:
    """Read the tuning declarations of a recipe package (one with a `tuning` module whose
    `all_tunings()` lists them), or import a module that `register`s its own."""
    importlib.import_module(package)
    try:
        mod = importlib.import_module(f"{package}.tuning")
    except ModuleNotFoundError:
        return
    for t in mod.all_tunings():
        _LIBRARY[t.name] = t


def tunables() -> dict[str, Tuning]:
    """The library's declarations (read on first use) and any registered ones."""
    if not _LIBRARY:
        load_recipes()
    return {**_LIBRARY, **_lib.registered()}


def register_bench(s: BenchSuite) -> BenchSuite:
    _BENCHES[s.name] = s
    return s


def load_suites() -> None:
    """Import every module of `autotune.suites`; each lists its suites in `SUITES`."""
    from . import suites

    _LOADED_SUITES.append(True)
    for info in pkgutil.iter_modules(suites.__path__):
        mod = importlib.import_module(f"{suites.__name__}.{info.name}")
        for s in getattr(mod, "SUITES", ()):
            register_bench(s)


def benches() -> dict[str, BenchSuite]:
    """Every suite of `autotune.suites` (imported on first use) and any registered one."""
    if not _LOADED_SUITES:
        load_suites()
    return dict(_BENCHES)
