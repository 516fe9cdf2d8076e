"""`make bench` (`python -m autotune bench`): every registered benchmark suite on this GPU.

Suites are declared per recipe under `autotune/suites/` (`autotune.declare.BenchSuite`);
this package knows none by name. Its modules, by concern:

    cli       the command line (`main`): which suites, where to, time cap, render only
    run       measuring: the copy curve, every case's variants (primary timing: each call
              behind a plain kernel in a CUDA graph; calls back to back as a second
              column), input rotation, tuned-vs-heuristic configs
    overhead  eager per-call host overhead of each recipe
    results   the JSON files and the statistics read from them (ours_time, copy_time_at,
              the plotted slice)
    report    the markdown pages (BENCH.md, bench-<suite>.md, OVERHEAD.md)
    plots     the per-suite PNGs
    readme    the README's headline block

Writes, under `--out` (default `results/<gpu-slug>/`): BENCH.json (the run header),
bench-<suite>.json (raw numbers, written as each suite finishes), BENCH.md,
bench-<suite>.md/.png, overhead.json and OVERHEAD.md.
"""
from .cli import main
from .results import back_to_back_time, copy_time_at, ours_time

__all__ = ["back_to_back_time", "copy_time_at", "main", "ours_time"]
