"""The compile pool: the probe finds the binaries a config runs (shared across configs
and keys that launch the same one), worker processes compile them into Triton's cache
for a GPU target without a GPU, and the measuring side then only loads them. Runs a
real sm_90 compile on the CPU (Triton bundles the compiler)."""
import json
import subprocess
from concurrent.futures import Future

import pytest

from autotune.tune.compile import Binary, CompilePool, ConfigCosts
from autotune.tune.phases import Phases
from tests.autotune.autotune_util import PY, REPO, subprocess_env
from tests.helpers import ON_GPU


@pytest.mark.parametrize("recipe", ["argmax", "relay", "sglang_target_verify"])
def test_pool_compiles_what_the_measuring_side_then_loads(tmp_path, recipe):
    """relay's launch passes tuple constexprs (RS, FBS), which the specialization data's
    JSON turns into lists: the pool's binaries must still lie under the launch's hash.
    The SGLang adapter's launch compiles the plain variant, its own, and its own capped
    at the plain one's registers where it uses more: the pool builds all three."""
    env = subprocess_env()
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([PY, "-c", "from tests.autotune import autotune_util; "
                        f"autotune_util.compile_pool_check({str(tmp_path)!r}, {recipe!r})"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    capping = recipe == "sglang_target_verify"
    per_launch = 2 if capping else 1         # the plain variant, then the launch's
    assert out["configs"] == 3 and 1 <= out["binaries"] <= 3 * per_launch
    assert all(len(v) == per_launch for v in out["per"].values()), out["per"]
    if recipe == "argmax":
        assert out["per2"] == out["per"], "another R launches the same binaries"
    assert out["compiled"] == out["binaries"] and out["failed"] == 0, out["errors"]
    assert out["paired"] == (3 if capping else 0)
    assert out["capped_failed"] == 0, out["errors"]
    if capping:                              # the chosen configs need a cap
        assert out["capped"] >= 1
    else:
        assert out["capped"] == 0
    assert out["loads"] == out["binaries"] + out["capped"] and out["misses"] == 0
    assert out["probed_not_loaded"] == 0     # the ids the budget prices loads by
    assert out["loaded_not_probed"] == out["capped"]
    assert out["new_files"] == [], "the measuring side compiled instead of loading"
    assert out["compiled_here"] == 0
    kernel = next(iter(out["per"].values()))[0].split(":")[0]
    assert out["extra_misses"] >= 1 and set(out["missed_kernels"]) == {kernel}
    assert out["extra_compiled"] >= 1 and set(out["compiled_kernels"]) == {kernel}


class _Executor:
    """Records submissions; every task finishes at once in 0.5 s (compiled)."""

    def __init__(self):
        self.submitted = []

    def submit(self, fn, module, qualname, spec, plain):
        self.submitted.append(qualname)
        f = Future()
        f.set_result((0.5, None, 0.25, "OSError: no C compiler" if qualname == "d"
                      else None))
        return f

    def shutdown(self, **kw):
        pass


def test_pool_order_follows_the_measurement_and_urgent_first(monkeypatch):
    pool = CompilePool(1, None, 0, "recipes")
    pool.executor.shutdown()
    pool.executor = ex = _Executor()
    pool.cap = 1                         # one task in flight: the order is visible
    bins = {n: Binary(n, "m", n, "{}") for n in "abcdef"}
    pool.add(bins)
    pool.prioritize(["c", "a", "b"])     # planned first, in this order; d, e, f after
    assert ex.submitted == ["c"]
    pool.urgent(["e"])                   # the measuring side waits for e: next (a pump:
    assert ex.submitted == ["c", "e"]    # c is collected, e goes out)
    pool.pump()
    assert ex.submitted == ["c", "e", "a"]
    while pool.left():
        pool.pump()
    assert ex.submitted == ["c", "e", "a", "b", "d", "f"]
    assert pool.ready(list(bins)) and pool.compiled("f")
    assert pool.stats.compiled == 6 and pool.stats.cpu_s == pytest.approx(4.5)
    assert pool.stats.launcher_s == pytest.approx(1.5) and pool.stats.launchers_failed == 1
    assert pool.stats.errors == ["d launcher: OSError: no C compiler"]


def test_a_launcher_that_cannot_be_built_leaves_the_binary_compiled(monkeypatch):
    """A worker compiles the binary, then builds its launcher; if that fails (here the
    preloaded object is no Triton kernel) the binary still counts as compiled and the
    launcher's error is returned apart."""
    import sys
    import types

    from autotune.tune import compile_worker as comp
    mod = types.ModuleType("fake_preload_mod")
    mod.kern = object()
    monkeypatch.setitem(sys.modules, "fake_preload_mod", mod)
    monkeypatch.setattr(comp, "preload", lambda kernel, spec: object())
    r = comp.compile_task("fake_preload_mod", "kern", "{}", plain="{}")
    assert r.err is None and r.secs >= 0 and r.launcher_s >= 0
    assert r.launcher_err is not None and r.launcher_err.startswith(
        ("AttributeError", "ImportError", "ModuleNotFoundError"))
    assert r.capped is None and r.capped_err.startswith("AttributeError")  # no cubin


def test_register_count_wants_a_cubin():
    from autotune.tune.cubin import register_count
    with pytest.raises(ValueError, match="ELF64"):
        register_count(b"not a cubin")


def test_config_costs_split_by_load_and_by_the_pool_compiling():
    """Each config's check and timing seconds land under whether its check loaded a
    binary and whether the pool still had binaries to compile, and under its recipe."""
    import types
    phases = Phases()
    watch = types.SimpleNamespace(loads=0)
    pool = types.SimpleNamespace(left=lambda: 3)
    costs = ConfigCosts(phases, watch, pool)
    for loads, check, timing, left, recipe in [(1, 0.05, 0.01, 3, "relay"),
                                               (0, 0.002, 0.008, 3, "argmax"),
                                               (0, 0.004, 0.012, 0, "relay")]:
        pool.left = lambda n=left: n
        b = costs.before()
        watch.loads += loads
        phases.add("check", check)
        phases.add("timing", timing)
        phases.add("search", 1.0)           # not a config's check or timing
        assert costs.after(b, recipe) == loads
    assert costs.report() == {
        "cached": {"configs": 1, "check_ms": 4.0, "timing_ms": 12.0},
        "cached while compiling": {"configs": 1, "check_ms": 2.0, "timing_ms": 8.0},
        "loaded while compiling": {"configs": 1, "check_ms": 50.0, "timing_ms": 10.0}}
    assert costs.report_recipes() == {
        "argmax": {"configs": 1, "check_ms": 2.0, "timing_ms": 8.0, "loads": 0},
        "relay": {"configs": 2, "check_ms": 27.0, "timing_ms": 11.0, "loads": 1}}


@pytest.mark.skipif(not ON_GPU, reason="a real tune with the compile pool needs a GPU")
def test_gpu_tune_loads_every_binary_from_the_pool(tmp_path):
    """One small argmax key on the GPU with an empty Triton cache: the pool compiles every
    binary the probe found and the measuring process compiles none itself; the table
    carries the kernels' source hash and no_slower_at."""
    env = subprocess_env(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    r = subprocess.run([PY, "-m", "autotune", "tune", "--recipe", "argmax", "--rows", "4",
                        "--vocab", "4096", "--dtype", "bfloat16", "--compile-workers", "2",
                        "--budget-s", "0", "--results", str(tmp_path), "--no-progress"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    from recipes._configs import gpu_slug
    from recipes.argmax import TUNING
    slug = gpu_slug()
    rep = json.loads((tmp_path / slug / "tune-report.json").read_text())
    pool, comp = rep["compile"]["pool"], rep["compile"]
    (k,) = rep["keys"]
    assert k["measured"] == k["admitted"] and pool["failed"] == 0
    assert pool["compiled"] + pool["from_cache"] == pool["binaries"] > 0
    assert comp["compiled_in_process"] == 0 and comp["loaded"] == pool["binaries"]
    assert comp["compiled_in_process_by_kernel"] == {}
    assert comp["config_costs_by_recipe"]["argmax"]["configs"] == k["measured"]
    split = comp["config_costs"]
    assert sum(v["configs"] for v in split.values()) == k["measured"]
    assert set(split) <= {"loaded", "cached", "loaded while compiling",
                          "cached while compiling"}
    tab = json.loads((tmp_path / slug / "argmax.json").read_text())
    assert tab["header"]["source_hash"] == TUNING.source_hash()
    (e,) = tab["entries"]
    assert e["no_slower_at"] == [] and e["trials"]["wrong"] == 0


@pytest.mark.skipif(not ON_GPU, reason="a real tune with the compile pool needs a GPU")
def test_gpu_tune_builds_the_adapters_capped_variant_ahead(tmp_path):
    """The SGLang adapter's launch caps its kernel at the plain variant's registers as
    the driver reports them; the pool reads them from the cubins: with the same numbers
    the measuring process compiles none of the capped binaries itself."""
    env = subprocess_env(TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    r = subprocess.run([PY, "-m", "autotune", "tune", "--recipe", "sglang_target_verify",
                        "--batch", "1", "--K", "3", "--vocab", "32000", "--dtype",
                        "bfloat16", "--trials", "8", "--compile-workers", "4",
                        "--budget-s", "0", "--results", str(tmp_path), "--no-progress"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    from recipes._configs import gpu_slug
    rep = json.loads((tmp_path / gpu_slug() / "tune-report.json").read_text())
    pool, comp = rep["compile"]["pool"], rep["compile"]
    assert pool["failed"] == 0 and pool["capped_failed"] == 0, pool["errors"]
    assert pool["capped"] >= 1
    assert comp["compiled_in_process"] == 0, comp["compiled_in_process_by_kernel"]
    assert comp["not_from_pool"] == 0, comp["not_from_pool_by_kernel"]
