"""`python -m autotune tune`: search every registered recipe's space per key and write
`results/<gpu-slug>/<recipe>.json`.

Per key (a `Job`):
  1. its study is created in the store (or found again: a killed tune resumes) and the
     heuristic's config is enqueued first; the sampler is a grid-restricted TPE, which an
     exhaustive study (space of at most `exhaustive_limit` configs after the static
     constraint, or `--exhaustive`) runs to the whole grid, so a budget cut leaves the
     configs TPE thought best (`sampler_for`);
  2. trials run (`autotune.search`): each config's outputs are compared bit for bit with
     `reference` on pristine copies of the inputs (fresh output allocations are poisoned
     first), then timed as serving engines call it: CUDA-graph replays after a GPU
     warm-up, inputs rotated when they fit in L2 (`autotune.timing`);
  3. the best few configs, the heuristic's and the config the table being replaced holds
     for the key (same space and kind of device) are checked and re-timed together,
     with more replays; the fastest correct one is the key's entry, with the
     heuristic's and torch's times for the same key (`finalize`). So a re-tune with a
     shorter budget never leaves a key slower than the table it rewrites, nor than the
     heuristic (up to the noise of one run).
The table is rewritten atomically after every key, so a killed tune keeps what it did.

With no GPU the same pipeline runs under the Triton interpreter on the "smoke" keys with
a few trials, timed by the wall clock, into `results/cpu-interpreter/` (labelled so, and
never used for dispatch on a GPU).

`--workers N` runs N processes (spawned; worker i on GPU i mod the GPU count) on one
store: each loads the same studies and asks Optuna for trials, so the storage is the
only coordination; with `--storage` pointing at a database server, tuners on several
hosts share the studies the same way. The parent shows progress from the store and
finalises the tables when the workers are done.

`--budget-s S` bounds the whole run, counted from the start of `tune()` (default 360 s
on a GPU, chosen so that the default `make tune`, 38 keys, ends well inside 8 minutes on
one H200 with process start-up and imports; 600 s on CPU; 0: none). Every key costs a
fixed part besides its search (inputs and references, compiling, `finalize`'s re-check
and re-timing, torch's timing): `Budget` keeps a running mean of what that fixed part
measured on the finished keys (first guess `FIXED_S`), sets it aside for every key not
yet done, and gives the next key's search the rest in proportion to its weight (its
trial target; an exhaustive key weighs what a sampled one of its grid would: `weight`)
among the keys left. Keys run in rounds over the recipes (`interleave`), so a budget
that runs short leaves the last keys of the largest recipes untuned, never a whole
recipe. A key that overran leaves less for the rest;
a key always gets at least one trial (its heuristic's config), even past the budget.
With `--workers`, the workers' searches end early enough for the parent to finalise
every key (a guessed fixed part each) and share their time the same way.
"""
from __future__ import annotations

import os
import random
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from recipes.tables import gpu_slug, results_root

from . import registry
from .registry import Tunable, key_str
from .search import (
    Encoding,
    OrderSampler,
    Outcome,
    StudyCounts,
    TunerFatal,
    config_id,
    info,
    make_sampler,
    ok_trials,
    search,
    study_counts,
    target_trials,
    worker_id,
    wrong_configs,
)
from .tables import previous_configs, table_path, update_table
from .timing import Timing, rotation, time_eager, time_graph, time_wall

# key-field aliases of the CLI options (recipes name their key fields themselves)
FIELD_ALIASES = {"vocab": ("V",), "batch": ("B", "R"), "rows": ("R",), "K": ("K",),
                 "dtype": ("dtype",)}


@dataclass
class Options:
    recipes: list[str] | None = None          # None: every registered recipe
    preset: str | None = None                 # None: "gpu" on CUDA, "smoke" on CPU
    overrides: dict = field(default_factory=dict)   # key field -> list of values
    trials: int | None = None                 # evaluated configs per sampled key
    frac: float = 0.3                         # default trials = frac * grid
    exhaustive: bool = False                  # force exhaustive for every key
    exhaustive_limit: int | None = None       # None: 200 on CUDA, 0 on CPU
    workers: int = 1
    storage: str | None = None                # None: sqlite results/<slug>/studies.db
    budget_s: float | None = None             # None: 360 on CUDA, 600 on CPU; 0: none
    seed: int = 0
    top: int = 3                              # configs re-timed at the end
    results: str | None = None                # results root (default: repo results/)
    package: str = "recipes"
    progress: bool = True
    search_reps: int | None = None            # timing replays per trial
    final_reps: int | None = None             # replays per config in the final re-timing
    precompile_threads: int | None = None     # None: auto (GPU only); 0: off
    heartbeat_s: int | None = None
    grace_s: int | None = None
    verbose: bool = False


@dataclass
class Job:
    tunable: Tunable
    key: dict
    grid: list            # configs the static constraint admits
    exhaustive: bool
    target: int
    study: str
    sampler: str = "tpe"  # "tpe": GridTPE (tune); "order": OrderSampler (quality's grids)

    @property
    def label(self) -> str:
        return f"{self.tunable.name}[{key_str(self.key)}]"


# --- environment -------------------------------------------------------------------------
def select_device() -> torch.device:
    """CUDA when present (the current device), else the CPU under the Triton interpreter.
    Must run before the recipes are imported (the interpreter is chosen at decoration)."""
    if torch.cuda.is_available() and os.environ.get("SPEC_TUNE_DEVICE", "") != "cpu":
        return torch.device("cuda", torch.cuda.current_device())
    os.environ["TRITON_INTERPRET"] = "1"
    return torch.device("cpu")


def resolve(opts: Options, device: torch.device) -> Options:
    cuda = device.type == "cuda"
    o = Options(**vars(opts))
    o.preset = o.preset or ("gpu" if cuda else "smoke")
    if o.exhaustive_limit is None:
        o.exhaustive_limit = 200 if cuda else 0
    if o.trials is None and not cuda:
        o.trials = 3
    if o.budget_s is None:
        o.budget_s = 360.0 if cuda else 600.0
    if o.search_reps is None:
        o.search_reps = 30 if cuda else 1
    if o.final_reps is None:
        o.final_reps = 100 if cuda else 1
    if o.precompile_threads is None:
        o.precompile_threads = min(16, os.cpu_count() or 1) if cuda else 0
    if not cuda:
        o.precompile_threads = 0
    return o


def results_dir(opts: Options) -> Path:
    return Path(opts.results) if opts.results else results_root()


def storage_url(opts: Options, slug: str) -> str:
    from .store import default_url
    return opts.storage or default_url(results_dir(opts), slug)


def open_store(opts: Options, slug: str):
    from .store import GRACE_S, HEARTBEAT_S, open_storage
    return open_storage(storage_url(opts, slug), heartbeat_s=opts.heartbeat_s or HEARTBEAT_S,
                        grace_s=opts.grace_s or GRACE_S)


def quiet_optuna() -> None:
    import optuna
    optuna.logging.set_verbosity(optuna.logging.ERROR)


# --- planning ----------------------------------------------------------------------------
def select_tunables(opts: Options) -> list[Tunable]:
    registry.load_recipes(opts.package)
    all_t = registry.tunables()
    if opts.recipes:
        missing = [r for r in opts.recipes if r not in all_t]
        if missing:
            raise SystemExit(f"autotune: unknown recipe(s) {missing}; registered: "
                             f"{sorted(all_t)}")
        return [all_t[r] for r in opts.recipes]
    return [all_t[n] for n in sorted(all_t)]


def keys_for(t: Tunable, preset: str, overrides: dict) -> list[dict]:
    """The recipe's default keys for `preset`, with CLI overrides applied: every field
    named by an override is replaced by each of its values (a product; duplicates
    dropped). A key without that field is kept as it is."""
    keys = [dict(k) for k in t.default_keys(preset)]
    for opt, values in overrides.items():
        if not values:
            continue
        fields = FIELD_ALIASES.get(opt, (opt,))
        out = []
        for k in keys:
            f = next((f for f in fields if f in k), None)
            if f is None:
                out.append(k)
                continue
            for v in values:
                out.append({**k, f: _coerce(v, k[f])})
        keys = out
    seen, uniq = set(), []
    for k in keys:
        s = key_str(k)
        if s not in seen:
            seen.add(s)
            uniq.append(k)
    return uniq


def _coerce(v, like):
    if isinstance(like, bool):
        return str(v).lower() in ("1", "true", "yes")
    if isinstance(like, int):
        return int(v)
    if isinstance(like, float):
        return float(v)
    return str(v)


def plan(opts: Options, slug: str, tunables: list[Tunable] | None = None) -> list[Job]:
    from .store import study_name

    jobs = []
    for t in tunables if tunables is not None else select_tunables(opts):
        sh, src = t.space_hash(), t.source_hash()
        for key in keys_for(t, opts.preset, opts.overrides):
            grid = t.configs(key)
            if not grid:
                print(f"autotune: {t.name}[{key_str(key)}]: the constraint admits no "
                      "config of the space; skipped", file=sys.stderr)
                continue
            # --trials caps every key: a small grid is exhaustive only if it fits
            limit = min(opts.exhaustive_limit, opts.trials or opts.exhaustive_limit)
            exhaustive = opts.exhaustive or len(grid) <= limit
            target = len(grid) if exhaustive else target_trials(len(grid), opts.trials,
                                                                opts.frac)
            jobs.append(Job(t, key, grid, exhaustive, target,
                            study_name(slug, t.name, key, sh, src)))
    return interleave(jobs)


def interleave(jobs: list[Job]) -> list[Job]:
    """Jobs in rounds over the recipes (each recipe's first key, then each one's second,
    ...), keys in their recipe's order: when the budget runs short, the keys left without
    a search are the last keys of the recipes with the most keys, never a whole recipe."""
    by: dict = {}
    for j in jobs:
        by.setdefault(j.tunable.name, []).append(j)
    out, i = [], 0
    while len(out) < len(jobs):
        out += [js[i] for js in by.values() if i < len(js)]
        i += 1
    return out


def weight(job: Job, opts: Options) -> float:
    """A job's claim on the budget: its trial target, but an exhaustive key claims no
    more than a sampled one of its grid would (`frac` of it): past that, its trials pay
    less than another key's first ones (the quality report: Optuna comes within 3% of
    the optimum in well under 30% of a grid)."""
    return min(job.target, target_trials(len(job.grid), opts.trials, opts.frac))


def job_seed(opts: Options, job: Job) -> int:
    import zlib
    return (opts.seed * 1_000_003 + zlib.crc32(job.study.encode())) % (2**31)


def exhaustive_order(job: Job, opts: Options, device: torch.device) -> list[dict]:
    """The heuristic's config first, then the rest of the grid in a seeded random order
    (so a budget cut leaves an unbiased sample)."""
    heur = _heuristic(job, device)
    first = [heur] if heur is not None and job.tunable.admits(heur, job.key) else []
    first = [{k: c[k] for k in job.tunable.space} for c in first]
    ids = {config_id(c) for c in first}
    rest = [c for c in job.grid if config_id(c) not in ids]
    random.Random(job_seed(opts, job)).shuffle(rest)
    return first + rest


def sampler_for(job: Job, opts: Options, device: torch.device, worker_index: int = 0):
    """GridTPE for `tune` (an exhaustive key runs it to the whole grid, so a budget cut
    leaves the configs TPE thought best); OrderSampler for `quality`'s measurements."""
    seed = job_seed(opts, job) + 7919 * worker_index
    if job.sampler == "order":
        return OrderSampler(Encoding(job.tunable.space), exhaustive_order(job, opts, device),
                            seed, stride=worker_index)
    return make_sampler(seed, job.grid, Encoding(job.tunable.space))


def prepare(job: Job, storage, opts: Options, device: torch.device):
    """Create (or load) the job's study; a TPE study gets the heuristic's config enqueued
    as its first trial (an OrderSampler takes it first by its order). Idempotent: a
    resumed study is left as it is."""
    import optuna

    study = optuna.create_study(study_name=job.study, storage=storage, direction="minimize",
                                load_if_exists=True, sampler=sampler_for(job, opts, device))
    if not study.user_attrs.get("prepared"):
        study.set_user_attr("recipe", job.tunable.name)
        study.set_user_attr("key", job.key)
        study.set_user_attr("grid", len(job.grid))
        study.set_user_attr("exhaustive", job.exhaustive)
        heur = _heuristic(job, device)
        if job.sampler == "tpe" and heur is not None and job.tunable.admits(heur, job.key):
            p = Encoding(job.tunable.space).params(heur)
            if p is not None:
                study.enqueue_trial(p, skip_if_exists=True)
        study.set_user_attr("prepared", True)
    return study


def load(job: Job, storage, opts: Options, device: torch.device, worker_index: int = 0):
    import optuna
    return optuna.load_study(study_name=job.study, storage=storage,
                             sampler=sampler_for(job, opts, device, worker_index))


def _heuristic(job: Job, device: torch.device) -> dict | None:
    try:
        return dict(job.tunable.heuristic(job.key, device))
    except Exception as exc:  # noqa: BLE001
        print(f"autotune: {job.label}: the heuristic raised {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return None


# --- measuring -----------------------------------------------------------------------------
def _clone(obj):
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
        return type(obj)(*(_clone(x) for x in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_clone(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)


def _poison_allocator(ref) -> None:
    """Fill blocks of the outputs' sizes with 0xA5 bytes and free them, so that outputs a
    config fails to write are likely garbage rather than an earlier config's answer (the
    caching allocator hands the same blocks out again). Best effort."""
    bufs = []
    for t in _tensors(ref):
        if t.numel():
            b = torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, device=t.device)
            b.fill_(0xA5)
            bufs.append(b)
    del bufs


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


class Measurer:
    """Inputs, references and timing for one key on one device."""

    def __init__(self, t: Tunable, key: dict, device: torch.device, opts: Options):
        self.t, self.key, self.device, self.opts = t, key, device, opts
        self.cuda = device.type == "cuda"
        n = rotation(t.bytes_moved(key), device) if self.cuda else 1
        base = opts.seed * 1000
        self.states = [t.make_inputs(key, device, base + i) for i in range(n)]
        check = sorted({0, n - 1})
        # pristine copies: every check runs on fresh ones, so a config cannot pass on
        # what an earlier run left in an in-place output
        self.pristine = {i: _clone(self.states[i]) for i in check}
        self.refs = {i: t.reference(_clone(self.states[i])) for i in check}
        self.unguarded = 0    # graph timings that could not be shown free of host stalls
        if self.cuda:
            torch.cuda.synchronize(device)

    def _health(self) -> None:
        if not self.cuda:
            return
        try:
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001
            raise TunerFatal(f"the CUDA context is unusable after a failed trial "
                             f"({_error_text(exc)}); restart the tune (it resumes)") from exc

    def check(self, cfg: dict) -> tuple[bool, str | None]:
        """(outputs equal the reference on every checked input set, error or None)."""
        try:
            for i, ref in self.refs.items():
                _poison_allocator(ref)
                out = self.t.run(_clone(self.pristine[i]), cfg)
                if not self.t.equal(out, ref):
                    return False, None
            return True, None
        except Exception as exc:  # noqa: BLE001
            msg = _error_text(exc)
            self._health()
            return False, msg

    def time(self, cfg: dict, reps: int) -> Timing:
        call = self._caller(self.t.run, cfg)
        if self.cuda:
            tm = time_graph(call, self.states, reps=reps, device=self.device)
            self.unguarded += tm.guarded is False
            return tm
        return time_wall(call, self.states, reps=reps, warmup=0, device=self.device)

    @staticmethod
    def _caller(fn, cfg):
        return lambda s: fn(s, cfg)

    def evaluate(self, cfg: dict) -> Outcome:
        ok, err = self.check(cfg)
        if err is not None:
            return Outcome("error", error=err)
        if not ok:
            return Outcome("wrong")
        err = None
        for _ in range(2):        # a graph capture can fail for a passing reason: retry once
            try:
                tm = self.time(cfg, self.opts.search_reps)
                return Outcome("ok", tm.p50, tm.p20, tm.p80)
            except Exception as exc:  # noqa: BLE001
                self._health()
                err = exc
        return Outcome("error", error="timing: " + _error_text(err))

    def time_torch(self) -> tuple[float | None, str | None]:
        peer = self.t.torch_peer
        if peer is None:
            return None, None
        reps = self.opts.final_reps
        if not self.cuda:
            try:
                return time_wall(peer, self.states, reps=reps, warmup=0).p50, "wall"
            except Exception:  # noqa: BLE001
                return None, None
        try:
            return time_graph(peer, self.states, reps=reps, device=self.device).p50, "graph"
        except Exception:  # noqa: BLE001 - not capturable: time plain calls
            try:
                torch.cuda.synchronize(self.device)
                return time_eager(peer, self.states, reps=reps, device=self.device).p50, "eager"
            except Exception:  # noqa: BLE001
                return None, None


# --- finalising a key --------------------------------------------------------------------
def finalize(job: Job, study, m: Measurer, opts: Options, log=print,
             previous: dict | None = None) -> dict | None:
    """Re-check and re-time the best few configs, the heuristic and `previous` (the
    config of the table being rewritten) together; the fastest correct one (admitted by
    the space) is the entry, and `chosen_from` says which of the three it was."""
    t, key = job.tunable, job.key
    counts = study_counts(study)
    trials = ok_trials(study)
    heur = _heuristic(job, m.device)
    cands = [dict(info(tr)["config"]) for tr in trials[: max(1, opts.top)]]
    searched = {config_id(c) for c in cands}
    heur_cfg = prev_cfg = None
    if heur is not None:
        heur_cfg = {k: heur[k] for k in t.space if k in heur}
        if config_id(heur_cfg) not in {config_id(c) for c in cands}:
            cands.append(heur_cfg)
    if previous is not None and t.admits(previous, key):
        prev_cfg = {k: previous[k] for k in t.space}
        if config_id(prev_cfg) not in {config_id(c) for c in cands}:
            cands.append(prev_cfg)
    results = {}
    rounds = 2 if m.cuda else 1
    reps = max(1, opts.final_reps // rounds)
    samples = {config_id(c): [] for c in cands}
    wrong_now = []
    for c in cands:
        ok, err = m.check(c)
        if not ok:
            wrong_now.append((c, err))
    bad = {config_id(c) for c, _ in wrong_now}
    live = [c for c in cands if config_id(c) not in bad]
    for _ in range(rounds):           # interleaved, so drift hits every candidate alike
        for c in live:
            try:
                samples[config_id(c)] += m.time(c, reps).samples
            except Exception as exc:  # noqa: BLE001
                m._health()
                bad.add(config_id(c))
                wrong_now.append((c, "timing: " + _error_text(exc)))
    for c in live:
        cid = config_id(c)
        if cid not in bad and samples[cid]:
            results[cid] = (c, Timing(samples[cid]))
    for c, err in wrong_now:
        log(f"autotune: {job.label}: config {c} failed in the final check: "
            f"{err or 'outputs differ from the reference'}")
    choosable = [(c, tm) for c, tm in results.values() if t.admits(c, key)]
    if not choosable:
        log(f"autotune: {job.label}: no correct config to record (dispatch keeps the "
            "heuristic)")
        return None
    best_cfg, best = min(choosable, key=lambda ct: ct[1].p50)
    h = results.get(config_id(heur_cfg)) if heur_cfg is not None else None
    p = results.get(config_id(prev_cfg)) if prev_cfg is not None else None
    best_id = config_id(best_cfg)
    chosen_from = ("search" if best_id in searched else
                   "heuristic" if heur_cfg is not None and best_id == config_id(heur_cfg)
                   else "previous table")
    torch_us, torch_mode = m.time_torch()
    full = {**(heur or {}), **best_cfg}
    entry = {
        "key": dict(key), "config": full,
        "p20_us": _r(best.p20), "p50_us": _r(best.p50), "p80_us": _r(best.p80),
        "heuristic_config": heur, "heuristic_p50_us": _r(h[1].p50) if h else None,
        "torch_p50_us": _r(torch_us), "torch_timing": torch_mode,
        "speedup_vs_heuristic": _r(h[1].p50 / best.p50, 3) if h and best.p50 > 0 else None,
        "speedup_vs_torch": _r(torch_us / best.p50, 3) if torch_us and best.p50 > 0 else None,
        "mode": "exhaustive" if job.exhaustive else "sampled", "grid": len(job.grid),
        "target": job.target, "budget_cut": counts.evaluated < min(job.target, len(job.grid)),
        "trials": {"evaluated": counts.evaluated, "wrong": counts.wrong,
                   "errors": counts.errors, "proposals": counts.proposals},
        "wrong_configs": wrong_configs(study),
        "chosen_from": chosen_from,
        "previous_config": prev_cfg, "previous_p50_us": _r(p[1].p50) if p else None,
        "study": job.study,
    }
    return entry


def _r(x, nd=3):
    return None if x is None else round(float(x), nd)


# --- running ---------------------------------------------------------------------------------
# A key's cost outside its search, first guess (seconds; then the mean measured): inputs
# and references, compiling, finalize's re-check and re-timing of the top configs and
# the heuristic's, torch's timing. The CPU figure is for the interpreter's smoke keys.
FIXED_S = {"cuda": 4.0, "cpu": 3.0}


def fixed_guess(device: torch.device) -> float:
    return FIXED_S["cuda" if device.type == "cuda" else "cpu"]


class Budget:
    """Shares of a time budget over jobs run one after another.

    `share()` is the next job's search time: (time left - fixed * jobs left) * its weight
    / the weights of the jobs left (itself included), never below 0 (the search then runs
    its one trial). `fixed` is the mean of the fixed costs (a job's time minus its search
    time) reported by `finished`, `fixed_s` until one is. `clock` is injectable (tests);
    `start` defaults to now. `seconds` None or 0: no budget (`share()` is None)."""

    def __init__(self, seconds: float | None, weights, fixed_s: float, *,
                 clock=time.monotonic, start: float | None = None):
        self.clock = clock
        t0 = clock() if start is None else start
        self.end = t0 + seconds if seconds else None
        self.weights = [max(1.0, float(w)) for w in weights]   # jobs not started yet
        self.fixed_s0 = fixed_s
        self.fixed_seen: list[float] = []

    @property
    def fixed_s(self) -> float:
        seen = self.fixed_seen
        return sum(seen) / len(seen) if seen else self.fixed_s0

    def share(self) -> float | None:
        """Seconds for the next job's search (the job is taken off the list)."""
        w = self.weights.pop(0) if self.weights else 1.0
        if self.end is None:
            return None
        jobs = len(self.weights) + 1
        pool = self.end - self.clock() - self.fixed_s * jobs
        return max(0.0, pool) * w / (w + sum(self.weights))

    def next_deadline(self) -> float | None:
        """`share()` as a deadline on the clock, counted from now: call it right before
        the search starts."""
        s = self.share()
        return None if s is None else self.clock() + s

    def finished(self, total_s: float, search_s: float) -> None:
        """A job took `total_s`, `search_s` of it searching: the rest was fixed cost."""
        self.fixed_seen.append(max(0.0, total_s - search_s))


class Progress:
    def __init__(self, total: int, enabled: bool, desc: str = "tune"):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, unit="cfg", dynamic_ncols=True,
                                file=sys.stderr)
            except Exception:  # noqa: BLE001
                self.bar = None

    def write(self, msg: str) -> None:
        if self.bar is not None:
            self.bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr)

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def set(self, n: int) -> None:
        if self.bar is not None:
            self.bar.n = n
            self.bar.refresh()

    def shrink(self, by: int) -> None:
        if self.bar is not None and by > 0:
            self.bar.total = max(self.bar.n, self.bar.total - by)
            self.bar.refresh()

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def tune(opts: Options) -> dict:
    """Run a tune; returns a summary {"slug", "tables": {recipe: path}, "entries": n, ...}."""
    t0 = time.monotonic()
    device = select_device()
    opts = resolve(opts, device)
    quiet_optuna()
    slug = gpu_slug(device)
    tunables = select_tunables(opts)
    jobs = plan(opts, slug, tunables)
    storage = open_store(opts, slug)
    out_dir = results_dir(opts)
    mode = "GPU" if device.type == "cuda" else "Triton interpreter (smoke, wall-clock)"
    print(f"autotune: {len(jobs)} keys over {len(tunables)} recipes on "
          f"{_device_name(device)} [{mode}]; store {_redact(storage_url(opts, slug))}; "
          f"budget {opts.budget_s or 'none'} s; workers {opts.workers}", file=sys.stderr)
    for j in jobs:
        prepare(j, storage, opts, device)
    # the configs the tables hold now, read before the first key rewrites them (a table
    # made by other kernels loses its other keys' entries at that rewrite)
    tables = {t.name: previous_configs(table_path(out_dir, slug, t.name), t, device, slug)
              for t in {j.tunable.name: j.tunable for j in jobs}.values()}
    previous = {j.label: tables[j.tunable.name].get(key_str(j.key)) for j in jobs}
    progress = Progress(sum(j.target for j in jobs), opts.progress)
    written: dict = {}
    if opts.workers > 1:
        # the parent finalises every key after the workers: they stop searching early
        # enough for that (a guessed fixed cost per key)
        search_s = opts.budget_s - fixed_guess(device) * len(jobs) if opts.budget_s else None
        search_end = None if search_s is None else time.time() + search_s - (
            time.monotonic() - t0)
        _run_workers(opts, jobs, storage, slug, progress, search_end)
        for j in jobs:       # finalise in the parent, one key after another
            k0 = time.monotonic()
            progress.describe(f"final {j.label}")
            study = load(j, storage, opts, device)
            _finalize_and_write(j, study, Measurer(j.tunable, j.key, device, opts), opts,
                                device, slug, out_dir, written, progress, started=k0,
                                previous=previous[j.label])
    else:
        budget = Budget(opts.budget_s, [weight(j, opts) for j in jobs], fixed_guess(device),
                        start=t0)
        wid = worker_id(0)
        pc = _precompiler(opts, device)
        try:
            for j in jobs:
                k0 = time.monotonic()
                progress.describe(j.label)
                study = load(j, storage, opts, device)
                m = Measurer(j.tunable, j.key, device, opts)
                before = study_counts(study).evaluated
                if pc is not None and before < min(j.target, len(j.grid)):
                    pc.submit(j, m.states[0], exhaustive_order(j, opts, device))
                progress.update(min(before, j.target))
                s0 = time.monotonic()
                counts = _search_job(j, study, m, opts, budget.next_deadline(), wid,
                                     progress)
                search_s = time.monotonic() - s0
                progress.shrink(j.target - min(j.target, counts.evaluated))
                _finalize_and_write(j, study, m, opts, device, slug, out_dir, written,
                                    progress, started=k0, previous=previous[j.label])
                budget.finished(time.monotonic() - k0, search_s)
        finally:
            if pc is not None:
                pc.close()     # cancel queued compiles, or exit would wait for them
    progress.close()
    elapsed = time.monotonic() - t0
    summary = {"slug": slug, "device": _device_name(device), "tables": written,
               "keys": len(jobs), "elapsed_s": round(elapsed, 1),
               "interpreter": device.type != "cuda"}
    print(f"autotune: wrote {len(written)} table(s) under {out_dir / slug} for "
          f"{len(jobs)} keys in {elapsed:.1f} s", file=sys.stderr)
    return summary


def _device_name(device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def _redact(url: str) -> str:
    import re
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


def _search_job(j: Job, study, m: Measurer, opts: Options, deadline, wid: str,
                progress: Progress | None) -> StudyCounts:
    enc = Encoding(j.tunable.space)

    def on_trial(status, cfg, out):
        if status in ("ok", "wrong", "error") and progress is not None:
            progress.update(1)
        if status == "wrong":
            _say(progress, f"autotune: WRONG OUTPUT {j.label} config {cfg}: differs from "
                           "the reference; recorded as failed, never chosen")
        elif status == "error" and opts.verbose:
            _say(progress, f"autotune: {j.label} config {cfg}: pruned ({out.error})")

    return search(study, enc, lambda c: j.tunable.admits(c, j.key), m.evaluate,
                  target=j.target, grid_size=len(j.grid),
                  deadline=deadline, worker=wid, on_trial=on_trial)


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress.write(msg)
    else:
        print(msg, file=sys.stderr, flush=True)


def _finalize_and_write(j, study, m, opts, device, slug, out_dir, written, progress,
                        started: float | None = None, previous: dict | None = None):
    """Finalise the key (with `previous`, the config its table held before this run),
    add its entry to the table, print its line (with the seconds since `started`: the
    key's whole time)."""
    path = table_path(out_dir, slug, j.tunable.name)
    entry = finalize(j, study, m, opts, log=progress.write, previous=previous)
    if entry is None:
        return
    update_table(path, j.tunable, device, slug, [entry])
    written[j.tunable.name] = str(path)
    hp = entry["heuristic_p50_us"]
    progress.write(
        f"  {j.label}: {entry['p50_us']:.2f} us {_short(entry['config'], j.tunable)}"
        + (f"  (heuristic {hp:.2f} us)" if hp else "")
        + ("  (the previous table's config, re-timed)"
           if entry["chosen_from"] == "previous table" else "")
        + f"  [{entry['trials']['evaluated']}/{entry['grid']} configs"
        + (f", {entry['trials']['wrong']} WRONG" if entry["trials"]["wrong"] else "")
        + (f", {m.unguarded} timings not shown free of host stalls" if m.unguarded else "")
        + (f", {time.monotonic() - started:.1f} s" if started is not None else "") + "]")


def _short(cfg: dict, t: Tunable) -> str:
    return " ".join(f"{k}={cfg[k]}" for k in t.space if k in cfg)


# --- several workers on one store ------------------------------------------------------------
def _run_workers(opts: Options, jobs: list[Job], storage, slug: str, progress: Progress,
                 search_end: float | None = None):
    """Run the workers; their searches end by `search_end` (time.time(), which every
    process reads alike; None: no budget)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(opts.workers)
    procs = [ctx.Process(target=_worker_main, args=(opts, i, barrier, search_end),
                         daemon=False)
             for i in range(opts.workers)]
    for p in procs:
        p.start()
    import optuna
    try:
        from multiprocessing.connection import wait
        while any(p.is_alive() for p in procs):
            wait([p.sentinel for p in procs if p.is_alive()], timeout=3.0)
            try:
                n = 0
                for j in jobs:
                    s = optuna.load_study(study_name=j.study, storage=storage)
                    n += min(j.target, study_counts(s).evaluated)
                progress.set(n)
            except Exception:  # noqa: BLE001 - progress is cosmetic
                pass
    finally:
        for p in procs:
            p.join()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        progress.write(f"autotune: {len(bad)} worker(s) exited with an error "
                       f"(codes {bad}); finalising what the store holds")


def _worker_main(opts: Options, index: int, barrier, search_end: float | None = None) -> None:
    """One worker process: pin a GPU, load the recipes, search every job's study, all by
    `search_end` (time.time()); the same shares as one process (`Budget`), its fixed
    cost per key being what it measures here (the parent finalises, and has already set
    a guess for that aside in `search_end`: the worker's first guess is 0, not that
    guess again)."""
    try:
        if torch.cuda.is_available() and os.environ.get("SPEC_TUNE_DEVICE", "") != "cpu":
            torch.cuda.set_device(index % torch.cuda.device_count())
        device = select_device()
        opts = resolve(opts, device)
        quiet_optuna()
        slug = gpu_slug(device)
        jobs = plan(opts, slug)
        storage = open_store(opts, slug)
        wid = worker_id(index)
        try:
            barrier.wait(timeout=600)
        except Exception:  # noqa: BLE001 - a slow or dead sibling: go on alone
            pass
        left = None if search_end is None else max(0.0, search_end - time.time())
        # None or 0 seconds both mean "no budget" to Budget: a spent one is a tiny one
        budget = Budget(None if left is None else max(left, 1e-3),
                        [weight(j, opts) for j in jobs], 0.0)
        for j in jobs:
            k0 = time.monotonic()
            study = load(j, storage, opts, device, index)
            if study_counts(study).evaluated >= min(j.target, len(j.grid)):
                budget.share()       # take it off the list; its time goes to the rest
                continue
            m = Measurer(j.tunable, j.key, device, opts)
            s0 = time.monotonic()
            _search_job(j, study, m, opts, budget.next_deadline(), wid, None)
            now = time.monotonic()
            budget.finished(now - k0, now - s0)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


# --- compiling ahead (GPU) ---------------------------------------------------------------
def _precompiler(opts: Options, device: torch.device):
    if device.type != "cuda" or not opts.precompile_threads:
        return None
    from .precompile import Precompiler
    return Precompiler(opts.precompile_threads)

