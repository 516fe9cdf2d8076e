"""`make bench` (`python -m autotune bench`): every registered benchmark suite on this GPU.

For each `BenchSuite` of the registry and each of its cases: make the inputs (several
input sets when one set fits in L2, so that a pass over them is not served from cache:
`timing.rotation`), time every variant (graph variants as CUDA-graph replays with
`timing.time_graph`, eager ones with `timing.time_eager`), time "ours" a second time at
the end (the two medians give the noise), and, when this GPU has a tuned table whose
config for the case differs from the heuristic's, time "ours" once more with the
heuristic config (`dispatch.heuristic_only`). Once per run, a copy kernel is timed at
every power-of-two size from 16 KiB to 1 GiB a side (`copy_curve`). Its largest copy is
the bandwidth ceiling: fraction of copy bandwidth = bytes / time / ceiling, and the
plots' floor line is bytes / ceiling. That ceiling is asymptotic: a copy of a few
megabytes also pays a launch and the memory system's ramp, and reaches half of it on an
H200. So each case is also compared with a copy of its own byte count ("same-size
copy": that copy's time over ours, interpolated log-log on the curve).

Writes, under `--out` (default `results/<gpu-slug>/`):
    BENCH.md           the page: run header, headline table, per-suite tables and plots
    BENCH.json         the run header (GPU, versions, date, copy bandwidth, command)
    bench-<suite>.json raw numbers: per case the label, bytes, and per variant p20/p50/p80 us
    bench-<suite>.md   the suite's table
    bench-<suite>.png  time against batch size, one panel per vocabulary (or the suite's
                       main size field), ours / torch eager / torch graph and the floor
    OVERHEAD.md/.json  eager Python-side time per call of each recipe (`--overhead`)

`--render DIR` rebuilds the .md/.png files (and `--readme README.md`'s headline block)
from the JSON files, without a GPU. Without a GPU a run is a functional check only: the
smoke preset under the Triton interpreter, nothing written unless `--out` is given.

Tables and plots are generic over the cases' label fields. x axis: "B", else "R", else the
numeric field with the most values; panels: the remaining numeric field with the most
values; every other field is fixed at its most common value. `BenchSuite.extra["plot"]`
may set {"x": field, "panel": field or None, "fixed": {field: value}}. The plotted cases
run first, so a time cap (`--max-seconds`) cuts table rows, not the plot.

Input sets for the L2 rotation are device copies of the case's first `make` (its values
do not matter to the timing, only its addresses), unless a copy would change a layout
(strided views, shared storage) or `BenchSuite.extra["clone_states"]` is False: then
`make` is called once per set.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

HEADLINE_START = "<!-- bench:headline:start -->"
HEADLINE_END = "<!-- bench:headline:end -->"
REPEAT = "ours (repeat)"
HEURISTIC = "ours (heuristic config)"
CURVE_SIDES = tuple(1 << k for k in range(14, 31))   # the copy curve: 16 KiB .. 1 GiB a side
COPY_BYTES = CURVE_SIDES[-1]  # the ceiling: the curve's largest copy (1 GiB a side)
HOST_COPY_BYTES = 1 << 24     # (the CPU functional check's stand-in)
RESERVE_S = 20.0              # kept back from --max-seconds for writing the reports


# ---------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autotune bench",
        description="Benchmark every recipe on this GPU and write results/<gpu>/BENCH.md.")
    p.add_argument("--recipe", action="append", default=[], metavar="NAME",
                   help="only this benchmark suite (repeatable; default: all)")
    p.add_argument("--preset", choices=("full", "quick", "smoke"), default=None,
                   help="case set: full (default on a GPU), quick, smoke")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output folder (default results/<gpu-slug>; without a GPU nothing "
                        "is written unless --out is given)")
    p.add_argument("--max-seconds", type=float, default=None, metavar="S",
                   help="stop starting new cases after S seconds (the reports still get "
                        "written; each suite gets a fair share)")
    p.add_argument("--reps", type=int, default=30, help="timed replays per measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overhead", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure eager per-call overhead (default on a GPU)")
    p.add_argument("--overhead-only", action="store_true",
                   help="measure only the per-call overhead")
    p.add_argument("--render", default=None, metavar="DIR",
                   help="rebuild the reports of DIR from its JSON files (no GPU needed)")
    p.add_argument("--readme", default=None, metavar="PATH",
                   help="replace the block between the bench:headline markers of PATH "
                        "with the headline table and one plot")
    p.add_argument("--package", default="recipes", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.render:
        out = Path(args.render)
        render(out)
        if args.readme:
            update_readme(Path(args.readme), out)
        print(f"bench: rendered {out}")
        return 0

    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")     # before the recipes import
    from autotune.registry import benches, load_recipes

    load_recipes(args.package)
    suites = benches()
    wanted = [x for r in args.recipe for x in r.split(",") if x]   # repeat or a,b
    if wanted:
        unknown = [r for r in wanted if r not in suites]
        if unknown:
            print(f"bench: unknown suite(s) {unknown}; registered: {sorted(suites)}",
                  file=sys.stderr)
            return 2
        suites = {n: suites[n] for n in wanted}

    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
        preset = args.preset or "full"
        from recipes.tables import gpu_slug

        out = Path(args.out) if args.out else _results_root() / gpu_slug(device)
        if preset != "full" and not args.out:     # never over the committed full results
            out = out / f"bench-{preset}"
    else:
        device = torch.device("cpu")
        print("bench: benchmarks need a GPU (none visible). Running the smoke preset under "
              "the Triton interpreter as a functional check: its times are host wall-clock "
              "times of the interpreter, not a benchmark"
              + ("." if args.out else "; nothing is written (no --out)."))
        preset = "smoke"
        out = Path(args.out) if args.out else None
    command = "python -m autotune bench" + ("" if not argv else " " + " ".join(argv))
    started = time.perf_counter()
    header = run_header(device, preset, command)
    header["suites"] = list(suites)
    old = _read(out / "BENCH.json") if (wanted and out is not None) else None
    if old and old.get("gpu") == header.get("gpu") and old.get("preset") == preset:
        # some suites again: the others' results stay, and the page says which run made
        # each suite (the header describes this run)
        header["suites"] = list(old.get("suites") or []) + [
            n for n in suites if n not in (old.get("suites") or [])]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    if args.overhead and (cuda or args.overhead_only) and out is not None:
        ov = measure_overhead(suites, device, calls=200 if cuda else 3)
        ov["header"] = header
        if wanted:                     # some suites again: the others' rows stay
            ov = merge_overhead(_read(out / "overhead.json"), ov)
        write_json(out / "overhead.json", ov)
        print(f"bench: overhead measured in {time.perf_counter() - started:.1f} s")
    if not args.overhead_only:
        if cuda:
            header["copy_curve"] = copy_curve(device)
            moved, us = header["copy_curve"][-1]
            header["copy_bandwidth_Bps"] = moved / (us * 1e-6)
        else:
            header["copy_bandwidth_Bps"] = host_copy_bandwidth()
        header["copy_bytes"] = COPY_BYTES if cuda else HOST_COPY_BYTES
        print(f"bench: copy bandwidth {header['copy_bandwidth_Bps'] / 1e12:.3f} TB/s "
              f"({'device' if cuda else 'host'} copy of {header['copy_bytes'] >> 20} MiB)")
        results = run_suites(suites, preset, device, header, args, started)
        header["seconds"] = round(time.perf_counter() - started, 1)
        if out is not None:
            write_json(out / "BENCH.json", header)
            for res in results:
                write_json(out / f"bench-{res['suite']}.json", res)
        for res in results:
            print(f"bench: {res['suite']}: {len(res['cases'])} cases, {res['seconds']} s"
                  + ("" if res["complete"] else " (cut by --max-seconds)"))
    if out is not None:
        try:
            render(out)
            if args.readme:
                update_readme(Path(args.readme), out)
            print(f"bench: wrote {out}/" + ("OVERHEAD.md" if args.overhead_only
                                           else "BENCH.md"))
        except Exception as exc:  # noqa: BLE001 - the JSON is written: render elsewhere
            print(f"bench: the JSON results are in {out}, but rendering failed "
                  f"({_err(exc)}); run `python -m autotune bench --render {out}` where "
                  "tabulate and matplotlib are installed", file=sys.stderr)
    print(f"bench: total {time.perf_counter() - started:.1f} s")
    return 0


def _results_root() -> Path:
    from recipes.tables import results_root

    return results_root()


# ---------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------
def run_header(device, preset: str, command: str) -> dict:
    import torch
    import triton

    h = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "preset": preset, "command": command, "torch": torch.__version__,
         "triton": triton.__version__, "cuda": torch.version.cuda,
         "python": platform.python_version(), "device_type": device.type}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        h.update(gpu=torch.cuda.get_device_name(device), sm_count=p.multi_processor_count,
                 l2_bytes=int(getattr(p, "L2_cache_size", 0)),
                 memory_bytes=int(p.total_memory))
    else:
        h.update(gpu="CPU (Triton interpreter): functional check, not a benchmark",
                 sm_count=None)
    return h


def host_copy_bandwidth() -> float:
    """Bytes per second (read + write / time) of a host copy: the CPU functional check's
    stand-in for the device ceiling."""
    import torch

    from autotune.timing import time_wall

    src = torch.empty(HOST_COPY_BYTES, dtype=torch.uint8)
    dst = torch.empty_like(src)
    t = time_wall(lambda s: s[1].copy_(s[0]), [(src, dst)], reps=3)
    return 2 * HOST_COPY_BYTES / (t.p50 * 1e-6)


def copy_curve(device) -> list:
    """[[bytes moved (read + written), median us], ...] of a copy kernel in CUDA graphs,
    one point per size of CURVE_SIDES, inputs rotated past twice the L2 as the cases'
    are. Its last point (1 GiB a side) is the run's bandwidth ceiling. A copy *kernel*
    (`torch.neg`): a graph-captured `copy_` becomes a memcpy node, which the H200 ran at
    2.72 TB/s against 4.24 TB/s for an elementwise kernel (results/h200/NOTES.md)."""
    import torch

    from autotune.timing import rotation, time_graph

    pts = []
    for side in CURVE_SIDES:
        n = side // 4
        sets = [(torch.empty(n, dtype=torch.float32, device=device),
                 torch.empty(n, dtype=torch.float32, device=device))
                for _ in range(rotation(2 * side, device))]
        for a, _ in sets:
            a.uniform_()
        t = time_graph(lambda s: torch.neg(s[0], out=s[1]), sets, reps=20, device=device)
        pts.append([2 * side, round(t.p50, 4)])
        del sets
    torch.cuda.empty_cache()
    return pts


def copy_time_at(curve, nbytes: float):
    """A copy's time (us) for `nbytes` moved, interpolated log-log on the curve; beyond
    its ends, the end point's time (below) or bandwidth (above). None without a curve."""
    if not curve or not nbytes or nbytes <= 0:
        return None
    pts = sorted((float(b), float(t)) for b, t in curve if b > 0 and t > 0)
    if not pts:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        return pts[-1][1] * nbytes / pts[-1][0]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if b0 <= nbytes <= b1:
            f = math.log(nbytes / b0) / math.log(b1 / b0)
            return math.exp(math.log(t0) + f * math.log(t1 / t0))
    return None


def _timing_dict(t) -> dict:
    return {"p20": round(t.p20, 4), "p50": round(t.p50, 4), "p80": round(t.p80, 4),
            "samples": len(t.samples)}


def _calls_for(est_us: float, n_states: int, target_us: float = 300.0) -> int:
    """Calls per replay: enough for ~target_us of work but at most 20, and never fewer
    than the input sets (each set is called once a replay)."""
    return max(n_states, min(20, math.ceil(target_us / max(est_us, 0.5))))


def time_variant(v, states, device, reps: int, est_us: float) -> dict:
    """One variant's timing: graph replays, eager event-timed calls, or (no GPU) the host
    wall clock of the interpreter."""
    from autotune.timing import time_eager, time_graph, time_wall

    n = _calls_for(est_us, len(states))
    if device.type != "cuda":
        t = time_wall(v.fn, states, reps=1, warmup=0)
        mode = "wall"
    elif v.eager:
        t = time_eager(v.fn, states, reps=reps, inner=n, device=device)
        mode = "eager"
    else:
        t = time_graph(v.fn, states, calls_per_replay=n, reps=reps, device=device)
        mode = "graph"
    return {**_timing_dict(t), "mode": mode}


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def tuned_status(fn, state, device) -> tuple[str, list]:
    """Run `fn(state)` once with config tracing on: 'none' (no tuned config was used),
    'same' (every tuned config equals the heuristic's) or 'differs'; plus the traces."""
    from autotune.registry import tunables
    from recipes import tables as dispatch

    with dispatch.trace_configs() as trace:
        fn(state)
        _sync(device)
    tuned = [(r, k, c) for r, k, c in trace if c is not None]
    if not tuned:
        return "none", []
    reg = tunables()
    rows = []
    differs = False
    for recipe, key, cfg in tuned:
        t = reg.get(recipe)
        h = t.heuristic(key, device) if t is not None else None
        same = h is not None and all(cfg.get(p) == h.get(p) for p in t.space)
        differs |= not same
        rows.append({"recipe": recipe, "key": key, "tuned": cfg, "heuristic": h})
    return ("differs" if differs else "same"), rows


class _NoClone(Exception):
    pass


def _clone_state(obj, seen: set):
    """A deep copy of a state's tensors on their device, keeping every tensor's shape,
    strides and dtype; raises _NoClone where a copy would not be the same layout (a
    strided view, an offset, two tensors sharing memory, an unknown container)."""
    import dataclasses

    import torch

    if isinstance(obj, torch.Tensor):
        if obj.numel():
            ptr = obj.untyped_storage().data_ptr()
            if ptr in seen or obj.storage_offset():
                raise _NoClone
            seen.add(ptr)
        c = obj.clone()
        if c.stride() != obj.stride():
            raise _NoClone
        return c
    if obj is None or isinstance(obj, (str, int, float, bool, torch.dtype, torch.device)):
        return obj
    if isinstance(obj, dict):
        return {k: _clone_state(v, seen) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*[_clone_state(v, seen) for v in obj])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_state(v, seen) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: _clone_state(getattr(obj, f.name), seen)
                                           for f in dataclasses.fields(obj) if f.init})
    raise _NoClone


def make_states(case, device, seed: int, n: int, clone: bool = True) -> list:
    """`n` input sets for one case. The first from `case.make`; the others are device
    copies of it when the copy keeps every tensor's layout (the rotation is there to put
    the inputs at other addresses, not to change their values, and making inputs on the
    host is most of a benchmark's time), else more `case.make` calls."""
    first = case.make(device, seed)
    if n <= 1:
        return [first]
    if clone:
        try:
            return [first] + [_clone_state(first, set()) for _ in range(n - 1)]
        except _NoClone:
            pass
    return [first] + [case.make(device, seed + k) for k in range(1, n)]


def plan_order(suite, cases: list) -> list[int]:
    """Run order: the cases the plot shows first (so a time cap keeps the plot whole),
    then the rest, each group in the suite's order."""
    labels = [c.label for c in cases]
    spec = plot_spec(labels, suite.extra)
    shown = [i for i, lab in enumerate(labels) if _in_slice(lab, spec)]
    rest = [i for i in range(len(cases)) if i not in set(shown)]
    return shown + rest


def run_suite(suite, preset: str, device, copy_bw: float, reps: int, seed: int,
              deadline: float | None, log=print, cases: list | None = None) -> dict:
    """Time every case of one suite (until `deadline`, a perf_counter time)."""
    import torch

    from autotune.timing import rotation
    from recipes import tables as dispatch

    t0 = time.perf_counter()
    cases = suite.cases(preset) if cases is None else cases
    res = {"suite": suite.name, "title": suite.title or suite.name, "notes": suite.notes,
           "extra": _jsonable(suite.extra), "preset": preset, "cases": [None] * len(cases),
           "variants": [], "complete": True}
    order = plan_order(suite, cases)
    for done, i in enumerate(order):
        case = cases[i]
        if deadline is not None and time.perf_counter() > deadline:
            res["complete"] = False
            log(f"  [{suite.name}] time cap reached: {len(order) - done} of {len(cases)} "
                "cases not run")
            break
        for name, v in case.variants.items():
            if name not in [x["name"] for x in res["variants"]]:
                res["variants"].append({"name": name, "eager": bool(v.eager),
                                        "peer": bool(v.peer)})
        entry = {"index": i, "label": _jsonable(case.label), "bytes": int(case.bytes),
                 "timings": {}, "errors": {}, "tuned": "none"}
        res["cases"][i] = entry
        est_us = case.bytes / (0.6 * copy_bw) * 1e6 + 2.0 if copy_bw > 0 else 10.0
        states = []
        try:
            n_states = 1 if device.type != "cuda" else rotation(case.bytes, device)
            states = make_states(case, device, seed, n_states,
                                 clone=(suite.extra or {}).get("clone_states", True))
            _sync(device)
            entry["states"] = len(states)
            names = list(case.variants)
            ours = case.variants.get("ours")
            if ours is not None and device.type == "cuda":
                try:
                    entry["tuned"], entry["configs"] = tuned_status(ours.fn, states[0],
                                                                    device)
                except Exception as exc:  # noqa: BLE001
                    entry["errors"]["tuned"] = _err(exc)
            plan = [(n, case.variants[n]) for n in names]
            if ours is not None:
                plan.append((REPEAT, ours))
            for name, v in plan:
                try:
                    if name == REPEAT and device.type != "cuda":
                        continue
                    entry["timings"][name] = time_variant(v, states, device, reps, est_us)
                except Exception as exc:  # noqa: BLE001 - one variant's failure is a cell
                    entry["errors"][name] = _err(exc)
                    _recover(device)
            if entry["tuned"] == "differs":
                try:
                    with dispatch.heuristic_only():
                        entry["timings"][HEURISTIC] = time_variant(ours, states, device,
                                                                   reps, est_us)
                except Exception as exc:  # noqa: BLE001
                    entry["errors"][HEURISTIC] = _err(exc)
                    _recover(device)
        except Exception as exc:  # noqa: BLE001 - a case that cannot be made is a row
            entry["errors"]["make"] = _err(exc)
            _recover(device)
        finally:
            del states
            if device.type == "cuda" and case.bytes > (1 << 30):
                torch.cuda.empty_cache()
        log("  " + _progress_line(suite.name, done + 1, len(cases), entry, t0))
    res["cases"] = [c for c in res["cases"] if c is not None]
    res["seconds"] = round(time.perf_counter() - t0, 1)
    return res


def _progress_line(name, k, n, entry, t0) -> str:
    lab = " ".join(f"{f}={v}" for f, v in entry["label"].items())
    tim = ", ".join(f"{v} {t['p50']:.3g}" for v, t in entry["timings"].items()
                    if v != REPEAT)
    err = f" ERRORS: {sorted(entry['errors'])}" if entry["errors"] else ""
    return (f"[{name} {k}/{n} {time.perf_counter() - t0:6.1f}s] {lab}: {tim} us"
            f"{err}")


def _err(exc: BaseException) -> str:
    msg = f"{type(exc).__name__}: {exc}".strip()
    return msg.splitlines()[0][:300] if msg else type(exc).__name__


def _recover(device) -> None:
    if device.type == "cuda":
        import torch

        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        torch.cuda.empty_cache()


def run_suites(suites: dict, preset: str, device, header: dict, args, started: float,
               log=print) -> list[dict]:
    results = []
    names = list(suites)
    all_cases = {}
    for name in names:
        try:
            all_cases[name] = suites[name].cases(preset)
        except Exception as exc:  # noqa: BLE001 - a suite that cannot list its cases
            log(f"bench: suite {name}: cases({preset!r}) failed: {_err(exc)}")
            all_cases[name] = []
    for k, name in enumerate(names):
        deadline = None
        if args.max_seconds is not None:
            left = args.max_seconds - RESERVE_S - (time.perf_counter() - started)
            if left <= 0:
                log(f"bench: time cap: suite {name} not run")
                results.append({"suite": name, "title": suites[name].title or name,
                                "notes": suites[name].notes, "cases": [], "variants": [],
                                "extra": _jsonable(suites[name].extra), "preset": preset,
                                "complete": False, "seconds": 0.0})
                continue
            # a share of what is left in proportion to the case counts (so time an earlier
            # suite did not use goes to the later ones)
            weights = [max(1, len(all_cases[n])) for n in names[k:]]
            deadline = time.perf_counter() + left * weights[0] / sum(weights)
        log(f"bench: suite {name} ({preset}, {len(all_cases[name])} cases)")
        res = run_suite(suites[name], preset, device, header["copy_bandwidth_Bps"],
                        args.reps, args.seed, deadline, log=log, cases=all_cases[name])
        res["date"], res["command"] = header["date"], header["command"]
        results.append(res)
        log(f"bench: suite {name}: {len(res['cases'])} cases in {res['seconds']} s")
    return results


# ---------------------------------------------------------------------------------------
# eager per-call overhead
# ---------------------------------------------------------------------------------------
class _NoLaunch:
    """Inside: every Triton kernel launch (`kernel[grid](...)`) returns at once, so a call
    times only our Python (validation, config dispatch, workspace)."""

    def __enter__(self):
        from triton.runtime.jit import JITFunction

        self._saved = [(JITFunction, JITFunction.run)]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            self._saved.append((InterpretedFunction, InterpretedFunction.run))
        except Exception:  # noqa: BLE001
            pass
        for cls, _ in self._saved:
            cls.run = _no_run
        return self

    def __exit__(self, *exc):
        for cls, fn in self._saved:
            cls.run = fn
        return False


def _no_run(self, *args, grid=None, warmup=False, **kwargs):
    return None


def host_us_per_call(fn, state, calls: int, *, sync: bool, device, rounds: int = 5) -> float:
    """Median over `rounds` of the host wall time per call of `calls` calls."""
    import torch

    cuda = device.type == "cuda"
    for _ in range(min(10, calls)):
        fn(state)
    if cuda:
        torch.cuda.synchronize(device)
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(state)
            if sync and cuda:
                torch.cuda.synchronize(device)
        out.append((time.perf_counter() - t0) * 1e6 / calls)
        if cuda:
            torch.cuda.synchronize(device)
    return statistics.median(out)


def _bare_launch_us(device, calls: int) -> float:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _noop(x_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x_ptr + i, i, mask=i < n)

    x = torch.zeros(16, dtype=torch.int32, device=device)
    return host_us_per_call(lambda s: _noop[(1,)](s, 16, BLOCK=16), x, calls, sync=False,
                            device=device)


def measure_overhead(suites: dict, device, calls: int = 200, log=print) -> dict:
    """Eager host-side cost per call of each suite's "ours" (and its eager peer) on the
    smoke preset's first case (tiny inputs, so the GPU work is negligible)."""
    rows = []
    for name, suite in suites.items():
        try:
            cases = suite.cases("smoke")
        except Exception as exc:  # noqa: BLE001
            rows.append({"suite": name, "error": _err(exc)})
            continue
        if not cases:
            continue
        case = cases[0]
        row = {"suite": name, "label": _jsonable(case.label)}
        try:
            state = case.make(device, 0)
            ours = case.variants["ours"]
            row["ours_host_us"] = host_us_per_call(ours.fn, state, calls, sync=False,
                                                   device=device)
            row["ours_sync_us"] = host_us_per_call(ours.fn, state, calls, sync=True,
                                                   device=device)
            with _NoLaunch():
                row["ours_python_us"] = host_us_per_call(ours.fn, state, calls, sync=False,
                                                         device=device)
            peer = next((v for v in case.variants.values() if v.peer and v.eager), None)
            if peer is not None:
                row["torch_host_us"] = host_us_per_call(peer.fn, state, calls, sync=False,
                                                        device=device)
                row["torch_sync_us"] = host_us_per_call(peer.fn, state, calls, sync=True,
                                                        device=device)
        except Exception as exc:  # noqa: BLE001
            row["error"] = _err(exc)
        rows.append(row)
        log(f"  overhead {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()
                                              if isinstance(v, float)))
    try:
        bare = _bare_launch_us(device, calls)
    except Exception as exc:  # noqa: BLE001
        bare = None
        log(f"  overhead: bare Triton launch failed: {_err(exc)}")
    return {"rows": rows, "bare_triton_launch_us": bare, "calls": calls}


def merge_overhead(old: dict | None, new: dict) -> dict:
    """The overhead report of a run over some suites, with the rows of the other suites
    kept from `old` (the same GPU only). Every row carries the date of the run that
    measured it; the bare-launch floor is the new run's."""
    date = (new.get("header") or {}).get("date")
    rows = [dict(r, date=r.get("date") or date) for r in new["rows"]]
    oh = (old or {}).get("header") or {}
    if old and oh.get("gpu") == (new.get("header") or {}).get("gpu"):
        mine = {r["suite"] for r in rows}
        rows += [dict(r, date=r.get("date") or oh.get("date")) for r in old.get("rows", [])
                 if r.get("suite") not in mine]
    return {**new, "rows": sorted(rows, key=lambda r: r["suite"])}


# ---------------------------------------------------------------------------------------
# reports
# ---------------------------------------------------------------------------------------
def write_json(path: Path, data) -> None:
    """The reports' JSON, written atomically by the tables' writer."""
    from autotune.tables import write_text_atomic

    write_text_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def plot_spec(labels: list[dict], extra: dict | None = None) -> dict:
    """x field, panel field, fixed values of the other fields (see the module doc)."""
    over = dict((extra or {}).get("plot") or {})
    fields = []
    for lab in labels:
        for f in lab:
            if f not in fields:
                fields.append(f)
    values = {f: [lab.get(f) for lab in labels if f in lab] for f in fields}
    distinct = {f: list(dict.fromkeys(values[f])) for f in fields}
    numeric = [f for f in fields if all(_num(v) for v in distinct[f])]
    x = over.get("x")
    if x is None:
        x = next((f for f in ("B", "R") if f in numeric and len(distinct[f]) > 1), None)
    if x is None and numeric:
        x = max(numeric, key=lambda f: len(distinct[f]))
    if "panel" in over:
        panel = over["panel"]
    else:
        cand = [f for f in numeric if f != x and len(distinct[f]) > 1]
        panel = max(cand, key=lambda f: len(distinct[f])) if cand else None
    fixed = {}
    for f in fields:
        if f in (x, panel):
            continue
        if f in (over.get("fixed") or {}):
            fixed[f] = over["fixed"][f]
        elif len(distinct[f]) > 1:
            fixed[f] = Counter(values[f]).most_common(1)[0][0]
    return {"x": x, "panel": panel, "fixed": fixed}


def _in_slice(label: dict, spec: dict) -> bool:
    return all(label.get(f) == v for f, v in spec["fixed"].items())


def _us(v) -> str:
    if v is None:
        return ""
    if v < 10:
        return f"{v:.2f}"
    if v < 100:
        return f"{v:.1f}"
    return f"{v:.0f}"


def _x(v) -> str:
    return "" if v is None else f"{v:.2f}x"


def _pct(v) -> str:
    return "" if v is None else f"{100 * v:.0f}%"


def _p50(entry: dict, name: str):
    t = entry["timings"].get(name)
    return None if t is None else t["p50"]


def ours_time(entry: dict):
    """Ours: the lower of the two runs' medians (the repeat guards against a slow first
    run); None if ours was not timed."""
    a, b = _p50(entry, "ours"), _p50(entry, REPEAT)
    vals = [v for v in (a, b) if v is not None]
    return min(vals) if vals else None


def noise(entry: dict):
    a, b = _p50(entry, "ours"), _p50(entry, REPEAT)
    if a is None or b is None or min(a, b) <= 0:
        return None
    return abs(a - b) / min(a, b)


def _peers(res: dict) -> tuple[str | None, str | None, list[str]]:
    """(eager peer, graph peer, other variants) of a suite."""
    eager = next((v["name"] for v in res["variants"] if v["peer"] and v["eager"]), None)
    graph = next((v["name"] for v in res["variants"] if v["peer"] and not v["eager"]), None)
    others = [v["name"] for v in res["variants"]
              if v["name"] not in ("ours", eager, graph)]
    return eager, graph, others


def suite_rows(res: dict, copy_bw: float | None, curve=None) -> tuple[list[str], list[list]]:
    """The suite table: label fields, ours, noise, every other variant, speedups over each
    peer, fraction of copy bandwidth, against a same-size copy, tuned vs heuristic."""
    fields = []
    for e in res["cases"]:
        for f in e["label"]:
            if f not in fields:
                fields.append(f)
    eager, graph, others = _peers(res)
    variants = [v for v in (eager, graph) if v] + others
    peers = [v["name"] for v in res["variants"] if v["peer"]]
    head = fields + ["ours us", "noise"] + [f"{v} us" for v in variants] \
        + [f"x vs {p}" for p in peers] + ["copy-BW"] + (["same-size copy"] if curve else []) \
        + ["tuned vs heuristic"]
    rows = []
    for e in res["cases"]:
        o = ours_time(e)
        row = [e["label"].get(f, "") for f in fields]
        row += [_us(o) if o is not None else _cell_err(e, "ours"), _pct(noise(e))]
        row += [_us(_p50(e, v)) if _p50(e, v) is not None else _cell_err(e, v)
                for v in variants]
        row += [_x(_p50(e, p) / o) if o and _p50(e, p) else "" for p in peers]
        bw = e["bytes"] / (o * 1e-6) / copy_bw if o and copy_bw else None
        row.append(_pct(bw))
        if curve:
            row.append(_pct(_vs_copy(e, curve)))
        row.append(_tuned_cell(e, o))
        rows.append(row)
    return head, rows


def _vs_copy(e: dict, curve):
    """A same-size copy's time over ours (1.0: as fast as copying the case's bytes)."""
    o, c = ours_time(e), copy_time_at(curve, e["bytes"])
    return c / o if o and c else None


def _cell_err(e: dict, name: str) -> str:
    if name in e["errors"]:
        return "error"
    if "make" in e["errors"]:
        return "error"
    return ""


def _tuned_cell(e: dict, o) -> str:
    st = e.get("tuned", "none")
    if st == "same":
        return "same config"
    if st == "differs":
        h = _p50(e, HEURISTIC)
        return _x(h / o) if h and o else "differs"
    return ""


def _ratios(res: dict, peer: str | None) -> list[float]:
    out = []
    if peer is None:
        return out
    for e in res["cases"]:
        o, p = ours_time(e), _p50(e, peer)
        if o and p:
            out.append(p / o)
    return out


def _geo(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def headline_rows(results: list[dict], copy_bw: float | None, curve=None):
    head = ["recipe", "cases", "ours us (min-max)", "x vs torch eager: geomean (min-max)",
            "x vs torch graph: geomean (min-max)", "copy-BW: median (max)"] \
        + (["same-size copy: median (max)"] if curve else []) + ["tuned vs heuristic"]
    rows = []
    for res in results:
        eager, graph, _ = _peers(res)
        os_ = [ours_time(e) for e in res["cases"] if ours_time(e)]
        cells = [res["suite"], str(len(res["cases"])) + ("" if res["complete"] else " (cut)")]
        cells.append(f"{_us(min(os_))}-{_us(max(os_))}" if os_ else "")
        for peer in (eager, graph):
            r = _ratios(res, peer)
            cells.append(f"{_x(_geo(r))} ({_x(min(r))}-{_x(max(r))})" if r else "")
        bws = [e["bytes"] / (ours_time(e) * 1e-6) / copy_bw for e in res["cases"]
               if ours_time(e) and copy_bw]
        cells.append(f"{_pct(statistics.median(bws))} ({_pct(max(bws))})" if bws else "")
        if curve:
            vc = [v for v in (_vs_copy(e, curve) for e in res["cases"]) if v]
            cells.append(f"{_pct(statistics.median(vc))} ({_pct(max(vc))})" if vc else "")
        gains = [_p50(e, HEURISTIC) / ours_time(e) for e in res["cases"]
                 if e.get("tuned") == "differs" and _p50(e, HEURISTIC) and ours_time(e)]
        tuned = sum(1 for e in res["cases"] if e.get("tuned") in ("same", "differs"))
        if gains:
            cells.append(f"{_x(_geo(gains))} geomean over {len(gains)} cases "
                         f"({tuned} tuned)")
        elif tuned:
            cells.append(f"same config ({tuned} tuned)")
        else:
            cells.append("no tuned table")
        rows.append(cells)
    return head, rows


def _table(head, rows) -> str:
    """A GitHub markdown table (tabulate's, or a plain one where tabulate is missing)."""
    try:
        from tabulate import tabulate
    except ImportError:
        cells = [[str(c) for c in head]] + [[str(c) for c in r] for r in rows]
        w = [max(len(r[i]) for r in cells) for i in range(len(head))]
        line = ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"
                for r in cells]
        return "\n".join([line[0], "|" + "|".join("-" * (x + 2) for x in w) + "|"]
                         + line[1:])
    return tabulate(rows, headers=head, tablefmt="github", disable_numparse=True)


def _header_md(h: dict) -> str:
    bw = h.get("copy_bandwidth_Bps")
    lines = [
        f"- GPU: **{h.get('gpu')}**" + (f", {h['sm_count']} SMs" if h.get("sm_count") else "")
        + (f", L2 {h['l2_bytes'] >> 20} MiB" if h.get("l2_bytes") else ""),
        f"- torch {h.get('torch')}, triton {h.get('triton')}, CUDA {h.get('cuda')}, "
        f"Python {h.get('python')}",
        f"- date: {h.get('date')}; preset: {h.get('preset')}; "
        f"run time: {h.get('seconds', '?')} s",
        f"- copy bandwidth (the ceiling): {bw / 1e12:.3f} TB/s, measured by a "
        f"{h.get('copy_bytes', COPY_BYTES) >> 20} MiB "
        f"{'device' if h.get('device_type') == 'cuda' else 'host'} copy "
        "(bytes read + written / time)" if bw else
        "- copy bandwidth: not measured",
        f"- copy curve (the same-size copy column): {len(h['copy_curve'])} sizes, "
        f"{h['copy_curve'][0][1]:.2f} us for {h['copy_curve'][0][0] >> 10} KiB moved to "
        f"{h['copy_curve'][-1][1]:.0f} us for {h['copy_curve'][-1][0] >> 30} GiB"
        if h.get("copy_curve") else "- copy curve: not measured",
        f"- command: `{h.get('command')}`",
    ]
    return "\n".join(lines)


METHOD = """\
How to read: times are medians in microseconds per call. "ours" and "torch graph" are
CUDA-graph replays (the way serving engines call these kernels; a graph holds up to 20
calls, more when there are more input sets, over up to 32 rotating input sets: a case
whose sets together exceed twice the L2 is read from DRAM, smaller ones can be served
from L2, and those under L2 / 32 a set, the B=1 cases, are); "torch eager"
is plain back-to-back calls timed with CUDA events (launch gaps included). "ours" is
timed twice (first and last); the table shows the lower median and the difference
between the two as noise. "x vs P" is P's time over ours (above 1: ours is faster).
"copy-BW" is the case's fewest bytes moved / our time / the copy bandwidth above.
"same-size copy" is the time a copy kernel takes to move the case's bytes (the copy
curve, measured in this run from 16 KiB to 1 GiB a side) over ours: small moves cannot
reach the asymptotic bandwidth (launch and ramp), so this is the fair yardstick there.
"tuned vs heuristic": the heuristic config's time over the tuned config's, for the cases
where this GPU's tuned table picks a different config ("same config": it picks the
heuristic's; empty: no tuned table)."""


def render(out: Path) -> None:
    """Write BENCH.md, bench-<suite>.md/.png and OVERHEAD.md from the JSON in `out`."""
    header = _read(out / "BENCH.json") or {}
    results = [r for r in (_read(p) for p in sorted(out.glob("bench-*.json"))) if r]
    order = header.get("suites")
    if order:
        results.sort(key=lambda r: order.index(r["suite"]) if r["suite"] in order else 99)
    copy_bw = header.get("copy_bandwidth_Bps")
    curve = header.get("copy_curve")
    parts = [f"# spec-cookbook benchmarks: {header.get('gpu', out.name)}", "",
             _header_md(header), "", METHOD, ""]
    if results:
        parts += ["## Headline", "", _table(*headline_rows(results, copy_bw, curve)), ""]
    for res in results:
        head, rows = suite_rows(res, copy_bw, curve)
        md = [f"## {res['title']}", ""]
        if res.get("date") and res.get("date") != header.get("date"):
            md += [f"*Measured by an earlier run: {res['date']}, `{res.get('command')}` "
                   "(its copy ceiling and curve were measured again by this page's run "
                   "on the same GPU).*", ""]
        if res.get("notes"):
            md += [res["notes"], ""]
        if not res["complete"]:
            md += ["*Stopped by the time cap: some cases were not run.*", ""]
        png = out / f"bench-{res['suite']}.png"
        try:
            if plot_suite(res, copy_bw, png, curve):
                md += [f"![{res['suite']}](bench-{res['suite']}.png)", ""]
        except ImportError as exc:
            md += [f"*(no plot: {_err(exc)}; re-render with matplotlib installed)*", ""]
        except Exception as exc:  # noqa: BLE001 - a plot failure leaves the tables
            md += [f"*(plot failed: {_err(exc)})*", ""]
        errors = [(e["label"], k, v) for e in res["cases"] for k, v in e["errors"].items()]
        table = _table(head, rows) if rows else "*(no cases)*"
        (out / f"bench-{res['suite']}.md").write_text("\n".join(md + [table, ""]
                                                               + _error_md(errors)) + "\n")
        parts += md + ["<details><summary>All cases "
                       f"({len(rows)})</summary>", "", table, "", "</details>", ""]
        parts += _error_md(errors)
    ov = _read(out / "overhead.json")
    if ov:
        text = overhead_md(ov)
        (out / "OVERHEAD.md").write_text(text)
        parts += ["## Eager call overhead", "", "See [OVERHEAD.md](OVERHEAD.md).", ""]
    if header or results:              # (an --overhead-only run has no BENCH.md of its own)
        (out / "BENCH.md").write_text("\n".join(parts).rstrip() + "\n")


def _error_md(errors) -> list[str]:
    if not errors:
        return []
    lines = ["Errors:", ""]
    for label, k, v in errors[:50]:
        lines.append(f"- {label} {k}: `{v}`")
    return lines + [""]


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def overhead_md(ov: dict) -> str:
    h = ov.get("header") or {}
    head = ["recipe", "case", "ours: host us/call", "of which our Python",
            "Triton launch + rest", "ours + sync us", "torch eager: host us/call",
            "torch eager + sync us"]
    dated = len({r.get("date") for r in ov["rows"]}) > 1     # rows from several runs
    if dated:
        head.append("measured")
    rows = []
    for r in ov["rows"]:
        if "error" in r and "ours_host_us" not in r:
            rows.append([r["suite"], "", "error: " + r["error"]] + [""] * 5
                        + ([r.get("date")] if dated else []))
            continue
        lab = " ".join(f"{k}={v}" for k, v in (r.get("label") or {}).items())
        rest = r["ours_host_us"] - r["ours_python_us"]
        rows.append([r["suite"], lab, _us(r["ours_host_us"]), _us(r["ours_python_us"]),
                     _us(rest), _us(r["ours_sync_us"]), _us(r.get("torch_host_us")),
                     _us(r.get("torch_sync_us"))] + ([r.get("date")] if dated else []))
    bare = ov.get("bare_triton_launch_us")
    gpu = h.get("gpu", "?")
    text = [f"# Eager call overhead: {gpu}", "",
            f"torch {h.get('torch')}, triton {h.get('triton')}, {h.get('date')}.", "",
            "Host wall time per call of each recipe's public function on the smoke "
            f"preset's tiny inputs ({ov.get('calls')} calls, median of 5 rounds), with "
            "`out=` buffers given (no allocation). \"host us/call\": back-to-back calls "
            "without synchronising (the Python + launch cost an eager engine pays per "
            "call; the GPU work is shorter, so this is what bounds eager throughput). "
            "\"of which our Python\": the same calls with every Triton launch turned into "
            "a no-op (validation, config dispatch, workspace). \"Triton launch + rest\": "
            "the difference (Triton's launcher: argument binding, specialisation key, "
            "driver launch). \"+ sync\": a device synchronisation after every call "
            "(latency of one call end to end). Under a CUDA graph none of this is paid.",
            "", _table(head, rows), ""]
    if bare is not None:
        text += [f"A bare Triton launch (a one-store kernel with three arguments) costs "
                 f"{_us(bare)} us of host time per call on this machine: the floor of "
                 "any Triton launcher.", ""]
    if h.get("device_type") == "cpu":
        text += ["*Measured under the Triton interpreter on a CPU: meaningless as "
                 "numbers, written only as a functional check.*", ""]
    return "\n".join(text)


# --- plots ------------------------------------------------------------------------------
_STYLE = {"ours": dict(color="#d62728", lw=2.2, marker="o", ms=4, zorder=5)}
_PEER_STYLES = [dict(color="#1f77b4", ls="--", marker="s", ms=3),
                dict(color="#2ca02c", ls=":", marker="^", ms=3),
                dict(color="#9467bd", ls="-.", marker="v", ms=3),
                dict(color="#8c564b", ls="--", marker="d", ms=3)]


def plot_suite(res: dict, copy_bw: float | None, path: Path, curve=None) -> bool:
    """Write the suite's PNG; False when there is nothing to plot."""
    cases = [e for e in res["cases"] if e["timings"]]
    if not cases:
        return False
    spec = plot_spec([e["label"] for e in res["cases"]], res.get("extra"))
    x, panel = spec["x"], spec["panel"]
    sel = [e for e in cases if _in_slice(e["label"], spec) and x in e["label"]]
    if not sel:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(e["label"].get(panel) for e in sel)) if panel else [None]
    if panel and all(_num(p) for p in panels):
        panels.sort()
    ncol = min(3, len(panels))
    nrow = math.ceil(len(panels) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.6 * ncol, 3.6 * nrow), squeeze=False)
    eager, graph, others = _peers(res)
    lines = ["ours"] + [v for v in (eager, graph) if v] + others
    styles = {"ours": _STYLE["ours"]}
    for k, name in enumerate(lines[1:]):
        styles[name] = _PEER_STYLES[k % len(_PEER_STYLES)]
    for k, pv in enumerate(panels):
        ax = axes[k // ncol][k % ncol]
        pts = sorted((e for e in sel if panel is None or e["label"].get(panel) == pv),
                     key=lambda e: e["label"][x])
        xs = [e["label"][x] for e in pts]
        measured = []
        for name in lines:
            ys = [ours_time(e) if name == "ours" else _p50(e, name) for e in pts]
            xy = [(a, b) for a, b in zip(xs, ys, strict=False) if b]
            if xy:
                ax.plot(*zip(*xy, strict=False), label=name, **styles[name])
                measured += [b for _, b in xy]
        if copy_bw:
            fl = [(e["label"][x], e["bytes"] / copy_bw * 1e6) for e in pts]
            ax.plot(*zip(*fl, strict=False), color="0.45", ls=(0, (1, 1)), lw=1.2,
                    label="bandwidth floor")
        if curve:
            cp = [(e["label"][x], copy_time_at(curve, e["bytes"])) for e in pts]
            ax.plot(*zip(*cp, strict=False), color="0.3", ls="--", lw=1.0,
                    label="copy of the same bytes")
        if xs and all(_num(v) and v > 0 for v in xs):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(set(xs)))
            ax.set_xticklabels([str(v) for v in sorted(set(xs))], fontsize=7)
        ax.set_yscale("log")
        if measured:       # the floor may go far below: keep the measured lines readable
            ax.set_ylim(bottom=min(measured) / 4, top=max(measured) * 1.6)
        ax.set_xlabel(x)
        ax.set_ylabel("us per call")
        ax.grid(True, which="both", alpha=0.25)
        ax.set_title(f"{panel} = {pv}" if panel else res["title"], fontsize=10)
        if k == 0:
            ax.legend(fontsize=7)
    for k in range(len(panels), nrow * ncol):
        axes[k // ncol][k % ncol].axis("off")
    fixed = ", ".join(f"{f}={v}" for f, v in spec["fixed"].items())
    fig.suptitle(res["title"] + (f" ({fixed})" if fixed else ""), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# --- README -----------------------------------------------------------------------------
def update_readme(readme: Path, out: Path, plot_suite_name: str | None = None) -> bool:
    """Replace the text between the headline markers of `readme` with the headline table
    and one plot of `out`; False (and nothing written) when the markers are missing."""
    header = _read(out / "BENCH.json") or {}
    results = [r for r in (_read(p) for p in sorted(out.glob("bench-*.json"))) if r]
    if not readme.exists() or not results:
        return False
    text = readme.read_text()
    a, b = text.find(HEADLINE_START), text.find(HEADLINE_END)
    if a < 0 or b < a:
        print(f"bench: {readme} has no {HEADLINE_START} ... {HEADLINE_END} block; "
              "not updated", file=sys.stderr)
        return False
    names = [r["suite"] for r in results]
    pick = plot_suite_name or ("chain_verify" if "chain_verify" in names else names[0])
    rel = os.path.relpath(out, readme.resolve().parent)
    bw = header.get("copy_bandwidth_Bps")
    block = [HEADLINE_START, "",
             f"{header.get('gpu', out.name)}, torch {header.get('torch')}, triton "
             f"{header.get('triton')}, {header.get('date')}"
             + (f"; copy bandwidth {bw / 1e12:.2f} TB/s" if bw else "")
             + f". Full tables: [{rel}/BENCH.md]({rel}/BENCH.md).", "",
             _table(*headline_rows(results, bw, header.get("copy_curve"))), "",
             f"![{pick}]({rel}/bench-{pick}.png)", "", HEADLINE_END]
    readme.write_text(text[:a] + "\n".join(block) + text[b + len(HEADLINE_END):])
    return True


if __name__ == "__main__":
    sys.exit(main())
