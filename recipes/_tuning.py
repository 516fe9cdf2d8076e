"""What a recipe declares for dispatch, as plain data: one `Tuning` named `TUNING` per
recipe module (`TUNINGS` where a module tunes several launches). The launcher passes it
to `_common.resolve_config`, which reads the table named after it; the tuner
(`autotune`) pairs it with the harness that measures it (`autotune/suites/`).

Key: a flat dict of the call's shape that can change the best config, e.g.
{"dtype": "bfloat16", "V": 151936, "R": 4}. String fields must match exactly when
dispatch looks for a nearby tuned key; numeric fields are compared in log2 space.
"""
from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from typing import Callable

import torch

from ._source_hash import source_hash


@dataclass(eq=False)        # compared and hashed by identity: dispatch caches by it
class Tuning:
    name: str                                   # table name: results/<gpu>/<name>.json
    space: dict[str, tuple]                     # parameter -> choices
    heuristic: Callable[[dict, torch.device], dict]     # (key, device) -> config
    constraint: Callable[[dict, dict], bool] | None = None   # (config, key) -> allowed
    sources: tuple = ()                         # kernels and launchers whose code is hashed
    on_request: bool = False                    # tuned only when named (`--recipe`)

    def configs(self, key: dict) -> list[dict]:
        """Every config of the space that the static constraint admits for `key`."""
        names = list(self.space)
        out = []
        for values in itertools.product(*(self.space[n] for n in names)):
            cfg = dict(zip(names, values, strict=True))
            if self.constraint is None or self.constraint(cfg, key):
                out.append(cfg)
        return out

    def space_hash(self) -> str:
        return hashlib.sha256(repr(sorted(self.space.items())).encode()).hexdigest()[:16]

    def source_hash(self) -> str:
        """A hash of the kernels' and launchers' code and of every function the kernels
        call (`_source_hash`): a table tuned for other code may no longer hold, and
        dispatch ignores it."""
        return source_hash(self.sources)

    def admits(self, config: dict, key: dict) -> bool:
        """True when `config` sets every parameter of the space to one of its choices and
        the static constraint accepts it for `key` (extra keys are allowed)."""
        try:
            for name, choices in self.space.items():
                if name not in config or config[name] not in choices:
                    return False
            return self.constraint is None or bool(self.constraint(config, key))
        except Exception:  # noqa: BLE001 - a constraint that chokes on it rejects it
            return False


def key_str(key: dict) -> str:
    """A key as one stable string: 'R=4,V=151936,dtype=bfloat16' (fields sorted)."""
    return ",".join(f"{k}={key[k]}" for k in sorted(key))
