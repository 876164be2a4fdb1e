"""The method registry: every recipe class, by name, found in ``trainers/``.

A recipe is a :class:`~trainers.recipe.Recipe` subclass with a ``name``, in a module of the ``trainers``
package; the registry imports those modules and lists what it finds, so adding a method is one new file there
(with its configs and its test) and no line here. The drivers reach recipes only through here, and ask them
(class attributes and hooks); they never probe a config. ``docs/METHODS.md``'s table of methods is written from
the recipes' own metadata (``python -m orchestrator.drivers.registry --write-docs``; a test checks it).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from pathlib import Path

import trainers
from orchestrator.config import CONFIG_DIR
from orchestrator.errors import ConfigError
from trainers.recipe import Recipe


def discover() -> dict[str, type[Recipe]]:
    """Every named recipe defined in a module of ``trainers``, by name (a name twice is an error)."""
    found: dict[str, type[Recipe]] = {}
    for info in pkgutil.iter_modules(trainers.__path__):
        module = importlib.import_module(f"trainers.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, Recipe)
                and obj.__module__ == module.__name__
                and "name" in vars(obj)
            ):
                if obj.name in found and found[obj.name] is not obj:
                    raise ConfigError(f"two recipes named {obj.name!r}: {found[obj.name]} and {obj}")
                found[obj.name] = obj
    return dict(sorted(found.items()))


METHODS: dict[str, type[Recipe]] = discover()


def get_method(name: str) -> type[Recipe]:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}: expected one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    return sorted(METHODS)


def register(recipe: type[Recipe]) -> type[Recipe]:
    """Add a recipe defined outside ``trainers/`` (a user's own, a test's), importable where Ray Train's workers
    run; refused when its name is taken. ``unregister`` takes it out again."""
    if not (isinstance(recipe, type) and issubclass(recipe, Recipe) and "name" in vars(recipe)):
        raise ConfigError(f"{recipe!r} is not a named Recipe subclass")
    if recipe.name in METHODS and METHODS[recipe.name] is not recipe:
        raise ConfigError(f"a recipe named {recipe.name!r} is registered already: {METHODS[recipe.name]}")
    METHODS[recipe.name] = recipe
    return recipe


def unregister(name: str) -> None:
    METHODS.pop(name, None)


def log_model(method: str, folder: str) -> object:
    """The outbox's logger for a method's own model format (:mod:`orchestrator.outbox`)."""
    return get_method(method).log_model(folder, name="model")


# ---------------------------------------------------------------- the docs' table, from the recipes
DOC = Path(__file__).resolve().parents[2] / "docs" / "METHODS.md"
BEGIN, END = (
    "<!-- methods table: written by python -m orchestrator.drivers.registry --write-docs -->",
    "<!-- end -->",
)


def presets(name: str) -> str:
    """The method's presets as ``--preset`` names them: the YAML files of ``configs/<name>/``."""
    return ", ".join(f"`{p.stem}`" for p in sorted((CONFIG_DIR / name).glob("*.yaml"))) or "none"


def methods_table(methods: dict[str, type[Recipe]] | None = None) -> str:
    """One row per method: what it is, its file, its presets (``configs/<name>/``), how it runs, how its runs are
    read, what it is registered as."""
    rows = [
        "| method | name | recipe | presets | runs with | dev metric → test | registered as |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, recipe in (methods or METHODS).items():
        fields = recipe.config_cls.model_fields
        registered = fields["tracking"].default.registry_model_name or name.replace("_", "-")
        domain = getattr(fields["eval"].default, "domain", None) if "eval" in fields else None
        reads = (
            recipe.reads.replace("the domain tasks", f"the domain tasks ({', '.join(domain)})")
            if domain
            else recipe.reads
        )
        rows.append(
            f"| {recipe.title} | `{name}` | `{recipe.__module__.replace('.', '/')}.py` | {presets(name)} "
            f"| {recipe.runs_with} "
            f"| {reads} | `{registered}` |"
        )
    return "\n".join(rows)


def with_table(text: str, table: str) -> str:
    """``text`` (the doc) with the block between the markers replaced by ``table``."""
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ConfigError(f"{DOC}: the methods table's markers are missing ({BEGIN} ... {END})")
    return pattern.sub(lambda _: f"{BEGIN}\n{table}\n{END}", text)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-docs"]:
        sys.exit("usage: python -m orchestrator.drivers.registry --write-docs")
    DOC.write_text(with_table(DOC.read_text(encoding="utf-8"), methods_table()), encoding="utf-8")
    print(f"{DOC}: the methods table written from {len(METHODS)} recipes")
