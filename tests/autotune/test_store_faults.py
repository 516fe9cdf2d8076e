"""The study store's faults (autotune/tune/store.py) and the tune's start-up checks: a
journal torn by a tune killed mid-append, folders that cannot be written (each cause its
own message), a second tuner on one store, a resumed run, Ctrl-C during start-up."""
import errno
import json
import os
import subprocess
import time

import optuna
import pytest
import torch

from autotune import cli
from autotune.tune import store as S
from autotune.tune.main import tune
from autotune.tune.search import info
from autotune.tune.store import JOURNAL, OWNER, Store, StoreError
from recipes import _configs as dispatch
from tests.autotune.autotune_util import (  # noqa: F401
    FAKE,
    PY,
    REPO,
    fake_fixture,
    subprocess_env,
    tune_options,
)

SLUG = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()
CLI = ["tune", "--package", FAKE, "--recipe", "fake_scale", "--preset", "smoke",
       "--no-progress", "--budget-s", "0"]


_opts = tune_options


def _config_ids(root) -> list[str]:
    st = Store(None, root, SLUG).storage
    out = []
    for s in st.get_all_studies():
        out += [info(t)["config_id"]
                for t in optuna.load_study(study_name=s.study_name, storage=st).trials]
    return out


def _count_runs(fake, monkeypatch) -> list:
    calls: list = []
    orig = fake.SCALE.run
    monkeypatch.setattr(fake.SCALE, "run", lambda x, cfg: (calls.append(1), orig(x, cfg))[1])
    return calls


# A tune killed (SIGKILL) in the middle of an append: the first half of the batch's bytes
# are on disk, under Optuna's journal lock, as a process dying inside write() leaves them.
KILLED_MID_APPEND = """
import json, os, signal, sys
from optuna.storages.journal import _file as F

def torn(self, logs):
    data = ("\\n".join(json.dumps(x, separators=(",", ":")) for x in logs) + "\\n").encode()
    with F.get_lock_file(self._lock):
        with open(self._file_path, "ab") as f:
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
        os.kill(os.getpid(), signal.SIGKILL)

F.JournalFileBackend.append_logs = torn
from autotune.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_tune_killed_mid_append_loses_only_its_last_batch(tmp_path, fake, capsys):
    journal = tmp_path / SLUG / JOURNAL
    tune(_opts(tmp_path, trials=4))
    first = _config_ids(tmp_path)
    assert len(first) == 4 and journal.read_bytes().endswith(b"\n")

    env = subprocess_env()   # the device the in-process tune used
    r = subprocess.run([PY, "-c", KILLED_MID_APPEND, *CLI, "--trials", "8", "--results",
                        str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -9, r.stderr[-3000:]
    torn = journal.read_bytes()
    assert not torn.endswith(b"\n"), "the child died before its append finished"
    assert (tmp_path / SLUG / (JOURNAL + OWNER)).exists(), "the dead tuner's claim stays"

    # what Optuna alone does with it: the torn line is accepted, the next append lands
    # on its bytes (and is lost with them), and after one more the whole store is
    # unreadable
    bare = tmp_path / "bare.journal"
    bare.write_bytes(torn)
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
    backend = JournalFileBackend(str(bare), lock_obj=JournalFileOpenLock(str(bare)))
    assert len(list(backend.read_logs(0))) > 0
    for name in ("x", "y"):
        backend.append_logs([{"op_code": 0, "worker_id": "w", "study_name": name,
                              "directions": [1]}])
    with pytest.raises(ValueError):
        list(JournalFileBackend(str(bare)).read_logs(0))

    capsys.readouterr()
    t0 = time.monotonic()
    tune(_opts(tmp_path, trials=8))
    err = capsys.readouterr().err
    assert "ended in a torn line" in err and "cut back to the last complete line" in err
    assert "claimed by a tuner that is gone" in err
    ids = _config_ids(tmp_path)
    assert set(first) <= set(ids) and len(ids) == len(set(ids)) == 8
    assert journal.read_bytes().endswith(b"\n")
    assert not (tmp_path / SLUG / (JOURNAL + OWNER)).exists(), "the claim is given back"
    assert time.monotonic() - t0 < 120


def test_a_torn_last_line_is_cut_before_anything_is_read_or_appended(tmp_path):
    """Without newline, or a final line that is no JSON (a zero-filled tail): cut to the
    last complete line; damage before the last line is left to the read (below)."""
    p = tmp_path / "j"
    good = b'{"a":1}\n{"b":2}\n'
    for tail in (b'{"c":', b"\x00\x00\x00\n", b'{"c":3}'):
        p.write_bytes(good + tail)
        assert S.cut_torn_tail(p) == len(tail) and p.read_bytes() == good
    p.write_bytes(good)
    assert S.cut_torn_tail(p) == 0 and p.read_bytes() == good
    p.write_bytes(b'{"c"')
    assert S.cut_torn_tail(p) == 4 and p.read_bytes() == b""
    long = b'{"x":"' + b"y" * 200_000 + b'"}\n'      # a line longer than the read chunk
    p.write_bytes(long + long[:-3])
    assert S.cut_torn_tail(p) == len(long) - 3 and p.read_bytes() == long


def test_a_damaged_store_alone_is_advised_to_be_deleted(tmp_path, fake, capsys):
    path = tmp_path / SLUG / JOURNAL
    path.parent.mkdir(parents=True)
    path.write_text('{"op_code": 0, "worker_id"\n{"op_code": 1}\n')
    rc = cli.main([*CLI, "--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "damaged" in err and f"rm {path}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def _refuse_writes(monkeypatch, code: int, under):
    """os.open of a file under `under` for writing fails with `code` (root, who runs
    the tests here, is never refused by permissions; a read-only mount needs root)."""
    real = os.open

    def fake_open(path, flags, *a, **k):
        if str(path).startswith(str(under)) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", fake_open)


@pytest.mark.parametrize("code,cause", [(errno.EACCES, "permission denied"),
                                        (errno.EROFS, "read-only file system")])
def test_an_unwritable_tables_folder_stops_before_measuring(tmp_path, fake, monkeypatch,
                                                            capsys, code, cause):
    calls = _count_runs(fake, monkeypatch)
    _refuse_writes(monkeypatch, code, tmp_path)
    rc = cli.main([*CLI, "--results", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and calls == []
    line = err.strip().splitlines()[-1]
    assert f"tables folder {tmp_path / SLUG} cannot be written: {cause}" in line
    assert "--results DIR" in line and "rm " not in err and "delete" not in err
    assert "Traceback" not in err


def test_a_results_root_that_is_a_file_names_the_cause(tmp_path, fake, monkeypatch, capsys):
    calls = _count_runs(fake, monkeypatch)
    root = tmp_path / "results"
    root.write_text("not a folder")
    rc = cli.main([*CLI, "--results", str(root)])
    err = capsys.readouterr().err
    assert rc == 2 and calls == [] and "Traceback" not in err
    assert "cannot be written: a component of the path is" in err and "rm " not in err


def test_store_messages_by_cause(tmp_path, monkeypatch):
    """A store folder that cannot be written and a store path that is a folder are named
    as such, never with advice to delete the store."""
    elsewhere = tmp_path / "elsewhere"
    with monkeypatch.context() as m:
        _refuse_writes(m, errno.EACCES, elsewhere)
        with pytest.raises(StoreError) as exc:
            Store(str(elsewhere / "s.journal"), tmp_path, SLUG, claim=True)
    msg = str(exc.value)
    assert "permission denied" in msg and "--storage FILE" in msg and "rm " not in msg
    (tmp_path / "dir.journal").mkdir()
    with pytest.raises(StoreError) as exc:
        Store(str(tmp_path / "dir.journal"), tmp_path, SLUG)
    msg = str(exc.value)
    assert "it is a directory, not a file" in msg and "rm " not in msg
    assert "delete" not in msg


HOLDER = """
import sys, time
from autotune.tune.store import Store
s = Store(sys.argv[1], None, "x", claim=True)
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_second_tuner_on_the_store_is_refused(tmp_path, fake, monkeypatch, capsys):
    journal = tmp_path / SLUG / JOURNAL
    journal.parent.mkdir(parents=True)
    holder = subprocess.Popen([PY, "-c", HOLDER, str(journal)], cwd=REPO,
                              env=subprocess_env(SPEC_TUNE_DEVICE="cpu"),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        calls = _count_runs(fake, monkeypatch)
        rc = cli.main([*CLI, "--results", str(tmp_path)])
        err = capsys.readouterr().err
        assert rc == 2 and calls == []
        assert f"another tuner (pid {holder.pid} on" in err
        assert "this run stops without measuring" in err and "--storage FILE" in err
        assert json.loads((tmp_path / SLUG / (JOURNAL + OWNER)).read_text())["pid"] == \
            holder.pid, "the refused run left the holder's claim alone"
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone (killed: its claim is left behind): the next tuner takes over
    rc = cli.main([*CLI, "--results", str(tmp_path), "--trials", "2"])
    err = capsys.readouterr().err
    assert rc == 0 and f"claimed by a tuner that is gone (pid {holder.pid})" in err
    assert len(_config_ids(tmp_path)) == 2


def test_a_resumed_run_says_how_many_configs_came_from_the_store(tmp_path, fake, capsys):
    tune(_opts(tmp_path, trials=4))
    assert "autotune: resumed" not in capsys.readouterr().err
    tune(_opts(tmp_path, trials=6))
    err = capsys.readouterr().err
    assert "resumed: 4 configs of 1 of the 1 keys come from the store" in err


def _interrupt(*_a, **_k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("where", ["select_device", "store", "measuring"])
def test_ctrl_c_gives_one_short_message_wherever_it_lands(tmp_path, fake, monkeypatch,
                                                          capsys, where):
    """Ctrl-C while the device is chosen, the store opened, or configs measured: exit
    130, the same last line (how to resume), no traceback."""
    from autotune.tune import device

    if where == "select_device":
        monkeypatch.setattr(device, "select_device", _interrupt)
    elif where == "store":
        monkeypatch.setattr(Store, "_open", _interrupt)
    else:
        monkeypatch.setattr(fake.SCALE, "run", _interrupt)
    argv = [*CLI, "--results", str(tmp_path)]
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == cli._resume_hint(cli.PROG, argv)
    assert not (tmp_path / SLUG / (JOURNAL + OWNER)).exists()
