"""autotune.bench: the report (tables, plots, README block) from synthetic results, the
CPU functional check end to end (partial runs keep the other suites), the overhead
report, the compat suite's peers, and the dispatch hooks the benchmark uses
(heuristic_only, trace_configs, the resolve cache)."""
import json
import math

import pytest
import torch

from autotune import bench
from autotune.bench import overhead, readme, report, results, run
from recipes import _configs as dispatch


def fake_suite(name="argmax", complete=True):
    """An argmax-like suite: dtype x V x R, graph ours/torch graph, eager torch."""
    cases = []
    for dt in ("bfloat16", "float32"):
        es = 2 if dt == "bfloat16" else 4
        for V in (32000, 151936):
            for R in (1, 4, 32, 256):
                nbytes = R * V * es
                ours = 3.0 + nbytes / 3.5e6
                t = {"ours": ours, results.REPEAT: ours * 1.02,
                     results.BACK_TO_BACK: ours * 0.8, "torch eager": ours * 3 + 8,
                     "torch graph": ours * 2}
                tuned = "none"
                if R == 4:
                    tuned = "differs"
                    t[results.HEURISTIC] = ours * 1.25
                elif R == 32:
                    tuned = "same"
                cases.append({
                    "index": len(cases), "label": {"dtype": dt, "R": R, "V": V},
                    "bytes": nbytes, "errors": {}, "tuned": tuned,
                    "timings": {k: {"p20": v * 0.98, "p50": v, "p80": v * 1.03,
                                    "samples": 30,
                                    "mode": "eager" if k == "torch eager" else
                                    "graph" if k == results.BACK_TO_BACK else "behind"}
                                for k, v in t.items()}})
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
    results.write_json(out / "BENCH.json", HEADER)
    results.write_json(out / "bench-argmax.json", fake_suite())
    other = fake_suite("other", complete=False)
    for c in other["cases"]:                       # a suite without a B/R field
        c["label"] = {"pairs": c["label"]["R"], "pair_bytes": c["label"]["V"]}
    results.write_json(out / "bench-other.json", other)


def test_copy_curve_interpolation_and_same_size_column(tmp_path):
    curve = [[1 << 15, 1.0], [1 << 16, 2.0], [1 << 17, 8.0]]
    assert results.copy_time_at(curve, 1 << 10) == 1.0             # below: the first time
    assert results.copy_time_at(curve, 1 << 16) == pytest.approx(2.0)
    assert results.copy_time_at(curve, 3 << 15) == pytest.approx(2.0 * 4 ** math.log2(1.5))
    assert results.copy_time_at(curve, 1 << 18) == pytest.approx(16.0)   # above: bandwidth
    assert results.copy_time_at(None, 1 << 16) is None and results.copy_time_at(curve, 0) is None
    res = fake_suite()
    e = res["cases"][0]
    curve = [[e["bytes"] // 2, 1.0], [e["bytes"] * 2, 4.0]]   # a copy of e's bytes: 2 us
    head, rows = report.suite_rows(res, HEADER["copy_bandwidth_Bps"], curve)
    cell = dict(zip(head, rows[0], strict=False))["same-size copy"]
    assert cell == f"{100 * 2.0 / results.ours_time(e):.0f}%"
    assert "same-size copy" not in report.suite_rows(res, 4.2e12)[0]
    out = tmp_path / "r"
    write_fake(out)
    results.write_json(out / "BENCH.json", {**HEADER, "copy_curve": curve})
    report.render(out)
    md = (out / "BENCH.md").read_text()
    assert "same-size copy: median (max)" in md and "copy curve (the same-size" in md


def test_plot_spec_picks_x_panels_and_fixed():
    labels = [{"dtype": d, "B": b, "K": k, "V": v} for d in ("bf16", "f32")
              for v in (1, 2, 3) for k in (1, 3) for b in (1, 2, 4)]
    spec = results.plot_spec(labels)
    assert spec["x"] == "B" and spec["panel"] == "V"
    assert spec["fixed"] == {"dtype": "bf16", "K": 1}
    spec = results.plot_spec(labels, {"plot": {"fixed": {"K": 3}, "panel": None}})
    assert spec["panel"] is None and spec["fixed"]["K"] == 3 and "V" in spec["fixed"]
    spec = results.plot_spec([{"pairs": p, "pair_bytes": n} for p in (1, 4)
                            for n in (64, 1024, 4096)])
    assert spec["x"] == "pair_bytes" and spec["panel"] == "pairs"


def test_render_tables_plots_and_readme(tmp_path):
    out = tmp_path / "results" / "h200"
    write_fake(out)
    report.render(out)
    md = (out / "BENCH.md").read_text()
    assert "NVIDIA H200" in md and "132 SMs" in md and "4.200 TB/s" in md
    assert "## Headline" in md and "| argmax" in md
    assert "bench-argmax.png" in md and "RuntimeError: boom" in md
    assert "Stopped by the time cap" in md
    suite_md = (out / "bench-argmax.md").read_text()
    head = [c.strip() for c in next(x for x in suite_md.splitlines()
                                    if x.startswith("| dtype")).split("|")[1:-1]]
    assert head[:4] == ["dtype", "R", "V", "ours us"], head
    assert "x vs torch graph" in head and "copy-BW" in head and "tuned vs heuristic" in head
    assert "1.25x" in suite_md and "same config" in suite_md   # tuned vs heuristic cells
    for name in ("argmax", "other"):
        png = out / f"bench-{name}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert head[4:7] == ["noise", "ours back to back us", "torch eager us"], head
    assert "Timed by an earlier bench" not in md

    page = tmp_path / "README.md"
    page.write_text(f"intro\n{readme.HEADLINE_START}\nold\n{readme.HEADLINE_END}\nrest\n")
    assert readme.update_readme(page, out)
    text = page.read_text()
    assert "old" not in text and text.startswith("intro") and text.rstrip().endswith("rest")
    assert "(results/h200/bench-argmax.png)" in text and "| argmax" in text
    assert "* : a suite timed by an earlier bench" not in text      # none is marked
    # the plotted suite is the one whose extra says so, not a name the bench knows
    other = results.read_json(out / "bench-other.json")
    results.write_json(out / "bench-other.json", {**other, "extra": {"readme": True}})
    assert readme.update_readme(page, out)
    assert "(results/h200/bench-other.png)" in page.read_text()
    assert bench.main(["--render", str(out), "--readme", str(page)]) == 0


def test_a_run_from_before_the_primary_timing_reads_as_back_to_back(tmp_path):
    res = fake_suite()
    for e in res["cases"]:
        del e["timings"][results.BACK_TO_BACK]
        for t in e["timings"].values():
            t["mode"] = "eager" if t["mode"] == "eager" else "graph"
    e = res["cases"][0]
    assert results.primary_regime(res) == "graph"
    assert results.back_to_back_time(e) == results.ours_time(e)
    assert "ours back to back us" not in report.suite_rows(res, 4.2e12)[0]
    out = tmp_path / "r"
    write_fake(out)
    results.write_json(out / "bench-argmax.json", res)
    report.render(out)
    assert report.BACK_TO_BACK_NOTE in (out / "bench-argmax.md").read_text()
    page = tmp_path / "README.md"
    page.write_text(f"{readme.HEADLINE_START}\n{readme.HEADLINE_END}\n")
    assert readme.update_readme(page, out)
    text = page.read_text()
    assert "| argmax *" in text and "* : a suite timed by an earlier bench" in text


def test_plot_slice_of_a_suite_of_several_ops():
    """Fixed fields constrain only the cases that have them: a verify op with N and two
    draft ops without it share the plot's B axis, one panel an op."""
    labels = [{"op": "verify", "dtype": "bf16", "B": b, "N": n, "V": 151936}
              for b in (1, 8) for n in (2, 4)]
    labels += [{"op": op, "dtype": "bf16", "B": b, "V": v, **({"H": 4096} if h else {})}
               for op, h in (("extend", 1), ("topk1", 0)) for b in (1, 8)
               for v in (32000, 151936)]
    spec = results.plot_spec(labels, {"plot": {"x": "B", "panel": "op",
                                               "fixed": {"N": 4, "V": 151936}}})
    shown = [lab for lab in labels if results.in_slice(lab, spec)]
    assert sorted({(lab["op"], lab["B"]) for lab in shown}) == [
        ("extend", 1), ("extend", 8), ("topk1", 1), ("topk1", 8), ("verify", 1),
        ("verify", 8)]
    assert len(shown) == 6 and all(lab["V"] == 151936 for lab in shown)
    assert all(lab.get("N", 4) == 4 for lab in shown)


def test_headline_numbers():
    res = fake_suite()
    head, rows = report.headline_rows([res], HEADER["copy_bandwidth_Bps"])
    row = dict(zip(head, rows[0], strict=False))
    assert row["cases"] == "16"
    ratios = [e["timings"]["torch graph"]["p50"] / results.ours_time(e) for e in res["cases"]]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert row["x vs torch graph: geomean (min-max)"].startswith(f"{geo:.2f}x")
    assert "1.25x geomean over 4 cases (8 tuned)" == row["tuned vs heuristic"]
    assert results.noise(res["cases"][0]) == pytest.approx(0.02)


def test_cpu_functional_check_end_to_end(tmp_path, device):
    """The smoke run writes each suite as it finishes; a later run over another suite
    keeps it, and a run the time cap leaves no time for overwrites nothing."""
    if device.type != "cpu":
        pytest.skip("the CPU functional check")
    out = tmp_path / "cpu"
    assert bench.main(["--out", str(out), "--suite", "argmax"]) == 0
    data = json.loads((out / "bench-argmax.json").read_text())
    assert data["preset"] == "smoke" and data["cases"]
    case = data["cases"][0]
    assert set(case["timings"]) >= {"ours", "torch eager", "torch graph"}
    assert not case["errors"]
    assert (out / "BENCH.md").exists() and (out / "bench-argmax.png").exists()
    before = (out / "bench-argmax.json").read_text()
    assert bench.main(["--out", str(out), "--recipe", "copy_inputs"]) == 0
    assert json.loads((out / "BENCH.json").read_text())["suites"] == ["argmax",
                                                                     "copy_inputs"]
    assert (out / "bench-argmax.json").read_text() == before
    assert "| copy_inputs" in (out / "BENCH.md").read_text()
    assert bench.main(["--out", str(out), "--suite", "argmax", "--max-seconds", "0"]) == 0
    assert (out / "bench-argmax.json").read_text() == before
    assert bench.main(["--suite", "nope"]) == 2


def test_overhead_report(device):
    from autotune.registry import benches, load_recipes

    load_recipes()
    suites = {k: v for k, v in benches().items() if k == "argmax"}
    ov = overhead.measure_overhead(suites, device, calls=2, log=lambda *a: None)
    row = ov["rows"][0]
    assert row["suite"] == "argmax" and "error" not in row, row
    assert row["ours_python_us"] > 0 and row["torch_host_us"] > 0
    ov["header"] = {**HEADER, "device_type": device.type}
    text = report.overhead_md(ov)
    assert "| argmax" in text and "of which our Python" in text


def test_overhead_rerun_of_some_suites_keeps_the_others():
    def overhead_of(date, gpu, suites):
        rows = [{"suite": n, "label": {"B": 1}, "ours_host_us": 40.0, "ours_python_us": 20.0,
                 "ours_sync_us": 50.0} for n in suites]
        return {"header": {**HEADER, "gpu": gpu, "date": date}, "rows": rows,
                "bare_triton_launch_us": 12.0, "calls": 200}

    old = overhead_of("day 1", "NVIDIA H200", ["argmax", "draft_tail", "relay"])
    new = overhead_of("day 2", "NVIDIA H200", ["draft_tail"])
    merged = overhead.merge_overhead(old, new)
    assert [(r["suite"], r["date"]) for r in merged["rows"]] == [
        ("argmax", "day 1"), ("draft_tail", "day 2"), ("relay", "day 1")]
    assert merged["header"]["date"] == "day 2"
    text = report.overhead_md(merged)
    assert "| measured" in text and "day 1" in text and "day 2" in text
    other_gpu = overhead.merge_overhead(overhead_of("day 1", "NVIDIA A100", ["argmax"]), new)
    assert [r["suite"] for r in other_gpu["rows"]] == ["draft_tail"]
    assert "measured" not in report.overhead_md(other_gpu)     # one run: no date column
    assert [r["suite"] for r in overhead.merge_overhead(None, new)["rows"]] == ["draft_tail"]


def test_no_launch_skips_kernels(device):
    import recipes

    x = torch.randn(3, 500, device=device)
    out = torch.full((3,), -5, dtype=torch.int64, device=device)
    with overhead.NoLaunch():
        recipes.argmax(x, out=out)
    assert out.tolist() == [-5, -5, -5]              # nothing was launched
    recipes.argmax(x, out=out)
    assert out.tolist() == torch.argmax(x, 1).tolist()


def test_dispatch_resolve_cache_trace_and_heuristic_only(tmp_path, monkeypatch):
    calls = []

    def heur(key, device):
        calls.append(key)
        return {"A": key["n"]}

    from recipes._tuning import Tuning

    demo = Tuning(name="demo", space={"A": (3, 4, 5, 99)}, heuristic=heur)
    cpu = torch.device("cpu")
    dispatch.clear_cache()
    a = dispatch.resolve(demo, {"n": 3}, cpu)
    b = dispatch.resolve(demo, {"n": 3}, cpu)
    assert a == b == {"A": 3} and len(calls) == 1            # cached
    dispatch.resolve(demo, {"n": 4}, cpu)
    assert len(calls) == 2
    with dispatch.trace_configs() as tr:
        dispatch.resolve(demo, {"n": 3}, cpu)
    assert tr == [("demo", {"n": 3}, None)] and len(calls) == 3   # tracing bypasses cache
    # a tuned table on a (pretend) GPU: lookup wins unless heuristic_only
    asked = []
    monkeypatch.setattr(dispatch, "lookup",
                        lambda r, k, d, h: asked.append(h) or {"A": 99})
    dispatch.clear_cache()
    assert dispatch.resolve(demo, {"n": 3}, cpu) == {"A": 99}
    assert asked == [{"A": 3}]           # the lookup knows the heuristic's config there
    with dispatch.heuristic_only():
        assert dispatch.resolve(demo, {"n": 3}, cpu) == {"A": 3}
    with dispatch.trace_configs() as tr:
        dispatch.resolve(demo, {"n": 5}, cpu)
    assert tr == [("demo", {"n": 5}, {"A": 99})]
    dispatch.clear_cache()


def test_make_states_clones_only_exact_layouts(device):
    from autotune.declare import BenchCase

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
    st = run.make_states(BenchCase({}, make_plain, {}, 0), device, 7, 3)
    assert made == [7] and len(st) == 3
    assert st[1]["x"].data_ptr() != st[0]["x"].data_ptr()
    assert torch.equal(st[2]["x"], st[0]["x"]) and st[2]["n"] == 3
    made.clear()
    st = run.make_states(BenchCase({}, make_view, {}, 0), device, 7, 3)
    assert made == [7, 8, 9] and st[1]["x"].stride() == (8, 1)


def test_a_suite_from_another_run_says_so(tmp_path):
    out = tmp_path / "r"
    write_fake(out)
    old = fake_suite()
    old["date"], old["command"] = "2024-12-31 00:00 UTC", "python -m autotune bench"
    results.write_json(out / "bench-argmax.json", old)
    report.render(out)
    md = (out / "BENCH.md").read_text()
    assert "Measured by an earlier run: 2024-12-31 00:00 UTC" in md
    old["date"] = "2099-01-01 00:00 UTC"        # a suite re-run after the page's run
    results.write_json(out / "bench-argmax.json", old)
    report.render(out)
    assert "Measured by a later run: 2099-01-01 00:00 UTC" in (out / "BENCH.md").read_text()
    same = fake_suite()
    same["date"] = HEADER["date"]
    results.write_json(out / "bench-argmax.json", same)
    report.render(out)
    assert "Measured by an earlier run" not in (out / "BENCH.md").read_text()


def test_compat_suite_peer_computes_what_the_adapters_do(device):
    """The compat suite's torch peer and chain_verify variant against the adapters, bit for
    bit, outputs and in-place updates (a peer computing something else would make its
    column meaningless)."""
    from autotune.suites.compat_sglang import SUITES
    from tests.helpers import assert_equal

    cases = SUITES[0].cases("smoke")
    assert {c.label["op"] for c in cases} == {"target_verify", "draft_extend", "draft_topk1"}
    for case in cases:
        mine, peer = case.make(device, 3), case.make(device, 3)
        got = case.variants["ours"].fn(mine)
        want = case.variants["torch graph"].fn(peer)
        what = case.label["op"]
        assert len(want) <= len(got)
        for k, w in enumerate(want):
            assert_equal(got[k], w, f"{what} output {k}")
        assert all(t is None for t in got[len(want):])
        for name in ("positions", "draft_tokens"):
            if name in mine:
                assert_equal(mine[name], peer[name], f"{what} {name}")
        if "ours: chain_verify" in case.variants:
            r = case.variants["ours: chain_verify"].fn(mine)
            assert_equal(r.bonus, got.bonus_tokens, "chain_verify bonus")
            assert_equal(r.accept_len, got.num_correct_drafts, "chain_verify accept_len")


def _case(label, ours, nbytes, **more):
    timings = {"ours": {"p50": ours, "mode": "behind"},
               results.REPEAT: {"p50": ours * 1.01, "mode": "behind"}}
    for name, us in more.items():
        timings[name] = {"p50": us, "mode": "graph" if name == results.BACK_TO_BACK
                         else "behind"}
    return {"label": label, "bytes": nbytes, "timings": timings, "errors": {},
            "tuned": "differs" if results.HEURISTIC in more else "none"}


def test_targets_from_synthetic_results(tmp_path):
    """targets.json: ids and verdicts from the bench files, the SGLang reference and the
    tune files; missing inputs and back-to-back-only files give null with a reason."""
    from autotune import targets

    root = tmp_path / "gpu"
    root.mkdir()
    assert all(r["met"] is None and r["reason"] for r in targets.compute(root))
    ref = {"target_verify": [{"dtype": "bfloat16", "B": 1, "N": 4, "V": 151936, "us": 4.19},
                             {"dtype": "bfloat16", "B": 256, "N": 4, "V": 151936,
                              "us": 98.03}],
           "draft_extend": [{"dtype": "bfloat16", "B": 1, "V": 32000, "H": 4096,
                             "us": 3.11}],
           "draft_topk1": [{"dtype": "bfloat16", "B": 1, "V": 32000, "us": 3.13}]}
    results.write_json(root / "sglang-reference.json", ref)
    results.write_json(root / "BENCH.json", HEADER)
    big = 256 * 4 * 151936 * 2
    compat = {"suite": "compat_sglang", "cases": [
        _case({"op": "target_verify", "dtype": "bfloat16", "B": 1, "N": 4, "V": 151936},
              2.7, 1 << 20, **{results.BACK_TO_BACK: 2.1}),
        # slower than 98.03 / 1.3 but at 95% of the copy bandwidth: met
        _case({"op": "target_verify", "dtype": "bfloat16", "B": 256, "N": 4, "V": 151936},
              big / (0.95 * HEADER["copy_bandwidth_Bps"]) * 1e6, big + 4096),
        _case({"op": "draft_extend", "dtype": "bfloat16", "B": 1, "V": 32000, "H": 4096},
              2.0, 1 << 16),
        _case({"op": "draft_topk1", "dtype": "bfloat16", "B": 1, "V": 32000}, 2.5, 1 << 16,
              **{results.HEURISTIC: 2.0})]}
    results.write_json(root / "bench-compat_sglang.json", compat)
    old = {"suite": "chain_verify", "cases": [
        {"label": {"dtype": "bfloat16", "B": 1, "K": 3, "V": 151936}, "bytes": 1 << 20,
         "errors": {}, "timings": {"ours": {"p50": 1.9, "mode": "graph"}}}]}
    results.write_json(root / "bench-chain_verify.json", old)
    results.write_json(root / "tune-report.json", {"wall_s": 431.0, "fresh": True, "keys": [
        {"recipe": "argmax", "key": {"R": 1}, "admitted": 96, "measured": 50},
        {"recipe": "relay", "key": {"B": 1}, "admitted": 40, "measured": 12}]})
    assert targets.main([str(root)]) == 0
    rows = {r["id"]: r for r in targets.rows_of(results.read_json(root / "targets.json"))}
    assert set(rows) >= {"dropin.verify_b1", "dropin.verify_all", "dropin.draft_all",
                         "verify.greedy_b1", "verify.sampled_b1", "tune.wall",
                         "tune.coverage", "tune.quality", "tune.never_slower",
                         "tune.geomean"}
    for r in rows.values():
        assert set(r) >= {"id", "what", "target", "measured", "unit", "met"}
        assert r["met"] is not None or r["reason"]
    assert rows["dropin.verify_b1"]["met"] is True and rows["dropin.verify_b1"]["measured"] == 2.7
    assert rows["dropin.verify_all"]["met"] is True and rows["dropin.verify_all"]["measured"] == 2
    assert rows["dropin.draft_all"]["met"] is False          # topk1: 2.5 > 3.13 / 1.3
    assert "draft_topk1" in rows["dropin.draft_all"]["detail"]
    assert rows["verify.greedy_b1"]["met"] is None            # timed back to back only
    assert "earlier bench" in rows["verify.greedy_b1"]["reason"]
    assert rows["tune.wall"]["met"] is True and rows["tune.wall"]["measured"] == 431.0
    assert rows["tune.coverage"]["met"] is False and rows["tune.coverage"]["measured"] == 30.0
    assert "relay B=1: 12 of 40" in rows["tune.coverage"]["detail"]
    assert "argmax" not in rows["tune.coverage"]["detail"]    # 50 of 96: over half
    assert rows["tune.quality"]["met"] is None                # no tuner-quality.json
    assert rows["tune.never_slower"]["met"] is False          # 2.5 vs 2.0 us: 25% slower
    results.write_json(root / "tune-report.json", {"wall_s": 100.0, "fresh": False})
    rows = {r["id"]: r for r in targets.compute(root)}
    assert rows["tune.wall"]["met"] is None and "fresh" in rows["tune.wall"]["reason"]


def test_compare_keeps_only_cases_whose_config_is_the_same(tmp_path):
    """`autotune.bench.compare`: new / base per batch class, over the heuristic-config
    variant, over ours where every tuned config is unchanged and over ours where neither
    run used a table entry; a suite from the same run on both sides is not compared."""
    from autotune.bench import compare

    def suite(scale, moved_cfg, date):
        s = fake_suite()
        s["date"] = date
        for c in s["cases"]:
            for t in c["timings"].values():
                t["p50"] *= scale
            cfg = {"BLOCK_V": 4096 if (moved_cfg and c["label"]["R"] == 256) else 2048}
            c["configs"] = [{"recipe": "argmax", "key": c["label"], "tuned": cfg,
                             "heuristic": {"BLOCK_V": 1024}}]
            if c["label"]["V"] == 32000 and c["label"]["R"] == 1:
                c["configs"] = []                          # no table entry used
        return s

    base, new = tmp_path / "base", tmp_path / "new"
    for d, s in ((base, suite(1.0, False, "d1")), (new, suite(0.9, True, "d2"))):
        d.mkdir()
        results.write_json(d / "BENCH.json", HEADER)
        results.write_json(d / "bench-argmax.json", s)
        same = fake_suite("other")
        same["date"] = "d0"
        results.write_json(d / "bench-other.json", same)
    rows = compare.case_ratios(results.read_json(base / "bench-argmax.json"),
                               results.read_json(new / "bench-argmax.json"))
    tuned = [r for r in rows if r[0] == "same tuned config"]
    assert {r[2]["R"] for r in tuned} == {1, 4, 32}          # R=256 changed config
    assert {(r[2]["V"], r[2]["R"]) for r in rows if r[0] == "no table entry"} == {(32000, 1)}
    assert all(abs(n / o - 0.9) < 1e-9 for _, _, _, o, n in rows)
    assert {r[2]["R"] for r in rows if r[0] == "heuristic config"} == {4}
    assert {compare.batch_class({"R": r}) for r in (1, 8, 16, 32, 64)} == {
        "B <= 8", "B 16-32", "B >= 64"}
    text = compare.report(base, new)
    assert "argmax                 same tuned config  B <= 8   geomean 0.900" in text
    assert "other                  the same run on both sides: not compared" in text


def test_compare_refuses_a_suite_not_in_both_runs(tmp_path, capsys):
    from autotune.bench import compare

    for d in ("base", "new"):
        write_fake(tmp_path / d)
    with pytest.raises(SystemExit) as e:
        compare.main([str(tmp_path / "base"), str(tmp_path / "new"), "--suite", "argmx"])
    assert e.value.code == 2
    assert "--suite: expected suites benched in both runs (argmax, other), got argmx" in (
        capsys.readouterr().err)
    assert compare.main([str(tmp_path / "base"), str(tmp_path / "new"),
                         "--suite", "argmax"]) == 0
