"""The function Ray Train runs on every worker, in a module of the standard library alone.

Ray Train's controller unpickles the train function and its config when it starts, and never calls them. Handed
``recipe.train_func`` and the typed config, it imported the recipe's module - transformers, MLflow, SciPy: the
controller of every run spent ~4 CPU-s more on it, and the workers started their train function ~8 s later,
for a model it never builds (``bench/results/train_startup.md``, ``typed-config`` vs ``payload``). So the
recipe class and the config travel as one pickled payload, opened on the workers only. It is the driver's own
pickle of its own objects, inside Ray's transport (itself pickle): no input from outside is unpickled here.
"""

from __future__ import annotations

import pickle

PAYLOAD = "recipe_and_config"


def payload(recipe, cfg) -> bytes:
    """The recipe class (by reference, unless its module is registered with cloudpickle to travel by value: a
    recipe the workers cannot import) and its typed config, validated once where it was made."""
    import ray.cloudpickle  # lazy: the driver's only; the controller imports this module and never calls it

    return ray.cloudpickle.dumps((recipe, cfg), protocol=pickle.HIGHEST_PROTOCOL)


def train_func(config: dict) -> list[dict]:
    """Ray Train's per-worker entry: the recipe's own loop (:meth:`trainers.recipe.Recipe.train_func`)."""
    recipe, cfg = pickle.loads(config[PAYLOAD])
    job = {k: v for k, v in config.items() if k != PAYLOAD}
    return recipe.train_func({**job, "method_config": cfg})
