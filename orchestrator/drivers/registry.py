"""The method registry: every recipe module, and the specs they declare.

A recipe declares its own :class:`~orchestrator.spec.MethodSpec` (``SPEC``, or ``SPECS`` for a file
with several methods); adding a sixth method means one new file in ``trainers/`` and one entry in
``RECIPES``. The drivers reach recipes only through here.
"""

from __future__ import annotations

from orchestrator.errors import ConfigError
from orchestrator.spec import MethodSpec
from trainers import parabart, siamese, sifter_lstm, sifter_simcse, tsdae

RECIPES = (sifter_simcse, tsdae, sifter_lstm, siamese, parabart)

METHODS: dict[str, MethodSpec] = {
    spec.name: spec for module in RECIPES for spec in getattr(module, "SPECS", None) or (module.SPEC,)
}


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}: expected one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> list[str]:
    return sorted(METHODS)
