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

Faults, each with its own message (`StoreError`; only a damaged store is advised to be
deleted):
- a journal whose last line is torn (a tune killed mid-append) is cut back to its last
  complete line, under the journal's lock, before anything is read or appended
  (`cut_torn_tail`): Optuna accepts a torn last line but not the line appended onto it;
- a folder that cannot be written (permission denied, read-only file system, a path
  component that is not a directory, no space) is named with its cause (`check_folder`,
  also run on the tables folder before anything is measured);
- a file store (journal or SQLite) is claimed by one tuner at a time (`OWNER`, a file
  beside it naming the host and pid): a second tuner stops and says who holds it, since
  both would measure the same configs. A claim left by a process that is gone on this
  host is taken over. A server database is not claimed (it is meant to be shared).
"""
from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

from recipes._tuning import key_str

from .search import results_of

JOURNAL = "studies.journal"
OWNER = ".owner"         # suffix of the claim file beside a file store
FLUSH_S = 2.0            # seconds between writes of the measured configs
LOCK_GRACE_S = 10        # a journal lock older than this is a dead process's


class StoreError(RuntimeError):
    """The store or the tables folder cannot be used; the message says why and what to
    do."""


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


def os_cause(exc: BaseException) -> str | None:
    """What a file-system error means for the user, or None when `exc` (or what it was
    raised from) is no file-system error."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno is not None:
            return {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                    errno.EROFS: "read-only file system",
                    errno.ENOTDIR: "a component of the path is not a directory",
                    errno.EEXIST: "a component of the path is a file, not a directory",
                    errno.EISDIR: "it is a directory, not a file",
                    errno.ENOSPC: "no space left on the device",
                    errno.EDQUOT: "disk quota exceeded"}.get(
                        exc.errno, os.strerror(exc.errno))
        exc = exc.__cause__ or exc.__context__
    return None


def check_folder(folder: Path, what: str, flag: str) -> None:
    """Create `folder` if needed and write (then remove) a file in it, so that a folder
    that cannot be written stops the run before anything is measured; the message names
    the cause and the option (`flag`) that puts the output elsewhere."""
    folder = Path(folder)
    probe = folder / f".write-check-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b"x")
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as exc:
        raise StoreError(f"autotune: the {what} {folder} cannot be written: "
                         f"{os_cause(exc)} ({exc.strerror or exc}). Make it a writable "
                         f"folder, or pass {flag} to use another.") from None


def cut_torn_tail(path: Path) -> int:
    """Cut the journal at `path` back to its last complete line when its last line is
    torn (no newline, or not JSON: a process killed while appending). Returns the bytes
    cut. Damage before the last line is left for the read to report."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        # the start of the last line: after the last newline but the file's final byte
        pos, start, chunk = size, 0, 1 << 16
        while pos > 0:
            n = min(chunk, pos)
            pos -= n
            f.seek(pos)
            buf = f.read(n)
            if pos + n == size:
                buf = buf[:-1]              # the final byte ends the last line or not
            i = buf.rfind(b"\n")
            if i >= 0:
                start = pos + i + 1
                break
        f.seek(start)
        last = f.read()
        if last.endswith(b"\n"):
            try:
                json.loads(last)
                return 0
            except ValueError:
                pass
        f.truncate(start)
        f.flush()
        os.fsync(f.fileno())
        return size - start


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True                         # another user's process
    return True


class Store:
    """The studies of one tune: created or found again by name, read once each, and
    written in batches. `claim=True` (a tuner that measures): the file store is claimed
    for this process first (`release` gives it back); `say` prints what was repaired."""

    def __init__(self, storage: str | None, root: Path, slug: str, *, claim: bool = False,
                 say=None):
        self.url = storage
        if storage is None or "://" not in storage:
            self.path = Path(storage) if storage else default_path(root, slug)
            self.where = str(self.path)
            self.journal = True
        else:
            self.path = Path(storage.split("///", 1)[1]) if storage.startswith("sqlite:///") \
                else None
            self.where = redact(storage)
            self.journal = False
        self.say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._studies: dict = {}
        self._pending: dict = {}
        self.last_flush = time.monotonic()
        self.written = 0
        self.flush_s = 0.0
        self.owner: Path | None = None
        if self.path is not None:
            check_folder(self.path.parent, "study store's folder", "--storage FILE")
        if claim and self.path is not None:
            self._claim()
        try:
            self.storage = self._guard(self._open)
        except BaseException:
            self.release()
            raise

    # --- one tuner a file store -----------------------------------------------------------
    def _claim(self) -> None:
        owner = Path(str(self.path) + OWNER)
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                try:
                    held = json.loads(owner.read_text())
                    host, pid = held["host"], int(held["pid"])
                except (OSError, ValueError, KeyError, TypeError):
                    held, host, pid = {}, None, None   # half written: its writer's gone
                if host == me["host"] and pid == me["pid"]:
                    self.owner = owner          # this process claimed it already
                    return
                if host is not None and (host != me["host"] or _alive(pid)):
                    raise StoreError(
                        f"autotune: another tuner (pid {pid} on {host}, since "
                        f"{held.get('since')}) is measuring into the study store "
                        f"{self.where}; two tuners on one store measure the same configs "
                        "twice, so this run stops without measuring. Wait for it to end, "
                        "or pass --storage FILE to give this run a store of its own (if "
                        f"that tuner is gone, remove {owner}).") from None
                self.say(f"autotune: the study store {self.where} was claimed by a tuner "
                         f"that is gone (pid {pid}); this run takes it over")
                owner.unlink(missing_ok=True)
                continue
            except OSError as exc:
                raise StoreError(f"autotune: the study store {self.where} cannot be "
                                 f"claimed ({owner}): {os_cause(exc)}. Make its folder "
                                 "writable, or pass --storage FILE to use another.") from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.owner = owner
            return
        raise StoreError(f"autotune: the study store {self.where} could not be claimed: "
                         f"{owner} keeps coming back (another tuner is starting).")

    def release(self) -> None:
        """Give the claim back (when this process holds it)."""
        owner, self.owner = self.owner, None
        if owner is None:
            return
        try:
            held = json.loads(owner.read_text())
            if held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
                owner.unlink()
        except (OSError, ValueError):
            pass

    # --- opening, and what to say when it fails ---------------------------------------
    def _open(self):
        import optuna

        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"optuna\..*")
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        if self.journal:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

            lock = JournalFileSymlinkLock(str(self.path), grace_period=LOCK_GRACE_S)
            backend = JournalFileBackend(str(self.path), lock_obj=lock)   # creates it
            lock.acquire()                  # no append can be under way while we cut
            try:
                cut = cut_torn_tail(self.path)
            finally:
                lock.release()
            if cut:
                self.say(f"autotune: the study store {self.where} ended in a torn line "
                         f"({cut} bytes: a tune stopped while writing); cut back to the "
                         "last complete line, every measurement before it is kept")
            storage = JournalStorage(backend)
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
            cause = os_cause(exc)
            what = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            if cause is not None and self.path is not None:
                raise StoreError(f"autotune: the study store {self.where} cannot be used: "
                                 f"{cause} ({what}). Fix that (the store and its folder "
                                 "must be writable), or pass --storage FILE to use "
                                 "another.") from exc
            if self.path is not None:
                fix = (f"it is damaged: delete it to start the studies afresh (`rm "
                       f"{self.path}`; the tuned tables next to it are separate and "
                       "stay), or pass --storage to use another")
            else:
                fix = "check that the database is reachable and intact, or pass another " \
                      "--storage"
            raise StoreError(f"autotune: the study store {self.where} cannot be used "
                             f"({what}). It holds only the measurements of earlier tunes: "
                             f"{fix}.") from exc

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
