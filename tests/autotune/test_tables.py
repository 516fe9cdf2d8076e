"""Tuned tables: atomic writes, merging, and dispatch from them (nearest key, fallbacks)."""
import json
import os
import warnings

import pytest
import torch

from autotune import tables
from autotune.registry import tunables
from recipes import _configs as dispatch
from recipes._configs import Entry, inside_tuned, key_distance, lookup, lookup_slug, nearest
from recipes._tuning import key_str
from tests.autotune.autotune_util import fake_fixture  # noqa: F401  (the `fake` fixture)


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv(dispatch.RESULTS_ENV, str(tmp_path))
    dispatch.clear_cache()
    yield tmp_path
    dispatch.clear_cache()


def _entry(key, cfg, p50=1.0, no_slower_at=(), heuristic=None):
    e = {"key": key, "config": cfg, "p20_us": p50, "p50_us": p50, "p80_us": p50,
         "no_slower_at": list(no_slower_at)}
    if heuristic is not None:
        e["heuristic_config"] = heuristic
    return e


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
    for field in ("source_hash", "harness_hash"):      # other kernels, or other inputs
        stale = {"header": {**hdr, field: "0" * 16}, "entries": [_entry(K64, C1)]}
        entries, dropped = tables.merge_entries(stale, hdr, [_entry(K256, C2)])
        assert [e["key"]["N"] for e in entries] == [256] and dropped == 1, field


def test_key_distance_and_nearest():
    a = {"dtype": "bfloat16", "V": 32000, "R": 4}
    assert key_distance(a, a) == 0
    assert key_distance(a, {**a, "dtype": "float32"}) == float("inf")
    assert key_distance(a, {"dtype": "bfloat16", "V": 32000}) == float("inf")
    r1, r32, r256 = ({**a, "R": 1}, {**a, "R": 32}, {**a, "R": 256})
    ks = lambda *keys: frozenset(key_str(k) for k in keys)      # noqa: E731
    # r32's config held up at r1 and r256 too; r1's and r256's only at their own keys
    entries = [Entry(r1, "r1", ks()), Entry(r32, "r32", ks(r1, r256)),
               Entry(r256, "r256", ks()), Entry({**a, "dtype": "float32"}, "f32", ks())]
    assert nearest(entries, r1) == "r1"                        # exact: always its own
    assert nearest(entries, {**a, "R": 3}) is None             # r1 alone near; not lent
    assert nearest(entries, {**a, "R": 20}) is None            # r32 alone near; not lent
    assert nearest(entries, {**a, "R": 400}) is None           # r256 never measured elsewhere
    assert nearest(entries, {**a, "R": 4096}) is None          # beyond a factor ~2
    assert nearest(entries, {**a, "R": 12}, max_field=float("inf")) == "r32"
    assert nearest(entries, {**a, "R": 4096}, max_field=float("inf")) is None  # beyond all
    assert nearest(entries, {**a, "R": 12}) is None            # 1 and 32 both too far
    assert nearest(entries, {**a, "dtype": "float16"}) is None
    # R=2 has two tuned keys near it (R=1, R=4): a config is lent only where it was
    # measured no slower than the heuristic at the other one too
    entries.append(Entry(a, "r4", ks()))
    assert nearest(entries, {**a, "R": 2}) is None
    entries[0] = Entry(r1, "r1", ks(a))
    assert nearest(entries, {**a, "R": 2}) == "r1"


def test_nearest_interpolates_never_extrapolates():
    """A config is lent only to a key inside the span of the tuned keys of its kind in
    every numeric field: K = 4 lies beyond K = 3, the only K tuned, so even configs that
    held up at both neighbours are not lent there."""
    ks = lambda *keys: frozenset(key_str(k) for k in keys)      # noqa: E731
    r4, r8 = ({"dtype": "bfloat16", "R": 4, "K": 3}, {"dtype": "bfloat16", "R": 8, "K": 3})
    entries = [Entry(r4, "r4", ks(r8)), Entry(r8, "r8", ks(r4))]
    assert inside_tuned(entries, {**r4, "R": 6}) and nearest(entries, {**r4, "R": 6}) == "r8"
    for beyond in ({**r4, "R": 6, "K": 4}, {**r4, "R": 6, "K": 2}, {**r8, "R": 12}):
        assert not inside_tuned(entries, beyond) and nearest(entries, beyond) is None
    # another dtype's tuned keys do not widen the span
    entries.append(Entry({"dtype": "float32", "R": 6, "K": 7}, "f32", ks()))
    assert nearest(entries, {**r4, "R": 6, "K": 4}) is None


def test_a_config_is_lent_only_between_near_tuned_keys():
    """The span that makes a key "between tuned keys" is that of the keys near it: V =
    129280 lies between the tuned 32000 and 151936, but 32000 is too far to count, so
    with near keys on one side only (151936 at B = 1 and 2) nothing is lent, even a
    config that held up at both of them; V = 200000 between 151936 and 262144, both
    near, borrows."""
    ks = lambda *keys: frozenset(key_str(k) for k in keys)      # noqa: E731
    k = lambda V, B: {"dtype": "bfloat16", "V": V, "B": B}     # noqa: E731
    keys = [k(V, B) for V in (32000, 151936, 262144) for B in (1, 2)]
    entries = [Entry(key, f"{key['V']}/{key['B']}", ks(*[o for o in keys if o != key]))
               for key in keys]
    assert inside_tuned(entries, k(129280, 1))                 # within all tuned keys
    assert nearest(entries, k(129280, 1)) is None              # not within the near ones
    assert nearest(entries, k(200000, 1)) in ("151936/1", "262144/1")


def test_a_config_is_lent_only_where_the_heuristic_is_the_lenders():
    """The measurements behind a lent config compared it with the heuristic's config at
    the lender's key; where the heuristic picks another config, they say nothing about
    it, and the key runs its heuristic."""
    ks = lambda *keys: frozenset(key_str(k) for k in keys)      # noqa: E731
    r4, r8 = {"dtype": "bfloat16", "R": 4}, {"dtype": "bfloat16", "R": 8}
    h4, h8 = {"SPLIT": 32}, {"SPLIT": 16}
    entries = [Entry(r4, "r4", ks(r8), h4), Entry(r8, "r8", ks(r4), h8)]
    r6 = {**r4, "R": 6}
    assert nearest(entries, r6) == "r8"                          # no heuristic given
    assert nearest(entries, r6, heuristic=h8) == "r8"
    assert nearest(entries, r6, heuristic=h4) == "r4"            # the next nearest's
    assert nearest(entries, r6, heuristic={"SPLIT": 8}) is None  # neither's heuristic
    assert nearest(entries, r4, heuristic={"SPLIT": 8}) == "r4"  # exact: always its own
    old = [Entry(r4, "r4", ks(r8)), Entry(r8, "r8", ks(r4))]     # no heuristic recorded
    assert nearest(old, r6, heuristic=h8) is None


def test_dispatch_exact_then_nearest(results, fake):
    _write(results, "test-gpu", fake.SCALE,
           [_entry(K64, C1, no_slower_at=[K256]), _entry(K256, C2, no_slower_at=[K64])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # a good table warns nothing
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K64) == C1
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K256) == C2
        # N=128 lies within a factor 2 of both tuned keys, and each config held up at the
        # other key: the nearer one's is lent; N=100 and N=200 have one tuned key near
        assert lookup_slug("test-gpu", fake.SCALE.tuning, {**K64, "N": 128}) == C1
        assert lookup_slug("test-gpu", fake.SCALE.tuning, {**K64, "N": 100}) is None
        assert lookup_slug("test-gpu", fake.SCALE.tuning, {**K64, "N": 200}) is None
        assert lookup_slug("test-gpu", fake.SCALE.tuning, {**K64, "dtype": "float16"}) is None
        # the table is read once per process
        os.unlink(tables.table_path(results, "test-gpu", "fake_scale"))
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K256) == C2
    # CPU tensors never dispatch from a table
    assert lookup(fake.SCALE.tuning, K64, torch.device("cpu")) is None
    with pytest.warns(RuntimeWarning, match="no tuned tables for this GPU"):
        assert lookup_slug("other-gpu", fake.SCALE.tuning, K64) is None        # no table


@pytest.mark.parametrize("damage", ["garbage", "no-entries", "bad-entry", "empty"])
def test_corrupt_table_warns_once_and_falls_back(results, fake, damage):
    path = tables.table_path(results, "test-gpu", "fake_scale")
    path.parent.mkdir(parents=True)
    path.write_text({"garbage": "{not json", "no-entries": '{"header": {}}',
                     "bad-entry": '{"entries": [{"key": 1}]}', "empty": ""}[damage])
    with pytest.warns(RuntimeWarning, match="ignoring the tuned table"):
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K64) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # only once
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K256) is None


def test_recipe_falls_back_to_heuristic_on_corrupt_table(results):
    """Through a real recipe: a damaged table never fails an import or a call."""
    import importlib

    from recipes import _common as C
    path = tables.table_path(results, "h200", "argmax")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2")
    key = {"dtype": "float32", "V": 100, "R": 2}
    A = importlib.import_module("recipes.argmax")
    with pytest.warns(RuntimeWarning):
        assert dispatch.lookup_slug("h200", A.TUNING, key) is None
    assert C.pick_config(A.TUNING, key, torch.device("cpu")) == \
        A.heuristic(key, torch.device("cpu"))


def test_space_change_ignores_table_with_one_warning(results, fake):
    _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1)], space_hash="0123456789abcdef")
    with pytest.warns(RuntimeWarning, match="another search space"):
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K64) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K256) is None


def test_invalid_configs_are_dropped_with_one_warning(results, fake):
    bad_choice = {"BLOCK": 48, "W": 1, "S": 1}
    rejected = {"BLOCK": 256, "W": 1, "S": 1}             # constraint: BLOCK <= N = 64
    _write(results, "test-gpu", fake.SCALE,
           [_entry({**K64, "N": 60}, bad_choice), _entry(K64, rejected),
            _entry(K256, C2)])
    with pytest.warns(RuntimeWarning, match="2 of 3 entries"):
        got = lookup_slug("test-gpu", fake.SCALE.tuning, K256)
    assert got == C2                                      # the valid entry is kept


def test_interpreter_tables_are_not_used_on_a_gpu(results, fake):
    _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1)], interpreter=True)
    with pytest.warns(RuntimeWarning, match="Triton interpreter"):
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K64) is None


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
    (results / "x" / "targets.json").write_text(json.dumps([{"id": "tune.wall"}]))
    (results / "x" / "broken.json").write_text("{not json")
    text = views.report_markdown(results, "x")
    assert "fake_scale" in text and "N=256" in text
    assert "BENCH" not in text and "overhead" not in text and "targets" not in text
    assert "broken" in text


def test_tables_are_written_readable_by_all(tmp_path):
    """A table is for every user of the machine: the umask's mode, not mkstemp's 0600."""
    old = os.umask(0o022)
    try:
        tables.write_json_atomic(tmp_path / "t.json", {"entries": []})
    finally:
        os.umask(old)
    assert (tmp_path / "t.json").stat().st_mode & 0o777 == 0o644


def test_a_config_needs_its_recorded_gain_to_replace_the_heuristic():
    """A tuned config recorded less than MIN_GAIN faster than the heuristic at its own key
    is not used there nor lent (such gains do not survive another process's timing);
    entries without a recorded speedup (older tables) keep their config."""
    from recipes._configs import MIN_GAIN, gains_enough
    ks = lambda *keys: frozenset(key_str(k) for k in keys)      # noqa: E731
    r4, r8 = {"dtype": "bfloat16", "R": 4}, {"dtype": "bfloat16", "R": 8}
    h = {"SPLIT": 32}
    small, enough = 1.0 + MIN_GAIN / 2, 1.0 + MIN_GAIN
    weak = [Entry(r4, {"SPLIT": 8}, ks(r8), h, small),
            Entry(r8, {"SPLIT": 16}, ks(r4), h, small)]
    assert not gains_enough(weak[0])
    assert nearest(weak, r4, heuristic=h) is None                 # exact, but too small
    assert nearest(weak, {**r4, "R": 6}, heuristic=h) is None     # and never lent
    strong = [Entry(r4, {"SPLIT": 8}, ks(r8), h, enough), weak[1]]
    assert nearest(strong, r4, heuristic=h) == {"SPLIT": 8}
    assert nearest(strong, {**r4, "R": 6}, heuristic=h) == {"SPLIT": 8}
    assert gains_enough(Entry(r4, h, ks(), h, 0.99))              # the heuristic's own
    assert gains_enough(Entry(r4, {"SPLIT": 8}, ks(), h, None))   # no speedup recorded
    assert gains_enough(Entry(r4, {"SPLIT": 8}))                  # oldest format


def test_show_says_where_dispatch_runs_the_heuristic_instead():
    """An entry whose recorded gain is under MIN_GAIN is marked in `show`'s entry column."""
    from autotune.views import _entry_note
    h, c = {"BLOCK": 64}, {"BLOCK": 128}
    weak = {"key": {"N": 1}, "config": c, "heuristic_config": h, "chosen_from": "search",
            "speedup_vs_heuristic": 1.005}
    assert _entry_note(weak) == "search (gain < 2%: dispatch runs the heuristic)"
    assert _entry_note({**weak, "speedup_vs_heuristic": 1.05}) == "search"
    assert _entry_note({**weak, "config": h, "chosen_from": "heuristic"}) == "heuristic kept"


@pytest.mark.xfail(strict=False, reason=(
    "known gap: the tables of chain_verify, copy_inputs, draft_tail, verify_metadata and "
    "the three sglang_* launches predate this tree's launchers and await their GPU "
    "retune (tools/gpu_pass.sh retune); dispatch ignores them with one warning"))
def test_committed_tables_match_the_kernels_they_tune():
    """Every tuned table committed under results/<gpu>/ was tuned over the recipe's
    current search space and kernel source: a stale one is ignored by dispatch (with a
    warning), so its GPU would run heuristic configs while its benchmark files show the
    tuned ones. A kernel change must come with its recipe's retune."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "results"
    checked = 0
    for t in tunables().values():
        for path in sorted(root.glob(f"*/{t.name}.json")):
            if path.parent.name == dispatch.INTERPRETER_SLUG:
                continue
            header = json.loads(path.read_text())["header"]
            assert header.get("space_hash") == t.space_hash(), f"{path}: other search space"
            assert header.get("source_hash") == t.source_hash(), (
                f"{path}: tuned for other kernel source; re-run `python -m autotune tune "
                f"--recipe {t.name}` on its GPU")
            checked += 1
    assert checked >= 9, f"only {checked} committed tables found under {root}"


@pytest.mark.parametrize("name,slug", [
    ("NVIDIA H200", "h200"), ("NVIDIA H200 NVL", "h200"), ("H200 SXM", "h200"),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA B200", "b200"), ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
    ("  nvidia   Tesla   ", "tesla"), ("???", "gpu")])
def test_gpu_name_variants_share_a_slug(name, slug):
    assert dispatch.slug_of(name) == slug


def test_a_gpu_without_tables_warns_once_naming_make_tune(results, fake):
    """No table folder for the GPU anywhere: one warning for the whole process (not per
    recipe, not per call), naming `make tune`; a GPU that has tables says nothing about
    a recipe it lacks."""
    from recipes.argmax import TUNING as ARGMAX

    with pytest.warns(RuntimeWarning) as caught:
        for t in (fake.SCALE.tuning, ARGMAX, fake.SCALE.tuning):
            assert lookup_slug("no-such-gpu", t, K64) is None
    assert len(caught) == 1 and "make tune" in str(caught[0].message)
    assert "'no-such-gpu'" in str(caught[0].message)
    _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lookup_slug("test-gpu", ARGMAX, {"dtype": "float32", "V": 100, "R": 2}) is None


@pytest.fixture
def two_roots(tmp_path, monkeypatch, fake):
    """(user folder, shipped folder): dispatch reads the first, then the second, which
    holds fake_scale's table for "test-gpu" (K64 -> C1)."""
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    monkeypatch.setenv(dispatch.RESULTS_ENV, str(user))
    monkeypatch.setattr(dispatch, "shipped_root", lambda: shipped)
    dispatch.clear_cache()
    _write(shipped, "test-gpu", fake.SCALE, [_entry(K64, C1)])
    yield user, shipped
    dispatch.clear_cache()


@pytest.mark.parametrize("damage", ["garbage", "wrong-space"])
def test_an_unusable_user_table_falls_through_to_the_shipped_one(two_roots, fake, damage):
    """A user's table that cannot be used (damaged, or tuned over another space) warns
    once, naming both files, and dispatch reads the shipped table behind it."""
    user, shipped = two_roots
    bad = tables.table_path(user, "test-gpu", "fake_scale")
    if damage == "garbage":
        bad.parent.mkdir(parents=True)
        bad.write_text("{not json")
    else:
        _write(user, "test-gpu", fake.SCALE, [_entry(K64, C2)], space_hash="0123456789abcdef")
    good = tables.table_path(shipped, "test-gpu", "fake_scale")
    with pytest.warns(RuntimeWarning) as caught:
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K64) == C1
    (w,) = caught
    assert str(bad) in str(w.message) and f"using {good} instead" in str(w.message)
    assert dispatch.table_in_use("test-gpu", fake.SCALE.tuning) == (good, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # once
        assert lookup_slug("test-gpu", fake.SCALE.tuning, K64) == C1


def test_show_prints_the_tables_in_use_wherever_they_are(two_roots):
    """`autotune show` on a machine whose user folder holds no table: the shipped tables
    dispatch reads are listed as in use and printed, not reported missing."""
    from autotune import views

    user, shipped = two_roots
    path = tables.table_path(shipped, "test-gpu", "fake_scale")
    text = views.show_text(user, "test-gpu", ["fake_scale"], dispatch=True)
    assert f"fake_scale: {path} (1 entries used)" in text
    assert f"== fake_scale on Test GPU ({path}) ==" in text and "N=64" in text
    assert "no tuned tables" not in text


def test_show_and_report_survive_a_damaged_table(results, fake):
    """Wrong-typed fields (display fields, header, a report) are shown as they are, never
    an exception; an entry that cannot be shown at all says so."""
    from autotune import views

    data = _write(results, "test-gpu", fake.SCALE, [_entry(K64, C1), _entry(K256, C2)])
    data["header"]["space"] = "not a dict"
    data["header"]["label"] = 7
    data["header"]["interpreter"] = True
    e0, e1 = data["entries"]
    e0.update(p50_us="fast", trials=[1], chosen_from={"x": 1}, speedup_vs_heuristic="2x",
              heuristic_config=[1], wrong_configs=[3, {"BLOCK": 1}])
    e1["config"] = {"BLOCK": {"nested": object.__name__}}
    e1["trials"] = {"wrong": "many"}
    tables.write_json_atomic(tables.table_path(results, "test-gpu", "fake_scale"), data)
    (results / "test-gpu" / "tune-report.json").write_text(json.dumps({"keys": 3}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        text = views.show_text(results, "test-gpu", None, dispatch=True)
    assert "'fast'" in text and "tune-report.json: unreadable" in text
    assert "fake_scale" in text and "N=256" in text
    md = views.report_markdown(results, "test-gpu")
    assert "'fast'" in md and "BLOCK=1" in md
