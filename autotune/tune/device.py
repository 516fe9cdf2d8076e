"""Which device a tune runs on. Imports torch only, never the recipes: on a machine
without a GPU the Triton interpreter must be switched on before the first recipe module
is imported (`triton.jit` picks compiled or interpreted code when it decorates), so the
command line calls `select_device` before it imports anything that imports `recipes`."""
from __future__ import annotations

import os
import sys

import torch

FORCE_ENV = "SPEC_TUNE_DEVICE"     # "cpu": the interpreter's smoke tune even on a GPU host


def select_device() -> torch.device:
    """CUDA when present (the current device), else the CPU under the Triton interpreter
    (sets TRITON_INTERPRET=1)."""
    if torch.cuda.is_available() and os.environ.get(FORCE_ENV, "") != "cpu":
        return torch.device("cuda", torch.cuda.current_device())
    os.environ["TRITON_INTERPRET"] = "1"
    return torch.device("cpu")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


# The Triton versions the tuner is tested with; pyproject.toml declares the same range.
# The tuner's compile pool and timing use Triton internals (its launcher, cache and
# driver classes) that change between minor versions; the library uses public API only.
TESTED_TRITON = "3.6"
_warned: list = []


def triton_version() -> str | None:
    from importlib import metadata

    for dist in ("triton", "pytorch-triton"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def warn_untested_triton(say=None) -> str | None:
    """Once a process: a line on stderr when the installed Triton is not TESTED_TRITON.*
    (returns the line, or None when there is nothing to say)."""
    v = triton_version()
    if _warned or v is None or v == TESTED_TRITON or v.startswith(TESTED_TRITON + "."):
        return None
    _warned.append(v)
    msg = (f"autotune: warning: Triton {v} is installed; the tuner is tested with Triton "
           f"{TESTED_TRITON}.* and uses Triton internals (compile pool, launcher, cache) "
           "that may have changed: a failure here may be that")
    (say or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)
    return msg
