"""The method registry: every recipe class, by name.

A recipe is a :class:`~trainers.recipe.Recipe` subclass in ``trainers/``; adding a method means
one new file there (with its configs and its test) and one entry in ``RECIPES``. The drivers reach
recipes only through here, and ask them (class attributes and hooks); they never probe a config.
"""

from __future__ import annotations

from orchestrator.errors import ConfigError
from trainers.mlm import MLMRecipe
from trainers.parabart_recipe import ParaBARTRecipe
from trainers.recipe import Recipe
from trainers.sbert import SBERTRecipe
from trainers.siamese import SiameseRecipe
from trainers.sifter_lstm import SifterLSTMRecipe
from trainers.sifter_simcse import SIFTERSimCSERecipe, SimCSERecipe
from trainers.tsdae import TSDAERecipe

RECIPES: tuple[type[Recipe], ...] = (
    SIFTERSimCSERecipe,
    SimCSERecipe,
    TSDAERecipe,
    SifterLSTMRecipe,
    SiameseRecipe,
    ParaBARTRecipe,
    MLMRecipe,
    SBERTRecipe,
)

METHODS: dict[str, type[Recipe]] = {recipe.name: recipe for recipe in RECIPES}


def get_method(name: str) -> type[Recipe]:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}: expected one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    return sorted(METHODS)


def log_model(method: str, folder: str) -> object:
    """The outbox's logger for a method's own model format (:mod:`orchestrator.outbox`)."""
    return get_method(method).log_model(folder, name="model")
