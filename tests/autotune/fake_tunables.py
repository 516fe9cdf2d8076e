"""Throw-away tunables for the autotuner's tests (no Triton, plain torch; CPU or CUDA).

Importing this module registers them; the CLI can load it with `--package
tests.autotune.fake_tunables` when the repository root is on PYTHONPATH. Names all start
with "fake_". Tests import it inside the `fake` fixture (tests/autotune/autotune_util.py)
and unregister them afterwards, so other tests
never see them in the registry.

`fake_scale`: out = x * 2 (exact). Its space has a static constraint, a config that gives
a wrong answer and is the fastest (must never be chosen), and a config that raises like
an out-of-resources launch (must be pruned, not fatal).
`fake_slow`: the same with a sleep in every run, for kill-and-resume tests.
"""
from __future__ import annotations

import os
import time

import torch

from autotune.declare import Tunable
from autotune.registry import register, unregister
from recipes._tuning import Tuning

SPACE = {"BLOCK": (32, 64, 128, 256), "W": (1, 2, 4), "S": (1, 2)}
WRONG = {"BLOCK": 256, "W": 1, "S": 1}
RAISES = {"BLOCK": 128, "W": 4, "S": 2}


def constraint(cfg: dict, key: dict) -> bool:
    return cfg["BLOCK"] >= 32 * cfg["W"] and cfg["BLOCK"] <= max(32, key["N"])


def heuristic(key: dict, device) -> dict:
    return {"BLOCK": 64, "W": 2, "S": 1}


def make_inputs(key: dict, device, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(key["N"], generator=g).to(getattr(torch, key["dtype"])).to(device)


def reference(x):
    return x * 2


def _work(cfg: dict) -> int:
    # a landscape: bigger blocks and W=2 are cheaper
    return 1 + (256 // cfg["BLOCK"]) + (0 if cfg["W"] == 2 else 1) + (cfg["S"] - 1)


def run(x, cfg):
    sub = {k: cfg[k] for k in SPACE}
    if sub == RAISES:
        raise RuntimeError("out of resource: shared memory, Required: 300000, Hardware "
                           "limit: 232448 (fake)")
    if sub == WRONG:
        return x * 2 + 1          # fastest and wrong
    y = x
    for _ in range(_work(cfg)):
        y = y + 0                  # a little work per step (kept exact)
    return y * 2


def _bytes(key: dict) -> int:
    return key["N"] * 8


def _keys(preset: str) -> list[dict]:
    if preset == "smoke":
        return [{"dtype": "float32", "N": 256}]
    return [{"dtype": d, "N": n} for d in ("float32", "bfloat16") for n in (64, 256)]


def _slow_run(x, cfg):
    time.sleep(float(os.environ.get("FAKE_SLOW_S", "0.3")))
    return run(x, cfg)


SCALE = Tunable(
    Tuning(name="fake_scale", space=SPACE, heuristic=heuristic, constraint=constraint,
           sources=(run, constraint)),
    make_inputs=make_inputs, run=run, reference=reference, bytes_moved=_bytes,
    default_keys=_keys, torch_peer=reference)

SLOW = Tunable(
    Tuning(name="fake_slow", space=SPACE, heuristic=heuristic, constraint=constraint,
           sources=(_slow_run,)),
    make_inputs=make_inputs, run=_slow_run, reference=reference, bytes_moved=_bytes,
    default_keys=lambda preset: [{"dtype": "float32", "N": 256}])


def register_all() -> None:
    register(SCALE)
    register(SLOW)


def unregister_all() -> None:
    unregister(SCALE.name)
    unregister(SLOW.name)


register_all()     # importing registers them (what `--package fake_tunables` relies on)
