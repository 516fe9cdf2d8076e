"""Measuring one config at one key: the key's inputs and references (made once per key),
the bit-for-bit check against the reference, and the timing.

A key's inputs are `rotation` sets (the benchmarks' rule: enough that one pass over them
exceeds twice the L2, up to 32; 4 where 32 would fit in the L2, which times the key
L2-resident), made once: the first and the last by the recipe's input maker (two
seeds), the others copies of the first (what the rotation needs is other addresses, not
other values, and some makers take a good part of a second a set on the host). The
first and the last are kept pristine with their references. A check runs the config on
fresh copies of those (fresh output allocations poisoned first, so an output a config
fails to write is garbage, not an earlier config's answer) and compares every output's
bits; only a config that passes is timed.

Timing (`autotune.timing.time_graph`): the config's calls over the rotation sets captured
in a CUDA graph, replayed `reps` times behind a GPU sleep so that host stalls cannot show;
the per-call median is the trial's value. The GPU is warmed up (`time_graph`'s warm-up)
only when it idled since the last timing, not for every config. Each call runs behind a
plain one-element op (`behind=`), the benchmark's primary regime; the op's own time,
the same for every config of the key (so it cannot change their order), is measured at
the key's first search timing and subtracted from the others' without being replayed
again (the final re-timing measures it each time). A replay holds every
rotation set once and, for a short kernel, enough calls to last ~`REPLAY_US` (at most
20): the first config measured (the heuristic's) sets that count for the key's others.

Under the Triton interpreter (no GPU) a timing is the host's wall clock (`time_wall`):
the smoke tune checks the pipeline, not the kernels' speed.
"""
from __future__ import annotations

import math
import time

import torch

from ..declare import Tunable
from ..timing import (
    Timing,
    plain_op,
    rotation,
    time_eager,
    time_graph,
    time_wall,
)
from .phases import NoPhases, Phases
from .search import Outcome

REPLAY_US = 200.0          # a replay of a short kernel's graph lasts about this long
MAX_CALLS = 20             # ... with at most this many calls beyond the rotation sets
IDLE_WARM_S = 0.5          # warm the GPU up again after it idled this long
_LAST_GPU = {"t": -math.inf}   # when the last timing ended (any key's)


class TunerFatal(RuntimeError):
    """The device cannot go on (e.g. a sticky CUDA error): stop the tune."""


def clone(obj):
    """A deep copy of (nested) inputs; tensors keep their strides."""
    if isinstance(obj, torch.Tensor):
        try:
            out = torch.empty_strided(obj.size(), obj.stride(), dtype=obj.dtype,
                                      device=obj.device)
            out.copy_(obj)
            return out
        except RuntimeError:      # overlapping strides (an expanded view): dense copy
            return obj.clone()
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(clone(x) for x in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


def tensors(obj):
    """The tensors in (nested lists, tuples, named tuples and dicts of) `obj`."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors(x)


def poison_allocator(ref) -> None:
    """Fill blocks of the outputs' sizes with 0xA5 bytes and free them, so that outputs a
    config fails to write are likely garbage rather than an earlier config's answer (the
    caching allocator hands the same blocks out again). Best effort."""
    bufs = []
    for t in tensors(ref):
        if t.numel():
            b = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, device=t.device)
            b.fill_(0xA5)
            bufs.append(b)
    del bufs


def error_text(exc: BaseException) -> str:
    s = str(exc).strip()
    return f"{type(exc).__name__}: {s.splitlines()[0] if s else ''}"


class Measurer:
    """Inputs, references, checks and timings for one key on one device. `first` is an
    input set made earlier with the same seed (the compile probe's), reused as set 0."""

    def __init__(self, t: Tunable, key: dict, device: torch.device, *, seed: int = 0,
                 search_reps: int = 20, final_reps: int = 25, first=None,
                 phases: Phases | None = None):
        self.t, self.key, self.device = t, key, device
        self.phases = phases or NoPhases()
        self.cuda = device.type == "cuda"
        self.search_reps, self.final_reps = search_reps, final_reps
        n = rotation(t.bytes_moved(key), device) if self.cuda else 1
        base = seed * 1000
        made = {0: first if first is not None else t.make_inputs(key, device, base)}
        if n > 1:
            made[n - 1] = t.make_inputs(key, device, base + n - 1)
        self.states = [made[i] if i in made else clone(made[0]) for i in range(n)]
        check = sorted({0, n - 1})
        # pristine copies: every check runs on fresh ones, so a config cannot pass on
        # what an earlier run left in an in-place output
        self.pristine = {i: clone(self.states[i]) for i in check}
        self.refs = {i: t.reference(clone(self.states[i])) for i in check}
        self.calls = None         # calls a replay holds (None: time_graph's default)
        # each call timed behind a plain one-element op, as an engine calls it after its
        # lm_head GEMM and as the benchmark's primary column times it
        self.behind = plain_op(self.device) if self.cuda else None
        self.base_us: dict = {}   # calls a replay -> the plain op's us, for the search
        self.unguarded = 0        # graph timings not shown free of host stalls
        self.timings = 0
        if self.cuda:
            torch.cuda.synchronize(device)

    def health(self) -> None:
        if not self.cuda:
            return
        try:
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001
            raise TunerFatal(f"the CUDA context is unusable after a failed trial "
                             f"({error_text(exc)}); run the same command again to resume "
                             "(what was measured is kept)") from exc

    def check(self, cfg: dict, phase: str = "check") -> tuple[bool, str | None]:
        """(outputs equal the reference on every checked input set, error or None)."""
        with self.phases(phase):
            return self._check(cfg)

    def _check(self, cfg: dict) -> tuple[bool, str | None]:
        try:
            for i, ref in self.refs.items():
                poison_allocator(ref)
                out = self.t.run(clone(self.pristine[i]), cfg)
                if not self.t.equal(out, ref):
                    return False, None
            return True, None
        except Exception as exc:  # noqa: BLE001
            msg = error_text(exc)
            self.health()
            return False, msg

    def _idle(self) -> bool:
        """Whether the GPU may have clocked down since the last timing (the next one then
        warms it up first)."""
        return time.monotonic() - _LAST_GPU["t"] > IDLE_WARM_S

    def time(self, cfg: dict, reps: int, phase: str = "timing") -> Timing:
        """Per-call microseconds of `cfg` (graph replays; wall clock on the CPU)."""
        with self.phases(phase):
            return self._time(_caller(self.t.run, cfg), reps, search=phase == "timing")

    def _time(self, call, reps: int, search: bool = False) -> Timing:
        if not self.cuda:
            return time_wall(call, self.states, reps=reps, warmup=0, device=self.device)
        known = self.base_us.get(self.calls) if search else None
        tm = time_graph(call, self.states, calls_per_replay=self.calls, reps=reps,
                        warmup=3, device=self.device, warm_gpu=self._idle(),
                        behind=self.behind, behind_us=known)
        if search and known is None and tm.base_us is not None:
            self.base_us[self.calls] = tm.base_us
        _LAST_GPU["t"] = time.monotonic()
        self.timings += 1
        self.unguarded += tm.guarded is False
        return tm

    def relocate(self) -> None:
        """Move the timed input sets to other addresses (copies made before the old sets
        are freed, so none lands where it was). On the H200 a small kernel's time can
        depend on where its inputs lie: draft_extend at B=1 Vd=151936 ran two configs
        0.1-0.4 us apart in either order, by input placement and from one capture to
        the next (docs/performance.md, "Dispatch"), and a tune took one that the
        benchmark then ran slower than the heuristic."""
        self.states = [clone(s) for s in self.states]

    def pace(self, us: float) -> None:
        """Size this key's replays from a config's per-call time (the heuristic's)."""
        if self.cuda and us > 0:
            n = len(self.states)
            self.calls = max(n, min(MAX_CALLS, math.ceil(REPLAY_US / us)))

    def evaluate(self, cfg: dict) -> Outcome:
        ok, err = self.check(cfg)
        if err is not None:
            return Outcome("error", error=err)
        if not ok:
            return Outcome("wrong")
        err = None
        for _ in range(2):        # a graph capture can fail for a passing reason: retry once
            try:
                tm = self.time(cfg, self.search_reps)
                return Outcome("ok", tm.p50, tm.p20, tm.p80)
            except Exception as exc:  # noqa: BLE001
                self.health()
                err = exc
        return Outcome("error", error="timing: " + error_text(err))

    def time_torch(self) -> tuple[float | None, str | None]:
        """torch's way of doing the same (the recipe's `torch_peer`), for the table."""
        with self.phases("torch"):
            return self._time_torch()

    def _time_torch(self) -> tuple[float | None, str | None]:
        peer = self.t.torch_peer
        if peer is None:
            return None, None
        reps = self.search_reps
        if not self.cuda:
            try:
                return time_wall(peer, self.states, reps=reps, warmup=0).p50, "wall"
            except Exception:  # noqa: BLE001
                return None, None
        try:
            tm = time_graph(peer, self.states, calls_per_replay=self.calls, reps=reps,
                            warmup=3, device=self.device, warm_gpu=self._idle())
            _LAST_GPU["t"] = time.monotonic()
            return tm.p50, "graph"
        except Exception:  # noqa: BLE001 - not capturable: time plain calls
            try:
                torch.cuda.synchronize(self.device)
                return time_eager(peer, self.states, reps=reps, device=self.device,
                                  warm_gpu=self._idle()).p50, "eager"
            except Exception:  # noqa: BLE001
                return None, None


def _caller(fn, cfg):
    return lambda s: fn(s, cfg)
