"""What a suite module (`autotune/suites/<recipe>.py`) declares: a `Tunable` per tuned
launch (the recipe's dispatch facts, `recipes._tuning.Tuning`, with what the tuner needs
to run it on synthetic inputs) and its benchmark suites. `autotune.registry` collects
them; this module imports no suite and no registry, so suites can import it.
"""
from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from recipes._source_hash import source_hash
from recipes._tuning import Tuning

from .bitwise import outputs_equal


@dataclass(eq=False)
class Tunable:
    tuning: Tuning                               # the recipe's dispatch facts
    make_inputs: Callable[[dict, torch.device, int], Any]   # (key, device, seed) -> inputs
    run: Callable[[Any, dict], Any]              # (inputs, config) -> outputs (our kernel)
    reference: Callable[[Any], Any]              # inputs -> outputs (plain torch semantics)
    bytes_moved: Callable[[dict], int]           # key -> fewest bytes a call must move
    default_keys: Callable[[str], list[dict]]    # preset ("gpu" | "smoke") -> keys to tune
    torch_peer: Callable[[Any], Any] | None = None   # inputs -> outputs, torch's way
    compare: Callable[[Any, Any], bool] | None = None  # (ours, ref) -> equal; default bits

    # the dispatch facts, read through
    name = property(lambda self: self.tuning.name)
    space = property(lambda self: self.tuning.space)
    heuristic = property(lambda self: self.tuning.heuristic)
    constraint = property(lambda self: self.tuning.constraint)
    sources = property(lambda self: self.tuning.sources)
    on_request = property(lambda self: self.tuning.on_request)

    def configs(self, key: dict) -> list[dict]:
        return self.tuning.configs(key)

    def admits(self, config: dict, key: dict) -> bool:
        return self.tuning.admits(config, key)

    def space_hash(self) -> str:
        return self.tuning.space_hash()

    def source_hash(self) -> str:
        return self.tuning.source_hash()

    def equal(self, ours, ref) -> bool:
        return (self.compare or outputs_equal)(ours, ref)

    def harness_hash(self) -> str:
        """A hash of the code of the modules that define this tunable's input maker, run
        and reference (its suite): measurements are of those inputs, so the tuner's store
        and a rewritten table's kept entries start afresh when they change (the
        recipe's `source_hash`, which dispatch checks, covers kernels and launchers)."""
        names = {getattr(f, "__module__", None)
                 for f in (self.make_inputs, self.run, self.reference)}
        return source_hash([sys.modules[n] for n in sorted(n for n in names if n)
                            if n in sys.modules])

    def study_hash(self) -> str:
        """What a store's studies of this tunable are named by besides its space: its
        kernels' source and its harness (`harness_hash`)."""
        both = f"{self.source_hash()}:{self.harness_hash()}"
        return hashlib.sha256(both.encode()).hexdigest()[:16]


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
