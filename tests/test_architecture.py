"""The house is one-way: library (``orchestrator/*`` outside ``drivers/``) ← recipes (``trainers/``) ←
drivers (``orchestrator/drivers/``) ← entry points (``jobs/``). Every import counts, also those inside
function bodies (they hide the graph, which is how a cycle survived before)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "trainers")
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Project modules ``path`` imports anywhere in the file (top level or inside a function)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports the module pkg.mod when it is one
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in modules:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = source_files()
    modules = set(files)
    return {m: imports_of(p, modules) - {m} for m, p in files.items()}


def layer(module: str) -> str:
    if module.startswith("orchestrator.drivers"):
        return "driver"
    if module.startswith("trainers"):
        return "recipe"
    return "library"


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    assert find_cycle(graph()) is None


def test_imports_point_down_only():
    allowed = {"library": {"library"}, "recipe": {"library", "recipe"}, "driver": {"library", "recipe", "driver"}}
    bad = [f"{m} -> {n}" for m, deps in graph().items() for n in sorted(deps) if layer(n) not in allowed[layer(m)]]
    assert bad == []


def test_drivers_reach_recipes_only_through_the_registry():
    bad = [f"{m} -> {n}" for m, deps in graph().items() if layer(m) == "driver" and m != "orchestrator.drivers.registry"
           for n in sorted(deps) if layer(n) == "recipe" and n != "trainers.common"]
    assert bad == []


def test_cycle_finder_finds_a_planted_cycle():
    """The checker itself can fail: a graph with a cycle is caught, with the cycle named."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_jobs_import_no_recipe():
    """Entry points stay thin: they reach methods through the drivers."""
    modules = set(source_files())
    bad = [f"{p.name} -> {n}" for p in sorted((ROOT / "jobs").glob("*.py")) for n in sorted(imports_of(p, modules))
           if layer(n) == "recipe"]
    assert bad == []


def test_no_source_file_over_the_line_limit():
    files = [*source_files().values(), *(ROOT / "jobs").glob("*.py")]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_lazy_imports_say_why():
    """An import inside a function is deliberate: the line says why (a comment on it or above it)."""
    bad = []
    for path in source_files().values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        here, above = lines[sub.lineno - 1], lines[sub.lineno - 2]
                        if "#" not in here and not above.strip().startswith("#"):
                            bad.append(f"{path.relative_to(ROOT)}:{sub.lineno}: {here.strip()}")
    assert bad == []


def test_every_module_imports_on_its_own():
    """No module depends on another having been imported first (what function-level imports used to hide)."""
    code = ("import importlib, sys; mods = sys.argv[1:]\n"
            "for m in mods: importlib.import_module(m)\n")
    mods = [m for m in source_files() if not m.endswith("__init__")]
    res = subprocess.run([sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]


def test_the_layout_doc_names_every_module():
    """docs/LAYOUT.md matches the tree: every package folder and module file is named there."""
    doc = (ROOT / "docs" / "LAYOUT.md").read_text(encoding="utf-8")
    layout = doc[doc.index("## Layout"):doc.index("## Configs")]
    missing = [str(p.relative_to(ROOT)) for pkg in (*PACKAGES, "jobs") for p in sorted((ROOT / pkg).rglob("*.py"))
               if p.name != "__init__.py" and not p.name.startswith("_") and pkg != "jobs" and p.name not in layout]
    folders = [f"{p.relative_to(ROOT)}/" for pkg in PACKAGES for p in [ROOT / pkg, *sorted((ROOT / pkg).glob("*/"))]
               if p.is_dir() and p.name != "__pycache__" and f"{p.relative_to(ROOT)}/" not in layout]
    assert missing == [] and folders == []
