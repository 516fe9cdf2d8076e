"""autotune.bench: the report (tables, plots, README block) from synthetic results, the
CPU functional check end to end, the overhead report, and the dispatch hooks the
benchmark uses (heuristic_only, trace_configs, the resolve cache)."""
import json
import math

import pytest
import torch

from autotune import bench
from recipes import tables as dispatch


def fake_suite(name="argmax", complete=True):
    """An argmax-like suite: dtype x V x R, graph ours/torch graph, eager torch."""
    cases = []
    for dt in ("bfloat16", "float32"):
        es = 2 if dt == "bfloat16" else 4
        for V in (32000, 151936):
            for R in (1, 4, 32, 256):
                nbytes = R * V * es
                ours = 3.0 + nbytes / 3.5e6
                t = {"ours": ours, bench.REPEAT: ours * 1.02, "torch eager": ours * 3 + 8,
                     "torch graph": ours * 2}
                tuned = "none"
                if R == 4:
                    tuned = "differs"
                    t[bench.HEURISTIC] = ours * 1.25
                elif R == 32:
                    tuned = "same"
                cases.append({
                    "index": len(cases), "label": {"dtype": dt, "R": R, "V": V},
                    "bytes": nbytes, "errors": {}, "tuned": tuned,
                    "timings": {k: {"p20": v * 0.98, "p50": v, "p80": v * 1.03,
                                    "samples": 30, "mode": "graph"} for k, v in t.items()}})
    cases[3]["errors"]["torch eager"] = "RuntimeError: boom"
    del cases[3]["timings"]["torch eager"]
    return {"suite": name, "title": name, "notes": "synthetic", "extra": {},
            "preset": "full", "complete": complete, "seconds": 1.0, "cases": cases,
            "variants": [{"name": "ours", "eager": False, "peer": False},
                         {"name": "torch eager", "eager": True, "peer": True},
                         {"name": "torch graph", "eager": False, "peer": True}]}


HEADER = {"gpu": "NVIDIA H200", "sm_count": 132, "torch": "2.11", "triton": "3.6.0",
          "cuda": "12.8", "python": "3.12", "date": "2025-01-01 00:00 UTC", "preset": "full",
          "command": "python -m autotune bench", "copy_bandwidth_Bps": 4.2e12,
          "copy_bytes": 1 << 30, "device_type": "cuda", "seconds": 300.0,
          "suites": ["argmax", "other"]}


def write_fake(out):
    out.mkdir(parents=True, exist_ok=True)
    bench.write_json(out / "BENCH.json", HEADER)
    bench.write_json(out / "bench-argmax.json", fake_suite())
    other = fake_suite("other", complete=False)
    for c in other["cases"]:                       # a suite without a B/R field
        c["label"] = {"pairs": c["label"]["R"], "pair_bytes": c["label"]["V"]}
    bench.write_json(out / "bench-other.json", other)


def test_copy_curve_interpolation_and_same_size_column(tmp_path):
    curve = [[1 << 15, 1.0], [1 << 16, 2.0], [1 << 17, 8.0]]
    assert bench.copy_time_at(curve, 1 << 10) == 1.0             # below: the first time
    assert bench.copy_time_at(curve, 1 << 16) == pytest.approx(2.0)
    assert bench.copy_time_at(curve, 3 << 15) == pytest.approx(2.0 * 4 ** math.log2(1.5))
    assert bench.copy_time_at(curve, 1 << 18) == pytest.approx(16.0)   # above: bandwidth
    assert bench.copy_time_at(None, 1 << 16) is None and bench.copy_time_at(curve, 0) is None
    res = fake_suite()
    e = res["cases"][0]
    curve = [[e["bytes"] // 2, 1.0], [e["bytes"] * 2, 4.0]]   # a copy of e's bytes: 2 us
    head, rows = bench.suite_rows(res, HEADER["copy_bandwidth_Bps"], curve)
    cell = dict(zip(head, rows[0], strict=False))["same-size copy"]
    assert cell == f"{100 * 2.0 / bench.ours_time(e):.0f}%"
    assert "same-size copy" not in bench.suite_rows(res, 4.2e12)[0]
    out = tmp_path / "r"
    write_fake(out)
    bench.write_json(out / "BENCH.json", {**HEADER, "copy_curve": curve})
    bench.render(out)
    md = (out / "BENCH.md").read_text()
    assert "same-size copy: median (max)" in md and "copy curve (the same-size" in md


def test_plot_spec_picks_x_panels_and_fixed():
    labels = [{"dtype": d, "B": b, "K": k, "V": v} for d in ("bf16", "f32")
              for v in (1, 2, 3) for k in (1, 3) for b in (1, 2, 4)]
    spec = bench.plot_spec(labels)
    assert spec["x"] == "B" and spec["panel"] == "V"
    assert spec["fixed"] == {"dtype": "bf16", "K": 1}
    spec = bench.plot_spec(labels, {"plot": {"fixed": {"K": 3}, "panel": None}})
    assert spec["panel"] is None and spec["fixed"]["K"] == 3 and "V" in spec["fixed"]
    spec = bench.plot_spec([{"pairs": p, "pair_bytes": n} for p in (1, 4)
                            for n in (64, 1024, 4096)])
    assert spec["x"] == "pair_bytes" and spec["panel"] == "pairs"


def test_render_tables_plots_and_readme(tmp_path):
    out = tmp_path / "results" / "h200"
    write_fake(out)
    bench.render(out)
    md = (out / "BENCH.md").read_text()
    assert "NVIDIA H200" in md and "132 SMs" in md and "4.200 TB/s" in md
    assert "## Headline" in md and "| argmax" in md
    assert "bench-argmax.png" in md and "RuntimeError: boom" in md
    assert "Stopped by the time cap" in md
    suite_md = (out / "bench-argmax.md").read_text()
    head = [c.strip() for c in suite_md.splitlines()[6].split("|")[1:-1]]
    assert head[:4] == ["dtype", "R", "V", "ours us"], head
    assert "x vs torch graph" in head and "copy-BW" in head and "tuned vs heuristic" in head
    assert "1.25x" in suite_md and "same config" in suite_md   # tuned vs heuristic cells
    for name in ("argmax", "other"):
        png = out / f"bench-{name}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{bench.HEADLINE_START}\nold\n{bench.HEADLINE_END}\nrest\n")
    assert bench.update_readme(readme, out)
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro") and text.rstrip().endswith("rest")
    assert "(results/h200/bench-argmax.png)" in text and "| argmax" in text
    assert bench.main(["--render", str(out), "--readme", str(readme)]) == 0


def test_headline_numbers():
    res = fake_suite()
    head, rows = bench.headline_rows([res], HEADER["copy_bandwidth_Bps"])
    row = dict(zip(head, rows[0], strict=False))
    assert row["cases"] == "16"
    ratios = [e["timings"]["torch graph"]["p50"] / bench.ours_time(e) for e in res["cases"]]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert row["x vs torch graph: geomean (min-max)"].startswith(f"{geo:.2f}x")
    assert "1.25x geomean over 4 cases (8 tuned)" == row["tuned vs heuristic"]
    assert bench.noise(res["cases"][0]) == pytest.approx(0.02)


def test_cpu_functional_check_end_to_end(tmp_path, device):
    if device.type != "cpu":
        pytest.skip("the CPU functional check")
    out = tmp_path / "cpu"
    assert bench.main(["--out", str(out), "--recipe", "argmax"]) == 0
    data = json.loads((out / "bench-argmax.json").read_text())
    assert data["preset"] == "smoke" and data["cases"]
    case = data["cases"][0]
    assert set(case["timings"]) >= {"ours", "torch eager", "torch graph"}
    assert not case["errors"]
    assert (out / "BENCH.md").exists() and (out / "bench-argmax.png").exists()
    assert bench.main(["--recipe", "nope"]) == 2


def test_overhead_report(device):
    from autotune.registry import benches, load_recipes

    load_recipes()
    suites = {k: v for k, v in benches().items() if k == "argmax"}
    ov = bench.measure_overhead(suites, device, calls=2, log=lambda *a: None)
    row = ov["rows"][0]
    assert row["suite"] == "argmax" and "error" not in row, row
    assert row["ours_python_us"] > 0 and row["torch_host_us"] > 0
    ov["header"] = {**HEADER, "device_type": device.type}
    text = bench.overhead_md(ov)
    assert "| argmax" in text and "of which our Python" in text


def test_overhead_rerun_of_some_suites_keeps_the_others():
    def report(date, gpu, suites):
        rows = [{"suite": n, "label": {"B": 1}, "ours_host_us": 40.0, "ours_python_us": 20.0,
                 "ours_sync_us": 50.0} for n in suites]
        return {"header": {**HEADER, "gpu": gpu, "date": date}, "rows": rows,
                "bare_triton_launch_us": 12.0, "calls": 200}

    old = report("day 1", "NVIDIA H200", ["argmax", "draft_tail", "relay"])
    new = report("day 2", "NVIDIA H200", ["draft_tail"])
    merged = bench.merge_overhead(old, new)
    assert [(r["suite"], r["date"]) for r in merged["rows"]] == [
        ("argmax", "day 1"), ("draft_tail", "day 2"), ("relay", "day 1")]
    assert merged["header"]["date"] == "day 2"
    text = bench.overhead_md(merged)
    assert "| measured" in text and "day 1" in text and "day 2" in text
    other_gpu = bench.merge_overhead(report("day 1", "NVIDIA A100", ["argmax"]), new)
    assert [r["suite"] for r in other_gpu["rows"]] == ["draft_tail"]
    assert "measured" not in bench.overhead_md(other_gpu)     # one run: no date column
    assert [r["suite"] for r in bench.merge_overhead(None, new)["rows"]] == ["draft_tail"]


def test_no_launch_skips_kernels(device):
    import recipes

    x = torch.randn(3, 500, device=device)
    out = torch.full((3,), -5, dtype=torch.int64, device=device)
    with bench._NoLaunch():
        recipes.argmax(x, out=out)
    assert out.tolist() == [-5, -5, -5]              # nothing was launched
    recipes.argmax(x, out=out)
    assert out.tolist() == torch.argmax(x, 1).tolist()


def test_dispatch_resolve_cache_trace_and_heuristic_only(tmp_path, monkeypatch):
    calls = []

    def heur(key, device):
        calls.append(key)
        return {"A": key["n"]}

    cpu = torch.device("cpu")
    dispatch.clear_cache()
    a = dispatch.resolve("demo", {"n": 3}, heur, cpu)
    b = dispatch.resolve("demo", {"n": 3}, heur, cpu)
    assert a == b == {"A": 3} and len(calls) == 1            # cached
    dispatch.resolve("demo", {"n": 4}, heur, cpu)
    assert len(calls) == 2
    with dispatch.trace_configs() as tr:
        dispatch.resolve("demo", {"n": 3}, heur, cpu)
    assert tr == [("demo", {"n": 3}, None)] and len(calls) == 3   # tracing bypasses cache
    # a tuned table on a (pretend) GPU: lookup wins unless heuristic_only
    monkeypatch.setattr(dispatch, "lookup", lambda r, k, d: {"A": 99})
    dispatch.clear_cache()
    assert dispatch.resolve("demo", {"n": 3}, heur, cpu) == {"A": 99}
    with dispatch.heuristic_only():
        assert dispatch.resolve("demo", {"n": 3}, heur, cpu) == {"A": 3}
    with dispatch.trace_configs() as tr:
        dispatch.resolve("demo", {"n": 5}, heur, cpu)
    assert tr == [("demo", {"n": 5}, {"A": 99})]
    dispatch.clear_cache()


def test_make_states_clones_only_exact_layouts(device):
    from autotune.registry import BenchCase

    made = []

    def make_plain(dev, seed):
        made.append(seed)
        x = torch.randn(4, 6, device=dev)
        return {"x": x, "pair": (x.sum(0), None), "n": 3}

    def make_view(dev, seed):
        made.append(seed)
        x = torch.randn(4, 8, device=dev)
        return {"x": x[:, :6]}

    made.clear()
    st = bench.make_states(BenchCase({}, make_plain, {}, 0), device, 7, 3)
    assert made == [7] and len(st) == 3
    assert st[1]["x"].data_ptr() != st[0]["x"].data_ptr()
    assert torch.equal(st[2]["x"], st[0]["x"]) and st[2]["n"] == 3
    made.clear()
    st = bench.make_states(BenchCase({}, make_view, {}, 0), device, 7, 3)
    assert made == [7, 8, 9] and st[1]["x"].stride() == (8, 1)


def test_a_suite_from_an_earlier_run_says_so(tmp_path):
    out = tmp_path / "r"
    write_fake(out)
    old = fake_suite()
    old["date"], old["command"] = "2024-12-31 00:00 UTC", "python -m autotune bench"
    bench.write_json(out / "bench-argmax.json", old)
    bench.render(out)
    md = (out / "BENCH.md").read_text()
    assert "Measured by an earlier run: 2024-12-31 00:00 UTC" in md
    same = fake_suite()
    same["date"] = HEADER["date"]
    bench.write_json(out / "bench-argmax.json", same)
    bench.render(out)
    assert "Measured by an earlier run" not in (out / "BENCH.md").read_text()
