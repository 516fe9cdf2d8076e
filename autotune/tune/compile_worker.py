"""The compile pool's worker processes (`compile.CompilePool`): each compiles Triton
binaries for the GPU's target into Triton's on-disk cache with no CUDA context, from
the specialization data the probe recorded, and builds their C launchers there too.
"""
from __future__ import annotations

import json
import os
import time
from typing import NamedTuple

WORKER_NICE = 10      # workers (and their ptxas) yield the cores to the measuring process


class TargetDriver:
    """What `JITFunction.preload` needs of a driver to compile: the device's index and
    compile target. Nothing here touches the GPU."""

    def __init__(self, target, index: int):
        self.target, self.index = target, index

    def is_active(self):
        return True

    def get_current_device(self):
        return self.index

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        import torch
        return torch.device("cuda", self.index)


def worker_init(target, index: int, package: str) -> None:
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the parent's to handle
    try:    # the measuring process (its launches, syncs and captures) comes first
        os.nice(WORKER_NICE)
    except (AttributeError, OSError):
        pass
    os.environ.pop("TRITON_INTERPRET", None)         # compiled kernels, whatever the parent
    from triton.runtime import driver
    driver.set_active(TargetDriver(target, index))
    import importlib
    importlib.import_module(package)


class Done(NamedTuple):
    """A worker's task: seconds compiling (the capped variant included), the error or
    None; seconds building the launcher, its error; the capped variant's spec (None: no
    cap, or no plain variant given) and the error deriving it."""
    secs: float
    err: str | None
    launcher_s: float = 0.0
    launcher_err: str | None = None
    capped: str | None = None
    capped_err: str | None = None


def compile_task(module: str, qualname: str, spec: str, plain: str | None = None) -> Done:
    """One binary (`plain`: the spec of the variant it may be capped at, whose capped
    binary is then compiled too), its launcher built."""
    import importlib
    t0 = time.monotonic()
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        kernel = preload(obj, spec)
    except Exception as exc:  # noqa: BLE001 - the measuring process will see it too
        return Done(time.monotonic() - t0, _text(exc))
    capped, capped_err = None, None
    if plain is not None:
        try:
            capped = _compile_capped(obj, kernel, spec, plain)
        except Exception as exc:  # noqa: BLE001 - left to the measuring process
            capped_err = _text(exc)
    secs = time.monotonic() - t0
    return Done(secs, None, *_build_launcher(kernel), capped, capped_err)


def _compile_capped(fn, kernel, spec: str, plain: str) -> str | None:
    """What `recipes._registers.register_cap` compiles after the plain variant and
    `kernel`: `kernel` with `maxnreg` at the plain variant's registers, where `kernel`
    uses more. The counts come from the cubins (`cubin.register_count`), the numbers
    the driver reports to `register_cap`. Returns the capped binary's spec, or None
    where no cap is needed."""
    from .cubin import register_count

    regs = register_count(kernel.asm["cubin"])
    cap = register_count(preload(fn, plain).asm["cubin"])
    if regs <= cap:
        return None
    d = json.loads(spec)
    d["options"]["maxnreg"] = cap
    d["key"] = f"{d['key']} maxnreg={cap}"     # the worker's in-memory cache only
    capped = json.dumps(d)
    preload(fn, capped)
    return capped


def preload(kernel, spec: str):
    """`JITFunction.preload(spec)`, with tuple constants kept tuples. The specialization
    data is JSON, which makes a tuple a list; Triton 3.6's preload turns the signature's
    lists back into tuples but not the constexprs' (relay's RS and FBS), and the constants
    enter the binary's cache hash as text: the pool's binary then lay under another hash
    than the launch's, and the measuring process compiled each relay binary again. The
    same steps as Triton's preload otherwise (its `_do_compile` included)."""
    import triton.language as tl
    from triton.runtime import driver
    from triton.runtime.jit import convert_to_tuple_if_list as tuples

    d = json.loads(spec)
    if d["name"] != kernel._fn_name:
        raise RuntimeError(f"specialization data of {d['name']}, not of {kernel._fn_name}")
    consts = {}
    for k, v in zip(map(tuple, d["constant_keys"]), d["constant_vals"], strict=True):
        if tl.dtype.is_dtype(v):
            consts[k] = tl.dtype(v)
        elif isinstance(v, dict) and "constexpr" in v:
            consts[k] = tl.constexpr(tuples(v["constexpr"]))
        else:
            consts[k] = tuples(v)
    attrs = dict(zip(map(tuple, d["attrs_keys"]), d["attrs_vals"], strict=True))
    signature = {k: tuples(v) for k, v in d["signature"].items()}
    device = driver.active.get_current_device()
    backend = kernel.device_caches[device][3]
    options = backend.parse_options({k: tuple(v) if isinstance(v, list) else v
                                     for k, v in d["options"].items()})
    return kernel._do_compile(d["key"], signature, device, consts, options, attrs,
                              warmup=True)


def _build_launcher(kernel) -> tuple[float, str | None]:
    """Build the binary's C launcher into Triton's cache as well. Triton builds it with
    the host's C compiler when a binary is first loaded (one per kernel signature), in
    the measuring process unless it is cached; building it here needs no GPU. An error
    only leaves that build to the first load (the pool's stats count it). Returns
    (seconds, error or None)."""
    t0 = time.monotonic()
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(kernel.src, kernel.metadata)
        return time.monotonic() - t0, None
    except Exception as exc:  # noqa: BLE001
        return time.monotonic() - t0, _text(exc)


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"
