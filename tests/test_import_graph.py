"""The packages' import graph: no module of `recipes` or `autotune` imports, however
indirectly, a module that imports it back (imports inside functions count: they are
the same dependency, taken later), and `recipes` never imports `autotune`."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("recipes", "autotune")


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of PACKAGES."""
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(name: str, path: Path, node, mods) -> list[str]:
    """The modules of `mods` an import statement of module `name` loads: `from a import
    b` loads a.b where that is a module, else a; a name outside `mods` is dropped."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:
            base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = base[:len(base) - node.level + 1]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix
                 for a in node.names]
    out = []
    for n in names:
        while n and n not in mods:
            n = n.rpartition(".")[0]
        if n and n != name:
            out.append(n)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(_targets(name, path, node, mods))
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_walker_sees_a_circle_and_relative_imports():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    g = import_graph()
    assert "recipes._common" in g["recipes.argmax"]                 # `from . import _common`
    assert "recipes.compat.vllm._ragged" in g["recipes.compat.vllm.mrv2"]
    assert "recipes._tuning" in g["recipes._configs"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circles(package):
    assert [g for g in circles(import_graph())
            if any(m.split(".")[0] == package for m in g)] == []


def test_recipes_never_import_the_tuner():
    graph = import_graph()
    bad = {m: sorted(t for t in ts if t.startswith("autotune"))
           for m, ts in graph.items() if m.startswith("recipes")}
    assert {m: ts for m, ts in bad.items() if ts} == {}
