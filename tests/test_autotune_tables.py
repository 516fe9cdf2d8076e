"""Tuned tables: atomic writes, merging, and dispatch from them (nearest key, fallbacks)."""
import json
import os
import warnings

import pytest
import torch
from autotune_util import fake_fixture  # noqa: F401  (the `fake` fixture)

from autotune import dispatch, tables
from autotune.dispatch import key_distance, lookup, lookup_slug, nearest


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv(dispatch.RESULTS_ENV, str(tmp_path))
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def _entry(key, cfg, p50=1.0):
    return {"key": key, "config": cfg, "p20_us": p50, "p50_us": p50, "p80_us": p50}


def _write(root, slug, t, entries, **header):
    hdr = tables.build_header(t, torch.device("cpu"), slug)
    hdr.update({"interpreter": False, "gpu": "Test GPU"}, **header)
    data = {"format": tables.FORMAT, "recipe": t.name, "header": hdr, "entries": entries}
    tables.write_json_atomic(tables.table_path(root, slug, t.name), data)
    return data


K64 = {"dtype": "float32", "N": 64}
K256 = {"dtype": "float32", "N": 256}
C1 = {"BLOCK": 32, "W": 1, "S": 1}
C2 = {"BLOCK": 64, "W": 2, "S": 2}


def test_atomic_write_keeps_the_old_table_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "g" / "r.json"
    tables.write_json_atomic(path, {"entries": [], "v": 1})
    before = path.read_text()

    def boom(data):
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(tables, "dumps", boom)
    with pytest.raises(KeyboardInterrupt):
        tables.write_json_atomic(path, {"entries": [], "v": 2})
    assert path.read_text() == before
    assert [p.name for p in path.parent.iterdir()] == ["r.json"], "temporary file left"


def test_atomic_write_replaces_whole_file(tmp_path):
    path = tmp_path / "r.json"
    big = {"entries": [{"key": {"i": i}, "config": {"x": [1, 2, 3]}} for i in range(2000)]}
    tables.write_json_atomic(path, big)
    tables.write_json_atomic(path, {"entries": []})
    assert json.loads(path.read_text()) == {"entries": []}
    assert json.loads(tables.dumps({"a": [1, 2], "b": {"c": ["x", "y"]}})) == \
        {"a": [1, 2], "b": {"c": ["x", "y"]}}


def test_merge_keeps_other_keys_only_when_compatible(fake):
    hdr = tables.build_header(fake.SCALE, torch.device("cpu"), "s")
    old = {"header": dict(hdr), "entries": [_entry(K64, C1), _entry(K256, C1)]}
    entries, dropped = tables.merge_entries(old, hdr, [_entry(K256, C2)])
    assert [e["key"]["N"] for e in entries] == [64, 256] and dropped == 0
    assert entries[1]["config"] == C2
    stale = {"header": {**hdr, "source_hash": "0" * 16}, "entries": [_entry(K64, C1)]}
    entries, dropped = tables.merge_entries(stale, hdr, [_entry(K256, C2)])
    assert [e["key"]["N"] for e in entries] == [256] and dropped == 1


def test_key_distance_and_nearest():
    a = {"dtype": "bfloat16", "V": 32000, "R": 4}
    assert key_distance(a, a) == 0
    assert key_distance(a, {**a, "dtype": "float32"}) == float("inf")
    assert key_distance(a, {"dtype": "bfloat16", "V": 32000}) == float("inf")
    entries = [({**a, "R": 1}, "r1"), ({**a, "R": 32}, "r32"), ({**a, "R": 256}, "r256"),
               ({**a, "dtype": "float32"}, "f32")]
    assert nearest(entries, {**a, "R": 1}) == "r1"
    assert nearest(entries, {**a, "R": 3}) == "r1"
    assert nearest(entries, {**a, "R": 20}) == "r32"
    assert nearest(entries, {**a, "R": 400}) == "r256"
    assert nearest(entries, {**a, "R": 4096}) is None           # beyond a factor ~2
    assert nearest(entries, {**a, "R": 4096}, max_field=float("inf")) == "r256"
    assert nearest(entries, {**a, "R": 12}) is None             # 1 and 32 both too far
    assert nearest(entries, {**a, "dtype": "float16"}) is None


def test_dispatch_exact_then_nearest(results, fake):
    _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1), _entry(K256, C2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # a good table warns nothing
        assert lookup_slug("test-gpu", "fake_scale", K64) == C1
        assert lookup_slug("test-gpu", "fake_scale", K256) == C2
        assert lookup_slug("test-gpu", "fake_scale", {**K64, "N": 100}) == C1   # nearest
        assert lookup_slug("test-gpu", "fake_scale", {**K64, "N": 200}) == C2
        assert lookup_slug("test-gpu", "fake_scale", {**K64, "dtype": "float16"}) is None
        assert lookup_slug("other-gpu", "fake_scale", K64) is None              # no table
        # the table is read once per process
        os.unlink(tables.table_path(results, "test-gpu", "fake_scale"))
        assert lookup_slug("test-gpu", "fake_scale", K256) == C2
    # CPU tensors never dispatch from a table
    assert lookup("fake_scale", K64, torch.device("cpu")) is None


@pytest.mark.parametrize("damage", ["garbage", "no-entries", "bad-entry", "empty"])
def test_corrupt_table_warns_once_and_falls_back(results, fake, damage):
    path = tables.table_path(results, "test-gpu", "fake_scale")
    path.parent.mkdir(parents=True)
    path.write_text({"garbage": "{not json", "no-entries": '{"header": {}}',
                     "bad-entry": '{"entries": [{"key": 1}]}', "empty": ""}[damage])
    with pytest.warns(RuntimeWarning, match="ignoring the tuned table"):
        assert lookup_slug("test-gpu", "fake_scale", K64) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # only once
        assert lookup_slug("test-gpu", "fake_scale", K256) is None


def test_recipe_falls_back_to_heuristic_on_corrupt_table(results):
    """Through a real recipe: a damaged table never fails an import or a call."""
    import importlib

    from recipes import _common as C
    path = tables.table_path(results, "h200", "argmax")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2")
    key = {"dtype": "float32", "V": 100, "R": 2}
    heur = importlib.import_module("recipes.argmax").heuristic
    with pytest.warns(RuntimeWarning):
        assert dispatch.lookup_slug("h200", "argmax", key) is None
    assert C.pick_config("argmax", key, heur, torch.device("cpu")) == \
        heur(key, torch.device("cpu"))


def test_space_change_ignores_table_with_one_warning(results, fake):
    _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1)], space_hash="0123456789abcdef")
    with pytest.warns(RuntimeWarning, match="another search space"):
        assert lookup_slug("test-gpu", "fake_scale", K64) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lookup_slug("test-gpu", "fake_scale", K256) is None


def test_invalid_configs_are_dropped_with_one_warning(results, fake):
    bad_choice = {"BLOCK": 48, "W": 1, "S": 1}
    rejected = {"BLOCK": 256, "W": 1, "S": 1}             # constraint: BLOCK <= N = 64
    _write(results, "test-gpu", fake.SCALE,
           [_entry({**K64, "N": 60}, bad_choice), _entry(K64, rejected),
            _entry(K256, C2)])
    with pytest.warns(RuntimeWarning, match="2 of 3 entries"):
        got = lookup_slug("test-gpu", "fake_scale", {**K64, "N": 200})
    assert got == C2                                      # the only valid entry is nearest


def test_interpreter_tables_are_not_used_on_a_gpu(results, fake):
    _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1)], interpreter=True)
    with pytest.warns(RuntimeWarning, match="Triton interpreter"):
        assert lookup_slug("test-gpu", "fake_scale", K64) is None


def test_header_fields(fake):
    h = tables.build_header(fake.SCALE, torch.device("cpu"), "cpu-interpreter")
    for f in ("gpu", "sm_count", "torch", "triton", "source_hash", "space_hash", "date",
              "interpreter", "label", "timing", "space"):
        assert f in h, f
    assert h["interpreter"] is True and "INTERPRETER" in h["label"]
    assert h["space_hash"] == fake.SCALE.space_hash()


def test_views_list_tables_only(results, fake):
    """`show` and `report` list the tuned tables of a folder, not the benchmark and
    quality reports next to them; a damaged table is reported as unreadable."""
    from autotune import views

    _write(results, "x", fake.SCALE, [_entry({"dtype": "float32", "N": 256},
                                             {"BLOCK": 64, "W": 2, "S": 1})])
    (results / "x" / "BENCH.json").write_text(json.dumps({"gpu": "Test GPU", "suites": []}))
    (results / "x" / "overhead.json").write_text(json.dumps({"rows": []}))
    (results / "x" / "broken.json").write_text("{not json")
    text = views.report_markdown(results, "x")
    assert "fake_scale" in text and "N=256" in text
    assert "BENCH" not in text and "overhead" not in text
    assert "broken" in text
