"""The registry and the tuner's planning and search order (no kernels run)."""
import dataclasses

import pytest
import torch

from autotune import registry
from autotune.bitwise import outputs_equal
from autotune.tune.options import Options, resolve
from autotune.tune.plan import keys_for, plan
from autotune.tune.search import Encoding, Result, config_id, is_ordinal, order_configs
from recipes._source_hash import code_text, source_texts
from recipes._tuning import Tuning, key_str
from tests.autotune.autotune_util import FAKE, fake_fixture  # noqa: F401  (the `fake` fixture)
from tests.autotune.test_tune import KEY


def test_every_recipe_tuning_has_one_tunable():
    """Each `Tuning` a recipe module declares is paired with its harness by exactly one
    suite tunable of the same name, and the registry holds no other library tunable."""
    import importlib
    import pkgutil

    import recipes

    declared = {}
    for info in pkgutil.walk_packages(recipes.__path__, "recipes."):
        mod = importlib.import_module(info.name)
        for v in vars(mod).values():
            if isinstance(v, Tuning) and v.__class__.__module__ == "recipes._tuning":
                declared[v.name] = v
    lib = {n: t for n, t in registry.tunables().items() if not n.startswith("fake_")}
    assert len(declared) >= 10 and set(lib) == set(declared)
    assert all(lib[n].tuning is declared[n] for n in declared)


def test_fake_is_registered_and_the_library_is_listed(fake):
    F = fake
    assert "fake_scale" in registry.tunables()
    names = registry.tunables()
    assert "fake_scale" in names and names["fake_scale"] is F.SCALE
    registry.load_recipes("recipes")
    t = registry.tunables()
    real = [n for n in t if not n.startswith("fake_")]
    assert real, "the suites declare no tunable"
    for name in real:
        tn = t[name]
        for preset in ("smoke", "gpu"):
            keys = tn.default_keys(preset)
            assert keys and all(isinstance(k, dict) and k for k in keys), (name, preset)
        key = tn.default_keys("smoke")[0]
        heur = tn.heuristic(key, torch.device("cpu"))
        assert set(tn.space) <= set(heur), f"{name}: heuristic lacks space parameters"
        assert tn.configs(key), f"{name}: the constraint admits nothing for {key}"
        assert tn.bytes_moved(key) > 0


def test_heuristics_pick_admitted_configs_at_every_default_key(monkeypatch):
    """The heuristic's config at each default key (gpu and smoke presets), for 78 and 132
    SMs, sets every parameter to one of its space's choices; for the split-argmax
    recipes, whose constraints are static limits, the constraint admits it too (copy_inputs'
    and the short kernels' constraints also prune configs that run like a smaller one)."""
    from recipes import _common as C

    for sms in (78, 132):
        monkeypatch.setattr(C, "sm_count", lambda device, sms=sms: sms)
        for tn in registry.tunables().values():
            for preset in ("smoke", "gpu"):
                for key in tn.default_keys(preset):
                    heur = tn.heuristic(key, torch.device("cpu"))
                    where = (tn.name, key, sms, heur)
                    assert all(heur[p] in ch for p, ch in tn.space.items()), where
                    if tn.name in ("argmax", "chain_verify", "draft_tail"):
                        assert tn.admits(heur, key), where


def test_configs_apply_the_constraint(fake):
    F = fake
    key = {"dtype": "float32", "N": 64}
    grid = F.SCALE.configs(key)
    assert grid and all(F.constraint(c, key) for c in grid)
    assert len(grid) == sum(1 for b in F.SPACE["BLOCK"] for w in F.SPACE["W"]
                            for s in F.SPACE["S"]
                            if F.constraint({"BLOCK": b, "W": w, "S": s}, key))
    assert F.SCALE.admits({"BLOCK": 64, "W": 2, "S": 1}, key)
    assert F.SCALE.admits({"BLOCK": 64, "W": 2, "S": 1, "extra": 1}, key)   # extras ok
    assert not F.SCALE.admits({"BLOCK": 256, "W": 1, "S": 1}, key)   # > N
    assert not F.SCALE.admits({"BLOCK": 48, "W": 1, "S": 1}, key)    # not a choice
    assert not F.SCALE.admits({"BLOCK": 64, "W": 2}, key)            # missing a parameter


def test_hashes_and_keys(fake):
    F = fake
    t = F.SCALE
    t2 = dataclasses.replace(t, tuning=dataclasses.replace(
        t.tuning, space={**t.space, "S": (1, 2, 3)}))
    assert t.space_hash() != t2.space_hash()
    assert t.space_hash() == dataclasses.replace(t.tuning).space_hash()
    assert len(t.source_hash()) == 16
    # the suite's inputs name the store's studies too; the recipe's hash knows no suite
    other = dataclasses.replace(t, make_inputs=_code_a, run=_code_a, reference=_code_a)
    assert other.harness_hash() != t.harness_hash() == dataclasses.replace(t).harness_hash()
    assert other.study_hash() != t.study_hash() and other.source_hash() == t.source_hash()
    assert key_str({"V": 3, "dtype": "x", "B": 1}) == "B=1,V=3,dtype=x"
    assert outputs_equal((torch.ones(2), None), (torch.ones(2), None))
    assert not outputs_equal(torch.ones(2), torch.ones(2, dtype=torch.float64))
    assert not outputs_equal(torch.zeros(1), torch.tensor([-0.0]))       # bits, not values
    assert not outputs_equal(torch.zeros(1, dtype=torch.bfloat16),
                             torch.tensor([-0.0], dtype=torch.bfloat16))
    nan = torch.tensor([float("nan"), 1.0])
    assert outputs_equal(nan, nan.clone())                  # the same NaN bits are equal
    assert not outputs_equal(torch.zeros(1), torch.ones(1))


def test_encoding_roundtrip():
    space = {"A": (1, 2, 4), "B": ("x", "y"), "C": (3,), "D": (True, False)}
    enc = Encoding(space)
    assert enc.ordinal == {"A": True, "B": False, "C": False, "D": False}
    assert is_ordinal((1, 2, 4)) and not is_ordinal((4, 2)) and not is_ordinal((True, False))
    cfg = {"A": 4, "B": "y", "C": 3, "D": False}
    p = enc.params(cfg)
    assert p == {"A": 2, "B": "y", "D": False}
    assert enc.config(p) == cfg
    assert enc.params({**cfg, "A": 3}) is None
    assert config_id(cfg) == config_id(dict(reversed(list(cfg.items()))))


def test_key_overrides(fake):
    F = fake
    t = F.SCALE
    keys = keys_for(t, "gpu", {})
    assert keys == t.default_keys("gpu")
    keys = keys_for(t, "gpu", {"dtype": ["float32"], "key": []})
    assert {k["dtype"] for k in keys} == {"float32"} and len(keys) == 2
    keys = keys_for(t, "gpu", {"N": ["128", "512"]})
    assert sorted({k["N"] for k in keys}) == [128, 512] and len(keys) == 4
    # an alias whose field the key lacks leaves the keys alone
    assert keys_for(t, "gpu", {"vocab": ["1000"]}) == t.default_keys("gpu")


def test_plan_orders_each_grid_from_the_heuristic(fake):
    F = fake
    cpu = torch.device("cpu")
    o = resolve(Options(recipes=["fake_scale"], package=FAKE), cpu)
    (j,) = plan(o, "test-gpu", cpu)                  # the smoke key on CPU
    assert len(j.grid) == 18 and len(j.order) == 18 and j.limit == 18
    assert sorted(map(config_id, j.order)) == sorted(map(config_id, j.grid))
    heur = F.heuristic(j.key, None)
    assert j.heuristic == heur and j.order[0] == heur
    enc = Encoding(F.SPACE)
    steps = [enc.steps(c, heur) for c in j.order]
    assert steps == sorted(steps)                   # nearest to the heuristic first
    assert j.study.startswith("tune:test-gpu:fake_scale[") and F.SCALE.space_hash() in j.study
    # another seed only reorders configs at the same distance
    other = order_configs(j.grid, F.SPACE, heur, seed=12345)
    assert [enc.steps(c, heur) for c in other] == steps and other != j.order
    # a previous table's config comes second
    prev = j.order[-1]
    again = order_configs(j.grid, F.SPACE, heur, seed=0, first=(heur, prev, {"BLOCK": 48}))
    assert again[:2] == [heur, prev] and len(again) == 18
    with pytest.raises(SystemExit):
        plan(Options(recipes=["no_such_recipe"], package=FAKE, preset="smoke"),
             "x", cpu)


def _code_a(x):
    """A docstring."""
    # a comment
    return x + 1


def _code_b(x):
    return x + 1      # the same code, told differently


def _code_c(x):
    return x + 2


def test_source_hash_follows_code_not_docstrings():
    def hash_of(fn):
        return Tuning(name="h", space={}, heuristic=None, sources=(fn,)).source_hash()

    assert code_text(_code_a).replace("_code_a", "f") == code_text(_code_b).replace("_code_b", "f")
    assert hash_of(_code_a) != hash_of(_code_c)
    assert hash_of(_code_a) == hash_of(_code_a)


_KERNEL_MODULE = """
import triton
import triton.language as tl


@triton.jit
def _leaf(x):
    return x + {step}


@triton.jit
def _middle(x):
    return _leaf(x) * 2


@triton.jit
def kernel(p):
    tl.store(p, _middle(tl.load(p)))
"""


def test_source_hash_covers_the_functions_a_kernel_calls(tmp_path, monkeypatch):
    """Two kernels of the same text whose callee's callee differs hash differently; a
    real recipe's hash reaches the shared scan it does not list itself, once."""
    import importlib
    import importlib.util
    import sys


    def kernel_with(i, step):
        path = tmp_path / f"kern_{i}.py"
        path.write_text(_KERNEL_MODULE.format(step=step))
        spec = importlib.util.spec_from_file_location(f"kern_{i}", path)
        mod = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, mod)   # the closure looks it up
        spec.loader.exec_module(mod)
        return mod.kernel

    def hash_of(fn):
        return Tuning(name="h", space={}, heuristic=None, sources=(fn,)).source_hash()

    one, one_again, two = kernel_with(0, "1"), kernel_with(1, "1  "), kernel_with(2, "2")
    assert len(source_texts([one])) == 3            # kernel, _middle, _leaf
    assert hash_of(one) == hash_of(one_again)      # layout is not code
    assert hash_of(one) != hash_of(two)
    argmax = importlib.import_module("recipes.argmax")
    texts = "\n".join(source_texts(argmax.TUNING.sources))
    # each callee once, with all its definitions: lane_fold has one compiled and one
    # under the interpreter
    for callee, defs in (("def chunk_scan(", 1), ("def lane_fold(", 2), ("def pack(", 1),
                         ("def pdl_enter(", 1)):
        assert texts.count(callee) == defs, callee


def test_encoding_and_sampler_follow_the_order_and_readiness(fake):
    from autotune.tune.search import KeySearch, Outcome

    grid = fake.SCALE.configs(KEY)
    order = sorted(grid, key=config_id)
    not_ready = {config_id(order[0]), config_id(order[1])}
    ks = KeySearch(fake.SPACE, order, limit=4,
                   ready=lambda c: config_id(c) not in not_ready,
                   resumed={config_id(order[2]): Result("ok", 1.0, config=order[2])})
    seen = []
    while ks.left():
        trial, cfg = ks.ask()
        seen.append(cfg)
        ks.tell(trial, cfg, Outcome("ok", 2.0, 2.0, 2.0))
        not_ready.clear()                     # compiled meanwhile
    # the first ready config first, the resumed one never, nothing past the limit
    assert seen == [order[3], order[0], order[1]]
    assert ks.ask() is None and ks.counts()["evaluated"] == 4
    assert Encoding(fake.SPACE).params(seen[0]) == ks.study.trials[1].params

