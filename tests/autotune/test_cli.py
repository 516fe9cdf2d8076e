"""The command line (autotune/cli.py, the `spec-cookbook` console script): subcommands and
--version, one flag name per concept, `tune --list`, progress only on a terminal, one
coverage figure, a missing extra in one line, the Triton version warning, and
examples/spec_decode.py --help without transformers."""
import io
import re
import subprocess

import pytest
import torch

import recipes
from autotune import cli
from autotune.bench import cli as bench_cli
from autotune.tune import device as D
from autotune.tune.run import Progress
from recipes import _configs as dispatch
from tests.autotune.autotune_util import FAKE, PY, REPO, fake_fixture, subprocess_env  # noqa: F401

SLUG = "cpu-interpreter" if not torch.cuda.is_available() else dispatch.gpu_slug()
PYPROJECT = (REPO / "pyproject.toml").read_text()     # Python 3.10 has no tomllib


def _toml_list(name: str) -> list[str]:
    body = re.search(rf"^{name} = \[(.*?)^\]", PYPROJECT, re.M | re.S).group(1)
    return re.findall(r'"([^"]+)"', body)


def test_console_script_and_version(capsys):
    scripts = re.search(r"^\[project\.scripts\]\n(.*?)\n\n", PYPROJECT, re.M | re.S)
    assert scripts.group(1) == 'spec-cookbook = "autotune.cli:script"'
    assert callable(cli.script)
    assert recipes.__version__ == "0.3.0" == cli.version()
    with pytest.raises(SystemExit) as exc:
        cli.build_parser("spec-cookbook").parse_args(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == "spec-cookbook 0.3.0"
    helptext = cli.build_parser("spec-cookbook").format_help()
    assert helptext.startswith("usage: spec-cookbook")
    for cmd in ("tune", "show", "report", "quality", "bench", "compare", "targets"):
        assert re.search(rf"^\s+{cmd}\s", helptext, re.M), cmd


def test_passed_on_subcommands_reach_their_entry_points(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["compare", "-h"])
    assert exc.value.code == 0 and "Compare two bench runs" in capsys.readouterr().out
    assert cli.main(["targets", "--help"]) == 0
    assert "TARGETS.md" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "-h"])
    assert exc.value.code == 0 and "--budget-s" in capsys.readouterr().out


def test_one_flag_name_per_concept():
    """--budget-s, --results and --preset name the same things in tune and bench; the
    earlier spellings parse to the same value but are not shown, and the Makefile uses
    the current names."""
    bp = bench_cli._parser()
    a = bp.parse_args(["--max-seconds", "5", "--recipe", "argmax"])
    b = bp.parse_args(["--budget-s", "5", "--suite", "argmax"])
    assert bench_cli._cap(a) == bench_cli._cap(b) == 5.0 and a.suite == b.suite == ["argmax"]
    # 0 is no budget, as the tuner's --budget-s 0; the earlier spelling's 0 started nothing
    assert bench_cli._cap(bp.parse_args(["--budget-s", "0"])) is None
    assert bench_cli._cap(bp.parse_args(["--max-seconds", "0"])) == 0
    assert bp.parse_args(["--results", "R"]).results == "R"
    bench_help = bp.format_help()
    assert "--max-seconds" not in bench_help and "--recipe" not in bench_help
    tp = cli.build_parser()
    for spelled in ("full", "gpu"):
        assert tp.parse_args(["tune", "--preset", spelled]).preset == "gpu"
    assert tp.parse_args(["quality", "--preset", "smoke"]).preset == "smoke"
    tune_help = tp._subparsers._group_actions[0].choices["tune"].format_help()
    assert "{full,smoke}" in tune_help and "gpu" not in re.findall(r"\{[^}]*\}", tune_help)[0]
    for p in (bench_help, tune_help):
        assert "--budget-s" in p and "--results" in p and "--preset" in p
    makefile = (REPO / "Makefile").read_text()
    assert "--max-seconds" not in makefile


def test_tune_list_names_the_keys_and_measures_nothing(tmp_path, fake, capsys):
    rc = cli.main(["tune", "--list", "--package", FAKE, "--recipe", "fake_scale",
                   "--preset", "smoke", "--results", str(tmp_path), "--key", "N=64,256"])
    assert rc == 0
    assert capsys.readouterr().out.splitlines() == [
        "fake_scale: 2 keys (preset smoke)", "  N=64,dtype=float32: grid 6 configs",
        "  N=256,dtype=float32: grid 18 configs", "2 keys over 1 recipes"]
    assert not any(tmp_path.iterdir()), "a --list wrote nothing"


class _Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_bar_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(Progress, "PLAIN_S", 0.0)
    log = _Stream(tty=False)
    p = Progress(3, True, stream=log)
    p.describe("fake_scale[N=256]")
    for _ in range(3):
        p.update(1)
    p.close()
    text = log.getvalue()
    assert "\r" not in text and p.bar is None
    assert text.splitlines()[-1] == "autotune: 3/3 configs measured (fake_scale[N=256])"
    term = _Stream(tty=True)
    p = Progress(3, True, stream=term)
    p.update(3)
    p.close()
    assert p.bar is not None and "\r" in term.getvalue()
    quiet = _Stream(tty=False)
    p = Progress(3, False, stream=quiet)
    p.update(3)
    assert quiet.getvalue() == ""


def test_the_tune_and_show_print_one_coverage(tmp_path, fake, capsys):
    """--trials 3 of a grid of 18: the plan covers all it is allowed (the fraction the
    budget planned is 100%), 17% of the grid is measured; both commands say 17%."""
    rc = cli.main(["tune", "--package", FAKE, "--recipe", "fake_scale", "--preset", "smoke",
                   "--results", str(tmp_path), "--no-progress", "--trials", "3",
                   "--budget-s", "0"])
    err = capsys.readouterr().err
    assert rc == 0
    last = [x for x in err.splitlines() if "wrote 1 table(s)" in x][0]
    tuned = re.search(r"coverage \S+ of each grid", last).group(0)
    assert tuned == "coverage 17% of each grid"
    assert cli.main(["show", "--results", str(tmp_path), "--slug", SLUG]) == 0
    shown = re.findall(r"coverage \S+ of each grid", capsys.readouterr().out)
    assert shown == [tuned]


def test_a_missing_extra_is_one_line_naming_the_pip_command(tmp_path):
    env = subprocess_env(SPEC_TUNE_DEVICE="cpu")
    code = ("import sys; sys.modules['optuna'] = None; from autotune.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([PY, "-c", code, "tune", "--recipe", "argmax", "--results",
                        str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "autotune: this command needs optuna, which is not installed: "
        "pip install 'spec-cookbook[tune]'"]


def test_spec_decode_help_needs_no_transformers():
    code = ("import sys, runpy; sys.modules['transformers'] = None; "
            "sys.argv = ['spec_decode.py'] + sys.argv[1:]; "
            "runpy.run_path('examples/spec_decode.py', run_name='__main__')")
    env = subprocess_env()
    r = subprocess.run([PY, "-c", code, "--help"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "--bench" in r.stdout, r.stderr[-2000:]
    r = subprocess.run([PY, "-c", code, "--K", "1"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "examples/spec_decode.py: the models come from transformers, which is not "
        "installed: pip install 'spec-cookbook[examples]'"]


def test_an_untested_triton_warns_once(monkeypatch):
    lines: list = []
    monkeypatch.setattr(D, "_warned", [])
    monkeypatch.setattr(D, "triton_version", lambda: "3.6.1")
    assert D.warn_untested_triton(lines.append) is None
    monkeypatch.setattr(D, "triton_version", lambda: "3.7.0")
    assert D.warn_untested_triton(lines.append) is not None
    assert D.warn_untested_triton(lines.append) is None
    assert len(lines) == 1 and "Triton 3.7.0" in lines[0] and "3.6.*" in lines[0]


def test_declared_dependency_ranges_are_the_tested_ones():
    deps = _toml_list("dependencies")
    assert deps == ["torch>=2.11,<2.14", f"triton>={D.TESTED_TRITON},<3.7"]
    v = D.triton_version()
    assert v is not None and v.startswith(D.TESTED_TRITON + "."), v


def test_bench_results_root_is_the_tuners(tmp_path, capsys):
    """`bench --results DIR` writes DIR/<gpu>/ as tune does (on the CPU, whose smoke run
    writes nothing by default, DIR/cpu-interpreter/bench-smoke/); --budget-s 0: no cap."""
    if torch.cuda.is_available():
        pytest.skip("the CPU functional check; on a GPU --results runs the full bench")
    assert cli.main(["bench", "--results", str(tmp_path), "--suite", "copy_inputs",
                     "--budget-s", "0", "--no-overhead"]) == 0
    out = tmp_path / SLUG / "bench-smoke"
    assert (out / "BENCH.json").is_file() and (out / "bench-copy_inputs.json").is_file()
    assert "nothing is written" not in capsys.readouterr().out
