"""The study store: Optuna's RDB storage, one study per (GPU, recipe, key, space, kernels).

Default: a SQLite file `results/<gpu-slug>/studies.db` (git-ignored). `--storage URL`
takes any SQLAlchemy URL Optuna accepts, e.g. `postgresql+psycopg2://user@host/db`, so
tuners on several processes or hosts share one study; Optuna's storage is the only
coordination (no queue of our own).

Resuming: the storage runs with a heartbeat. A trial whose process died (killed tune)
stops beating; after `grace_period` seconds the next tuner that starts a trial marks it
failed and `RetryFailedTrialCallback` puts its config back in the queue. Finished trials
are never re-run: re-running `tune` continues every study where it stopped.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from .registry import key_str

HEARTBEAT_S = 10
GRACE_S = 60


def default_url(root: Path, slug: str) -> str:
    path = (Path(root) / slug / "studies.db").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def open_storage(url: str, *, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S):
    """An Optuna RDBStorage with heartbeat and retry of stale trials.

    SQLite runs in WAL mode with `synchronous=NORMAL`: a commit is not fsynced (a killed
    process loses nothing committed; only a power cut may lose the last trials), which
    takes the store's cost per trial from ~200 ms to a few ms. Several processes share
    the file: a writer waits up to 300 s for the lock."""
    import optuna
    from optuna import storages as S

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"optuna\..*")
    sqlite = url.startswith("sqlite")
    if sqlite:
        engine_kwargs = {"connect_args": {"timeout": 300}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    kw = {"heartbeat_interval": heartbeat_s, "grace_period": grace_s}
    retry = getattr(S, "RetryHeartbeatStaleTrialCallback", None)
    if retry is not None:   # Optuna >= 4.9
        kw["heartbeat_stale_trial_callback"] = retry(max_retry=2)
    else:
        kw["failed_trial_callback"] = S.RetryFailedTrialCallback(max_retry=2)
    if sqlite:
        _sqlite_wal(url)
    storage = S.RDBStorage(url, engine_kwargs=engine_kwargs, **kw)
    if sqlite:
        from sqlalchemy import event

        def _pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        event.listen(storage.engine, "connect", _pragmas)
        storage.engine.dispose()     # pooled connections re-open with the pragmas
    return storage


def _sqlite_wal(url: str) -> None:
    """Put a SQLite store in WAL mode (a property of the file: once is enough)."""
    import sqlite3

    path = url.split("///", 1)[1] if "///" in url else ""
    if not path or path == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=300)
    try:
        con.execute("PRAGMA journal_mode=WAL")
    finally:
        con.close()


def study_name(slug: str, recipe: str, key: dict, space_hash: str, source_hash: str,
               kind: str = "tune") -> str:
    """Studies are per GPU kind, recipe, key, space and kernel source: a changed kernel or
    space starts afresh instead of mixing old timings in. `kind` separates the
    exhaustive studies of `autotune quality` from the tuning ones."""
    return f"{kind}:{slug}:{recipe}[{key_str(key)}]:space={space_hash}:src={source_hash}"
