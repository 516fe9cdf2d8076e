"""autotune.timing: graph replays queued behind a GPU sleep, so that a stalled host (another
Python thread holding the GIL) does not show up in the samples; and the timing behind a
plain op (the op's graph subtracted).

On CPU the guard's logic runs against a simulated stream (a host clock, a GPU that runs
queued work in order, never before it was queued); on a GPU the real thing is timed
with a thread spinning in Python beside it."""
import threading

import pytest
import torch

from autotune import timing
from tests.helpers import ON_GPU

CLOCK_MHZ = 1980.0       # the simulated GPU's cycles per microsecond
REPLAY_US = 40.0         # GPU time of one replay
LAUNCH_US = 5.0          # host time to queue anything


class SimStream:
    """Host and GPU clocks in microseconds; the GPU runs each queued item in order, from
    when it was queued at the earliest."""

    def __init__(self, stalls):
        self.host = 0.0
        self.gpu = 0.0
        self.stalls = stalls       # replay index (counted over the test) -> host stall us
        self.replays = 0
        self.sleeps = []

    def queue(self, gpu_us: float) -> float:
        start = max(self.gpu, self.host)
        self.gpu = start + gpu_us
        self.host += LAUNCH_US
        return start


def _simulate(monkeypatch, stalls):
    sim = SimStream(stalls)

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = sim.queue(0.0)

        def elapsed_time(self, end):
            return (end.t - self.t) / 1000.0

    class Graph:
        def replay(self):
            sim.host += sim.stalls.get(sim.replays, 0.0)
            sim.replays += 1
            sim.queue(REPLAY_US)

    def sleep(cycles):
        sim.sleeps.append(cycles / CLOCK_MHZ)
        sim.queue(cycles / CLOCK_MHZ)

    def synchronize(device=None):
        sim.host = max(sim.host, sim.gpu)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "_sleep", sleep)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(timing.time, "perf_counter", lambda: sim.host / 1e6)
    monkeypatch.setattr(timing, "_GUARD", {"cycles_per_us": 1500.0, "host_us_per_rep": 20.0})
    return sim, Graph()


def test_guard_redoes_a_chunk_the_host_stalled_in(monkeypatch):
    """A 5 ms stall in the first attempt: the chunk is redone behind a longer sleep, the
    samples are the replays' own time, and the clock rate was learnt from the sleep."""
    sim, graph = _simulate(monkeypatch, {3: 5000.0})
    ms, guarded = timing._guarded_replays(graph, 20, None)
    assert guarded
    assert len(ms) == 20 and all(x * 1000 == pytest.approx(REPLAY_US) for x in ms)
    assert len(sim.sleeps) == 2 and sim.sleeps[1] > 5000.0
    assert sim.replays == 40
    # learnt from the sleep's events (which also hold its launch gap)
    assert timing._GUARD["cycles_per_us"] == pytest.approx(CLOCK_MHZ, rel=0.01)


def test_guard_sizes_its_sleep_from_the_last_call(monkeypatch):
    """No stall: one attempt each; the first call's sleep is the first guess, the next
    one twice the host time per replay the first call saw, for its own replays."""
    sim, graph = _simulate(monkeypatch, {})
    ms, guarded = timing._guarded_replays(graph, 30, None)
    assert guarded and len(sim.sleeps) == 1 and sim.replays == 30
    assert max(ms) * 1000 == pytest.approx(REPLAY_US)
    host_us = 3 * 30 * LAUNCH_US + 3 * LAUNCH_US
    assert timing._GUARD["host_us_per_rep"] == pytest.approx(host_us / 30)
    monkeypatch.setattr(timing, "GUARD_MIN_US", 10.0)
    ms, guarded = timing._guarded_replays(graph, 15, None)
    assert guarded and len(sim.sleeps) == 2
    assert sim.sleeps[1] == pytest.approx(host_us, rel=0.02)


def test_guard_gives_up_after_its_attempts_and_says_so(monkeypatch):
    """Stalls in every attempt, longer than the longest sleep allowed: the last attempt's
    samples are kept and flagged as not guarded."""
    monkeypatch.setattr(timing, "GUARD_MAX_US", 2000.0)
    stalls = {i: 5000.0 for i in range(0, 1000, 10)}
    sim, graph = _simulate(monkeypatch, stalls)
    ms, guarded = timing._guarded_replays(graph, 10, None)
    assert not guarded
    assert len(sim.sleeps) == timing.GUARD_ATTEMPTS and len(ms) == 10
    assert max(ms) * 1000 > 1000.0        # the stall shows: nothing hid it


def test_time_graph_behind_a_plain_op_subtracts_the_op(monkeypatch):
    """On the simulated stream, a call costs CALL_B2B us after another call (its launch
    hidden) and CALL_BEHIND us after the plain op (OP_US): behind=op gives CALL_BEHIND
    (the graph of n x [op, call] minus the graph of n x [op], per call), without it
    CALL_B2B; the op's own time is reported apart."""
    OP_US, CALL_B2B, CALL_BEHIND = 1.5, 2.0, 3.25
    sim, _ = _simulate(monkeypatch, {})
    tags = []

    class SimGraph:
        def __init__(self, fns):
            tags.clear()
            for fn in fns:
                fn()
            self.us = sum(OP_US if t == "op" else CALL_BEHIND if k and tags[k - 1] == "op"
                          else CALL_B2B for k, t in enumerate(tags))

        def replay(self):
            sim.queue(self.us)

    monkeypatch.setattr(timing, "prime", lambda fns, device: None)
    monkeypatch.setattr(timing, "capture", lambda fns, device: SimGraph(fns))
    monkeypatch.setattr(timing, "_warm", lambda device: None)

    def op():
        tags.append("op")

    def call(state):
        tags.append("call")

    t = timing.time_graph(call, [0, 1, 2], calls_per_replay=6, reps=30, behind=op)
    assert t.guarded and len(t.samples) == 30
    assert t.p50 == pytest.approx(CALL_BEHIND) and t.base_us == pytest.approx(OP_US)
    t = timing.time_graph(call, [0, 1, 2], calls_per_replay=6, reps=30)
    assert t.p50 == pytest.approx(CALL_B2B) and t.base_us is None


@pytest.mark.skipif(not ON_GPU, reason="times CUDA graph replays with CUDA events: needs a "
                                       "GPU")
def test_time_graph_is_not_fooled_by_a_busy_python_thread(device):
    """A thread spinning in Python holds the GIL for up to a switch interval (5 ms) each
    time the timing thread lets it go; the median per-call time of a trivial kernel must
    stay within 2x of the unloaded one."""
    x = torch.randn(4096, device=device)
    y = torch.empty_like(x)

    def call(_):
        torch.neg(x, out=y)

    quiet = timing.time_graph(call, [0], reps=50, device=device)
    stop, spins = threading.Event(), [0]

    def spin():
        n = 0
        while not stop.is_set():
            n += 1
        spins[0] = n

    th = threading.Thread(target=spin, daemon=True)
    th.start()
    try:
        loaded = timing.time_graph(call, [0], reps=50, device=device)
    finally:
        stop.set()
        th.join()
    assert spins[0] > 0
    assert quiet.guarded
    assert loaded.p50 <= 2.0 * quiet.p50, (quiet.p50, loaded.p50, loaded.guarded)


@pytest.mark.skipif(not ON_GPU, reason="times CUDA graph replays with CUDA events: needs a "
                                       "GPU")
def test_time_graph_behind_a_plain_op_on_the_gpu(device):
    """A copy kernel behind the plain op: the op's own time is measured and subtracted,
    and what is left is a real kernel's time (positive, a few microseconds at most)."""
    x = torch.randn(1 << 16, device=device)
    y = torch.empty_like(x)
    t = timing.time_graph(lambda _: torch.neg(x, out=y), [0], reps=30, device=device,
                          behind=timing.plain_op(device))
    assert t.base_us is not None and 0.5 < t.base_us < 20.0, t.base_us
    assert 0.2 < t.p50 < 20.0, (t.p50, t.base_us)


def test_a_warm_up_runs_one_state_per_launch_signature(monkeypatch):
    """time_graph warms up one state of each distinct launch signature, not every state:
    copies of a set (fresh, aligned allocations) share one, while a view at an address
    off the 16-byte grid, another shape or another plain value each need their own run."""
    base = torch.zeros(64)
    a = {"x": base[:32], "n": 3}
    copies = [{"x": base[:32].clone(), "n": 3} for _ in range(5)]
    off = {"x": base[1:33], "n": 3}            # 4 bytes past the start: not 16-aligned
    other_n = {"x": base[:32].clone(), "n": 4}
    other_shape = {"x": base[:16].clone(), "n": 3}
    states = [a, *copies, off, other_n, other_shape, copies[0]]
    assert timing.one_per_signature(states) == [a, off, other_n, other_shape]

    primed, captured = [], []
    monkeypatch.setattr(timing, "prime", lambda fns, device: primed.append(len(fns)))
    monkeypatch.setattr(timing, "capture", lambda fns, device: captured.append(len(fns)))
    monkeypatch.setattr(timing, "_guarded_replays", lambda g, n, d: ([1.0] * n, True))
    monkeypatch.setattr(timing, "_warm", lambda device: None)
    timing.time_graph(lambda s: None, [a, *copies], reps=3, warmup=0)
    timing.time_graph(lambda s: None, states, reps=3, warmup=0)
    assert primed == [1, 4] and captured == [20, 20]


def test_l2_resident_cases_are_timed_over_fewer_input_sets(monkeypatch):
    """A case whose 32 rotation sets would all fit in the L2 is timed over L2_SETS sets
    (L2-resident, in the tuner and the benchmarks alike); larger ones keep the rotation
    that exceeds twice the L2."""
    monkeypatch.setattr(timing, "l2_bytes", lambda device=None: 50 << 20)
    assert timing.rotation(1 << 20) == timing.L2_SETS                 # 32 x 1 MB in L2
    assert timing.rotation(2 << 20) == 32                             # 64 MB: not
    assert timing.rotation(20 << 20) == 5                             # 100 MB / 20 MB
    assert timing.rotation(100 << 20) == 1
    assert timing.rotation(0) == 1


def test_a_known_behind_time_is_subtracted_without_replaying_its_graph(monkeypatch):
    """`behind_us` (the op's per-call time from an earlier timing) is subtracted as given:
    only the graph of [op, call] pairs is captured and replayed."""
    captured, replayed = [], []
    monkeypatch.setattr(timing, "prime", lambda fns, device: None)
    monkeypatch.setattr(timing, "capture", lambda fns, device: captured.append(len(fns))
                        or len(fns))
    monkeypatch.setattr(timing, "_warm", lambda device: None)

    def replays(graph, n, device):
        replayed.extend([graph] * n)
        return [0.004] * n, True           # 4 us a replay of 4 calls

    monkeypatch.setattr(timing, "_guarded_replays", replays)
    t = timing.time_graph(lambda s: None, [0], calls_per_replay=4, reps=5, warmup=0,
                          behind=lambda: None, behind_us=0.25)
    assert captured == [8] and replayed == [8] * 5
    assert t.base_us == 0.25 and t.p50 == pytest.approx(1.0 - 0.25)


@pytest.mark.skipif(not ON_GPU, reason="times CUDA graph replays with CUDA events: needs a "
                                       "GPU")
def test_time_graph_warms_up_each_launch_signature_before_capturing(device):
    """A Triton kernel timed over sets of which one is a view 4 bytes off the 16-byte
    grid (another specialization of the kernel): the warm-up runs one set of each kind,
    so the capture compiles and loads nothing, and the timing comes back."""
    import recipes
    base = torch.randn(4, 32001, device=device)
    states = [base[:, :32000].clone() for _ in range(3)] + [base[:, 1:]]
    assert len(timing.one_per_signature(states)) == 2
    out = torch.empty(4, dtype=torch.int64, device=device)
    t = timing.time_graph(lambda s: recipes.argmax(s, out=out), states, reps=5,
                          device=device, behind=timing.plain_op(device))
    assert len(t.samples) == 5 and t.base_us is not None and t.p50 > 0


def test_the_tuner_measures_the_plain_op_once_a_key_in_its_search(monkeypatch):
    """Measurer: the search's first timing at a replay size measures the plain op and the
    next ones reuse it; a new replay size measures it again; the final re-timing always
    measures it."""
    from autotune.tune import measure
    from autotune.tune.phases import NoPhases

    seen = []

    def fake_time_graph(call, states, *, behind_us=None, **kw):
        seen.append(behind_us)
        return timing.Timing([2.0], guarded=True,
                             base_us=behind_us if behind_us is not None else 1.25)

    monkeypatch.setattr(measure, "time_graph", fake_time_graph)
    m = object.__new__(measure.Measurer)
    m.cuda, m.device, m.states, m.behind = True, None, [0], (lambda: None)
    m.calls, m.base_us, m.timings, m.unguarded = 20, {}, 0, 0
    m.phases = NoPhases()
    m.t = type("T", (), {"run": staticmethod(lambda s, c: None)})()
    for phase in ("timing", "timing", "final", "timing"):
        m.time({}, 5, phase=phase)
    m.calls = 10
    m.time({}, 5)
    m.time({}, 5)
    assert seen == [None, 1.25, None, 1.25, None, 1.25]
