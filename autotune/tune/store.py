"""The study store: Optuna's storage, one study per (GPU, recipe, key, space, kernels),
holding every config measured there (its status, times, error).

Default: an Optuna journal file, `results/<gpu-slug>/studies.journal` (git-ignored), which
appends a measured config in well under a millisecond; `--storage URL` takes any
SQLAlchemy URL Optuna accepts (e.g. `postgresql+psycopg2://user@host/db`, shared by
tuners on several hosts; a relational store costs tens of milliseconds a trial, which a
tune of thousands of configs feels), and any other `--storage` value is a journal file.

Only finished trials are ever written, in batches (`Store.add`, `Store.flush`: at most
`FLUSH_S` apart, at the end of every key, and when a tune stops, Ctrl-C included): the
store never holds a RUNNING trial, and a killed tune loses at most the last batch. A later
run reads what a study holds and measures only the configs it lacks.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

from recipes._tuning import key_str

from .search import results_of

JOURNAL = "studies.journal"
FLUSH_S = 2.0            # seconds between writes of the measured configs
LOCK_GRACE_S = 10        # a journal lock older than this is a dead process's


class StoreError(RuntimeError):
    """The store cannot be opened or read; the message says what to delete."""


def default_path(root: Path, slug: str) -> Path:
    return (Path(root) / slug / JOURNAL).resolve()


def study_name(slug: str, recipe: str, key: dict, space_hash: str, source_hash: str,
               kind: str = "tune") -> str:
    """Studies are per GPU kind, recipe, key, space and kernel source: a changed kernel or
    space starts afresh instead of mixing old timings in."""
    return f"{kind}:{slug}:{recipe}[{key_str(key)}]:space={space_hash}:src={source_hash}"


def redact(url: str) -> str:
    import re
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)


class Store:
    """The studies of one tune: created or found again by name, read once each, and
    written in batches."""

    def __init__(self, storage: str | None, root: Path, slug: str):
        self.url = storage
        if storage is None or "://" not in storage:
            self.path = Path(storage) if storage else default_path(root, slug)
            self.where = str(self.path)
        else:
            self.path = Path(storage.split("///", 1)[1]) if storage.startswith("sqlite:///") \
                else None
            self.where = redact(storage)
        self._studies: dict = {}
        self._pending: dict = {}
        self.last_flush = time.monotonic()
        self.written = 0
        self.flush_s = 0.0
        self.storage = self._guard(self._open)

    # --- opening, and what to say when it fails ---------------------------------------
    def _open(self):
        import optuna

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"optuna\..*")
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        if self.url is None or "://" not in self.url:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = JournalFileSymlinkLock(str(self.path), grace_period=LOCK_GRACE_S)
            storage = JournalStorage(JournalFileBackend(str(self.path), lock_obj=lock))
        else:
            storage = _rdb(self.url)
        storage.get_all_studies()          # reads the whole store: damage shows here
        return storage

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except (KeyboardInterrupt, StoreError):
            raise
        except Exception as exc:  # noqa: BLE001
            if self.path is not None:
                fix = (f"delete it to start the studies afresh (`rm {self.path}`; the "
                       "tuned tables next to it are separate and stay), or pass "
                       "--storage to use another")
            else:
                fix = "check that the database is reachable and intact, or pass another " \
                      "--storage"
            raise StoreError(f"autotune: the study store {self.where} cannot be used "
                             f"({type(exc).__name__}: {str(exc).strip()[:300]}). It holds "
                             f"only the measurements of earlier tunes: {fix}.") from exc

    # --- studies --------------------------------------------------------------------------
    def study(self, name: str):
        s = self._studies.get(name)
        if s is None:
            import optuna
            s = self._studies[name] = self._guard(
                lambda: optuna.create_study(study_name=name, storage=self.storage,
                                            direction="minimize", load_if_exists=True))
        return s

    def results(self, name: str) -> dict:
        """config_id -> Result of every config the study holds (none pending included)."""
        s = self.study(name)
        return self._guard(lambda: results_of(s.get_trials(deepcopy=False)))

    def add(self, name: str, frozen) -> None:
        """Queue a finished trial for the study; `maybe_flush` / `flush` write it."""
        self._pending.setdefault(name, []).append(frozen)

    def pending(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def maybe_flush(self) -> None:
        if self._pending and time.monotonic() - self.last_flush >= FLUSH_S:
            self.flush()

    def flush(self) -> int:
        """Write every queued trial; returns how many."""
        t0 = time.monotonic()
        n = 0
        while self._pending:
            name, trials = next(iter(self._pending.items()))
            s = self.study(name)
            self._guard(s.add_trials, trials)
            n += len(trials)
            del self._pending[name]
        self.written += n
        self.last_flush = time.monotonic()
        self.flush_s += self.last_flush - t0
        return n


def _rdb(url: str):
    """An Optuna RDBStorage; SQLite in WAL mode with `synchronous=NORMAL` (a commit is
    not fsynced: a killed process loses nothing committed), a writer waiting up to 300 s
    for the lock."""
    from optuna import storages as S

    sqlite = url.startswith("sqlite")
    engine_kwargs = {"connect_args": {"timeout": 300}} if sqlite else {"pool_pre_ping": True}
    if sqlite:
        _sqlite_wal(url)
    storage = S.RDBStorage(url, engine_kwargs=engine_kwargs)
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
