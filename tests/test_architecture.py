"""The house is one-way: library (``orchestrator/*`` outside ``drivers/``) ← recipes (``trainers/``) ←
drivers (``orchestrator/drivers/``) ← entry points (``jobs/``). Every import counts, also those inside
function bodies (they hide the graph, which is how a cycle survived before)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("orchestrator", "trainers")
MAX_LINES = 600  # formatted lines; a file is split at a seam a reader would name, never to meet this


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
                return stack[stack.index(n) :] + [n]
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
    allowed = {
        "library": {"library"},
        "recipe": {"library", "recipe"},
        "driver": {"library", "recipe", "driver"},
    }
    bad = [
        f"{m} -> {n}"
        for m, deps in graph().items()
        for n in sorted(deps)
        if layer(n) not in allowed[layer(m)]
    ]
    assert bad == []


def test_drivers_reach_recipes_only_through_the_registry():
    bad = [
        f"{m} -> {n}"
        for m, deps in graph().items()
        if layer(m) == "driver" and m != "orchestrator.drivers.registry"
        for n in sorted(deps)
        if layer(n) == "recipe" and n not in ("trainers.common", "trainers.recipe")
    ]
    assert bad == []


def engine_bypasses(files: dict[str, Path]) -> list[str]:
    """Calls that start trials or training anywhere but the engine: a Tune experiment (``Tuner(...)``,
    ``Tuner.restore``) outside ``drivers/engine.py``; a Ray Train run (``build_trainer``, ``fit``) outside the
    engine's trial and a comparison's start stage (which trains inside its arm's engine trial)."""
    allowed = {
        "Tuner": {"orchestrator.drivers.engine"},
        "restore": {"orchestrator.drivers.engine"},
        "build_trainer": {"orchestrator.drivers.engine", "orchestrator.drivers.compare_start"},
        "fit": {"orchestrator.drivers.engine", "orchestrator.drivers.compare_start"},
    }
    found = []
    for module, path in files.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if name == "fit" and isinstance(f, ast.Attribute):  # trainer.fit() / tuner.fit(): the objects
                    continue  # above are what is counted; `fit(trainer, ...)` is drivers.train's
                if name in allowed and module not in allowed[name] and layer(module) == "driver":
                    found.append(f"{module}: {name}(...)")
    return found


def test_every_job_runs_through_the_one_engine():
    """Train runs, comparisons and a sweep's two stages start their trials only through
    ``orchestrator.drivers.engine.launch`` (the e2e tests also see each job print its one line)."""
    assert engine_bypasses(source_files()) == []


def test_the_engine_bypass_finder_finds_a_planted_tuner(tmp_path):
    planted = tmp_path / "x.py"
    planted.write_text("from ray import tune\n\ndef go(t):\n    return tune.Tuner(t).fit()\n")
    other = tmp_path / "y.py"
    other.write_text(
        "from orchestrator.drivers.train import build_trainer, fit\n\ndef go(r, c, s):\n    fit(build_trainer(r, c, s), r, c)\n"
    )
    got = engine_bypasses({"orchestrator.drivers.x": planted, "orchestrator.drivers.y": other})
    assert got == [
        "orchestrator.drivers.x: Tuner(...)",
        "orchestrator.drivers.y: fit(...)",
        "orchestrator.drivers.y: build_trainer(...)",
    ]


def test_cycle_finder_finds_a_planted_cycle():
    """The checker itself can fail: a graph with a cycle is caught, with the cycle named."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(g) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_jobs_import_no_recipe():
    """Entry points stay thin: they reach methods through the drivers."""
    modules = set(source_files())
    bad = [
        f"{p.name} -> {n}"
        for p in sorted((ROOT / "jobs").glob("*.py"))
        for n in sorted(imports_of(p, modules))
        if layer(n) == "recipe"
    ]
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
    code = "import importlib, sys; mods = sys.argv[1:]\nfor m in mods: importlib.import_module(m)\n"
    mods = [m for m in source_files() if not m.endswith("__init__")]
    res = subprocess.run(
        [sys.executable, "-c", code, *mods], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert res.returncode == 0, res.stderr[-3000:]


def test_the_layout_doc_names_every_module():
    """docs/LAYOUT.md matches the tree: every package folder and module file is named there, but a method's
    recipe file, which the methods table lists (written from the recipes: the next test)."""
    from orchestrator.drivers.registry import METHODS

    recipe_files = {f"{recipe.__module__.split('.')[-1]}.py" for recipe in METHODS.values()}
    doc = (ROOT / "docs" / "LAYOUT.md").read_text(encoding="utf-8")
    layout = doc[: doc.index("## Configs")]
    missing = [
        str(p.relative_to(ROOT))
        for pkg in PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if p.name != "__init__.py" and p.name not in recipe_files and p.name not in layout
    ]
    folders = [
        f"{p.relative_to(ROOT)}/"
        for pkg in PACKAGES
        for p in [ROOT / pkg, *sorted((ROOT / pkg).glob("*/"))]
        if p.is_dir() and p.name != "__pycache__" and f"{p.relative_to(ROOT)}/" not in layout
    ]
    assert missing == [] and folders == []


def test_the_methods_table_is_written_from_the_recipes(tmp_path):
    """docs/METHODS.md's table of methods is what the recipes' metadata writes (``python -m
    orchestrator.drivers.registry --write-docs``): a new method edits no doc by hand but its FIDELITY section.
    Planted: a recipe whose title changed no longer matches the doc."""
    from orchestrator.drivers import registry

    doc = registry.DOC.read_text(encoding="utf-8")
    assert registry.with_table(doc, registry.methods_table()) == doc
    assert all(f"| `{name}` |" in doc for name in registry.METHODS)
    renamed = {
        **registry.METHODS,
        "tsdae": type("T", (registry.METHODS["tsdae"],), {"title": "TSDAE, renamed"}),
    }
    assert registry.with_table(doc, registry.methods_table(renamed)) != doc


# ---------------------------------------------------------------- the recipe interface
def recipe_faults(methods: dict) -> list[str]:
    """What is wrong with the registry's recipes: not a ``Recipe`` under its own name, metadata missing, a hook
    neither written nor read from the recipe's protocol, or a method's recipe inheriting another's."""
    from trainers.recipe import Recipe

    bad = []
    recipes = set(methods.values())
    for name, recipe in methods.items():
        if not (isinstance(recipe, type) and issubclass(recipe, Recipe) and recipe.name == name):
            bad.append(f"{name}: {recipe!r}")
            continue
        for attr in ("config_cls", "metric", "metric_label"):
            if not hasattr(recipe, attr):
                bad.append(f"{name}: no {attr}")
        protocol_hooks = ("dev", "evaluate", "evaluate_base") if recipe.protocol else ()
        for hook in ("build", "loss", "dev", "prepare_data", "export", "evaluate", "evaluate_base"):
            if hook == "evaluate_base" and not recipe.has_base:
                continue
            if (
                inspect.getattr_static(recipe, hook) is inspect.getattr_static(Recipe, hook)
                and hook not in protocol_hooks
            ):
                bad.append(f"{name}: {hook} not written")
        if inspect.isabstract(recipe):
            bad.append(f"{name}: abstract ({', '.join(sorted(recipe.__abstractmethods__))})")
        bad += [f"{name}: inherits {other.name}'s recipe" for other in recipe.__mro__[1:] if other in recipes]
    return bad


def test_every_registered_method_is_a_recipe_class_of_its_own():
    """One interface: every method the registry lists subclasses ``Recipe``, under its own name, with its
    metadata declared and the worker hooks it needs written or read from its protocol; no method's recipe
    subclasses another's (what they share is composed). Planted: a recipe that inherits another method's is
    caught, and one with a hook left as the base's cannot be built."""
    from orchestrator.drivers.registry import METHODS
    from trainers.recipe import Recipe

    assert recipe_faults(METHODS) == [] and len(METHODS) >= 8
    borrowed = type("Borrowed", (METHODS["tsdae"],), {"name": "borrowed"})
    assert recipe_faults({**METHODS, "borrowed": borrowed}) == ["borrowed: inherits tsdae's recipe"]
    half = type(
        "Half", (METHODS["tsdae"],), {"loss": Recipe.loss}
    )  # a hook left as the base's: cannot be built
    assert inspect.isabstract(half) and half.__abstractmethods__ == {"loss"}
    with pytest.raises(TypeError, match="names no protocol and writes no dev / evaluate"):
        type("Unread", (Recipe,), {"name": "unread"})


PROBES = ("getattr", "hasattr")


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def probes(path: Path) -> list[str]:
    """Calls of getattr / hasattr in ``path`` whose object is a config, a model or a recipe."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in PROBES
            and node.args
        ):
            target = ast.unparse(node.args[0])
            if any(w in target for w in ("cfg", "config", "model", "recipe", "base")):
                out.append(f"{shown(path)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_drivers_ask_recipes_never_probe():
    """A driver asks the recipe (``recipe.base_model(cfg)``, ``recipe.has_base``) instead of probing a config
    or a model for attributes some methods have."""
    assert [p for f in sorted((ROOT / "orchestrator" / "drivers").glob("*.py")) for p in probes(f)] == []


def test_the_probe_finder_finds_a_planted_probe(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(cfg):\n    return getattr(cfg, "model", None), hasattr(x, "a")\n')
    assert [p.split(": ", 1)[1] for p in probes(planted)] == ["getattr(cfg, 'model', None)"]


def literal_method_lists(path: Path, names: set[str]) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            found = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
            if len(found) >= 2:
                out.append(f"{shown(path)}:{node.lineno}: {found}")
    return out


def test_no_test_names_methods_by_a_literal_list():
    """Tests that cover every method derive the list from the registry: a new method is covered by them
    without editing them."""
    from orchestrator.drivers.registry import method_names

    names = set(method_names())
    assert [x for p in sorted((ROOT / "tests").rglob("*.py")) for x in literal_method_lists(p, names)] == []
    assert literal_method_lists(Path(__file__), {"probe_a", "probe_b"}) != []  # the set literal on this line
