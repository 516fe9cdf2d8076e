"""A tune's pieces: its start (`start`: device, options, plan), one device's measuring
(`Session`), its tables and report (`Run`), and the run in this one process
(`tune_here`); `main.tune` starts it here or in `workers`. See the package docstring for
the pipeline."""
from __future__ import annotations

import math
import os
import socket
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

from ..provenance import header, relative
from ..tables import previous_configs, table_path
from ..timing import rotation
from ..views import coverage_text
from .budget import RESERVE_S, CostModel, Coverage, OrderBins, gpu_seconds
from .compile import ConfigCosts, LoadWatch, probe, start_pool
from .device import device_name, select_device, warn_untested_triton
from .measure import Measurer, tensors
from .options import Options, resolve, results_dir
from .phases import PHASES, Phases
from .plan import Job, job_seed, plan, reorder, select_tunables
from .search import KeySearch, config_id
from .store import Store, check_folder
from .write import (
    REPORT,
    finalize,
    had_tables,
    key_row,
    no_slower_at,
    write_report,
    write_table,
)

KEEP_INPUTS = 0.25       # of the free GPU memory: probe input sets kept for measuring
SAVE_EVERY_S = 20.0      # tables and report rewritten at most this often during a run


def worker_id(index: int | None = None) -> str:
    return f"{socket.gethostname()}:{os.getpid()}" + (f":w{index}" if index is not None else "")


class Progress:
    """Configs measured so far, on stderr: a tqdm bar when stderr is a terminal; else
    (a log file, a pipe) a plain line at most every PLAIN_S seconds, since a bar's
    carriage-return frames would fill a log. `enabled=False`: neither."""

    PLAIN_S = 30.0

    def __init__(self, total: int, enabled: bool, desc: str = "tune", stream=None):
        self.bar = None
        self.stream = stream or sys.stderr
        self.n, self.of, self.label = 0, total, desc
        self.plain = False
        self.said = time.monotonic()
        if enabled:
            if _is_tty(self.stream):
                try:
                    from tqdm import tqdm
                    self.bar = tqdm(total=total, desc=desc, unit="cfg", dynamic_ncols=True,
                                    file=self.stream)
                except ImportError:
                    self.plain = True
            else:
                self.plain = True

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=self.stream)
        else:
            print(msg, file=self.stream, flush=True)

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.plain and time.monotonic() - self.said >= self.PLAIN_S:
            self.said = time.monotonic()
            self.write(f"autotune: {self.n}/{max(self.of, self.n)} configs measured "
                       f"({self.label})")

    def done(self) -> int:
        return self.n

    def total(self, n: int) -> None:
        self.of = max(self.n, n)
        if self.bar is not None:
            self.bar.total = self.of
            self.bar.refresh()

    def describe(self, text: str) -> None:
        self.label = text[:60]
        if self.bar is not None:
            self.bar.set_description_str(self.label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class Session:
    """Measuring on one device: the store, the compile pool and its probes, the cost
    model, and one key's measurement loop (`measure`)."""

    def __init__(self, opts: Options, device: torch.device, slug: str, phases: Phases,
                 progress: Progress, worker: str | None = None, claim: bool = True):
        self.opts, self.device, self.slug = opts, device, slug
        self.phases, self.progress = phases, progress
        self.cuda = device.type == "cuda"
        with phases("plan"):
            # `claim`: this process is the store's one tuner (`--workers`' processes
            # share the claim of their parent)
            self.store = Store(opts.storage, results_dir(opts), slug, claim=claim,
                               say=progress.write)
        self.pool = start_pool(opts.compile_workers or 0, device, opts.package)
        self.watch = LoadWatch(self.pool)
        self.costs = ConfigCosts(phases, self.watch, self.pool)
        self.model = CostModel("cuda" if self.cuda else "cpu",
                               self.pool.stats.workers if self.pool else 0)
        self.bins: dict = {}        # study -> {config_id: [binary ids]}
        self.first: dict = {}       # study -> the probe's input set, kept for measuring
        self.done: dict = {}        # study -> config_ids the store holds (at planning,
        #                             then after each time the key is measured)
        self._views: dict = {}
        self.worker = worker or worker_id()

    # --- before measuring ---------------------------------------------------------------
    def prepare(self, jobs: list[Job]) -> None:
        """Read what the store holds for each job; on a GPU with a compile pool, probe
        every job's grid and queue its binaries."""
        with self.phases("plan"):
            for j in jobs:
                self.done[j.study] = set(self.store.results(j.study))
        held = [sum(config_id(c) in self.done[j.study] for c in j.grid) for j in jobs]
        if sum(held):
            self.progress.write(
                f"autotune: resumed: {sum(held)} configs of {sum(h > 0 for h in held)} of "
                f"the {len(jobs)} keys come from the store {self.store.where} (measured "
                "by an earlier run, not measured again)")
        if self.pool is None:
            return
        keep = KEEP_INPUTS * torch.cuda.mem_get_info(self.device)[0] if self.cuda else 0
        for j in jobs:
            with self.phases("probe"):
                inputs = j.tunable.make_inputs(j.key, self.device, self.opts.seed * 1000)
                per, binaries = probe(j.tunable.run, inputs, j.order)
                self.bins[j.study] = per
                self.pool.add(binaries)
                nbytes = sum(t.numel() * t.element_size() for t in tensors(inputs))
                if nbytes <= keep:
                    self.first[j.study] = inputs
                    keep -= nbytes
            self.pool.pump()        # the workers start on the first keys' binaries

    def order_bins(self, job: Job) -> OrderBins:
        per = self.bins.get(job.study, {})
        return OrderBins(set(per.get(config_id(c), ())) for c in job.order)

    def prioritize(self, jobs: list[Job], limit) -> None:
        """Compile order: every job's planned configs in measurement order, then the rest
        of the grids (ready should the coverage grow)."""
        if self.pool is None:
            return
        first, rest = [], []
        for j in jobs:
            per, n = self.bins.get(j.study, {}), limit(len(j.grid))
            for i, c in enumerate(j.order):
                (first if i < n else rest).extend(per.get(config_id(c), ()))
        self.pool.prioritize(first + rest)

    def planning_view(self, jobs: list[Job], finished=frozenset()) -> list:
        """What `Coverage.plan` needs of each job (made once a job and again after each
        time it is measured, `refresh`), flagged when the job is in `finished`."""
        out = []
        for j in jobs:
            v = self._views.get(j.study)
            if v is None:
                held = self.done.get(j.study, set())
                done = [0]
                for c in j.order:
                    done.append(done[-1] + (config_id(c) in held))
                v = self._views[j.study] = (len(j.grid), done, self.gpu_s(j),
                                            self.order_bins(j))
            out.append((*v, j.study in finished))
        return out

    def refresh(self, job: Job) -> None:
        """After measuring `job`: its planning view counts what the store holds now."""
        self.done[job.study] = set(self.store.results(job.study))
        self._views.pop(job.study, None)

    def gpu_s(self, job: Job) -> float:
        if not self.cuda:
            return 0.0
        nbytes = job.tunable.bytes_moved(job.key)
        return gpu_seconds(nbytes, rotation(nbytes, self.device), self.opts.search_reps)

    def plan_coverage(self, cov: Coverage, jobs: list[Job], finished=frozenset()) -> float:
        """The coverage for `jobs`, the keys still to measure first; those in `finished`
        (studies) count with what they lack of the fraction (the top-up pass)."""
        with self.phases("budget"):
            if self.pool is not None:
                self.pool.pump()
                self.model.observe_binaries(self.pool.stats.per_binary_s())
            compiled = self.pool.compiled if self.pool is not None and self.pool.left() \
                else None
            before = cov.fraction if cov.history else None
            loaded = self.watch.loaded if self.cuda else None
            f = cov.plan(self.planning_view(jobs, finished), compiled, loaded)
            if f != before:
                self.prioritize(jobs, cov.limit)
        return f

    def ready(self, job: Job, cfg: dict) -> bool:
        if self.pool is None:
            return True
        return self.pool.ready(self.bins.get(job.study, {}).get(config_id(cfg), ()))

    # --- one key ------------------------------------------------------------------------
    def measure(self, job: Job, limit: int, *, deadline: float | None = None,
                on_trial=None):
        """Measure the first `limit` configs of the job's order that the store lacks
        (until `deadline`, time.monotonic(), if given, after one at least). Returns
        (KeySearch, Measurer, seconds spent measuring configs, seconds waiting)."""
        ph, opts = self.phases, self.opts
        with ph("inputs"):
            m = Measurer(job.tunable, job.key, self.device, seed=opts.seed,
                         search_reps=opts.search_reps, final_reps=opts.final_reps,
                         first=self.first.pop(job.study, None), phases=ph)
        with ph("search"):
            resumed = self.store.results(job.study)
            ks = KeySearch(job.tunable.space, job.order, limit=limit,
                           ready=(lambda c: self.ready(job, c)) if self.pool else None,
                           resumed=resumed, worker=self.worker,
                           seed=job_seed(opts.seed, job.study))
        nbytes = job.tunable.bytes_moved(job.key)
        paced = False
        h = resumed.get(config_id(job.heuristic)) if job.admitted else None
        if h is not None and h.status == "ok":
            m.pace(h.p50)
            paced = True
        else:
            m.pace(2.0 + nbytes / 2.5e6)          # a first guess from the bytes moved
        gpu_s = self.gpu_s(job)
        cfg_s = wait_s = 0.0
        bins = self.bins.get(job.study, {})
        with self.watch:
            while ks.left():
                if deadline is not None and time.monotonic() >= deadline and ks.results:
                    break
                if self.pool is not None:
                    self.pool.pump()
                nxt = ks.peek()
                if not self.ready(job, nxt):
                    with ph("compile_wait"):
                        t = time.monotonic()
                        self.pool.wait(bins.get(config_id(nxt), ()), timeout=0.5)
                        wait_s += time.monotonic() - t
                    continue
                with ph("search"):
                    trial, cfg = ks.ask()
                t0 = time.monotonic()
                before = self.costs.before()
                out = m.evaluate(cfg)
                dt = time.monotonic() - t0
                loads = self.costs.after(before, job.tunable.name)
                if not paced and out.status == "ok":
                    m.pace(out.value)
                    paced = True
                with ph("search"):
                    self.store.add(job.study, ks.tell(trial, cfg, out))
                self.model.observe_config(dt, gpu_s, loads)
                cfg_s += dt
                if on_trial is not None:
                    on_trial(job, cfg, out)
                with ph("store"):
                    self.store.maybe_flush()
        with ph("store"):
            self.store.flush()
        return ks, m, cfg_s, wait_s

    def compile_report(self) -> dict:
        out = {"pool": None, "loaded": self.watch.loads,
               "not_from_pool": self.watch.misses,
               "not_from_pool_by_kernel": dict(sorted(self.watch.missed_kernels.items())),
               "compiled_in_process": self.watch.compiled,
               "compiled_in_process_by_kernel": dict(sorted(self.watch.compiled_kernels.items())),
               "config_costs": self.costs.report(),
               "config_costs_by_recipe": self.costs.report_recipes()}
        if self.pool is not None:
            s = self.pool.stats
            out["pool"] = {"workers": s.workers, "binaries": s.probed,
                           "compiled": s.compiled, "from_cache": s.cached,
                           "failed": s.failed, "left": self.pool.left(),
                           "launchers_failed": s.launchers_failed,
                           "capped": s.capped, "capped_failed": s.capped_failed,
                           "launcher_s": round(s.launcher_s, 1),
                           "worker_s": round(s.cpu_s, 1),
                           "compile_s_mean": round(s.compile_s / s.compiled, 3)
                           if s.compiled else None,
                           "first_result_s": None if s.first_s is None
                           else round(s.first_s, 1),
                           "wall_s": round(s.wall_s, 1), "errors": s.errors}
        return out

    def close(self) -> None:
        try:
            self.store.flush()
        finally:
            self.store.release()
            if self.pool is not None:
                self.pool.close()


def attach_previous(jobs: list[Job], out_dir, slug: str, device, seed: int) -> None:
    """Each job's `previous`: the config the table being rewritten holds for its key
    (read before the first write; a table made by other kernels loses its other keys'
    entries at that write, yet each is offered its old config), second in its order."""
    tables: dict = {}
    for j in jobs:
        t = j.tunable
        if t.name not in tables:
            tables[t.name] = previous_configs(table_path(out_dir, slug, t.name), t,
                                              device, slug)
        j.previous = tables[t.name].get(j.kstr)
        if j.previous is not None:
            reorder(j, seed)


def _short(cfg: dict, space) -> str:
    return " ".join(f"{k}={cfg[k]}" for k in space if k in cfg)


class Run:
    """The state of one tune, for the tables and the report."""

    def __init__(self, opts, device, slug, out_dir, jobs, phases, fresh):
        self.opts, self.device, self.slug, self.out_dir = opts, device, slug, out_dir
        self.jobs, self.phases, self.fresh = jobs, phases, fresh
        self.entries: dict = {}      # recipe -> key_str -> entry
        self.results: dict = {}      # recipe -> key_str -> {config_id: Result}
        self.rows: list = []
        self._row_at: dict = {}      # study -> index in rows (a top-up replaces its row)
        self.tables: dict = {}       # recipe -> path
        self.session: Session | None = None
        self.coverage: Coverage | None = None
        self.dirty: dict = {}        # recipe -> tunable, with entries not yet written
        self.reported_at = -math.inf

    def finished(self, job: Job, entry: dict | None, results: dict, counts: dict,
                 planned: int, seconds: float) -> None:
        """Record a finished key (again after a top-up: its row is replaced, its seconds
        are the sum); its recipe's table is rewritten at the next `save`."""
        t = job.tunable
        self.results.setdefault(t.name, {})[job.kstr] = results
        at = self._row_at.get(job.study)
        if at is None:
            self._row_at[job.study] = len(self.rows)
            self.rows.append(key_row(job, entry, counts, planned, seconds))
        else:
            seconds += self.rows[at]["seconds"]
            self.rows[at] = key_row(job, entry, counts, planned, seconds)
        if entry is None or not entry["admitted"]:
            return
        self.entries.setdefault(t.name, {})[job.kstr] = entry
        self.dirty[t.name] = t

    def save(self) -> None:
        """Rewrite the tables of the recipes with new entries (every entry's no_slower_at
        again, with every key's measurements)."""
        with self.phases("write"):
            for name, t in self.dirty.items():
                ents = self.entries[name]
                heur = {j.kstr: j.heuristic if j.admitted else None
                        for j in self.jobs if j.tunable.name == name}
                no_slower_at(ents, self.results[name], heur, t.space)
                self.tables[name] = str(write_table(self.out_dir, self.slug, t, self.device,
                                                    list(ents.values())))
        self.dirty.clear()

    def report(self, *, complete: bool, interrupted: bool = False, extra=None,
               force: bool = True) -> str | None:
        """Write the tables with new entries, then the tune report; unforced, at most
        every SAVE_EVERY_S (each table write recomputes a recipe's whole table; returns
        None when it wrote nothing)."""
        if not force and time.monotonic() - self.reported_at < SAVE_EVERY_S:
            return None
        self.save()
        self.reported_at = time.monotonic()
        wall = time.monotonic() - self.opts.started
        path = self.out_dir / self.slug / REPORT
        s = self.session
        cov = self.coverage
        doc = {"slug": self.slug, **header(self.device, self.opts.command),
               "interpreter": self.device.type != "cuda",
               "wall_s": round(wall, 2), "fresh": self.fresh, "complete": complete,
               "interrupted": interrupted, "budget_s": self.opts.budget_s or None,
               "coverage": {"fraction": cov.fraction if cov else None,
                            "history": cov.history if cov else []},
               "keys_planned": len(self.jobs),
               "configs_measured": sum(r["measured"] for r in self.rows),
               "phases": self.phases.report(wall), "phase_notes": PHASES,
               "compile": s.compile_report() if s else None,
               "cost_model": s.model.as_dict() if s else None,
               "store": {"where": relative(s.store.where, self.out_dir),
                         "written": s.store.written,
                         "flush_s": round(s.store.flush_s, 2)} if s else None,
               "tables": {k: relative(v, self.out_dir) for k, v in self.tables.items()},
               "keys": self.rows, **(extra or {})}
        with self.phases("write"):
            write_report(path, doc)
        return str(path)


class Start(NamedTuple):
    """A tune before it measures (`start`): the device, the resolved options, the plan."""
    opts: Options
    device: torch.device
    slug: str
    out_dir: Path
    tunables: list
    jobs: list[Job]
    phases: Phases
    fresh: bool


def start(opts: Options) -> Start:
    """Pick the device (the interpreter without a GPU), resolve the options, plan every
    job and give it the config of the table it will rewrite."""
    device = select_device()
    warn_untested_triton()
    opts = resolve(opts, device)
    phases = Phases()
    phases.add("startup", max(0.0, time.monotonic() - opts.started))
    from recipes._configs import gpu_slug

    with phases("plan"):
        slug = gpu_slug(device)
        out_dir = results_dir(opts)
        tunables = select_tunables(opts)
        fresh = not had_tables(out_dir, slug)
        check_folder(out_dir / slug, "tables folder", "--results DIR")
        jobs = plan(opts, slug, device, tunables)
        attach_previous(jobs, out_dir, slug, device, opts.seed)
    return Start(opts, device, slug, out_dir, tunables, jobs, phases, fresh)


def tune_here(opts: Options, device: torch.device, slug: str, out_dir: Path, tunables: list,
              jobs: list[Job], phases: Phases, fresh: bool) -> dict:
    """The started tune (`Start`'s fields) measured in this process: see `main.tune`."""
    progress = Progress(0, opts.progress)
    run = Run(opts, device, slug, out_dir, jobs, phases, fresh)
    session = run.session = Session(opts, device, slug, phases, progress)
    mode = "GPU" if device.type == "cuda" else "Triton interpreter (smoke, wall-clock)"
    pool = f"{session.pool.stats.workers} compile processes" if session.pool else \
        "no compile pool"
    progress.write(f"autotune: {len(jobs)} keys over {len(tunables)} recipes on "
                   f"{device_name(device)} [{mode}]; store {session.store.where}; budget "
                   f"{opts.budget_s or 'none'} s; {pool}")
    cov = run.coverage = Coverage(opts.budget_s, opts.started, session.model,
                                  cap=opts.trials, exhaustive=opts.exhaustive)
    try:
        session.prepare(jobs)
        f = session.plan_coverage(cov, jobs)
        planned = sum(cov.limit(len(j.grid)) for j in jobs)
        progress.total(planned)
        if session.pool is not None:
            progress.write(f"autotune: {sum(len(j.grid) for j in jobs)} configs over "
                           f"{len(jobs)} keys run {session.pool.stats.probed} distinct "
                           f"binaries; the budget plans {f:.0%} of every grid ({planned} "
                           "configs; a --trials cap may take fewer)")
        _run_jobs(run, jobs, progress)
    except KeyboardInterrupt:
        session.close()
        where = run.report(complete=False, interrupted=True)
        progress.close()
        progress.write(f"autotune: interrupted; {session.store.written} measured configs "
                       f"are in the store {session.store.where} and the keys finished are "
                       f"in their tables (report {where})")
        raise
    finally:
        try:
            run.save()                 # whatever ends the run, finished keys are kept
        finally:
            session.close()
    progress.close()
    where = run.report(complete=True)
    elapsed = time.monotonic() - opts.started
    cover = coverage_text(run.rows)
    progress.write(f"autotune: wrote {len(run.tables)} table(s) under {out_dir / slug} for "
                   f"{len(jobs)} keys in {elapsed:.1f} s"
                   + (f" ({cover})" if cover else "") + f"; report {where}")
    return {"slug": slug, "device": device_name(device), "tables": run.tables,
            "keys": len(jobs), "elapsed_s": round(elapsed, 1), "report": where,
            "interpreter": device.type != "cuda"}


def _run_jobs(run: Run, jobs: list[Job], progress: Progress) -> None:
    session, cov, opts = run.session, run.coverage, run.opts

    def on_trial(job, cfg, out):
        progress.update(1)
        if out.status == "wrong":
            progress.write(f"autotune: WRONG OUTPUT {job.label} config {cfg}: differs from "
                           "the reference; recorded as failed, never chosen")
        elif out.status == "error" and opts.verbose:
            progress.write(f"autotune: {job.label} config {cfg}: pruned ({out.error})")

    def measure_key(j: Job, limit: int, deadline: float | None = None) -> None:
        k0 = time.monotonic()
        progress.describe(j.label)
        ks, m, cfg_s, wait_s = session.measure(j, limit, deadline=deadline,
                                               on_trial=on_trial)
        entry = finalize(j, m, ks.results, top=opts.top, planned=limit, log=progress.write)
        seconds = time.monotonic() - k0
        run.finished(j, entry, ks.results, ks.counts(), limit, seconds)
        session.model.observe_key(max(0.0, seconds - cfg_s - wait_s))
        session.refresh(j)
        say_key(progress, j, entry, ks, m, limit, seconds)
        del m
        run.report(complete=False, force=False)

    finished: set = set()
    for i, j in enumerate(jobs):
        measure_key(j, cov.limit(len(j.grid)))
        finished.add(j.study)
        if i + 1 < len(jobs):
            session.plan_coverage(cov, jobs[i + 1:] + jobs[:i + 1], finished)
            progress.total(progress.done() + sum(cov.limit(len(x.grid)) for x in jobs[i + 1:]))
    top_up(session, cov, jobs, finished, measure_key, progress)


def top_up(session: Session, cov: Coverage, jobs: list[Job], finished: set, measure_key,
           progress: Progress) -> None:
    """Bring the keys measured at a lower coverage than the plan now allows up to it,
    the least covered first, while the budget lasts (a key is started only if its fixed
    cost and one config fit; `measure` stops it at the budget's end). A key whose
    top-up added nothing to the store is not tried again."""
    tried: dict = {}          # study -> configs of its prefix held when its top-up began
    while True:
        session.plan_coverage(cov, jobs, finished)
        owed = []
        for j, (grid, done, *_rest) in zip(jobs, session.planning_view(jobs), strict=True):
            n = cov.limit(grid)
            if done[n] < n and tried.get(j.study) != done[n]:
                owed.append((done[n] / n, n, j, done[n]))
        if not owed:
            return
        _, n, j, held = min(owed, key=lambda o: o[0])
        tried[j.study] = held
        model = session.model
        end = cov.end - RESERVE_S - model.per_key() if cov.end is not None else None
        if end is not None and cov.clock() + model.per_config_host() >= end:
            progress.write(f"autotune: top-up stopped by the budget; {len(owed)} keys "
                           "below the fraction of their grid planned last")
            return
        progress.total(progress.done() + n - held)
        measure_key(j, n, deadline=end)


def say_key(progress, j: Job, entry, ks, m, limit: int, seconds: float) -> None:
    c = ks.counts()
    head = f"  {j.label}: "
    if entry is None:
        head += "no entry (heuristic)"
    elif not entry["admitted"]:
        head += (f"heuristic kept at {entry['p50_us']:.2f} us (outside the constraint's "
                 "grid: no table entry)")
    else:
        hp = entry["heuristic_p50_us"]
        head += (f"{entry['p50_us']:.2f} us {_short(entry['config'], j.tunable.space)}"
                 + (f"  (heuristic {hp:.2f} us)" if hp else "")
                 + {"heuristic": "  [heuristic kept]",
                    "previous table": "  [the previous table's config, re-timed]"}.get(
                        entry["chosen_from"], ""))
    progress.write(head + f"  [{c['evaluated']}/{len(j.grid)} configs"
                   + (f", {c['wrong']} WRONG" if c["wrong"] else "")
                   + (f", {m.unguarded} timings not shown free of host stalls"
                      if m.unguarded else "")
                   + f", {seconds:.1f} s]")


