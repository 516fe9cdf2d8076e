"""`--workers N`: N processes (spawned), worker i on GPU i mod the GPU count, each with its
own compile pool (the host's cores shared out) and the keys i, i + N, ... of the plan.
They share the study store; each measures and finalises its keys and hands the entries
to the parent, which writes the tables (every entry's no_slower_at from the store's
measurements of all keys) and the report. Each worker plans its coverage against the
same budget, counted from the parent's start."""
from __future__ import annotations

import queue as _queue
import sys
import time
import traceback

import torch


def tune_workers(opts, device, slug, out_dir, jobs, phases, fresh: bool) -> dict:
    import multiprocessing as mp

    from ..views import coverage_text
    from .run import Progress, Run
    from .store import Store

    progress = Progress(0, False)
    # the parent claims the store for its workers before they start
    store = Store(opts.storage, out_dir, slug, claim=True, say=progress.write)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    n = opts.workers
    procs = [ctx.Process(target=_worker_main, args=(opts, i, n, q), daemon=False)
             for i in range(n)]
    for p in procs:
        p.start()
    run = Run(opts, device, slug, out_dir, jobs, phases, fresh)
    progress.write(f"autotune: {len(jobs)} keys over {n} workers; store {store.where}; "
                   f"budget {opts.budget_s or 'none'} s")
    extra: dict = {"workers": {}}
    try:
        while any(p.is_alive() for p in procs) or not q.empty():
            try:
                msg = q.get(timeout=1.0)
            except _queue.Empty:
                continue
            if msg[0] == "key":
                _, idx, entry, counts, planned, seconds, line = msg
                j = jobs[idx]
                run.finished(j, entry, store.results(j.study), counts, planned, seconds)
                progress.write(line)
                run.report(complete=False, extra=extra, force=False)
            elif msg[0] == "done":
                extra["workers"][str(msg[1])] = msg[2]
    finally:
        for p in procs:
            p.join()
        try:
            run.save()
        finally:
            store.release()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        progress.write(f"autotune: {len(bad)} worker(s) exited with an error (codes {bad}); "
                       "the tables hold the keys they finished")
    where = run.report(complete=not bad, extra=extra)
    elapsed = time.monotonic() - opts.started
    cover = coverage_text(run.rows)
    progress.write(f"autotune: wrote {len(run.tables)} table(s) under {out_dir / slug} for "
                   f"{len(jobs)} keys in {elapsed:.1f} s"
                   + (f" ({cover})" if cover else "") + f"; report {where}")
    return {"slug": slug, "tables": run.tables, "keys": len(jobs),
            "elapsed_s": round(elapsed, 1), "report": where,
            "interpreter": device.type != "cuda"}


def _worker_main(opts, index: int, n: int, q) -> None:
    """One worker: pin a GPU, plan as the parent did, measure and finalise every n-th
    key, send each entry to the parent."""
    try:
        if torch.cuda.is_available():
            torch.cuda.set_device(index % torch.cuda.device_count())
        from .device import select_device
        device = select_device()
        from recipes._configs import gpu_slug

        from .budget import Coverage
        from .options import resolve, results_dir
        from .phases import Phases
        from .plan import plan
        from .run import Progress, Session, attach_previous, say_key, worker_id
        from .write import finalize

        opts = resolve(opts, device)
        slug = gpu_slug(device)
        phases = Phases()
        jobs = plan(opts, slug, device)
        attach_previous(jobs, results_dir(opts), slug, device, opts.seed)
        mine = list(range(index, len(jobs), n))
        lines: list = []
        progress = Progress(0, False)
        progress.write = lines.append
        session = Session(opts, device, slug, phases, progress, worker_id(index),
                          claim=False)
        cov = Coverage(opts.budget_s, opts.started, session.model, cap=opts.trials,
                       exhaustive=opts.exhaustive)
        try:
            todo = [jobs[i] for i in mine]
            session.prepare(todo)
            session.plan_coverage(cov, todo)
            for k, i in enumerate(mine):
                j = jobs[i]
                k0 = time.monotonic()
                limit = cov.limit(len(j.grid))
                ks, m, cfg_s, wait_s = session.measure(j, limit)
                entry = finalize(j, m, ks.results, top=opts.top, planned=limit,
                                 log=lines.append)
                seconds = time.monotonic() - k0
                session.model.observe_key(max(0.0, seconds - cfg_s - wait_s))
                say_key(progress, j, entry, ks, m, limit, seconds)
                q.put(("key", i, entry, ks.counts(), limit, seconds, "\n".join(lines)))
                lines.clear()
                if k + 1 < len(mine):
                    session.plan_coverage(cov, todo[k + 1:])
        finally:
            session.close()
        q.put(("done", index, {"phases": phases.report(time.monotonic() - opts.started),
                               "compile": session.compile_report(),
                               "coverage": cov.history}))
    except Exception:
        traceback.print_exc()
        sys.exit(1)
