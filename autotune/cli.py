"""`spec-cookbook COMMAND` (the console script) or `python -m autotune COMMAND`.

  tune     measure the registered recipes' configs per key on this GPU; write
           results/<gpu>/<recipe>.json and results/<gpu>/tune-report.json
           (`tune --list`: the recipes and keys it would tune, measuring nothing)
  show     print the last tune's report, which tables dispatch uses (and from where),
           and the tuned tables of this GPU (or --slug)
  report   write results/<gpu>/tuning.md: every table as markdown (and print it)
  quality  exhaustive optimum vs the tuner's search; writes results/<gpu>/tuner-quality.md
  bench    the benchmark report (`bench -h` lists its options)
  compare  two bench runs, config for config (`compare -h`)
  targets  the issues' speed targets against a bench run (`targets -h`)

One name per concept across commands: --recipe NAME (the recipes to tune; bench runs
suites, named by `bench --list`: --suite NAME), --preset (full | smoke; bench also
quick), --results DIR (the results root: each GPU writes DIR/<gpu>/), --budget-s S (the
time budget in seconds), --out PATH (where the command's own report goes). Earlier
spellings still work: tune --preset gpu (= full), bench --max-seconds (= --budget-s).
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from pathlib import Path

PROCESS_T0 = time.monotonic()      # the tune report's wall time counts from here
PROG = "python -m autotune"

# modules of the optional extras -> the extra that installs them
EXTRAS = {"optuna": "tune", "tabulate": "tune", "tqdm": "tune", "matplotlib": "tune",
          "sqlalchemy": "tune", "transformers": "examples"}
PASSED_ON = ("bench", "compare", "targets")     # subcommands that parse their own options


def version() -> str:
    """`recipes.__version__`, read from the package's source without importing it (an
    import would settle compiled vs interpreted kernels before the device is chosen)."""
    import importlib.util

    spec = importlib.util.find_spec("recipes")
    text = Path(spec.origin).read_text() if spec and spec.origin else ""
    m = re.search(r"^__version__\s*=\s*[\"']([^\"']+)[\"']", text, re.M)
    return m.group(1) if m else "unknown"


def _csv(values) -> list[str]:
    out = []
    for v in values or []:
        out += [x for x in str(v).split(",") if x != ""]
    return out


def _preset(value: str) -> str:
    """--preset of tune and quality: `full` (the recipes' default GPU keys, which the
    recipes call "gpu") or `smoke`; `gpu` is the earlier spelling of `full`."""
    v = {"full": "gpu", "gpu": "gpu", "smoke": "smoke"}.get(value)
    if v is None:
        raise argparse.ArgumentTypeError(f"expected full or smoke, got {value!r}")
    return v


def _add_common(p: argparse.ArgumentParser, budget_help: str) -> None:
    p.add_argument("--recipe", action="append", metavar="NAME",
                   help="recipe(s) to work on (repeat or comma-separate; default: all "
                        "registered but those tuned on request, which the run names)")
    p.add_argument("--preset", type=_preset, metavar="{full,smoke}",
                   help="key set of the recipes (default: full on CUDA, smoke on CPU)")
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
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (default: a bar on a terminal, else a plain line "
                        "every 30 s)")
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


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"spec-cookbook {version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("tune", help="tune the recipes on this GPU (or a CPU smoke tune)")
    _add_common(t, "time budget of the whole run in seconds, from the process start "
                   "(default 450 on a GPU: a fresh `make tune` of the default keys within "
                   "8 minutes; 150 on CPU; 0: none). Every key measures the same fraction "
                   "of its grid, the largest the costs measured so far say fits (planned "
                   "again as keys finish); at least the heuristic's config")
    _add_keys(t)
    t.add_argument("--list", action="store_true",
                   help="print the recipes and keys this command would tune (each key's "
                        "grid size) and exit without measuring")
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
        s.add_argument("--results", metavar="DIR", help="results root (as tune's)")
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

    for name, hlp in (("bench", "benchmark report (its options: bench -h)"),
                      ("compare", "two bench runs config for config (compare -h)"),
                      ("targets", "the speed targets against a bench run (targets -h)")):
        sub.add_parser(name, help=hlp, add_help=False)
    return ap


def _slug(a) -> str:
    from recipes._configs import gpu_slug
    return a.slug or gpu_slug()          # gpu_slug() picks this machine's device


def _root(a) -> Path:
    from recipes._configs import results_root
    return Path(a.results) if a.results else results_root()


def _passed_on(cmd: str, argv: list[str]) -> int:
    """bench / compare / targets: their own command lines, given the rest of argv."""
    if cmd == "bench":
        from .tune.device import warn_untested_triton
        warn_untested_triton()
        try:
            from . import bench
        except ImportError as exc:
            if isinstance(exc, ModuleNotFoundError) and _missing_extra(exc):
                raise
            print(f"autotune bench: the benchmark package autotune/bench/ cannot be "
                  f"imported ({exc})", file=sys.stderr)
            return 2
        main = bench.main
    elif cmd == "compare":
        from .bench.compare import main
    else:
        from .targets import main
    return int(main(argv) or 0)


def _resume_hint(prog: str, argv: list[str]) -> str:
    cmd = prog + " " + " ".join(shlex.quote(x) for x in argv)
    return (f"autotune: stopped by Ctrl-C. To resume, run the same command again ({cmd}): "
            "the configs measured so far are in the study store and are not measured "
            "again; the keys finished are already in their tables.")


def _list(opts) -> int:
    """`tune --list`: the plan (recipes, keys, grid sizes) and nothing measured."""
    from recipes._tuning import key_str

    from .tune.device import select_device
    from .tune.options import resolve
    from .tune.plan import plan, select_tunables

    device = select_device()
    opts = resolve(opts, device)
    from recipes._configs import gpu_slug

    tunables = select_tunables(opts)
    jobs = plan(opts, gpu_slug(device), device, tunables)
    for t in tunables:
        mine = [j for j in jobs if j.tunable is t]
        print(f"{t.name}: {len(mine)} keys (preset "
              f"{'full' if opts.preset == 'gpu' else opts.preset})")
        for j in mine:
            print(f"  {key_str(j.key)}: grid {len(j.grid)} configs")
    print(f"{len(jobs)} keys over {len(tunables)} recipes")
    return 0


def _run_measuring(a, argv: list[str]) -> int:
    """tune / quality: pick the device (the interpreter is switched on before any recipe
    is imported), run, and turn the known failures into a message and an exit code."""
    from .tune.device import select_device, warn_untested_triton
    select_device()
    if a.cmd == "tune" and a.list:
        return _list(_options(a))
    warn_untested_triton()
    from .provenance import command_line
    from .tune.measure import TunerFatal
    from .tune.store import StoreError

    command = command_line(a.prog, argv)
    try:
        if a.cmd == "tune":
            from dataclasses import replace

            from .tune.main import tune
            from .views import show_text

            summary = tune(replace(_options(a), command=command))
            if summary["tables"]:
                print(show_text(Path(a.results) if a.results else None, summary["slug"],
                                list(summary["tables"])))
            return 0
        from .quality import quality
        quality(_options(a), n_keys=a.keys, seeds=a.seeds, within=a.within, frac=a.frac,
                min_grid=a.min_grid, max_grid=a.max_grid, measure=not a.no_measure,
                out=a.out, command=command)
        return 0
    except StoreError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except TunerFatal as exc:
        print(f"autotune: stopped: {exc}", file=sys.stderr)
        return 3


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return (f"autotune: this command needs {top}, which is not installed: "
            f"pip install 'spec-cookbook[{extra}]'")


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[0] if argv else None
    try:
        if cmd in PASSED_ON:
            return _passed_on(cmd, argv[1:])
        a = build_parser(prog).parse_args(argv)
        a.prog = prog
        if a.cmd in ("tune", "quality"):
            return _run_measuring(a, argv)
        if a.cmd in ("show", "report"):
            return _views(a)
        return 2
    except KeyboardInterrupt:
        # the same words whether start-up (imports, planning, the store) or measuring
        # was interrupted
        msg = _resume_hint(prog, argv) if cmd in ("tune", "quality") else \
            "autotune: stopped by Ctrl-C."
        print(msg, file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        msg = _missing_extra(exc)
        if msg is None:
            raise
        print(msg, file=sys.stderr)
        return 2


def _views(a) -> int:
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


def script() -> int:
    """The `spec-cookbook` console script."""
    return main(prog="spec-cookbook")
