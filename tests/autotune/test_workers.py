"""Several tuner workers on one Optuna store: a real PostgreSQL server on loopback (the
way tuners on several hosts share a store), and the default journal file (one host)."""
import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

import optuna
import pytest

from autotune.tune.search import EVALUATED, info
from tests.autotune.autotune_util import FAKE, PY, REPO, subprocess_env


def _pg_bin() -> str | None:
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(os.path.realpath(found))
    cands = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(cands[-1]) if cands else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    """Start a throw-away PostgreSQL server on 127.0.0.1 in a temporary directory."""
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        pytest.skip("psycopg2 is not installed (pip install -e '.[dev]' brings "
                    "psycopg2-binary)")
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; "
                    "`apt-get install postgresql` provides them (.ci/run does)")
    prefix = []
    if os.geteuid() == 0:                  # the server refuses to run as root
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run the "
                        "PostgreSQL server as")
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root without runuser(1) to drop to the postgres user")
        prefix = [runuser, "-u", "postgres", "--"]
    tmp = tempfile.mkdtemp(prefix="autotune-pg-")
    data, sock, log = f"{tmp}/data", f"{tmp}/sock", f"{tmp}/server.log"
    os.mkdir(sock)
    if prefix:
        for p in (tmp, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    port = _free_port()

    def run(*args, check=True):
        return subprocess.run(prefix + [os.path.join(bindir, args[0]), *args[1:]],
                              capture_output=True, text=True, timeout=120, check=check,
                              cwd=tmp)

    try:
        run("initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
            "--no-sync")
        run("pg_ctl", "-D", data, "-l", log, "-w", "-t", "60", "-o",
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=50", "start")
    except subprocess.CalledProcessError as exc:
        logtext = open(log).read() if os.path.exists(log) else ""
        shutil.rmtree(tmp, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc.stderr}\n{logtext}")
    try:
        run("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "autotune")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/autotune"
    finally:
        run("pg_ctl", "-D", data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def _two_workers(tmp_path, storage, budget_s="0"):
    """Two workers, two keys: each worker measures and finalises one; the parent writes
    both entries into one table."""
    cmd = [PY, "-m", "autotune", "tune", "--package", FAKE, "--recipe",
           "fake_slow", "--key", "N=128,256", "--workers", "2", "--trials", "5",
           "--results", str(tmp_path), "--no-progress", "--budget-s", budget_s]
    if storage:
        cmd += ["--storage", storage]
    r = subprocess.run(cmd, cwd=REPO, env=subprocess_env(FAKE_SLOW_S="0.05",
                                                         SPEC_TUNE_DEVICE="cpu"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    if storage:
        st = optuna.storages.RDBStorage(storage)
    else:
        from autotune.tune.store import Store
        st = Store(None, tmp_path, "cpu-interpreter").storage
    names = [s.study_name for s in st.get_all_studies()]
    assert len(names) == 2, names
    workers = set()
    for name in names:
        study = optuna.load_study(study_name=name, storage=st)
        ev = [t for t in study.trials if info(t).get("status") in EVALUATED]
        assert len(ev) == 5 and all(t.state.is_finished() for t in study.trials)
        workers |= {info(t)["worker"].rsplit(":", 1)[1] for t in ev}
    assert workers == {"w0", "w1"}, f"trials by {workers}: both workers should contribute"
    tab = json.loads((tmp_path / "cpu-interpreter" / "fake_slow.json").read_text())
    assert sorted(e["key"]["N"] for e in tab["entries"]) == [128, 256]
    rep = json.loads((tmp_path / "cpu-interpreter" / "tune-report.json").read_text())
    assert rep["complete"] and len(rep["keys"]) == 2 and set(rep["workers"]) == {"0", "1"}


def test_two_workers_share_a_postgres_store(tmp_path, postgres_url):
    _two_workers(tmp_path, postgres_url)


def test_two_workers_share_the_journal(tmp_path):
    """With a budget too (ample: the workers' coverage must not cut the 5 configs)."""
    _two_workers(tmp_path, None, budget_s="120")
