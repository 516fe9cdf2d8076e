"""The package as a user installs it: a non-editable wheel ships the tuned tables and finds
them, writes tunes where the user can write, and the library never imports the tuner."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str, cwd: Path, env: dict) -> str:
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


TABLE = {"format": "spec-cookbook/tuned-table/1", "recipe": "argmax", "header": {},
         "entries": []}


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of the source tree with a tuned table of a made-up GPU planted in results/,
    next to a benchmark report and a tune report of the same GPU (which must not ship)."""
    top = tmp_path_factory.mktemp("tree") / "src"
    for name in ("recipes", "autotune", "results"):
        shutil.copytree(ROOT / name, top / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.db*", "*.journal*"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, top / name)
    gpu = top / "results" / "test-gpu"
    gpu.mkdir()
    (gpu / "argmax.json").write_text(json.dumps(TABLE))
    (gpu / "bench-argmax.json").write_text("{}")
    (gpu / "tune-report.json").write_text("{}")
    return top


@pytest.fixture(scope="module")
def wheel(tree, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", str(tree), "-w", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    (whl,) = out.glob("spec_cookbook-*.whl")
    return whl


def test_wheel_ships_the_tables_and_nothing_of_the_reports(tree, wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(n for n in names if n.startswith("recipes/results/"))
    def is_table(p: Path) -> bool:
        data = json.loads(p.read_text())
        return isinstance(data, dict) and str(data.get("format", "")).startswith(
            "spec-cookbook/tuned-table/")

    tables = sorted(p for p in (tree / "results").glob("*/*.json")
                    if p.parent.name != "cpu-interpreter" and is_table(p))
    assert shipped == [f"recipes/results/{p.parent.name}/{p.name}" for p in tables]
    assert "recipes/results/test-gpu/argmax.json" in shipped
    assert "recipes/py.typed" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)


def test_installed_package_finds_its_tables_and_writes_to_the_user_cache(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    str(target), str(wheel)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "SPEC_COOKBOOK_RESULTS"}
    env.update(PYTHONPATH=str(target), XDG_CACHE_HOME=str(tmp_path / "cache"))
    code = ("import json, recipes, recipes._configs as t; print(json.dumps({"
            "'file': recipes.__file__, 'version': recipes.__version__, "
            "'table': str(t.find_table('test-gpu', 'argmax')), 'write': str(t.results_root())}))")
    got = json.loads(_run(code, cwd=tmp_path, env=env))
    assert got["file"].startswith(str(target))
    assert got["table"] == str(target / "recipes" / "results" / "test-gpu" / "argmax.json")
    assert got["write"] == str(tmp_path / "cache" / "spec-cookbook" / "results")
    meta = _run("import importlib.metadata as m; print(m.version('spec-cookbook'))",
                cwd=tmp_path, env=env).strip()
    assert meta == got["version"]
    # the user's own table wins over the shipped one
    env["SPEC_COOKBOOK_RESULTS"] = str(tmp_path / "mine")
    (tmp_path / "mine" / "test-gpu").mkdir(parents=True)
    (tmp_path / "mine" / "test-gpu" / "argmax.json").write_text("{}")
    code = "import recipes._configs as t; print(t.find_table('test-gpu', 'argmax'))"
    assert _run(code, cwd=tmp_path, env=env).strip() == str(
        tmp_path / "mine/test-gpu/argmax.json")


def test_library_imports_no_tuner():
    """At run time; the source's imports: tests/autotune/test_imports.py."""
    code = ("import sys, recipes, recipes.compat.sglang; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('autotune', 'optuna')); "
            "print(bad)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    assert _run(code, cwd=ROOT, env=env).strip() == "[]"
