"""What a recipe declares about its own tuning, as plain data: the tuner (`autotune`) reads
these declarations, and the library never imports the tuner.

Each recipe module defines one `Tuning` named `TUNING` (a module that tunes several
launches lists them as `TUNINGS`): its search space, the static constraint and heuristic
its launcher uses, the key that selects a table entry, and what a tuner needs to run it
on synthetic inputs (an input maker, the call, the reference, the fewest bytes a call
moves, the default keys). `all_tunings()` lists the library's own.

Key: a flat dict of the call's shape that can change the best config, e.g.
{"dtype": "bfloat16", "V": 151936, "R": 4}. String fields must match exactly when
dispatch looks for a nearby tuned key; numeric fields are compared in log2 space.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import itertools
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ._common import SAME_SIZE_INT


@dataclass
class Tuning:
    name: str                                   # table name: results/<gpu>/<name>.json
    space: dict[str, tuple]                     # parameter -> choices
    heuristic: Callable[[dict, torch.device], dict]
    make_inputs: Callable[[dict, torch.device, int], Any]   # (key, device, seed) -> inputs
    run: Callable[[Any, dict], Any]             # (inputs, config) -> outputs (our kernel)
    reference: Callable[[Any], Any]             # inputs -> outputs (plain torch semantics)
    bytes_moved: Callable[[dict], int]          # key -> fewest bytes a call must move
    default_keys: Callable[[str], list[dict]]   # preset ("gpu" | "smoke") -> keys to tune
    constraint: Callable[[dict, dict], bool] | None = None   # (config, key) -> allowed
    torch_peer: Callable[[Any], Any] | None = None   # inputs -> outputs, torch's way
    compare: Callable[[Any, Any], bool] | None = None  # (ours, ref) -> equal; default exact
    sources: tuple = ()                         # kernels/functions whose source is hashed
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
        """A hash of the kernels' and launchers' code (docstrings and comments left out):
        a table tuned for other code may no longer hold, and dispatch ignores it."""
        h = hashlib.sha256()
        for obj in self.sources:
            h.update(code_text(getattr(obj, "fn", obj)).encode())  # a JITFunction wraps .fn
        return h.hexdigest()[:16]

    def equal(self, ours, ref) -> bool:
        return (self.compare or outputs_equal)(ours, ref)

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


def code_text(obj) -> str:
    """The source of a function or module as its syntax tree prints it: the same text for
    the same code, whatever its docstrings, comments and layout."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return repr(obj)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bit patterns on the CPU (floating dtypes as same-size integers, so -0.0
    differs from +0.0 and a NaN equals the same NaN); other dtypes as they are."""
    return _bit_view(t.detach().cpu().contiguous())


def _bit_view(t: torch.Tensor) -> torch.Tensor:
    """`t` on its device, floating dtypes viewed as same-size integers (any strides)."""
    return t.view(SAME_SIZE_INT[t.element_size()]) if t.is_floating_point() else t


def outputs_equal(a, b) -> bool:
    """Bitwise equality of (nested tuples of) tensors; None matches None. Compared on the
    tensors' device with one host sync in all (a tuner checks thousands of configs)."""
    pairs: list = []
    if not _same_structure(a, b, pairs):
        return False
    differs = [(_bit_view(x) != _bit_view(y.to(x.device))).any() for x, y in pairs
               if x.numel()]
    return not differs or not bool(torch.stack(differs).any())


def _same_structure(a, b, pairs: list) -> bool:
    """Equal apart from the tensors' contents; the tensor pairs (same dtype and shape)
    go to `pairs`."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and a.shape == b.shape):
            return False
        pairs.append((a.detach(), b.detach()))
        return True
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same_structure(x, y, pairs)
                                        for x, y in zip(a, b, strict=True))
    return a == b


def key_str(key: dict) -> str:
    """A key as one stable string: 'R=4,V=151936,dtype=bfloat16' (fields sorted)."""
    return ",".join(f"{k}={key[k]}" for k in sorted(key))


# The library's tuned recipes, in the order tunes and reports list them.
RECIPE_MODULES = ("argmax", "chain_verify", "draft_tail", "relay", "verify_metadata",
                  "copy_inputs", "compat.sglang")


def all_tunings() -> list[Tuning]:
    """The `TUNING` declaration of every recipe module of the library (a module that
    tunes several launches lists them as `TUNINGS`)."""
    out = []
    for m in RECIPE_MODULES:
        mod = importlib.import_module(f"{__package__}.{m}")
        out += getattr(mod, "TUNINGS", (mod.TUNING,))
    return out


_EXTRA: dict[str, Tuning] = {}


def register(t: Tuning) -> Tuning:
    """Declare a tuning outside the library's recipes (a user's own kernel, a test's), so
    that `get` finds it and dispatch checks its tables like the library's."""
    _EXTRA[t.name] = t
    return t


def unregister(name: str) -> None:
    _EXTRA.pop(name, None)


def registered() -> dict[str, Tuning]:
    """The declarations `register` added, by name."""
    return dict(_EXTRA)


def get(name: str) -> Tuning | None:
    """The declaration for table `name` (the library's, else a registered one), or None."""
    for t in all_tunings():
        if t.name == name:
            return t
    return _EXTRA.get(name)
