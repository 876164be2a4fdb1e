"""A model card for a config, with nothing measured: for the tests that read what a card says of a setting."""

from __future__ import annotations


def card_for(cfg, steps: int | None = None, params: dict | None = None) -> str:
    from orchestrator.evaluation.suite import TestReport
    from orchestrator.results.publish import Choice, model_card
    from trainers.supervised_contrastive import SupervisedContrastiveRecipe

    return model_card(
        recipe=SupervisedContrastiveRecipe,
        cfg=cfg,
        origin="train run `r`",
        params=params or {},
        test=TestReport("t", {"m": 0.5}, "m", "| m |"),
        base=None,
        choice=Choice({}, 0.5, None, "base", 0.0),
        registered_name="r",
        steps=steps,
    )
