"""Where a tune's time goes: seconds per named phase (not nested), for the tune report."""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

# the phases, in the order the report lists them, and what each one counts
PHASES = {
    "startup": "process start, imports, CUDA initialisation",
    "plan": "recipes, keys, grids, orders, the store and the previous tables read",
    "probe": "one input set per key and the compile probe of its planned configs",
    "inputs": "each key's rotation input sets, pristine copies and references",
    "compile_wait": "the measuring process waiting for the compile pool",
    "check": "bit-for-bit checks (a binary's first run loads or compiles it)",
    "timing": "CUDA-graph timings of the search (capture, warm-up, replays)",
    "search": "Optuna ask/tell and the measurement loop's bookkeeping",
    "store": "writing measured configs to the study store",
    "final": "the final re-check and re-timing of each key's candidates",
    "torch": "timing torch's way of doing the same, for the tables",
    "budget": "planning the coverage from the costs measured so far",
    "write": "tables and this report",
}


class Phases:
    def __init__(self):
        self.seconds: dict = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] += time.monotonic() - t0

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] += seconds

    def report(self, wall_s: float) -> dict:
        """{phase: seconds} in PHASES order, plus "other" (the wall time not in any)."""
        out = {k: round(self.seconds[k], 2) for k in PHASES if k in self.seconds}
        out.update({k: round(v, 2) for k, v in self.seconds.items() if k not in out})
        out["other"] = round(max(0.0, wall_s - sum(self.seconds.values())), 2)
        return out


class NoPhases(Phases):
    """Phases that counts nothing (a measurer outside a tune)."""

    @contextlib.contextmanager
    def __call__(self, name: str):
        yield
