"""Measuring: every case of every suite, and the copy curve that is the yardstick.

For each case of a `BenchSuite`: make the inputs (several input sets when one set fits
in L2, so that a pass over them is not served from cache: `timing.rotation`), then time
every variant. Graph variants are timed behind a plain kernel (`timing.time_graph(...,
behind=timing.plain_op(device))`: each call after a one-element torch op in the graph,
time(op + call) - time(op)), the way an engine calls us after its lm_head GEMM. "ours"
is also timed with its calls back to back ("ours (back to back)": there a launch with
programmatic dependent launch overlaps the call before it), and once more at the end
with the primary timing ("ours (repeat)": the two medians give the noise). When this
GPU has a tuned table whose config for the case differs from the heuristic's, "ours" is
timed once more with the heuristic config (`recipes._configs.heuristic_only`). Eager
variants are plain calls timed with events (`timing.time_eager`).

Once per run, a copy kernel is timed at every power-of-two size from 16 KiB to 1 GiB a
side (`copy_curve`, behind the same plain kernel). Its largest copy is the bandwidth
ceiling; each case is also compared with a copy of its own byte count.

Input sets for the L2 rotation are device copies of the case's first `make` (its values
do not matter to the timing, only its addresses), unless a copy would change a layout
(strided views, shared storage) or `BenchSuite.extra["clone_states"]` is False: then
`make` is called once per set.

The plotted cases run first (`plan_order`), so a time cap cuts table rows, not the plot.
"""
from __future__ import annotations

import dataclasses
import math
import time
import traceback

from autotune.provenance import FIELDS

from .results import (
    BACK_TO_BACK,
    HEURISTIC,
    REPEAT,
    error_text,
    in_slice,
    jsonable,
    plot_spec,
)

CURVE_SIDES = tuple(1 << k for k in range(14, 31))   # the copy curve: 16 KiB .. 1 GiB a side
COPY_BYTES = CURVE_SIDES[-1]  # the ceiling: the curve's largest copy (1 GiB a side)
HOST_COPY_BYTES = 1 << 24     # (the CPU functional check's stand-in)
RESERVE_S = 20.0              # kept back from --max-seconds for writing the reports


def run_header(device, preset: str, command: str) -> dict:
    """The run's header (`autotune.provenance.header`) and what the bench adds: the
    preset, the device type and the GPU's size."""
    import torch

    from autotune.provenance import header

    h = {**header(device, command), "preset": preset, "device_type": device.type}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        h.update(sm_count=p.multi_processor_count,
                 l2_bytes=int(getattr(p, "L2_cache_size", 0)),
                 memory_bytes=int(p.total_memory))
    else:
        h.update(sm_count=None)
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
    behind a plain kernel as the cases are, one point per size of CURVE_SIDES, inputs
    rotated past twice the L2 as the cases' are. Its last point (1 GiB a side) is the
    run's bandwidth ceiling. A copy *kernel* (`torch.neg`): a graph-captured `copy_`
    becomes a memcpy node, which the H200 ran at 2.72 TB/s against 4.24 TB/s for an
    elementwise kernel (docs/performance.md)."""
    import torch

    from autotune.timing import plain_op, rotation, time_graph

    op = plain_op(device)
    pts = []
    for side in CURVE_SIDES:
        n = side // 4
        sets = [(torch.empty(n, dtype=torch.float32, device=device),
                 torch.empty(n, dtype=torch.float32, device=device))
                for _ in range(rotation(2 * side, device))]
        for a, _ in sets:
            a.uniform_()
        t = time_graph(lambda s: torch.neg(s[0], out=s[1]), sets, reps=20, device=device,
                       behind=op)
        pts.append([2 * side, round(t.p50, 4)])
        del sets
    torch.cuda.empty_cache()
    return pts


def _timing_dict(t) -> dict:
    d = {"p20": round(t.p20, 4), "p50": round(t.p50, 4), "p80": round(t.p80, 4),
         "samples": len(t.samples)}
    if t.base_us is not None:
        d["base_us"] = round(t.base_us, 4)
    return d


def _calls_for(est_us: float, n_states: int, target_us: float = 300.0) -> int:
    """Calls per replay: enough for ~target_us of work but at most 20, and never fewer
    than the input sets (each set is called once a replay)."""
    return max(n_states, min(20, math.ceil(target_us / max(est_us, 0.5))))


def time_variant(v, states, device, reps: int, est_us: float, behind=None) -> dict:
    """One variant's timing: graph replays (each call after `behind` when given: the
    primary timing), eager event-timed calls, or (no GPU) the host wall clock of the
    interpreter."""
    from autotune.timing import time_eager, time_graph, time_wall

    n = _calls_for(est_us, len(states))
    if device.type != "cuda":
        t = time_wall(v.fn, states, reps=1, warmup=0)
        mode = "wall"
    elif v.eager:
        t = time_eager(v.fn, states, reps=reps, inner=n, device=device)
        mode = "eager"
    else:
        t = time_graph(v.fn, states, calls_per_replay=n, reps=reps, device=device,
                       behind=behind)
        mode = "graph" if behind is None else "behind"
    return {**_timing_dict(t), "mode": mode}


def _sync(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _recover(device) -> None:
    if device.type == "cuda":
        import torch

        try:
            torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001
            traceback.print_exc()
        torch.cuda.empty_cache()


def tuned_status(fn, state, device) -> tuple[str, list]:
    """Run `fn(state)` once with config tracing on: 'none' (no tuned config was used),
    'same' (every tuned config equals the heuristic's) or 'differs'; plus the traces."""
    from autotune.registry import tunables
    from recipes import _configs as dispatch

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
    shown = [i for i, lab in enumerate(labels) if in_slice(lab, spec)]
    rest = [i for i in range(len(cases)) if i not in set(shown)]
    return shown + rest


def suite_result(suite, preset: str, complete: bool = True) -> dict:
    """A suite's result before any case: what the reports need besides the cases."""
    return {"suite": suite.name, "title": suite.title or suite.name, "notes": suite.notes,
            "extra": jsonable(suite.extra), "preset": preset, "cases": [], "variants": [],
            "complete": complete, "seconds": 0.0}


def _time_case(case, entry, states, device, reps: int, est_us: float, behind) -> None:
    """Every variant of one case into `entry` (a failing variant is an error cell)."""
    from recipes import _configs as dispatch

    ours = case.variants.get("ours")
    cuda = device.type == "cuda"
    if ours is not None and cuda:
        try:
            entry["tuned"], entry["configs"] = tuned_status(ours.fn, states[0], device)
        except Exception as exc:  # noqa: BLE001
            entry["errors"]["tuned"] = error_text(exc)
    plan = [(n, v, None if v.back_to_back else behind) for n, v in case.variants.items()]
    if ours is not None and cuda:
        plan += [(BACK_TO_BACK, ours, None), (REPEAT, ours, behind)]
    if entry["tuned"] == "differs":
        plan.append((HEURISTIC, ours, behind))
    for name, v, after in plan:
        try:
            if name == HEURISTIC:
                with dispatch.heuristic_only():
                    t = time_variant(v, states, device, reps, est_us, after)
            else:
                t = time_variant(v, states, device, reps, est_us, after)
            entry["timings"][name] = t
        except Exception as exc:  # noqa: BLE001 - one variant's failure is a cell
            entry["errors"][name] = error_text(exc)
            _recover(device)


def run_suite(suite, preset: str, device, copy_bw: float, reps: int, seed: int,
              deadline: float | None, log=print, cases: list | None = None) -> dict:
    """Time every case of one suite (until `deadline`, a perf_counter time)."""
    import torch

    from autotune.timing import plain_op, rotation

    t0 = time.perf_counter()
    cases = suite.cases(preset) if cases is None else cases
    res = suite_result(suite, preset)
    res["cases"] = [None] * len(cases)
    behind = plain_op(device) if device.type == "cuda" else None
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
        entry = {"index": i, "label": jsonable(case.label), "bytes": int(case.bytes),
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
            _time_case(case, entry, states, device, reps, est_us, behind)
        except Exception as exc:  # noqa: BLE001 - a case that cannot be made is a row
            entry["errors"]["make"] = error_text(exc)
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


def run_suites(suites: dict, preset: str, device, header: dict, *, reps: int, seed: int,
               max_seconds: float | None, started: float, log=print,
               on_result=None) -> list[dict]:
    """Every suite in turn; `on_result(res)` as each one finishes (the caller writes it,
    so a run stopped later keeps the suites done). Under `max_seconds` (counted from
    `started`, a perf_counter time) each suite gets a share of the time left in
    proportion to its case count; a suite the cap leaves no time for is not run and not
    passed to `on_result` (its earlier results stay)."""
    results = []
    names = list(suites)
    all_cases, failed = {}, {}
    for name in names:
        try:
            all_cases[name] = suites[name].cases(preset)
        except Exception as exc:  # noqa: BLE001 - a suite that cannot list its cases
            failed[name] = f"cases({preset!r}) failed: {error_text(exc)}"
            log(f"bench: suite {name}: {failed[name]}")
            all_cases[name] = []
    for k, name in enumerate(names):
        deadline = None
        if max_seconds is not None:
            left = max_seconds - RESERVE_S - (time.perf_counter() - started)
            if left <= 0:
                log(f"bench: time cap: suite {name} not run")
                results.append(suite_result(suites[name], preset, complete=False))
                continue
            # a share of what is left in proportion to the case counts (so time an earlier
            # suite did not use goes to the later ones)
            weights = [max(1, len(all_cases[n])) for n in names[k:]]
            deadline = time.perf_counter() + left * weights[0] / sum(weights)
        log(f"bench: suite {name} ({preset}, {len(all_cases[name])} cases)")
        res = run_suite(suites[name], preset, device, header["copy_bandwidth_Bps"],
                        reps, seed, deadline, log=log, cases=all_cases[name])
        res.update({k: header.get(k) for k in FIELDS})
        if name in failed:
            res["error"] = failed[name]
        results.append(res)
        if on_result is not None:
            on_result(res)
        log(f"bench: suite {name}: {len(res['cases'])} cases in {res['seconds']} s")
    return results
