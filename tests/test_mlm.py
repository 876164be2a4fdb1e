"""MLM (trainers/mlm.py): the loss against a hand-computed masked cross-entropy, the masking rule against
the reference collator's (whole words, round(0.15·n), 80/10/10, never a special token), and the recipe's
hooks on a tiny model - no Ray here: the shared loop is tested with the other recipes."""

from __future__ import annotations

import math
import random

import pytest
import torch

from trainers.mlm import (
    IGNORE,
    MaskedLM,
    MLMConfig,
    MLMRecipe,
    batch_rng,
    choose_positions,
    compute_loss,
    export_model,
    mask_batch,
)


def tiny_cfg(model_dir, **kw) -> MLMConfig:
    return MLMConfig.model_validate(
        {
            "model": {"name_or_path": str(model_dir), "max_length": 32, "pooling": "mean"},
            "eval": {"batch_size": 64, "max_length": 32, "tasks": ["stsb"]},
            **kw,
        }
    )


def test_loss_is_the_masked_cross_entropy_computed_by_hand(tiny_bert_dir):
    from orchestrator.models import load_encoder

    torch.manual_seed(0)
    encoder, _ = load_encoder(str(tiny_bert_dir), add_pooling_layer=False)
    model = MaskedLM(encoder).eval()
    with torch.no_grad():
        model.bias.normal_()  # a zero bias would hide a head that forgot it
    ids = torch.tensor([[101, 2023, 103, 2003, 1037, 3231, 102], [101, 103, 2204, 102, 0, 0, 0]])
    mask = (ids != 0).long()
    labels = torch.full_like(ids, IGNORE)
    labels[0, 2], labels[0, 5], labels[1, 1] = 2742, 3231, 2023
    got = model(ids, mask, labels)
    with torch.no_grad():
        states = encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        words = encoder.get_input_embeddings().weight
        terms = []
        for b, t in [(0, 2), (0, 5), (1, 1)]:
            h = model.transform(states[b, t])
            logits = words @ h + model.bias
            terms.append(-(logits[labels[b, t]] - torch.logsumexp(logits, 0)))
    assert float(got) == pytest.approx(float(sum(terms) / 3), rel=1e-5)
    # the output matrix is the word embeddings themselves (tied), not a copy
    assert not any(p is not words and p.shape == words.shape for p in model.parameters())


def test_whole_words_are_chosen_up_to_the_budget_and_never_a_special_token():
    special = {0, 1, 2}
    ids = [1, 10, 11, 90, 12, 91, 92, 13, 14, 15, 16, 17, 18, 19, 2, 0, 0]  # 90-92: "##" pieces
    for seed in range(200):
        got = choose_positions(ids, special, 0.15, True, lambda t: t >= 90, random.Random(seed))
        assert len(got) <= max(1, round(14 * 0.15)) and got  # 14 real tokens: a budget of 2
        assert not {ids[i] for i in got} & special
        for i in got:  # a piece is chosen only with its word's first token, and the reverse
            if ids[i] >= 90:
                assert i - 1 in got
            if i + 1 < len(ids) and ids[i + 1] >= 90:
                assert i + 1 in got
    single = choose_positions(ids, special, 0.15, False, lambda t: t >= 90, random.Random(0))
    assert len(single) == 2


def test_masking_follows_the_80_10_10_rule_on_whole_words(tiny_bert_dir):
    from orchestrator.models import load_tokenizer

    tok = load_tokenizer(str(tiny_bert_dir))
    cfg = tiny_cfg(tiny_bert_dir, model={"name_or_path": str(tiny_bert_dir), "max_length": 64})
    texts = ["the unbelievably photogenic flamingos congregated near the saltwater lagoon at dawn"] * 400
    b = mask_batch(tok, texts, cfg, random.Random(7))
    plain = tok(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")["input_ids"]
    chosen = b["labels"] != IGNORE
    assert torch.equal(b["labels"][chosen], plain[chosen])  # labels are the original ids
    assert torch.equal(b["input_ids"][~chosen], plain[~chosen])  # nothing else changed
    real = int((plain != tok.pad_token_id).sum(1)[0]) - 2
    assert set(chosen.sum(1).tolist()) <= set(range(1, round(real * 0.15) + 1))
    masked = (b["input_ids"][chosen] == tok.mask_token_id).float().mean()
    kept = (b["input_ids"][chosen] == plain[chosen]).float().mean()
    n = int(chosen.sum())
    tol = 4 * math.sqrt(0.1 * 0.9 / n)  # 4 standard errors of a 10% share
    assert abs(float(masked) - 0.8) < 4 * math.sqrt(0.16 / n) and abs(float(kept) - 0.1) < tol + 0.01
    assert not bool(chosen[:, 0].any()) and not bool((chosen & (plain == tok.sep_token_id)).any())


def test_recipe_hooks_train_a_step_and_export_the_encoder(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    cfg = tiny_cfg(tiny_bert_dir)
    recipe = MLMRecipe(cfg, {"shards": "", "rows_per_worker": 8})
    recipe.setup()
    torch.manual_seed(0)
    model = recipe.build()
    texts = {"text": ["a man is playing a guitar", "the cat sat on the mat", "two dogs run across a field"]}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"step": 0, "epoch": 0}
    first, logs = recipe.loss(model, texts, state)
    assert logs["masked_tokens"] >= 3 and math.isfinite(float(first))
    for _ in range(5):  # the same masks each step: the loss on them falls
        loss, _ = recipe.loss(model, texts, state)
        opt.zero_grad()
        loss.backward()
        opt.step()
    again, _ = compute_loss(model, recipe.tokenizer, texts["text"], cfg, batch_rng(42, 0, 0))
    assert float(again) < float(first)
    assert recipe.dev(model) == {}  # TSDAE's protocol: no labelled data before the test
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": model.state_dict()}, ckpt / "model.pt")
    out = export_model(cfg, ckpt, tmp_path / "model")
    st = SentenceTransformer(str(out), device="cpu")
    assert st.encode(["a test"]).shape == (1, 32)
    # one test for every encoder recipe: MLM, TSDAE and SimCSE arms can stand in one comparison
    from trainers.sifter_simcse import SimCSERecipe
    from trainers.tsdae import TSDAERecipe

    test = "the test (the method's evaluation)"
    assert (
        MLMRecipe.comparable(cfg)[test]
        == TSDAERecipe.comparable(cfg)[test]
        == SimCSERecipe.comparable(cfg)[test]
    )
