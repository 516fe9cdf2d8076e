"""Shared pieces of the autotuner tests (not a test module)."""
import importlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE = "tests.autotune.fake_tunables"      # the `--package` of the fake tunables


@pytest.fixture(name="fake")
def fake_fixture():
    """The fake tunables, registered for the test and unregistered after it."""
    mod = importlib.import_module(FAKE)
    mod.register_all()
    yield mod
    mod.unregister_all()


def subprocess_env(**extra) -> dict:
    """Environment for `python -m autotune ...` subprocesses that can load
    `tests.autotune.fake_tunables`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("SPEC_TUNE_DEVICE", os.environ.get("SPEC_TUNE_DEVICE", ""))
    env.update({k: str(v) for k, v in extra.items()})
    if env.get("SPEC_TUNE_DEVICE") == "cpu":
        # the CPU smoke path exactly as CI runs it, also on a GPU host: the subprocess sees
        # no GPU, so nothing in it (recipes, torch, the tuner) takes a CUDA branch
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


PY = sys.executable


def tune_options(tmp_path, **kw):
    """Options of a quick in-process tune of the fake `fake_scale` into `tmp_path`."""
    from autotune.tune.options import Options

    base = dict(recipes=["fake_scale"], package=FAKE, preset="smoke",
                results=str(tmp_path), progress=False, budget_s=0, seed=0,
                compile_workers=0)
    base.update(kw)
    return Options(**base)


def compile_pool_check(cache_dir: str, recipe: str = "argmax") -> dict:
    """Run in a fresh process without the interpreter (`test_autotune_compile`): probe the
    `recipe`'s smoke key's first three configs (the SGLang adapter's: the three with the
    most elements a thread, which need its register cap) for an sm_90 target with no GPU
    (the tuner's worker driver, which only reports the target), compile them in a pool
    of two processes, then load them the way the measuring process does (Triton's JIT with
    warmup=True: compile or load, no launch). Returns what the test checks.

    The SGLang adapter (`sglang_target_verify`) caps its kernel at the plain variant's
    registers, which `recipes._registers.matching_cap` does on CUDA devices only and
    reads from the loaded binary: here it runs on the CPU tensors too, and a loaded
    binary's register count is the cubin's (what the driver reports on a GPU)."""
    import json
    import time as _time

    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_CACHE_DIR"] = cache_dir
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    from autotune.tune import compile as TC
    from autotune.tune.compile_worker import TargetDriver
    target = GPUTarget("cuda", 90, 32)
    driver.set_active(TargetDriver(target, 0))
    from autotune.registry import get
    from recipes import _common as C
    C.check_runnable = lambda *a, **k: None     # CPU tensors into the compiled launcher
    if recipe == "sglang_target_verify":
        _cap_on_the_cpu()
    t = get(recipe)
    cpu = torch.device("cpu")
    key = t.default_keys("smoke")[0]
    if recipe == "relay":       # the smoke key's grid holds 2 configs: a default key
        key = {**key, "B": 8, "width": 4096, "nfields": 5}
    grid = t.configs(key)[:3]
    if recipe == "sglang_target_verify":     # the most elements a thread: they need a cap
        grid = sorted(t.configs(key), key=lambda c: -c["BLOCK_V"] * c["UNROLL"]
                      // c["num_warps"])[:3]
    per, bins = TC.probe(t.run, t.make_inputs(key, cpu, 0), grid)
    per2 = None
    if recipe == "argmax":                       # R is no kernel argument: same binaries
        per2, _ = TC.probe(t.run, t.make_inputs({**key, "R": key["R"] * 2}, cpu, 0), grid)
    pool = TC.CompilePool(2, target, 0, "recipes")
    pool.add(bins)
    pool.prioritize(list(bins))
    t0 = _time.monotonic()
    while pool.left() and _time.monotonic() - t0 < 300:
        pool.wait(list(bins), timeout=1.0)
    stats = pool.stats
    pool.close()
    files = {os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs}
    from triton.runtime.jit import JITFunction
    orig = JITFunction.run

    def compile_only(fn, *a, grid, warmup, **k):
        return orig(fn, *a, grid=grid, warmup=True, **k)

    watch = TC.LoadWatch(pool)
    JITFunction.run = compile_only
    try:
        x = t.make_inputs(key, cpu, 0)
        with watch:
            for cfg in grid:
                t.run(x, cfg)
    finally:
        JITFunction.run = orig
    new = {os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs} - files
    out = {"configs": len(per), "binaries": len(bins), "per": per, "per2": per2,
           "compiled": stats.compiled + stats.cached, "failed": stats.failed,
           "capped": stats.capped, "capped_failed": stats.capped_failed,
           "paired": sum(b.plain is not None for b in bins.values()),
           "errors": stats.errors, "loads": watch.loads, "misses": watch.misses,
           "compiled_here": watch.compiled,
           "loaded_not_probed": len(watch.loaded - set(bins)),
           "probed_not_loaded": len(set(bins) - watch.loaded),
           "new_files": sorted(new)}
    # a config the pool never had: the measuring side compiles it, counted by kernel
    extra = next(c for c in t.configs(key) if c not in grid
                 and not set(TC.probe(t.run, x, [c])[1]) <= set(bins))
    JITFunction.run = compile_only
    try:
        with watch:
            t.run(x, extra)
    finally:
        JITFunction.run = orig
    out["extra_misses"] = watch.misses - out["misses"]
    out["missed_kernels"] = watch.missed_kernels
    out["extra_compiled"] = watch.compiled - out["compiled_here"]
    out["compiled_kernels"] = watch.compiled_kernels
    print(json.dumps(out))
    return out


def _cap_on_the_cpu() -> None:
    """`register_cap` for CPU tensors, with the cubin's register count as the loaded
    binary's (`compile_pool_check`)."""
    import importlib

    from triton.compiler.compiler import CompiledKernel

    from autotune.tune.cubin import register_count
    from recipes import _registers as R
    CV = importlib.import_module("recipes.chain_verify")

    def init_handles(self):
        self.n_regs, self.n_spills = register_count(self.asm["cubin"]), 0

    def cap(kernel, args, meta, plain, device):
        c = R.register_cap(kernel, args, meta, plain)
        return None if c is R.PROBED else c

    CompiledKernel._init_handles = init_handles
    CV.matching_cap = cap
