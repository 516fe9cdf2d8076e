"""Eager per-call overhead: the host time one call of each recipe costs outside a graph.

`measure_overhead` times each suite's "ours" (and its eager peer) on the smoke preset's
first case (tiny inputs, so the GPU work is negligible): back-to-back calls without
synchronising, the same with every Triton launch turned into a no-op (`NoLaunch`: our
Python alone), and with a synchronisation after every call. `merge_overhead` keeps the
rows of the suites a partial run did not measure. The markdown is `report.overhead_md`.
"""
from __future__ import annotations

import statistics
import time

from .results import error_text, jsonable


class NoLaunch:
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
            rows.append({"suite": name, "error": error_text(exc)})
            continue
        if not cases:
            continue
        case = cases[0]
        row = {"suite": name, "label": jsonable(case.label)}
        try:
            state = case.make(device, 0)
            ours = case.variants["ours"]
            row["ours_host_us"] = host_us_per_call(ours.fn, state, calls, sync=False,
                                                   device=device)
            row["ours_sync_us"] = host_us_per_call(ours.fn, state, calls, sync=True,
                                                   device=device)
            with NoLaunch():
                row["ours_python_us"] = host_us_per_call(ours.fn, state, calls, sync=False,
                                                         device=device)
            peer = next((v for v in case.variants.values() if v.peer and v.eager), None)
            if peer is not None:
                row["torch_host_us"] = host_us_per_call(peer.fn, state, calls, sync=False,
                                                        device=device)
                row["torch_sync_us"] = host_us_per_call(peer.fn, state, calls, sync=True,
                                                        device=device)
        except Exception as exc:  # noqa: BLE001
            row["error"] = error_text(exc)
        rows.append(row)
        log(f"  overhead {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()
                                              if isinstance(v, float)))
    try:
        bare = _bare_launch_us(device, calls)
    except Exception as exc:  # noqa: BLE001
        bare = None
        log(f"  overhead: bare Triton launch failed: {error_text(exc)}")
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
