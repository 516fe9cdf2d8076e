"""Every report in results/<gpu>/ says how it was made (`autotune.provenance`): the GPU,
the versions, the date and the command, in its JSON and at the top of its page; and no
report names a path of the machine that made it."""
import json
import re
from pathlib import Path

import pytest
import torch

from autotune import bench, provenance, targets
from autotune.bench import report, results
from autotune.quality import render_report
from autotune.tune.options import Options
from tests.autotune.autotune_util import FAKE, REPO, fake_fixture  # noqa: F401

MADE_WITH = ("gpu", "torch", "triton", "python", "date", "command")
# an absolute path of the usual machine folders (a report's own text has no such thing)
ABSOLUTE = re.compile(r"(?<![\w.])/(?:tmp|home|root|work|usr|var|mnt|opt|scratch|Users)/")


def _made_with(h: dict, command_start: str) -> None:
    missing = [k for k in MADE_WITH if not h.get(k)]
    assert not missing, f"header lacks {missing}: {h}"
    assert h["command"].startswith(command_start), h["command"]


def _no_machine_path(tmp_path: Path, *files: Path) -> None:
    for f in files:
        text = f.read_text()
        assert str(tmp_path) not in text and not ABSOLUTE.search(text), f.name


def test_header_line_and_older_files():
    h = provenance.header(torch.device("cpu"), "python -m autotune x")
    _made_with(h, "python -m autotune x")
    assert h["torch"] == torch.__version__
    line = provenance.line(h)
    assert line.startswith(h["date"]) and f"torch {h['torch']}" in line
    assert line.endswith("command: `python -m autotune x`")
    # a file from before the header: what it has, the rest "not recorded"
    old = {"gpu": "NVIDIA H200", "versions": {"torch": "2.11", "triton": "3.6.0"}}
    assert provenance.of(old) == {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6.0"}
    assert provenance.line({"date": "d"}) == (
        "d; GPU: not recorded; versions not recorded; command: not recorded")
    assert provenance.of([1, 2]) == {}


def test_command_and_paths_are_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    cmd = provenance.command_line("python -m autotune bench",
                                  ["--out", str(REPO / "results" / "h200"),
                                   f"--readme={REPO}/README.md", "--results",
                                   str(tmp_path / "x y")])
    assert cmd == ("python -m autotune bench --out results/h200 --readme=README.md "
                   "--results '.../x y'")
    assert provenance.relative(tmp_path / "h200" / "a.json", tmp_path) == "h200/a.json"
    assert provenance.relative("/elsewhere/s.journal", tmp_path) == ".../s.journal"
    assert provenance.relative("postgresql://u:***@db/x", tmp_path) == \
        "postgresql://u:***@db/x"


def test_bench_reports_carry_the_header(tmp_path):
    """A bench run (the smoke preset of one suite, then the overhead): BENCH.json, the
    suite's JSON, BENCH.md, bench-<suite>.md and OVERHEAD.md all say GPU, versions, date
    and command."""
    out = tmp_path / "bench"
    argv = ["--out", str(out), "--suite", "copy_inputs", "--preset", "smoke"]
    assert bench.main(argv) == 0
    assert bench.main(argv + ["--overhead-only"]) == 0
    head = results.read_json(out / "BENCH.json")
    _made_with(head, "python -m autotune bench --out .../bench --suite copy_inputs")
    suite = results.read_json(out / "bench-copy_inputs.json")
    _made_with(suite, head["command"])
    assert {k: suite[k] for k in MADE_WITH} == {k: head[k] for k in MADE_WITH}
    line = provenance.line(provenance.of(head))
    assert f"Measured: {line}." in (out / "bench-copy_inputs.md").read_text()
    ov = results.read_json(out / "overhead.json")
    _made_with(ov["header"], "python -m autotune bench")
    assert provenance.line(provenance.of(ov["header"])) in (out / "OVERHEAD.md").read_text()
    page = (out / "BENCH.md").read_text()
    assert f"**{head['gpu']}**" in page and provenance.versions_text(head) in page
    assert head["date"] in page and f"`{head['command']}`" in page
    _no_machine_path(tmp_path, *[p for p in out.iterdir() if p.suffix in (".json", ".md")])


def test_suite_pages_of_older_runs_say_not_recorded(tmp_path):
    """A suite file of the page's own run from before suites kept the header gets the
    run header's GPU and versions; one of an earlier run says what it lacks."""
    out = tmp_path / "r"
    out.mkdir()
    head = {**provenance.header(torch.device("cpu"), "python -m autotune bench"),
            "preset": "full", "suites": ["argmax", "relay"]}
    results.write_json(out / "BENCH.json", head)

    def suite(name, date, command):
        return {"suite": name, "title": name, "complete": True, "variants": [],
                "cases": [], "date": date, "command": command}

    results.write_json(out / "bench-argmax.json", suite("argmax", head["date"],
                                                        head["command"]))
    results.write_json(out / "bench-relay.json", suite("relay", "2000-01-01 00:00 UTC",
                                                       "python -m autotune bench -x"))
    report.render(out)
    own = (out / "bench-argmax.md").read_text()
    assert f"Measured: {provenance.line(provenance.of(head))}." in own
    older = (out / "bench-relay.md").read_text()
    assert ("Measured: 2000-01-01 00:00 UTC; GPU: not recorded; versions not recorded; "
            "command: `python -m autotune bench -x`.") in older
    assert f"Copy ceiling and curve (the copy-BW and same-size copy columns): " \
           f"{provenance.line(provenance.of(head))}" in older
    assert "*Measured by an earlier run: 2000-01-01 00:00 UTC; GPU: not recorded" in (
        out / "BENCH.md").read_text()


def test_tune_report_header_and_relative_paths(tmp_path, fake, capsys):
    """`python -m autotune tune` into a results root given as an absolute path: the
    report has GPU, versions, date and command, and its paths are relative to the root."""
    from autotune import cli
    from recipes._configs import gpu_slug

    assert cli.main(["tune", "--package", FAKE, "--recipe", "fake_scale",
                     "--preset", "smoke", "--results", str(tmp_path), "--no-progress",
                     "--budget-s", "0", "--compile-workers", "0", "--trials", "2"]) == 0
    slug = "cpu-interpreter" if not torch.cuda.is_available() else gpu_slug()
    path = tmp_path / slug / "tune-report.json"
    rep = json.loads(path.read_text())
    _made_with(rep, f"python -m autotune tune --package {FAKE} --recipe fake_scale "
                    f"--preset smoke --results .../{tmp_path.name} ")
    assert rep["store"]["where"] == f"{slug}/studies.journal"
    assert rep["tables"] == {"fake_scale": f"{slug}/fake_scale.json"}
    _no_machine_path(tmp_path, path)


def test_tuner_quality_header():
    doc = render_report([], [], torch.device("cpu"), "cpu-interpreter", Options(), 1, 0.03,
                        0.5, 1.0, command="python -m autotune quality --keys 2")
    js = doc["json"]
    _made_with(js, "python -m autotune quality --keys 2")
    assert js["optuna"]
    md = doc["markdown"]
    assert f"Date {js['date']}; {provenance.versions_text(js)}" in md
    assert "made by `python -m autotune quality --keys 2`" in md


def test_targets_header_inputs_and_older_list(tmp_path, capsys):
    """targets.json: the bench run's GPU and versions, its own date and command, each
    input's header; TARGETS.md says the same; a bare list (older file) still reads."""
    root = tmp_path / "gpu"
    root.mkdir()
    head = {**provenance.header(torch.device("cpu"), "python -m autotune bench"),
            "gpu": "NVIDIA H200", "copy_bandwidth_Bps": 4e12}
    results.write_json(root / "BENCH.json", head)
    results.write_json(root / "tune-report.json", {"gpu": "NVIDIA H200", "date": "d1",
                                                   "wall_s": 1.0, "fresh": True})
    assert targets.main([str(root)]) == 0
    md = capsys.readouterr().out
    doc = results.read_json(root / "targets.json")
    _made_with(doc, "python -m autotune.targets .../gpu")
    assert {k: doc[k] for k in ("gpu", "torch", "triton", "cuda", "python")} == {
        k: head[k] for k in ("gpu", "torch", "triton", "cuda", "python")}
    assert [i["files"] for i in doc["inputs"]] == [["BENCH.json"], ["tune-report.json"]]
    assert provenance.line(doc) in md
    assert ("- `tune-report.json`: d1; GPU: NVIDIA H200; versions not recorded; command: "
            "not recorded") in md
    assert targets.rows_of(doc) == doc["rows"] and doc["rows"]
    assert targets.rows_of(doc["rows"]) == doc["rows"]
    assert str(tmp_path) not in md and not ABSOLUTE.search(md)
    _no_machine_path(tmp_path, root / "targets.json")


@pytest.mark.parametrize("folder", sorted(p.name for p in (REPO / "results").iterdir()
                                          if p.is_dir()))
def test_committed_reports_name_no_machine_path(folder):
    files = [p for p in (REPO / "results" / folder).iterdir()
             if p.is_file() and p.suffix in (".json", ".md")]
    bad = [p.name for p in files if ABSOLUTE.search(p.read_text())]
    assert not bad, f"results/{folder}: absolute paths in {bad}"
