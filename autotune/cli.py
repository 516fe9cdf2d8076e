"""`python -m autotune {tune,show,report,quality,bench}`.

  tune     measure the registered recipes' configs per key on this GPU; write
           results/<gpu>/<recipe>.json and results/<gpu>/tune-report.json
  show     print the last tune's report, which tables dispatch uses (and from where),
           and the tuned tables of this GPU (or --slug)
  report   write results/<gpu>/tuning.md: every table as markdown (and print it)
  quality  exhaustive optimum vs the tuner's search; writes results/<gpu>/tuner-quality.md
  bench    the benchmark report (autotune.bench.main; arguments are passed through)
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

PROCESS_T0 = time.monotonic()      # the tune report's wall time counts from here


def _csv(values) -> list[str]:
    out = []
    for v in values or []:
        out += [x for x in str(v).split(",") if x != ""]
    return out


def _add_common(p: argparse.ArgumentParser, budget_help: str) -> None:
    p.add_argument("--recipe", action="append", metavar="NAME",
                   help="recipe(s) to work on (repeat or comma-separate; default: all "
                        "registered but those tuned on request, which the run names)")
    p.add_argument("--preset", choices=("gpu", "smoke"),
                   help="key set of the recipes (default: gpu on CUDA, smoke on CPU)")
    p.add_argument("--storage", metavar="URL|FILE",
                   help="Optuna study store: a SQLAlchemy URL (e.g. "
                        "postgresql+psycopg2://user@host/db) or a journal file (default: "
                        "results/<gpu>/studies.journal)")
    p.add_argument("--results", metavar="DIR", help="results root (default: ./results of "
                   "the repository, or $SPEC_COOKBOOK_RESULTS)")
    p.add_argument("--package", default="recipes",
                   help="package whose import registers the recipes (default: recipes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, metavar="S", help=budget_help)
    p.add_argument("--compile-workers", type=int, metavar="N",
                   help="processes compiling Triton binaries ahead on a GPU host (default: "
                        "the cores less one; 0: compile in the measuring process)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="report every pruned (failed to compile / out of resources) config")


def _add_keys(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("keys (override fields of the recipes' default keys)")
    g.add_argument("--vocab", "-V", action="append", metavar="V", help="vocabulary size(s)")
    g.add_argument("--batch", "-B", action="append", metavar="B",
                   help="batch size(s) (the key's B, or R for recipes keyed by rows)")
    g.add_argument("--rows", "-R", action="append", metavar="R", help="rows (the key's R)")
    g.add_argument("--K", "-K", dest="K", action="append", metavar="K",
                   help="draft length(s)")
    g.add_argument("--dtype", action="append", metavar="DTYPE",
                   help="dtype(s), e.g. bfloat16,float32")
    g.add_argument("--key", action="append", metavar="FIELD=V1,V2",
                   help="any other key field, e.g. --key H=4096,7168")


def _overrides(a) -> dict:
    ov = {}
    for name in ("vocab", "batch", "rows", "K", "dtype"):
        vals = _csv(getattr(a, name, None))
        if vals:
            ov[name] = vals
    for item in a.key or []:
        if "=" not in item:
            raise SystemExit(f"--key: expected FIELD=V1,V2, got {item!r}")
        f, v = item.split("=", 1)
        ov[f.strip()] = _csv([v])
    return ov


def _options(a):
    from .tune.options import Options

    return Options(
        recipes=_csv(a.recipe) or None, preset=a.preset,
        overrides=_overrides(a) if hasattr(a, "vocab") else {},
        trials=getattr(a, "trials", None), exhaustive=getattr(a, "exhaustive", False),
        workers=getattr(a, "workers", 1), storage=a.storage, budget_s=a.budget_s,
        seed=a.seed, top=getattr(a, "top", 2), results=a.results, package=a.package,
        progress=not a.no_progress, compile_workers=a.compile_workers,
        search_reps=getattr(a, "search_reps", None),
        final_reps=getattr(a, "final_reps", None), verbose=a.verbose, started=PROCESS_T0)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m autotune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tune", help="tune the recipes on this GPU (or a CPU smoke tune)")
    _add_common(t, "time budget of the whole run in seconds, from the process start "
                   "(default 450 on a GPU: a fresh `make tune` of the default keys within "
                   "8 minutes; 150 on CPU; 0: none). Every key measures the same fraction "
                   "of its grid, the largest the costs measured so far say fits (planned "
                   "again as keys finish); at least the heuristic's config")
    _add_keys(t)
    t.add_argument("--trials", type=int, metavar="N",
                   help="at most N configs a key (default: as the budget allows; 3 on CPU)")
    t.add_argument("--exhaustive", action="store_true",
                   help="measure every config of every key, whatever the budget")
    t.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes, worker i on GPU i mod #GPUs, each with every N-th key "
                        "(default 1)")
    t.add_argument("--top", type=int, default=2,
                   help="best configs re-timed with the heuristic's at the end (default 2)")
    t.add_argument("--search-reps", type=int, metavar="N", help="graph replays per trial")
    t.add_argument("--final-reps", type=int, metavar="N",
                   help="graph replays per config and round in the final re-timing")

    for name, hlp in (("show", "print the tune report, the tables dispatch uses, and the "
                               "tuned tables"),
                      ("report", "write results/<gpu>/tuning.md from the tables")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("--slug", help="GPU folder under results/ (default: this machine's)")
        s.add_argument("--recipe", action="append", metavar="NAME")
        s.add_argument("--results", metavar="DIR")
        if name == "report":
            s.add_argument("--out", metavar="FILE", help="default results/<gpu>/tuning.md")

    q = sub.add_parser("quality", help="exhaustive optimum vs the tuner's search")
    _add_common(q, "time budget in seconds, from the process start: measuring and replays "
                   "(default 300 on a GPU, none on CPU; 0: none). A key's grid is started "
                   "only if what it lacks is expected to fit the time left, and is then "
                   "measured to the end unless the budget runs out; keys not measured "
                   "completely are listed apart and left out of the verdict")
    q.add_argument("--keys", type=int, default=14,
                   help="keys to choose, in turn from each recipe (default 14; the verdict "
                        "needs at least 12 complete ones)")
    q.add_argument("--seeds", type=int, default=5, help="replays per key (default 5)")
    q.add_argument("--within", type=float, default=0.03, help="goal (default 0.03 = 3%%)")
    q.add_argument("--frac", type=float, default=0.5,
                   help="the tune's coverage the replays are held to (default 0.5: a "
                        "default tune measures at least half of every grid)")
    q.add_argument("--min-grid", type=int, default=30,
                   help="smallest grid (configs the constraint admits) of a chosen key "
                        "(default 30)")
    q.add_argument("--max-grid", type=int, default=200,
                   help="largest grid of a chosen key (default 200)")
    q.add_argument("--no-measure", action="store_true",
                   help="only replay over what the store already measured")
    q.add_argument("--out", metavar="FILE",
                   help="default results/<gpu>/tuner-quality.md")

    sub.add_parser("bench", help="benchmark report (arguments go to autotune.bench)",
                   add_help=False)
    return ap


def _slug(a) -> str:
    from recipes._configs import gpu_slug
    return a.slug or gpu_slug()          # gpu_slug() picks this machine's device


def _root(a) -> Path:
    from recipes._configs import results_root
    return Path(a.results) if a.results else results_root()


def cmd_bench(argv: list[str]) -> int:
    try:
        from . import bench
    except ImportError as exc:
        print(f"autotune bench: the benchmark module autotune/bench.py is not available "
              f"({exc})", file=sys.stderr)
        return 2
    return int(bench.main(argv) or 0)


def _resume_hint(argv: list[str]) -> str:
    cmd = "python -m autotune " + " ".join(shlex.quote(x) for x in argv)
    return (f"autotune: stopped by Ctrl-C. To resume, run the same command again ({cmd}): "
            "the configs measured so far are in the study store and are not measured "
            "again; the keys finished are already in their tables.")


def _run_measuring(a, argv: list[str]) -> int:
    """tune / quality: pick the device (the interpreter is switched on before any recipe
    is imported), run, and turn the known failures into a message and an exit code."""
    from .tune.device import select_device
    select_device()
    from .tune.measure import TunerFatal
    from .tune.store import StoreError

    try:
        if a.cmd == "tune":
            from .tune.run import tune
            from .views import show_text

            summary = tune(_options(a))
            if summary["tables"]:
                print(show_text(Path(a.results) if a.results else None, summary["slug"],
                                list(summary["tables"])))
            return 0
        from .quality import quality
        quality(_options(a), n_keys=a.keys, seeds=a.seeds, within=a.within, frac=a.frac,
                min_grid=a.min_grid, max_grid=a.max_grid, measure=not a.no_measure,
                out=a.out, command=shlex.join(["python", "-m", "autotune", *argv]))
        return 0
    except KeyboardInterrupt:
        print(_resume_hint(argv), file=sys.stderr)
        return 130
    except StoreError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except TunerFatal as exc:
        print(f"autotune: stopped: {exc}", file=sys.stderr)
        return 3


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    a = build_parser().parse_args(argv)
    if a.cmd in ("tune", "quality"):
        return _run_measuring(a, argv)
    if a.cmd in ("show", "report"):
        from .views import report_markdown, show_text

        root, slug = _root(a), _slug(a)
        recipes = _csv(a.recipe) or None
        if a.cmd == "show":
            print(show_text(root, slug, recipes, dispatch=True))
            return 0
        from .tables import write_text_atomic
        text = report_markdown(root, slug, recipes)
        out = Path(a.out) if a.out else root / slug / "tuning.md"
        write_text_atomic(out, text)
        print(text)
        print(f"autotune report: wrote {out}", file=sys.stderr)
        return 0
    return 2
