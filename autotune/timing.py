"""One timing helper for tuning and benchmarks: CUDA-graph replay medians.

`time_graph(call, states)` captures a graph that runs `call(state)` once for each state
in `states` (rotating inputs, so data that fits in L2 is not re-read from cache), warms
the GPU up, replays it `reps` times with CUDA events around each replay, and returns the
per-call samples in microseconds. `time_eager` times plain calls the same way, for
torch eager and Python-overhead measurements. `rotation(nbytes)` says how many input
sets make one pass larger than twice the L2. `time_wall` is the stand-in under the Triton
interpreter (no GPU: no graphs, no events): host wall-clock time, for smoke tests only.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    samples: list   # microseconds per call, one per replay

    def q(self, f: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, max(0, round(f * (len(s) - 1))))]

    @property
    def p20(self) -> float:
        return self.q(0.2)

    @property
    def p50(self) -> float:
        return statistics.median(self.samples)

    @property
    def p80(self) -> float:
        return self.q(0.8)


def l2_bytes(device=None) -> int:
    try:
        return int(torch.cuda.get_device_properties(device).L2_cache_size)
    except Exception:  # noqa: BLE001
        return 50 << 20


def rotation(nbytes: int, device=None, cap: int = 32) -> int:
    """Input sets needed so that one pass over them exceeds twice the L2."""
    if nbytes <= 0:
        return 1
    return max(1, min(cap, -(-2 * l2_bytes(device) // nbytes)))


def _warm(device) -> None:
    """Spin the GPU up to its clocks: ~20 ms of matrix products."""
    a = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)
    for _ in range(40):
        a @ a
    torch.cuda.synchronize(device)


def time_graph(call, states, *, calls_per_replay: int | None = None, reps: int = 50,
               warmup: int = 5, device=None, warm_gpu: bool = True) -> Timing:
    """Per-call microseconds of `call(state)` replayed in a CUDA graph.

    The graph runs over `states` in turn, repeated until it holds at least
    `calls_per_replay` calls (default: max(len(states), 20)), so a replay lasts long
    enough for the events to resolve it.
    """
    states = list(states)
    n = calls_per_replay or max(len(states), 20)
    order = [states[i % len(states)] for i in range(n)]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):          # first calls outside capture: compile, alloc
        for s in states:
            call(s)
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s in order:
            call(s)
    if warm_gpu:
        _warm(device)
    for _ in range(warmup):
        graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize(device)
    samples = [starts[i].elapsed_time(ends[i]) * 1000.0 / n for i in range(reps)]
    del graph
    return Timing(samples)


def time_eager(call, states, *, reps: int = 50, inner: int = 20, warmup: int = 3,
               device=None, warm_gpu: bool = True) -> Timing:
    """Per-call microseconds of plain (non-graph) calls, `inner` calls per sample."""
    states = list(states)
    for s in states:
        call(s)
    torch.cuda.synchronize(device)
    if warm_gpu:
        _warm(device)
    for _ in range(warmup):
        for i in range(inner):
            call(states[i % len(states)])
    samples = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(inner):
            call(states[i % len(states)])
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) * 1000.0 / inner)
    return Timing(samples)


def time_wall(call, states, *, reps: int = 3, warmup: int = 1, device=None) -> Timing:
    """Per-call microseconds by the host's wall clock (`time.perf_counter`), one sample per
    pass over `states`. For the Triton interpreter's smoke runs, where there are no CUDA
    graphs or events; it measures the interpreter, not a GPU. On a CUDA device it
    synchronises after each pass, so it is usable there too (it then includes launch
    overhead: prefer `time_graph`)."""
    states = list(states)
    cuda = device is not None and torch.device(device).type == "cuda"
    for _ in range(warmup):
        for s in states:
            call(s)
    samples = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        for s in states:
            call(s)
        if cuda:
            torch.cuda.synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e6 / len(states))
    return Timing(samples)
