"""Compiling ahead: every distinct Triton binary a tune will run, compiled once, in a
pool of processes, into Triton's on-disk cache; the measuring process then only loads
cached binaries (a few milliseconds each) instead of compiling (0.5-2 s each, and
in-process compiles are bound to one core by the GIL).

1. Probe (`probe`): the key's run is called for each planned config with Triton's
   `knobs.runtime.jit_cache_hook` set to a hook that records what Triton is about to
   compile (the kernel, and the specialization data that `JITFunction.preload` takes) and
   skips it: nothing is compiled or launched, so a probe costs the launcher's Python.
   A binary is identified by the kernel and its specialization data (argument
   specialization, constants and options: what Triton's on-disk cache hash is made
   of), so configs and keys that launch the same binary share it: one compile, then
   timed at every key that runs it.
2. Pool (`CompilePool`): `workers` spawned processes (`compile_worker`), each with a
   driver that only reports the GPU's target (no CUDA context, no GPU memory), run
   `compile_worker.preload` (Triton's `JITFunction.preload` of the specialization
   data, tuples kept), which compiles into the on-disk cache (`TRITON_CACHE_DIR`,
   default ~/.triton/cache, kept between runs: a second tune finds its binaries
   there), and build the binary's C launcher into it too. A binary that
   `recipes._registers.register_cap` may cap at its plain variant's registers (`probe`
   pairs them) is compiled with the plain one, and, where it uses more registers
   (`cubin.register_count`), capped as well. Binaries go out in the order the
   measuring process needs them: the planned configs of every key in measurement
   order first, then the rest of the grids; a binary the measuring process waits for
   goes to the front.
3. Loads (`LoadWatch`): the measuring process counts the binaries it loaded, those the
   pool did not have (disabled, failed or not yet done), and those it compiled itself
   (Triton's disk cache missed).

The pool is an accelerator only: on any failure it stops with one message and the
measuring process compiles in-process as before. A binary that fails to compile in a
worker is left to the measuring process, whose trial records the error.
"""
from __future__ import annotations

import hashlib
import heapq
import itertools
import json
import sys
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import dataclass, field, replace

from .compile_worker import Done, compile_task, worker_init

HIT_S = 0.05          # a worker compile faster than this came from Triton's cache
OUTSTANDING = 3       # tasks in flight a worker (keeps the pool busy between top-ups)


@dataclass(frozen=True)
class Binary:
    bid: str
    module: str
    qualname: str
    spec: str           # Triton's specialization data (JSON)
    plain: str | None = None    # a register-capped variant's plain spec (`probe`)


def binary_id(module: str, qualname: str, spec: str) -> str:
    """The binary's id: its kernel and specialization data without Triton's in-memory
    key, i.e. what its on-disk cache hash is made of (argument specialization,
    constants, options); the pool can then name a binary it derives (a capped variant)
    the way the measuring process's hook will."""
    d = json.loads(spec)
    d.pop("key", None)
    text = json.dumps(d, sort_keys=True)
    return f"{module}.{qualname}:" + hashlib.sha1(text.encode()).hexdigest()[:16]


class _Hook:
    """A `jit_cache_hook` that records each compile request, and whether it was a manual
    warmup; `skip` makes Triton skip the compile and the launch (the probe)."""

    def __init__(self, skip: bool):
        self.skip = skip
        self.seen: list[tuple[Binary, bool]] = []

    def __call__(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):
        spec = compile["specialization_data"]
        self.seen.append((Binary(binary_id(fn.module, fn.name, spec), fn.module, fn.name,
                                 spec), is_manual_warmup))
        return self.skip


class _hooked:
    def __init__(self, hook):
        self.hook = hook

    def __enter__(self):
        from triton import knobs
        self.prev = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = self.hook
        return self.hook

    def __exit__(self, *exc):
        from triton import knobs
        knobs.runtime.jit_cache_hook = self.prev


def probe(run, inputs, configs: list[dict]) -> tuple[dict, dict]:
    """({config_id: [binary ids]}, {binary id: Binary}) of `run(inputs, config)` for each
    config, without compiling or launching anything. A config whose launcher raises
    gets no binaries (its trial reports the error).

    Two manual warmups of one kernel in a row are `recipes._registers.register_cap`'s
    plain variant and the variant it may cap at the plain one's registers (the only
    manual warmups a launcher makes): the second binary keeps the first's spec
    (`Binary.plain`), so that its worker compiles the capped binary too."""
    from .search import config_id

    per, binaries = {}, {}
    with _hooked(_Hook(skip=True)) as hook:
        for cfg in configs:
            hook.seen.clear()
            try:
                run(inputs, cfg)
            except Exception:  # noqa: BLE001 - the trial will report it
                pass
            ids, prev = [], None
            for b, manual in hook.seen:
                if manual and prev is not None and prev.qualname == b.qualname \
                        and prev.module == b.module and prev.bid != b.bid:
                    b = replace(b, plain=prev.spec)
                    binaries[b.bid] = b
                    prev = None
                else:
                    prev = b if manual else None
                binaries.setdefault(b.bid, b)
                if b.bid not in ids:
                    ids.append(b.bid)
            per[config_id(cfg)] = ids
    return per, binaries


class LoadWatch:
    """Counts, in the measuring process, the binaries Triton loads or compiles (its
    in-memory cache missed) and keeps their ids (the budget prices a binary's first use);
    those of them the pool had not compiled (`misses`); and, from Triton's compilation
    listener, the binaries this process compiled because Triton's disk cache missed
    (`compiled`), which is what a pool's binary under another hash than the launch's
    shows up as."""

    def __init__(self, pool: "CompilePool | None"):
        self.pool = pool
        self.loads = 0
        self.misses = 0
        self.missed_kernels: dict = {}    # "module.kernel" -> binaries the pool lacked
        self.compiled = 0
        self.compiled_kernels: dict = {}  # "module.kernel" -> binaries compiled here
        self.loaded: set[str] = set()
        self._ctx = _hooked(self)
        self._prev_listener = None

    def __call__(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):
        self.loads += 1
        bid = binary_id(fn.module, fn.name, compile["specialization_data"])
        self.loaded.add(bid)
        if self.pool is None or not self.pool.compiled(bid):
            self.misses += 1
            _count(self.missed_kernels, f"{fn.module}.{fn.name}")
        return None

    def _listen(self, *, src, metadata, metadata_group, times, cache_hit) -> None:
        if not cache_hit:
            self.compiled += 1
            fn = getattr(src, "fn", None)
            _count(self.compiled_kernels, f"{getattr(fn, 'module', '?')}."
                   f"{getattr(src, 'name', '?')}")
        if self._prev_listener is not None:
            self._prev_listener(src=src, metadata=metadata, metadata_group=metadata_group,
                                times=times, cache_hit=cache_hit)

    def __enter__(self):
        from triton import knobs
        self._ctx.__enter__()
        self._prev_listener = knobs.compilation.listener
        knobs.compilation.listener = self._listen
        return self

    def __exit__(self, *exc):
        from triton import knobs
        knobs.compilation.listener = self._prev_listener
        self._ctx.__exit__(*exc)


def _count(counts: dict, name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


class ConfigCosts:
    """A measured config's check and timing seconds, split by whether its check loaded a
    binary and whether the pool was still compiling, and by recipe: where a tune's
    per-config cost goes (the tune report's `compile.config_costs` and
    `compile.config_costs_by_recipe`)."""

    def __init__(self, phases, watch: LoadWatch, pool: "CompilePool | None"):
        self.phases, self.watch, self.pool = phases, watch, pool
        self.split: dict = {}        # tag -> [configs, check s, timing s, loads]
        self.recipes: dict = {}      # recipe -> the same

    def before(self) -> tuple:
        busy = self.pool is not None and self.pool.left() > 0
        s = self.phases.seconds
        return s["check"], s["timing"], self.watch.loads, busy

    def after(self, before: tuple, recipe: str = "") -> int:
        """Books the config's seconds; returns how many binaries its check loaded."""
        check, timing, loads, busy = before
        tag = ("loaded" if self.watch.loads > loads else "cached") + \
            (" while compiling" if busy else "")
        s = self.phases.seconds
        add = (1, s["check"] - check, s["timing"] - timing, self.watch.loads - loads)
        for row in (self.split.setdefault(tag, [0, 0.0, 0.0, 0]),
                    self.recipes.setdefault(recipe, [0, 0.0, 0.0, 0])):
            row[:] = [a + b for a, b in zip(row, add, strict=True)]
        return add[3]

    @staticmethod
    def _means(rows: dict, loads: bool) -> dict:
        return {k: {"configs": n, "check_ms": round(1e3 * c / n, 2),
                    "timing_ms": round(1e3 * t / n, 2), **({"loads": ld} if loads else {})}
                for k, (n, c, t, ld) in sorted(rows.items())}

    def report(self) -> dict:
        """{tag: {"configs", "check_ms", "timing_ms"}} (means a config)."""
        return self._means(self.split, loads=False)

    def report_recipes(self) -> dict:
        """{recipe: {"configs", "check_ms", "timing_ms", "loads"}} (means a config; loads
        in all)."""
        return self._means(self.recipes, loads=True)


@dataclass
class PoolStats:
    workers: int = 0
    probed: int = 0          # distinct binaries the probes found
    compiled: int = 0        # compiled by a worker
    cached: int = 0          # found in Triton's cache by a worker
    failed: int = 0
    launchers_failed: int = 0   # binaries whose launcher the worker could not build
    capped: int = 0          # register-capped variants compiled (`_compile_capped`)
    capped_failed: int = 0   # capped variants the worker could not derive
    launcher_s: float = 0.0  # worker seconds building (or finding) launchers
    cpu_s: float = 0.0       # worker seconds, all tasks
    compile_s: float = 0.0   # worker seconds of the binaries that were compiled
    first_s: float | None = None   # pool start -> first result
    wall_s: float = 0.0      # pool start -> last result
    errors: list = field(default_factory=list)

    def per_binary_s(self) -> float | None:
        n = self.compiled + self.cached + self.failed
        return self.cpu_s / n if n else None


class CompilePool:
    """`workers` processes compiling `Binary`s in priority order (lower first)."""

    def __init__(self, workers: int, target, device_index: int, package: str):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        self.stats = PoolStats(workers=workers)
        self.t0 = time.monotonic()
        self.executor = ProcessPoolExecutor(
            max_workers=workers, mp_context=mp.get_context("spawn"),
            initializer=worker_init, initargs=(target, device_index, package))
        self.binaries: dict = {}       # bid -> Binary
        self.status: dict = {}         # bid -> "queued" | "running" | "done" | "failed"
        self.prio: dict = {}           # bid -> priority (queued ones)
        self.heap: list = []
        self.running: dict = {}        # future -> bid
        self.by_bid: dict = {}         # bid -> future
        self.cap = OUTSTANDING * workers
        self.enabled = True
        self._seq = itertools.count()
        self._left = 0                 # binaries queued or running

    # --- queueing ---------------------------------------------------------------------
    def add(self, binaries: dict) -> None:
        """Queue binaries not seen before (after every prioritized one)."""
        for bid, b in binaries.items():
            if bid not in self.binaries:
                self.binaries[bid] = b
                self.status[bid] = "queued"
                self._left += 1
                self.stats.probed += 1
                self._set(bid, (2, next(self._seq)))

    def prioritize(self, ordered: list[str]) -> None:
        """Queued binaries in this order (first occurrence), ahead of any others."""
        seen = set()
        for i, bid in enumerate(ordered):
            if bid not in seen and self.status.get(bid) == "queued":
                self._set(bid, (1, i))
            seen.add(bid)
        self.pump()

    def _set(self, bid: str, prio) -> None:
        self.prio[bid] = prio
        heapq.heappush(self.heap, (prio, next(self._seq), bid))
        if len(self.heap) > 4 * len(self.prio) + 1024:      # mostly stale entries
            self.heap = [e for e in self.heap if self.prio.get(e[2]) == e[0]]
            heapq.heapify(self.heap)

    def urgent(self, bids) -> None:
        for bid in bids:
            if self.status.get(bid) == "queued":
                self._set(bid, (0, next(self._seq)))
        self.pump()

    # --- running ----------------------------------------------------------------------
    def pump(self) -> None:
        """Collect finished tasks and top the workers up."""
        if not self.enabled:
            return
        self._collect([f for f in self.running if f.done()])
        while len(self.running) < self.cap and self.heap:
            prio, _, bid = heapq.heappop(self.heap)
            if self.status.get(bid) != "queued" or self.prio.get(bid) != prio:
                continue                              # stale entry
            b = self.binaries[bid]
            try:
                fut = self.executor.submit(compile_task, b.module, b.qualname, b.spec,
                                           b.plain)
            except Exception as exc:  # noqa: BLE001 - a broken pool
                self._disable(exc)
                return
            self.status[bid] = "running"
            self.prio.pop(bid, None)
            self.running[fut] = bid
            self.by_bid[bid] = fut

    def _collect(self, futures) -> None:
        for f in futures:
            bid = self.running.pop(f)
            self._left -= 1
            try:
                r = Done(*f.result())
            except Exception as exc:  # noqa: BLE001 - a worker died: no more pool
                self.status[bid] = "failed"
                self._disable(exc)
                return
            now = time.monotonic() - self.t0
            if self.stats.first_s is None:
                self.stats.first_s = now
            self.stats.wall_s = now
            self.stats.cpu_s += r.secs + r.launcher_s
            self.stats.launcher_s += r.launcher_s
            b = self.binaries[bid]
            if r.launcher_err is not None:
                self.stats.launchers_failed += 1
                self._error(f"{b.qualname} launcher: {r.launcher_err}")
            if r.capped is not None:       # the measuring process's hook names it so
                self.status[binary_id(b.module, b.qualname, r.capped)] = "done"
                self.stats.capped += 1
            if r.capped_err is not None:
                self.stats.capped_failed += 1
                self._error(f"{b.qualname} capped: {r.capped_err}")
            if r.err is None:
                self.status[bid] = "done"
                if r.secs < HIT_S:
                    self.stats.cached += 1
                else:
                    self.stats.compiled += 1
                    self.stats.compile_s += r.secs
            else:
                self.status[bid] = "failed"
                self.stats.failed += 1
                self._error(f"{b.qualname}: {r.err}")

    def _error(self, text: str) -> None:
        if len(self.stats.errors) < 5:
            self.stats.errors.append(text)

    def _disable(self, exc) -> None:
        if self.enabled:
            self.enabled = False
            print(f"autotune: the compile pool stopped ({type(exc).__name__}: {exc}); "
                  "binaries compile in the measuring process from here on", file=sys.stderr)

    def compiled(self, bid: str) -> bool:
        return self.status.get(bid) == "done"

    def ready(self, bids) -> bool:
        """Nothing left for the pool to do for these binaries (compiled, failed, or the
        pool is off): the measuring process may run them."""
        if not self.enabled:
            return True
        return all(self.status.get(b) not in ("queued", "running") for b in bids)

    def wait(self, bids, timeout: float = 1.0) -> None:
        """Wait (at most `timeout`) until one of `bids` is done, putting them first; when
        none of them is running yet, until any task ends (and frees a worker for them)."""
        self.urgent(bids)
        futs = [self.by_bid[b] for b in bids if self.status.get(b) == "running"]
        if not futs:
            futs = list(self.running)
        if futs:
            wait(futs, timeout=timeout, return_when=FIRST_COMPLETED)
        elif not self.ready(bids):
            time.sleep(min(timeout, 0.05))
        self.pump()

    def left(self) -> int:
        """Binaries queued or running (compiled, failed or not, they are off the list)."""
        return self._left

    def close(self) -> None:
        self.enabled = False
        try:
            self.executor.shutdown(wait=False, cancel_futures=True)
        except Exception:  # noqa: BLE001
            pass


def start_pool(workers: int, device, package: str) -> CompilePool | None:
    """A pool for `device` (CUDA), or None (no workers asked, or it cannot start)."""
    if workers <= 0 or device.type != "cuda":
        return None
    try:
        from triton.runtime import driver
        target = driver.active.get_current_target()
        return CompilePool(workers, target, device.index or 0, package)
    except Exception as exc:  # noqa: BLE001
        print(f"autotune: no compile pool ({type(exc).__name__}: {exc}); binaries compile "
              "in the measuring process", file=sys.stderr)
        return None
