"""`python -m autotune {tune,show,report,quality,bench}`.

  tune     search the registered recipes' spaces per key; write results/<gpu>/<recipe>.json
  show     print the tuned tables of this GPU (or --slug)
  report   write results/<gpu>/tuning.md: every table as markdown (and print it)
  quality  exhaustive optimum vs the tuner's search; writes results/<gpu>/tuner-quality.md
  bench    the benchmark report (autotune.bench.main; arguments are passed through)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _csv(values) -> list[str]:
    out = []
    for v in values or []:
        out += [x for x in str(v).split(",") if x != ""]
    return out


def _add_common(p: argparse.ArgumentParser, budget_help: str) -> None:
    p.add_argument("--recipe", action="append", metavar="NAME",
                   help="recipe(s) to work on (repeat or comma-separate; default: all "
                        "registered)")
    p.add_argument("--preset", choices=("gpu", "smoke"),
                   help="key set of the recipes (default: gpu on CUDA, smoke on CPU)")
    p.add_argument("--storage", metavar="URL",
                   help="Optuna storage URL shared by all workers/hosts, e.g. "
                        "postgresql+psycopg2://user@host/db (default: sqlite "
                        "results/<gpu>/studies.db)")
    p.add_argument("--results", metavar="DIR", help="results root (default: ./results of "
                   "the repository, or $SPEC_COOKBOOK_RESULTS)")
    p.add_argument("--package", default="recipes",
                   help="package whose import registers the recipes (default: recipes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frac", type=float, default=0.3,
                   help="trials of a sampled key, as a fraction of its grid (default 0.3)")
    p.add_argument("--budget-s", type=float, metavar="S", help=budget_help)
    p.add_argument("--precompile-threads", type=int, metavar="N",
                   help="threads compiling configs ahead on a GPU host (default: up to 16; "
                        "0: off)")
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
    from .tuner import Options

    return Options(
        recipes=_csv(a.recipe) or None, preset=a.preset,
        overrides=_overrides(a) if hasattr(a, "vocab") else {},
        trials=getattr(a, "trials", None), frac=a.frac,
        exhaustive=getattr(a, "exhaustive", False),
        exhaustive_limit=getattr(a, "exhaustive_limit", None),
        workers=getattr(a, "workers", 1), storage=a.storage, budget_s=a.budget_s,
        seed=a.seed, top=getattr(a, "top", 3), results=a.results, package=a.package,
        progress=not a.no_progress, precompile_threads=a.precompile_threads,
        search_reps=getattr(a, "search_reps", None),
        final_reps=getattr(a, "final_reps", None), verbose=a.verbose,
        heartbeat_s=getattr(a, "heartbeat_s", None), grace_s=getattr(a, "grace_s", None))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m autotune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tune", help="tune the recipes on this GPU (or a CPU smoke tune)")
    _add_common(t, "time budget of the whole run in seconds (default 360 on a GPU, chosen "
                   "so that the default key set ends well inside 8 minutes on one H200, "
                   "start-up included; 600 on CPU; 0: none). Each key's fixed cost (inputs, "
                   "compiling, final re-timing; measured as the run goes) is set aside, the "
                   "rest is shared out over the keys' searches in proportion to their "
                   "trial counts; a key always gets at least one trial")
    _add_keys(t)
    t.add_argument("--trials", type=int, metavar="N",
                   help="configs evaluated per sampled key (default: --frac of the grid; "
                        "3 on CPU)")
    t.add_argument("--exhaustive", action="store_true",
                   help="evaluate every config of every key")
    t.add_argument("--exhaustive-limit", type=int, metavar="N",
                   help="keys with at most N configs are searched exhaustively "
                        "(default 200 on a GPU, 0 on CPU)")
    t.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes on one store, worker i on GPU i mod #GPUs (default 1)")
    t.add_argument("--top", type=int, default=3, help="configs re-timed at the end")
    t.add_argument("--search-reps", type=int, metavar="N", help="graph replays per trial")
    t.add_argument("--final-reps", type=int, metavar="N",
                   help="graph replays per config in the final re-timing")
    t.add_argument("--heartbeat-s", type=int, metavar="S",
                   help="store heartbeat of running trials (default 10)")
    t.add_argument("--grace-s", type=int, metavar="S",
                   help="a running trial without heartbeat for S seconds is retried by the "
                        "next tuner (default 60)")

    for name, hlp in (("show", "print the tuned tables"),
                      ("report", "write results/<gpu>/tuning.md from the tables")):
        s = sub.add_parser(name, help=hlp)
        s.add_argument("--slug", help="GPU folder under results/ (default: this machine's)")
        s.add_argument("--recipe", action="append", metavar="NAME")
        s.add_argument("--results", metavar="DIR")
        if name == "report":
            s.add_argument("--out", metavar="FILE", help="default results/<gpu>/tuning.md")

    q = sub.add_parser("quality", help="exhaustive optimum vs the tuner's search")
    _add_common(q, "time budget in seconds, from the choice of keys on: measuring and "
                   "replays (default 300 on a GPU, none on CPU; 0: none). A key's grid is "
                   "started only if it and its replays are expected to fit the time left, "
                   "and is then measured to the end unless the budget runs out; keys not "
                   "measured completely are listed apart and left out of the verdict")
    q.add_argument("--keys", type=int, default=12,
                   help="keys to choose, in turn from each recipe (default 12; the verdict "
                        "needs at least 10 complete ones)")
    q.add_argument("--seeds", type=int, default=5, help="replays per key (default 5)")
    q.add_argument("--within", type=float, default=0.03, help="goal (default 0.03 = 3%%)")
    q.add_argument("--min-grid", type=int, default=30,
                   help="smallest grid (configs the constraint admits) of a chosen key "
                        "(default 30)")
    q.add_argument("--max-grid", type=int, default=120,
                   help="largest grid of a chosen key (default 120: small grids, so that "
                        "many complete ones fit the budget)")
    q.add_argument("--no-measure", action="store_true",
                   help="only replay over what the store already measured")
    q.add_argument("--out", metavar="FILE",
                   help="default results/<gpu>/tuner-quality.md")

    sub.add_parser("bench", help="benchmark report (arguments go to autotune.bench)",
                   add_help=False)
    return ap


def _slug(a) -> str:
    from recipes.tables import gpu_slug
    return a.slug or gpu_slug()          # gpu_slug() picks this machine's device


def _root(a) -> Path:
    from recipes.tables import results_root
    return Path(a.results) if a.results else results_root()


def cmd_bench(argv: list[str]) -> int:
    try:
        from . import bench
    except ImportError as exc:
        print(f"autotune bench: the benchmark module autotune/bench.py is not available "
              f"({exc})", file=sys.stderr)
        return 2
    return int(bench.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    a = build_parser().parse_args(argv)
    if a.cmd == "tune":
        from .search import TunerFatal
        from .tuner import tune
        from .views import show_text

        try:
            summary = tune(_options(a))
        except TunerFatal as exc:
            print(f"autotune: stopped: {exc}", file=sys.stderr)
            return 3
        if summary["tables"]:
            print(show_text(Path(a.results) if a.results else None, summary["slug"],
                            list(summary["tables"])))
        return 0
    if a.cmd in ("show", "report"):
        from .views import report_markdown, show_text

        root, slug = _root(a), _slug(a)
        recipes = _csv(a.recipe) or None
        if a.cmd == "show":
            print(show_text(root, slug, recipes))
            return 0
        from .tables import write_text_atomic
        text = report_markdown(root, slug, recipes)
        out = Path(a.out) if a.out else root / slug / "tuning.md"
        write_text_atomic(out, text)
        print(text)
        print(f"autotune report: wrote {out}", file=sys.stderr)
        return 0
    if a.cmd == "quality":
        from .quality import quality

        quality(_options(a), n_keys=a.keys, seeds=a.seeds, within=a.within,
                min_grid=a.min_grid, max_grid=a.max_grid, measure=not a.no_measure,
                out=a.out)
        return 0
    return 2
