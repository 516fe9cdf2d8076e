"""Which device a tune runs on. Imports torch only, never the recipes: on a machine
without a GPU the Triton interpreter must be switched on before the first recipe module
is imported (`triton.jit` picks compiled or interpreted code when it decorates), so the
command line calls `select_device` before it imports anything that imports `recipes`."""
from __future__ import annotations

import os

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
