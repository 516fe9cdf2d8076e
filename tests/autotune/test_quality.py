"""`python -m autotune quality`: the tuner's search against the exhaustive optimum on
fake tunables (the report, complete grids only, the verdict, the replay of the tuner's
order, the re-timing of the optimum and the picks)."""
import json
import time

import pytest
import torch

from autotune.timing import Timing
from autotune.tune.main import tune
from autotune.tune.options import Options
from autotune.tune.search import Result, config_id
from tests.autotune.autotune_util import fake_fixture  # noqa: F401  (the `fake` fixture)
from tests.autotune.test_tune import KEY, _opts, _report


def test_quality_report_smoke(tmp_path, fake):
    from autotune.quality import quality
    path = quality(_opts(tmp_path, budget_s=None), n_keys=2, seeds=2, min_grid=4,
                   max_grid=100)
    text = path.read_text()
    assert "Tuner quality" in text and "fake_scale" in text
    data = json.loads(path.with_suffix(".json").read_text())
    assert data["n_keys"] == 1 and data["keys"][0]["grid"] == 18
    k = data["keys"][0]
    assert k["measured"] == 18 and len(k["replays"]) == 2 and k["budget"] == 9
    assert all(r["trials_to_goal"] is None or 1 <= r["trials_to_goal"] <= 18
               for r in k["replays"])
    # the same study as tune's: a tune now finds the whole grid measured
    tune(_opts(tmp_path))
    assert _report(tmp_path)["keys"][0]["measured"] == 18


def test_quality_counts_only_complete_grids(tmp_path, fake, monkeypatch, capsys):
    """A key whose estimated cost does not fit is not started; one cut by the budget's hard
    stop is listed as incomplete and left out of the verdict; a later run resumes it."""
    from autotune import quality as Q
    monkeypatch.setenv("FAKE_SLOW_S", "0.05")
    for kind in ("cpu", "cuda"):            # the same guess on either device
        monkeypatch.setitem(Q.SECONDS_PER_CONFIG, kind, 0.5)

    def run(budget_s):
        path = Q.quality(_opts(tmp_path, recipes=["fake_slow"], budget_s=budget_s,
                               started=time.monotonic()),
                         n_keys=2, seeds=1, min_grid=4, max_grid=100)
        return path.read_text(), json.loads(path.with_suffix(".json").read_text())

    text, data = run(0.3)                  # 18 configs x 0.5 s (the guess above) > 0.3 s
    assert "fake_slow[N=256,dtype=float32]: not started" in capsys.readouterr().err
    (inc,) = data["incomplete"]
    assert data["n_keys"] == 0 and inc["measured"] == 0 and inc["grid"] == 18
    assert inc["why"].startswith("not started: 18 configs need ~9 s")
    assert "0 of 18 configs measured (not started" in text
    for kind in ("cpu", "cuda"):                             # now it is started ...
        monkeypatch.setitem(Q.SECONDS_PER_CONFIG, kind, 0.0)
    monkeypatch.setattr(Q, "REPLAY_S", 0.0)
    text, data = run(0.3)                  # ... and cut: each config takes >= 0.1 s
    (inc,) = data["incomplete"]
    assert 1 <= inc["measured"] < 18 and data["keys"] == []
    assert inc["why"] == "cut by the end of the budget"
    assert "Incomplete" in text and "0 of 0 complete keys" in text and "NOT MET" in text
    text, data = run(0)                    # no budget: the grid is completed
    assert data["incomplete"] == [] and data["n_keys"] == 1
    (k,) = data["keys"]
    assert k["measured"] == 18 and k["heuristic"]["note"] is None
    assert k["heuristic"]["us"] > 0


def _quality_row(reached: bool) -> dict:
    rep = {"seed": 0, "trials_to_goal": 3 if reached else None, "evaluated": 30,
           "best_at_budget_us": 1.0, "ratio_at_budget": 1.0, "budget": 10}
    return {"recipe": "r", "key": {"N": 1}, "grid": 30, "measured": 30, "optimum_us": 1.0,
            "optimum_config": {}, "heuristic": {"us": None, "note": "outside the grid"},
            "replays": [rep], "budget": 10}


@pytest.mark.parametrize("complete,reached,verdict", [(12, 11, "MET"), (12, 10, "NOT MET"),
                                                      (11, 11, "NOT MET")])
def test_quality_verdict_needs_twelve_complete_keys(complete, reached, verdict):
    from autotune.quality import render_report
    rows = [_quality_row(i < reached) for i in range(complete)]
    incomplete = [{"recipe": "r", "key": {"N": 2}, "grid": 40, "measured": 7,
                   "why": "cut by the end of the budget"}]
    doc = render_report(rows, incomplete, torch.device("cpu"), "cpu-interpreter", Options(),
                        1, 0.03, 0.5, 1.0, grids=(30, 60),
                        command="python -m autotune quality --max-grid 60")
    assert doc["json"]["verdict"] == verdict and doc["json"]["n_keys"] == complete
    assert doc["json"]["grid_range"] == [30, 60]
    md = doc["markdown"]
    assert "whose grid has 30-60 configs" in md
    assert "made by `python -m autotune quality --max-grid 60`" in md
    assert f"**{reached} of {complete} complete keys**" in md and f"**{verdict}**" in md
    assert "`N=2`: 7 of 40 configs measured (cut by the end of the budget)" in md
    assert "- (outside the grid)" in md


def test_quality_replay_walks_the_tuners_order(fake):
    from autotune.quality import heuristic_time, replay
    from autotune.tune.plan import Job

    grid = fake.SCALE.configs(KEY)
    heur = fake.heuristic(KEY, None)
    job = Job(fake.SCALE, KEY, grid, "s", heur)
    times = {config_id(c): Result("ok", 10.0 + i, config=c) for i, c in enumerate(grid)}
    times[config_id(heur)] = Result("ok", 5.0, config=heur)      # the heuristic is best
    r = replay(job, times, seed=1, frac=0.5, within=0.03)
    assert r["trials_to_goal"] == 1 and r["ratio_at_budget"] == 1.0 and r["budget"] == 9
    assert heuristic_time(job, times) == {"us": 5.0, "note": None}
    assert heuristic_time(Job(fake.SCALE, KEY, grid, "s", None), times) == {
        "us": None, "note": "outside the grid"}
    times[config_id(heur)] = Result("error")
    assert heuristic_time(job, times) == {"us": None, "note": "error"}


def test_quality_retimes_the_optimum_and_the_picks(fake):
    """`retime` times the optimum and each seed's pick again together; the verdict then
    rests on the re-timed ratio, not on the single measurements' lucky optimum."""
    from autotune.quality import render_report, retime

    opt, pick = {"BLOCK": 256, "W": 2, "S": 1}, {"BLOCK": 64, "W": 2, "S": 1}
    row = {**_quality_row(False), "optimum_config": opt, "optimum_us": 1.0}
    row["replays"] = [{**row["replays"][0], "best_at_budget_config": pick,
                       "ratio_at_budget": 1.05}]

    class M:
        final_reps, cuda, timed = 3, False, []

        def pace(self, us):
            pass

        def time(self, cfg, reps, phase):
            self.timed.append((config_id(cfg), phase))
            return Timing([1.0 if cfg == opt else 1.02] * reps)

    m = M()
    retime(row, lambda: m, rounds=2)
    assert len(m.timed) == 4 and {p for _, p in m.timed} == {"final"}
    assert row["replays"][0]["retimed_ratio"] == pytest.approx(1.02)
    doc = render_report([row] * 12, [], torch.device("cpu"), "cpu-interpreter", Options(),
                        1, 0.03, 0.5, 1.0)
    assert doc["json"]["verdict"] == "MET" and doc["json"]["passed_single_measurements"] == 0
    assert "| 1.050 | 1.020 |" in doc["markdown"]
    same = {**row, "replays": [{**row["replays"][0], "best_at_budget_config": opt}]}
    m.timed.clear()
    retime(same, lambda: m, rounds=2)                # the pick is the optimum: no timing
    assert m.timed == [] and same["replays"][0]["retimed_ratio"] == 1.0

