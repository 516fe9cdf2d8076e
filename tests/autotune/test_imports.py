"""The import graph of recipes/ and autotune/, read from the source with `ast` (nothing is
imported): no import cycles, and dependencies one way (autotune imports recipes, never
the reverse; neither imports the developers' tools/).

Every import statement counts, at module level or inside a function or an `if
TYPE_CHECKING:` block: an import moved into a function hides a cycle from import time,
not from the design. `from P import x` depends on the module P.x where x is one, else on
P; importing a module is not counted as depending on its parent packages (Python runs
their __init__ first, but a package that imports its own modules is no cycle)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("recipes", "autotune")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of PACKAGES under `root`."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known) -> set[str]:
    """The dotted names module `name` (at `path`) imports, resolved against `known`
    where they are modules of PACKAGES, as written otherwise."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
    return out


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports (itself left out)."""
    known = modules(root)

    def owner(n):                      # the deepest module of PACKAGES that n names
        while n and n not in known:
            n = n.rpartition(".")[0]
        return n

    return {m: {owner(n) for n in imported(m, p, known) if owner(n)} - {m}
            for m, p in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def test_cycles_finds_a_cycle_through_a_function_level_import(tmp_path):
    """The check itself: a cycle closed by an import inside a function, a relative
    `from . import` and a package that imports its own module (no cycle)."""
    pkg = tmp_path / "recipes"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .sub import b\ndef f():\n    pass\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def g():\n    from .. import a\n")
    (tmp_path / "autotune").mkdir()
    (tmp_path / "autotune" / "__init__.py").write_text("import recipes.a\n")
    g = graph(tmp_path)
    assert g["recipes"] == {"recipes.a"} and g["autotune"] == {"recipes.a"}
    assert cycles(g) == [["recipes.a", "recipes.sub.b"]]


@pytest.mark.parametrize("package", [
    "recipes",
    "autotune",
    "autotune.tune",
    "autotune.bench",
])
def test_no_import_cycle(package):
    """No cycle among the modules of `package` (a cycle between recipes and autotune
    would need recipes to import autotune: `test_dependencies_point_one_way`)."""
    inside = [c for c in cycles(graph())
              if all(m == package or m.startswith(package + ".") for m in c)]
    assert not inside, f"import cycles in {package}: " + "; ".join(
        " <-> ".join(c) for c in inside)


def test_dependencies_point_one_way():
    """recipes imports neither autotune nor tools; autotune does not import tools."""
    known = modules()
    for m, path in known.items():
        names = imported(m, path, known)
        top = {n.split(".")[0] for n in names}
        if m.split(".")[0] == "recipes":
            assert not top & {"autotune", "tools"}, f"{path} imports {sorted(names)}"
        assert "tools" not in top, f"{path} imports tools"
