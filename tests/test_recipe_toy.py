"""A new method is one file: a toy recipe outside ``trainers/`` (``tests/toy_recipe.py``) registered, trained 2
steps under Ray Train, exported and tested, with no registry line and no doc edited."""

from __future__ import annotations

import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_toy_recipe_is_registered_trained_exported_and_tested(tiny_bert_dir, tiny_shards, tmp_path):
    import ray.cloudpickle
    import toy_recipe
    from sentence_transformers import SentenceTransformer

    from orchestrator.drivers import registry
    from orchestrator.drivers.train import build_trainer, export_and_test, fit

    # a module the workers cannot import (tests/ is not on their path): its classes travel by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[toy_recipe.__name__])
    registry.register(toy_recipe.ToyRecipe)
    try:
        recipe = registry.get_method("toy")
        cfg = recipe.config_cls.model_validate(
            {
                "model": {"name_or_path": str(tiny_bert_dir), "max_length": 16},
                "train": {"max_steps": 2, "eval_steps": 1},
                "scaling": {"num_workers": 1},
                "eval": {"tasks": ["stsb"], "max_length": 32, "batch_size": 256},
                "run": {"storage": str(tmp_path / "store")},
            }
        )
        outcome = fit(build_trainer(recipe, cfg, tiny_shards, name="toy"), recipe, cfg)
        assert [int(r["step"]) for r in outcome.history] == [1, 2]
        assert all(
            r["loss"] > 0 and "stsb_dev_spearman" in r for r in outcome.history
        )  # read by its protocol
        out, test = export_and_test(recipe, cfg, outcome, tmp_path / "model", tasks=["stsb"])
        assert test.headline == "sts_avg_spearman_all" and test.detail["sts"]["tasks"]["stsb"]["n"] == 1379
        assert SentenceTransformer(str(out), device="cpu").encode(["a sentence"]).shape == (1, 32)
        assert "toy" in registry.methods_table()  # its row, written from its metadata
    finally:
        registry.unregister("toy")
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[toy_recipe.__name__])
    assert "toy" not in registry.METHODS
