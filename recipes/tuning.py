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
import functools
import hashlib
import importlib
import inspect
import itertools
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

import torch
from triton.runtime.jit import KernelInterface

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
        """A hash of the kernels' and launchers' code (docstrings and comments left out)
        and of every function the kernels call, however deep (`source_texts`): a table
        tuned for other code may no longer hold, and dispatch ignores it."""
        h = hashlib.sha256()
        for text in source_texts(self.sources):
            h.update(text.encode())
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


def _is_jit(obj) -> bool:
    """A `@triton.jit` function, compiled or under the interpreter (another class there)."""
    return isinstance(obj, KernelInterface) and inspect.isfunction(getattr(obj, "fn", None))


def _module(name: str):
    """The loaded module `name` (imported if need be), or None where it cannot be."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@functools.lru_cache(maxsize=None)
def _module_defs(module_name: str) -> dict[str, list]:
    """Name -> every function definition of that name at a module's top level, including
    those under a module-level `if` (a helper defined one way compiled and another way
    under the interpreter has both)."""
    try:
        tree = ast.parse(inspect.getsource(_module(module_name)))
    except (OSError, TypeError, SyntaxError):
        return {}
    defs: dict[str, list] = {}
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(node.name, []).append(node)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo[:0] = [*node.body, *getattr(node, "orelse", []),
                        *getattr(node, "finalbody", [])]
    return defs


def _device_calls(module_name: str, node) -> list[tuple[str, str]]:
    """(module, name) of the functions of our own code that a kernel-code definition
    names, bare or as `module.name`, in order of appearance (Triton's own left out)."""
    module = _module(module_name)
    scope = vars(module) if module is not None else {}
    local = _module_defs(module_name)
    out = []
    for n in ast.walk(node):
        target = None
        if isinstance(n, ast.Name):
            obj = scope.get(n.id)
            fn = obj.fn if _is_jit(obj) else obj
            if n.id in local:
                target = (module_name, n.id)
            elif inspect.isfunction(fn) and fn.__name__ in _module_defs(fn.__module__):
                target = (fn.__module__, fn.__name__)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            base = scope.get(n.value.id)
            if inspect.ismodule(base) and n.attr in _module_defs(base.__name__):
                target = (base.__name__, n.attr)
        if target is not None and not target[0].startswith("triton"):
            out.append(target)
    return out


def source_texts(sources) -> list[str]:
    """The code text of each of `sources`, then of every function that the kernels among
    them call, however deep (depth first, each once): all of its definitions in its
    module, so the texts are the same compiled and under the interpreter."""
    kernels = [obj.fn for obj in sources if _is_jit(obj)]
    seen = {(fn.__module__, fn.__name__) for fn in kernels}
    texts = [code_text(getattr(obj, "fn", obj)) for obj in sources]  # a JITFunction wraps .fn

    def walk(module_name, name):        # the callees of every definition of `name`
        for d in _module_defs(module_name).get(name, []):
            for target in _device_calls(module_name, d):
                if target not in seen:
                    seen.add(target)
                    texts.append(_defs_text(*target))
                    walk(*target)

    for fn in kernels:
        walk(fn.__module__, fn.__name__)
    return texts


@functools.lru_cache(maxsize=None)
def _defs_text(module_name: str, name: str) -> str:
    return "\n".join(_unparse(d) for d in _module_defs(module_name).get(name, []))


def _unparse(tree) -> str:
    """A syntax tree as text, its docstrings left out."""
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def code_text(obj) -> str:
    """The source of a function or module as its syntax tree prints it: the same text for
    the same code, whatever its docstrings, comments and layout."""
    try:
        return _code_text(obj)          # remembered: kernels recur across tunings
    except TypeError:                   # unhashable
        return _code_text.__wrapped__(obj)


@functools.lru_cache(maxsize=None)
def _code_text(obj) -> str:
    try:
        return _unparse(ast.parse(textwrap.dedent(inspect.getsource(obj))))
    except (OSError, TypeError, SyntaxError):
        return repr(obj)


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
                  "copy_inputs", "compat.sglang", "compat.vllm.mrv2")


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
