"""The source hash of a tuned table: the code text of a recipe's kernels and launchers
and of every function of our own that the kernels call, however deep. Docstrings,
comments and layout are left out, so only a change of code makes a table stale.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import textwrap

from triton.runtime.jit import KernelInterface


def source_hash(sources) -> str:
    """16 hex digits over `source_texts(sources)`."""
    h = hashlib.sha256()
    for text in source_texts(sources):
        h.update(text.encode())
    return h.hexdigest()[:16]


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
