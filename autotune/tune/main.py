"""`tune(opts)`: a whole tune, started (`run.start`), then measured in this process
(`run.tune_here`) or, with `--workers N`, in N processes (`workers.tune_workers`)."""
from __future__ import annotations

from .options import Options
from .run import start, tune_here
from .workers import tune_workers


def tune(opts: Options) -> dict:
    """Run a tune; returns {"slug", "tables": {recipe: path}, "keys", "elapsed_s",
    "report", "interpreter"}. KeyboardInterrupt: the store is flushed, the report says
    so, and the exception goes on (the command line says how to resume)."""
    s = start(opts)
    if s.opts.workers > 1:
        return tune_workers(s.opts, s.device, s.slug, s.out_dir, s.jobs, s.phases, s.fresh)
    return tune_here(*s)
