"""`python tools/tune_costs.py`: what measuring one config costs the tuner, piece by
piece, outside a tune (no compile pool beside it), on a few default keys of this GPU.

For each key: the Measurer's set-up, then over its first `--configs` configs in the
tune's order (compiled and loaded first, outside the clock) the median milliseconds of
the check on both input sets and of its parts, of a search timing (`search_reps`
replays) and one of 10, and of the timing's host pieces (the warm-up run before the
capture and the capture itself). Then, in the same process, the first call of configs
of another key whose binaries Triton's disk cache holds (run once before, e.g. by a
tune): a binary's load. `--launchers`: instead, probe every default key's grid (nothing
compiled or launched) and count the binaries and the distinct launcher signatures
(Triton builds one C launcher per signature at its first load). Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, not tools/, first

import torch

from autotune import timing
from autotune.tune.compile import probe
from autotune.tune.measure import Measurer, clone, poison_allocator
from autotune.tune.options import Options, resolve
from autotune.tune.plan import plan, select_tunables

KEYS = {"chain_verify": "B=1,K=3,V=151936,dtype=bfloat16,mode=greedy",
        "draft_tail": "B=8,H=4096,V=151936,dtype=bfloat16",
        "argmax": "R=32,V=151936,dtype=bfloat16"}


def _ms(fn, cfgs) -> str:
    ts = []
    for c in cfgs:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(c)
        torch.cuda.synchronize()
        ts.append(1e3 * (time.perf_counter() - t0))
    return f"median {statistics.median(ts):7.2f} ms  (min {min(ts):.2f}, max {max(ts):.2f})"


def pieces(job, dev, n: int) -> None:
    t, cfgs = job.tunable, job.order[:n]
    t0 = time.perf_counter()
    m = Measurer(t, job.key, dev, search_reps=20, final_reps=25)
    print(f"\n== {job.label}: {len(m.states)} input sets; Measurer "
          f"{1e3 * (time.perf_counter() - t0):.1f} ms")
    t0 = time.perf_counter()
    for c in cfgs:
        t.run(clone(m.pristine[0]), c)
    torch.cuda.synchronize()
    print(f"compile and load {len(cfgs)} configs: {time.perf_counter() - t0:.1f} s")
    m.pace(3.0)
    states = m.states
    calls = max(len(states), m.calls or 20)
    rows = [
        ("check (both sets)", lambda c: m.check(c)),
        ("  poison, copy, run (one set)",
         lambda c: (poison_allocator(m.refs[0]), t.run(clone(m.pristine[0]), c))),
        ("  copy only", lambda c: clone(m.pristine[0])),
        ("  compare only", lambda c: t.equal(m.refs[0], m.refs[0])),
        ("timing (search reps)", lambda c: m.time(c, m.search_reps)),
        ("timing (10 reps)", lambda c: m.time(c, 10)),
        ("warm-up run of the sets", lambda c: timing.prime(
            [lambda s=s: t.run(s, c) for s in timing.one_per_signature(states)], dev)),
        ("capture of the calls", lambda c: timing.capture(
            [lambda s=s: t.run(s, c) for s in (states * calls)[:calls]], dev)),
    ]
    for name, fn in rows:
        print(f"  {name:34s} {_ms(fn, cfgs)}")


def loads(job, dev, n: int) -> None:
    x = job.tunable.make_inputs(job.key, dev, 0)
    first, second = [], []
    for c in job.order[:n]:
        for out in (first, second):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            job.tunable.run(clone(x), c)
            torch.cuda.synchronize()
            out.append(1e3 * (time.perf_counter() - t0))
    print(f"\n== {job.label}: first call of {n} configs (a binary's load from the disk "
          f"cache): median {statistics.median(first):.1f} ms, max {max(first):.1f}; "
          f"second call median {statistics.median(second):.2f} ms")


def launchers(jobs, dev) -> None:
    binaries: dict = {}
    for j in jobs:
        binaries.update(probe(j.tunable.run, j.tunable.make_inputs(j.key, dev, 0), j.grid)[1])
    sigs = {json.dumps(list(json.loads(b.spec)["signature"].values())) for b in
            binaries.values()}
    print(f"{len(jobs)} keys: {len(binaries)} distinct binaries, {len(sigs)} distinct "
          "launcher signatures")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python tools/tune_costs.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", type=int, default=24, help="configs a key (default 24)")
    ap.add_argument("--load-key", default="B=64,K=3,V=151936,dtype=float32,mode=greedy",
                    help="chain_verify key whose binaries the disk cache holds")
    ap.add_argument("--launchers", action="store_true",
                    help="count the default grids' binaries and launcher signatures")
    a = ap.parse_args(argv)
    dev = torch.device("cuda")
    if a.launchers:
        opts = resolve(Options(), dev)
        return launchers(plan(opts, "costs", dev, select_tunables(opts)), dev)
    opts = resolve(Options(recipes=sorted(KEYS)), dev)
    jobs = plan(opts, "costs", dev, select_tunables(opts))
    for j in jobs:
        if KEYS.get(j.tunable.name) == j.kstr:
            pieces(j, dev, a.configs)
    for j in jobs:
        if j.tunable.name == "chain_verify" and j.kstr == a.load_key:
            loads(j, dev, 2 * a.configs)


if __name__ == "__main__":
    main()
