"""What a tune is asked to do (`Options`, filled by the command line) and the defaults
that depend on the device (`resolve`)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .device import usable_cores

# Defaults (GPU, CPU). The GPU budget counts from the process start and leaves 30 s of
# the 480 s a fresh `make tune` may take for the Makefile's set-up check (~12 s on the
# H200) and for estimates that come out low (a 420 s budget ended 22 s early there);
# the run re-plans its coverage as it measures.
BUDGET_S = {"cuda": 450.0, "cpu": 150.0}
SEARCH_REPS = {"cuda": 20, "cpu": 1}      # graph replays of one trial (one guard chunk)
FINAL_REPS = {"cuda": 25, "cpu": 1}       # replays per candidate and round at the end
CPU_TRIALS = 3                            # configs per smoke key under the interpreter


@dataclass
class Options:
    recipes: list[str] | None = None          # None: every registered recipe
    preset: str | None = None                 # None: "gpu" on CUDA, "smoke" on CPU
    overrides: dict = field(default_factory=dict)   # key field -> list of values
    trials: int | None = None                 # at most this many configs a key (None: as
                                              #   the budget allows; 3 on CPU)
    exhaustive: bool = False                  # every config of every key, budget or not
    workers: int = 1                          # processes, one a GPU
    storage: str | None = None                # None: results/<slug>/studies.journal
    budget_s: float | None = None             # None: BUDGET_S; 0: none
    seed: int = 0
    top: int = 2                              # best configs re-timed with the heuristic's
    results: str | None = None                # results root (default: recipes._configs')
    package: str = "recipes"
    progress: bool = True
    search_reps: int | None = None
    final_reps: int | None = None
    compile_workers: int | None = None        # None: cores - 1 on a GPU host; 0: off
    verbose: bool = False
    started: float | None = None              # time.monotonic() at process start
    command: str | None = None                # the command line, for the report's header


def resolve(opts: Options, device: torch.device) -> Options:
    """A copy of `opts` with every None default filled in for `device`."""
    kind = "cuda" if device.type == "cuda" else "cpu"
    o = Options(**vars(opts))
    o.preset = o.preset or ("gpu" if kind == "cuda" else "smoke")
    if o.trials is None and kind == "cpu" and not o.exhaustive:
        o.trials = CPU_TRIALS
    if o.budget_s is None:
        o.budget_s = BUDGET_S[kind]
    o.search_reps = o.search_reps or SEARCH_REPS[kind]
    o.final_reps = o.final_reps or FINAL_REPS[kind]
    if kind == "cpu":
        o.compile_workers = 0             # interpreted kernels: nothing to compile
    elif o.compile_workers is None:
        o.compile_workers = max(0, usable_cores() // max(1, o.workers) - 1)
    if o.started is None:
        o.started = time.monotonic()
    return o


def results_dir(opts: Options) -> Path:
    from recipes._configs import results_root
    return Path(opts.results) if opts.results else results_root()
