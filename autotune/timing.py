"""One timing helper for tuning and benchmarks: CUDA-graph replay medians.

`time_graph(call, states)` captures a graph that runs `call(state)` once for each state
in `states` (rotating inputs: `rotation` says how many sets a case gets), warms the GPU
up, replays it `reps` times with CUDA events around each replay, and returns the
per-call samples in microseconds. The replays are queued behind a GPU sleep so that a
stalled host cannot show up in them (see `time_graph`).

Back to back, a call that launches with programmatic dependent launch (PDL) overlaps its
launch with the call before it. An engine calls us right after its lm_head GEMM, a
kernel that does not release its dependents early, so there the launch latency shows.
`time_graph(..., behind=plain_op(device))` measures that: each call behind a plain
one-element torch op in the graph, reported as time(op + call) - time(op) (a graph of
n x [op, call] minus a graph of n x [op], medians of their replays).

`time_eager` times plain calls the same way (no guard: it measures the host's launch
cost on purpose), for torch eager and Python-overhead measurements. `rotation(nbytes)`
says how many input sets make one pass larger than twice the L2. `time_wall` is the
stand-in under the Triton interpreter (no GPU: no graphs, no events): host wall-clock
time, for smoke tests only.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch


@dataclass
class Timing:
    samples: list   # microseconds per call, one per replay
    # time_graph: True when every replay was queued before the GPU reached it (no host
    # stall can be in the samples), False when the last attempt still could not show
    # that; None where it does not apply (eager, wall clock, merged samples)
    guarded: bool | None = None
    # time_graph(..., behind=op): the op's own median per call, already subtracted from
    # the samples; None otherwise
    base_us: float | None = None

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


# Input sets of a case whose `cap` rotation sets would all fit in the L2. Such a case is
# L2-resident, as a decode step's small inputs are right after the kernel that wrote
# them; a cyclic pass over 32 sets near the L2's size is not: on the H200 the same
# configs timed over 32 such sets ran up to 12% slower than over 4, and within 1.5% where
# both timings rotate alike (docs/performance.md, How the numbers are measured).
L2_SETS = 4


def rotation(nbytes: int, device=None, cap: int = 32) -> int:
    """Input sets for timing a case that moves `nbytes` a call, the same rule for the
    tuner and the benchmarks: enough that one pass over them exceeds twice the L2 (then
    it is read from DRAM), at most `cap`; but `L2_SETS` where `cap` sets would all fit
    in the L2 (the case is timed L2-resident)."""
    if nbytes <= 0:
        return 1
    l2 = l2_bytes(device)
    n = max(1, min(cap, -(-2 * l2 // nbytes)))
    return min(n, L2_SETS) if n * nbytes <= l2 else n


def _warm(device) -> None:
    """Spin the GPU up to its clocks: ~20 ms of matrix products."""
    a = torch.randn(2048, 2048, device=device, dtype=torch.bfloat16)
    for _ in range(40):
        a @ a
    torch.cuda.synchronize(device)


# The sleep that time_graph queues ahead of its replays is sized from the last one:
# twice the host's time per replay last seen, at the GPU clock rate last measured.
_GUARD = {"cycles_per_us": 1500.0,   # first guess (a ~1.5-2 GHz clock)
          "host_us_per_rep": 20.0}   # first guess: a 1 ms sleep for GUARD_CHUNK replays
# replays queued behind one sleep: keeps the launch queue short, and the sleep too when
# the host is slowed down (each GIL hand-over can cost a 5 ms switch interval, and
# torch lets the GIL go in each event record and graph replay: three per replay)
GUARD_CHUNK = 25
GUARD_ATTEMPTS = 3         # sleeps tried per chunk, each 2x the host time last seen
GUARD_MIN_US, GUARD_MAX_US = 1000.0, 2_000_000.0


def _guarded_replays(graph, reps: int, device) -> tuple[list, bool]:
    """Milliseconds of `reps` replays of `graph`, each between two events, all queued
    behind `torch.cuda._sleep`; and whether the host finished queueing them before the
    sleep ended (then the GPU never waited for the host inside a sample)."""
    for _ in range(GUARD_ATTEMPTS):
        sleep_us = 2.0 * _GUARD["host_us_per_rep"] * reps
        sleep_us = min(GUARD_MAX_US, max(GUARD_MIN_US, sleep_us))
        cycles = int(sleep_us * _GUARD["cycles_per_us"])
        slept = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        t0 = time.perf_counter()
        slept[0].record()
        torch.cuda._sleep(cycles)
        slept[1].record()
        for i in range(reps):
            starts[i].record()
            graph.replay()
            ends[i].record()
        host_us = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize(device)
        slept_us = slept[0].elapsed_time(slept[1]) * 1000.0
        if slept_us > 0:
            _GUARD["cycles_per_us"] = cycles / slept_us
        _GUARD["host_us_per_rep"] = host_us / reps
        if host_us < slept_us:
            break
    return [starts[i].elapsed_time(ends[i]) for i in range(reps)], host_us < slept_us


def plain_op(device=None):
    """A one-element torch op launched the ordinary way (no programmatic dependent
    launch): for `time_graph(..., behind=...)`, the predecessor whose end the next
    kernel's launch must wait for, as an engine's lm_head GEMM is to ours."""
    a = torch.zeros(1, device=device)
    b = torch.empty_like(a)
    return lambda: torch.neg(a, out=b)


def launch_signature(obj):
    """What a Triton launch specializes on in a (nested) state: each tensor's dtype,
    shape, strides and whether its address is 16-byte aligned, and the plain values.
    States with equal signatures run the same binaries."""
    if isinstance(obj, torch.Tensor):
        return (obj.dtype, tuple(obj.shape), obj.stride(), obj.data_ptr() % 16 == 0)
    if isinstance(obj, (tuple, list)):
        return (type(obj).__name__, *(launch_signature(x) for x in obj))
    if isinstance(obj, dict):
        return tuple((k, launch_signature(v)) for k, v in obj.items())
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return type(obj).__name__


def one_per_signature(states) -> list:
    """The first state of each distinct `launch_signature`: what a warm-up must run so
    that nothing compiles or loads during a capture over all of them."""
    firsts: dict = {}
    for s in states:
        firsts.setdefault(launch_signature(s), s)
    return list(firsts.values())


def prime(fns, device) -> None:
    """Run `fns` once outside any capture (compiling, first allocations), on a side
    stream as graph capture needs."""
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)


_CAPTURES = {"n": 0}
RELEASE_EVERY = 256      # captures between two releases of dead graphs' memory pools


def capture(fns, device):
    """A CUDA graph of `fns` called in order, captured on a side stream with
    `CUDAGraph.capture_begin`. Not `torch.cuda.graph`: its entry synchronizes and
    empties the device and host caching allocators, so the allocations after it are
    cudaMalloc's again (a tune captures thousands of graphs). Each graph has its own
    memory pool, which the allocator frees only when its cache is emptied: that is done
    here once every RELEASE_EVERY captures. (One pool shared by every capture fails
    torch 2.11's host-allocator assertion once a graph of it is gone.)"""
    _CAPTURES["n"] += 1
    if _CAPTURES["n"] % RELEASE_EVERY == 0:
        torch.cuda.empty_cache()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            for fn in fns:
                fn()
        finally:
            graph.capture_end()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph


def time_graph(call, states, *, calls_per_replay: int | None = None, reps: int = 50,
               warmup: int = 5, device=None, warm_gpu: bool = True,
               behind=None, behind_us: float | None = None) -> Timing:
    """Per-call microseconds of `call(state)` replayed in a CUDA graph.

    The graph runs over `states` in turn, repeated until it holds at least
    `calls_per_replay` calls (default: max(len(states), 20)), so a replay lasts long
    enough for the events to resolve it.

    `behind` (a callable of no arguments, e.g. `plain_op(device)`): each call is
    preceded by it in the graph, and a second graph holds only the n `behind` calls; the
    two are replayed in alternating chunks and each sample is a replay of the first
    minus the median replay of the second, per call (`Timing.base_us`: that median).
    `behind_us`: that median as an earlier timing measured it (same `behind`, same
    calls a replay), subtracted without replaying the second graph again.

    Host stalls: a sample is the GPU time between an event recorded before a replay and
    one recorded after it. If the host thread stalls between queueing the first event
    and the replay (another Python thread holds the GIL, e.g. the tuner's compile-ahead
    pool: up to a 5 ms switch interval each time), the GPU reaches the event, idles, and
    the idle time is counted. So the replays are queued behind a GPU sleep
    (`torch.cuda._sleep`) between two events: if the host queued everything (from before
    the sleep to after the last event) in less time than the sleep lasted on the GPU, the
    GPU found every replay already queued and never waited for the host. Otherwise the
    chunk is redone behind a sleep of twice that host time, up to GUARD_ATTEMPTS times
    (the last attempt's samples are kept anyway: `Timing.guarded` says whether every
    chunk of GUARD_CHUNK replays was shown clean). Each sleep lasts twice the host time
    per replay seen last, times the replays it covers (at least 1 ms), converted to
    cycles at the clock rate its predecessor's events measured.
    """
    states = list(states)
    n = calls_per_replay or max(len(states), 20)
    order = [states[i % len(states)] for i in range(n)]
    steps = []
    for s in order:
        if behind is not None:
            steps.append(behind)
        steps.append(lambda s=s: call(s))
    first = [lambda s=s: call(s) for s in one_per_signature(states)] + \
        ([behind] if behind else [])
    prime(first, device)
    graph = capture(steps, device)
    base = capture([behind] * n, device) if behind is not None and behind_us is None \
        else None
    if warm_gpu:
        _warm(device)
    for _ in range(warmup):
        graph.replay()
        if base is not None:
            base.replay()
    ms, base_ms, guarded = [], [], True
    for lo in range(0, reps, GUARD_CHUNK):
        size = min(GUARD_CHUNK, reps - lo)
        chunk, ok = _guarded_replays(graph, size, device)
        ms += chunk
        guarded = guarded and ok
        if base is not None:
            chunk, ok = _guarded_replays(base, size, device)
            base_ms += chunk
            guarded = guarded and ok
    del graph, base
    per_call = [x * 1000.0 / n for x in ms]
    if behind is None:
        return Timing(per_call, guarded=guarded)
    base_us = behind_us if behind_us is not None else statistics.median(base_ms) * 1000.0 / n
    return Timing([x - base_us for x in per_call], guarded=guarded, base_us=base_us)


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
