"""One recipe per method (``trainers/recipe.py``: what a method is). The ``orchestrator`` package is imported
first: its environment defaults (offline hub, Train V2) hold before a recipe imports transformers or Ray."""

import orchestrator  # noqa: F401
