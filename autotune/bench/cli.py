"""`python -m autotune bench` (`make bench`): the command line.

A run measures the copy curve, then each chosen suite (`--suite`, default all), writing
`bench-<suite>.json` and `BENCH.json` as each suite finishes, so a run stopped by a
time limit keeps the suites it finished, and a run over some suites keeps the others'
results: a full run can be split over several calls (`--suite a,b` then `--suite c,d`;
`--list` prints the suites and their case counts). `--budget-s` shares a time cap
over the suites. At the end it renders the pages (`report.render`) and, with
`--readme`, the README block. `--render DIR` rebuilds the pages from the JSON without a
GPU. Without a GPU a run is a functional check only: the smoke preset under the Triton
interpreter, nothing written unless `--out` or `--results` is given.

Option names are the tuner's where the concept is one (`autotune.cli`): --results DIR
(the results root), --budget-s, --preset; `--max-seconds` is the earlier spelling of
`--budget-s` and `--recipe` of `--suite` (suites are named by `--list`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from autotune.provenance import command_line

from . import overhead, run
from .readme import update_readme
from .report import render
from .results import error_text, read_json, write_json


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autotune bench",
        description="Benchmark every recipe on this GPU and write results/<gpu>/BENCH.md.")
    p.add_argument("--suite", dest="suite", action="append", default=[], metavar="NAME",
                   help="only this benchmark suite (repeat or comma-separate; default: all; "
                        "--list names them)")
    p.add_argument("--recipe", dest="suite", action="append", help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true",
                   help="print the suites and their case counts for the preset, and exit")
    p.add_argument("--preset", choices=("full", "quick", "smoke"), default=None,
                   help="case set: full (default on a GPU), quick, smoke")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="results root, as the tuner's: the output folder is DIR/<gpu-slug> "
                        "(default: the repository's results/)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="the output folder itself (default <results>/<gpu-slug>; without a "
                        "GPU nothing is written unless --out or --results is given)")
    p.add_argument("--budget-s", type=float, default=None, metavar="S",
                   help="stop starting new cases after S seconds (the reports still get "
                        "written; each suite gets a fair share; 0: none, as the tuner's)")
    # the earlier spelling, whose 0 starts no case
    p.add_argument("--max-seconds", type=float, help=argparse.SUPPRESS)
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


def _cap(args) -> float | None:
    """The time cap in seconds: --budget-s (0: none), else --max-seconds."""
    if args.budget_s is not None:
        return args.budget_s or None
    return args.max_seconds


def _results_root(args) -> Path:
    if args.results:
        return Path(args.results)
    from recipes._configs import results_root

    return results_root()


def _pick_suites(args):
    """(suites to run, names asked for) or None after printing the unknown names."""
    from autotune.registry import benches, load_recipes

    load_recipes(args.package)
    suites = benches()
    wanted = [x for r in args.suite for x in r.split(",") if x]   # repeat or a,b
    if wanted:
        unknown = [r for r in wanted if r not in suites]
        if unknown:
            print(f"bench: --suite: unknown suite(s) {unknown}; expected one of "
                  f"{sorted(suites)} (`bench --list`)", file=sys.stderr)
            return None
        suites = {n: suites[n] for n in wanted}
    return suites, wanted


def _list(suites: dict, preset: str) -> None:
    for name, s in suites.items():
        try:
            n = len(s.cases(preset))
        except Exception as exc:  # noqa: BLE001
            n = f"cases() failed: {error_text(exc)}"
        print(f"{name}: {n} cases ({preset})")


def _render_all(out: Path, readme: str | None, overhead_only: bool) -> None:
    try:
        render(out)
        if readme:
            update_readme(Path(readme), out)
        print(f"bench: wrote {out}/" + ("OVERHEAD.md" if overhead_only else "BENCH.md"))
    except Exception as exc:  # noqa: BLE001 - the JSON is written: render elsewhere
        print(f"bench: the JSON results are in {out}, but rendering failed "
              f"({error_text(exc)}); run `python -m autotune bench --render {out}` where "
              "tabulate and matplotlib are installed", file=sys.stderr)


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
    picked = _pick_suites(args)
    if picked is None:
        return 2
    suites, wanted = picked
    if args.list:
        _list(suites, args.preset or ("full" if cuda else "smoke"))
        return 0

    if cuda:
        device = torch.device("cuda", torch.cuda.current_device())
        preset = args.preset or "full"
        from recipes._configs import gpu_slug

        out = Path(args.out) if args.out else _results_root(args) / gpu_slug(device)
        if preset != "full" and not args.out:     # never over the committed full results
            out = out / f"bench-{preset}"
    else:
        device = torch.device("cpu")
        print("bench: benchmarks need a GPU (none visible). Running the smoke preset under "
              "the Triton interpreter as a functional check: its times are host wall-clock "
              "times of the interpreter, not a benchmark"
              + ("." if args.out or args.results else
               "; nothing is written (no --out or --results)."))
        preset = "smoke"
        from recipes._configs import gpu_slug

        out = Path(args.out) if args.out else (
            _results_root(args) / gpu_slug(device) / "bench-smoke" if args.results else None)
    command = command_line("python -m autotune bench", argv)
    started = time.perf_counter()
    header = run.run_header(device, preset, command)
    header["suites"] = list(suites)
    old = read_json(out / "BENCH.json") if (wanted and out is not None) else None
    if old and old.get("gpu") == header.get("gpu") and old.get("preset") == preset:
        # some suites again: the others' results stay, and the page says which run made
        # each suite (the header describes this run)
        header["suites"] = list(old.get("suites") or []) + [
            n for n in suites if n not in (old.get("suites") or [])]
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    if args.overhead and (cuda or args.overhead_only) and out is not None:
        ov = overhead.measure_overhead(suites, device, calls=200 if cuda else 3)
        ov["header"] = header
        if wanted:                     # some suites again: the others' rows stay
            ov = overhead.merge_overhead(read_json(out / "overhead.json"), ov)
        write_json(out / "overhead.json", ov)
        print(f"bench: overhead measured in {time.perf_counter() - started:.1f} s")
    if not args.overhead_only:
        if cuda:
            header["copy_curve"] = run.copy_curve(device)
            moved, us = header["copy_curve"][-1]
            header["copy_bandwidth_Bps"] = moved / (us * 1e-6)
        else:
            header["copy_bandwidth_Bps"] = run.host_copy_bandwidth()
        header["copy_bytes"] = run.COPY_BYTES if cuda else run.HOST_COPY_BYTES
        print(f"bench: copy bandwidth {header['copy_bandwidth_Bps'] / 1e12:.3f} TB/s "
              f"({'device' if cuda else 'host'} copy of {header['copy_bytes'] >> 20} MiB)")

        def save(res):
            if out is None:
                return
            write_json(out / f"bench-{res['suite']}.json", res)
            header["seconds"] = round(time.perf_counter() - started, 1)
            write_json(out / "BENCH.json", header)

        if out is not None:
            write_json(out / "BENCH.json", header)
        results = run.run_suites(suites, preset, device, header, reps=args.reps,
                                 seed=args.seed, max_seconds=_cap(args),
                                 started=started, on_result=save)
        header["seconds"] = round(time.perf_counter() - started, 1)
        if out is not None:
            write_json(out / "BENCH.json", header)
        for res in results:
            print(f"bench: {res['suite']}: {len(res['cases'])} cases, {res['seconds']} s"
                  + ("" if res["complete"] else " (cut by --budget-s)"))
    if out is not None:
        _render_all(out, args.readme, args.overhead_only)
    print(f"bench: total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
