"""SimCSE / SIFTER-SimCSE maths: the loss against sentence-transformers' MNRL, and distributed == single-process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from st_model import AsSentenceTransformer

from trainers.sifter_simcse import ContrastiveConfig, build_model, compute_loss, info_nce

X = [
    "a man is playing a guitar .",
    "the cat sat on the mat .",
    "she reads a long book .",
    "dogs run in the park .",
    "he cooked dinner for his family .",
    "the sun rises in the east .",
    "they built a small house .",
    "a child is eating an apple .",
]
Y = [
    x + " " + b
    for x, b in zip(
        X,
        [
            "man playing",
            "cat sat on",
            "she reads book",
            "dogs run in",
            "he cooked dinner for",
            "sun rises in",
            "they built house",
            "child eating",
        ],
    )
]
Z = [
    "man is playing guitar .",
    "cat sat on mat .",
    "reads long book .",
    "dogs run in park .",
    "cooked dinner for family .",
    "sun rises in east .",
    "built small house .",
    "child is eating apple .",
]
BATCH = {"text": X, "backbone_view": Y, "deletion_view": Z}


def cfg_for(model_dir, pooling: str = "cls", **kw) -> ContrastiveConfig:
    return ContrastiveConfig.model_validate(
        {"model": {"name_or_path": str(model_dir), "max_length": 16, "pooling": pooling}, **kw}
    )


def test_info_nce_matches_hand_computation():
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    b = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    # cos: [[1, 0.7071], [0, 0.7071]] / 0.5
    logits = torch.tensor([[2.0, 1.41421356], [0.0, 1.41421356]])
    expected = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 1]) / 2
    assert info_nce(a, b, 0.5).item() == pytest.approx(expected.item(), rel=1e-6)


def test_config_validation():
    from orchestrator.config import validate
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError, match="lambda_xy: Input should be greater than or equal to 0"):
        validate(ContrastiveConfig, {"lambda_xy": -1}, "x.yaml")
    with pytest.raises(ConfigError, match="at least one of lambda_xx"):
        validate(
            ContrastiveConfig, {"lambda_xx": 0, "lambda_xy": 0, "lambda_xz": 0, "lambda_yz": 0}, "x.yaml"
        )
    assert ContrastiveConfig(lambda_xx=1, lambda_xy=0, lambda_xz=0, lambda_yz=0).views() == ["x", "x2"]
    assert ContrastiveConfig().views() == ["x", "y", "z"]


LAMBDAS = {
    "sifter_simcse": {},  # the config's defaults: λ_XY = λ_XZ = λ_YZ = 1, λ_XX' = 0
    "simcse": {"lambda_xx": 1, "lambda_xy": 0, "lambda_xz": 0, "lambda_yz": 0},
    "mixed": {"lambda_xx": 0.5, "lambda_xy": 2, "lambda_xz": 0, "lambda_yz": 0.25},
    "sifter_matryoshka": {"matryoshka_dims": [32, 16, 8], "matryoshka_weights": [1.0, 0.5, 0.25]},
}


@pytest.mark.parametrize("method", sorted(LAMBDAS))
def test_the_loss_is_the_lambda_weighted_sum_of_sentence_transformers_mnrl_over_the_views(
    tiny_bert_dir, method
):
    """The loss on the tiny model, derived apart from ``compute_loss``: each view (X, Y = X + backbone,
    Z = X without useless words) tokenised and encoded alone, and sentence-transformers'
    MultipleNegativesRankingLoss (scale 1/τ) on every weighted pair, summed with its λ - with ``matryoshka_dims``,
    each pair's MNRL wrapped in sentence-transformers' MatryoshkaLoss. Dropout is off, so X' is X (SimCSE's term is
    then MNRL(X, X)); the gradient of every encoder weight agrees too."""
    from sentence_transformers.sentence_transformer.losses.matryoshka import MatryoshkaLoss
    from sentence_transformers.sentence_transformer.losses.multiple_negatives_ranking import (
        MultipleNegativesRankingLoss,
    )

    cfg = cfg_for(tiny_bert_dir, dropout=0.0, **LAMBDAS[method])
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    loss, logs = compute_loss(model, tok, BATCH, cfg)
    ours = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    def embed(texts):
        enc = tok(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
        return model(enc["input_ids"], enc["attention_mask"])

    emb = {"x": embed(X), "x2": embed(X), "y": embed(Y), "z": embed(Z)}
    mnrl = MultipleNegativesRankingLoss(model=torch.nn.Identity(), scale=1 / cfg.temperature)
    weights = {
        ("x", "x2"): cfg.lambda_xx,
        ("x", "y"): cfg.lambda_xy,
        ("x", "z"): cfg.lambda_xz,
        ("y", "z"): cfg.lambda_yz,
    }
    if cfg.matryoshka_dims:
        st = AsSentenceTransformer(model, 32)
        wrapped = MatryoshkaLoss(
            st,
            MultipleNegativesRankingLoss(st, scale=1 / cfg.temperature),
            cfg.matryoshka_dims,
            matryoshka_weights=cfg.matryoshka_weights,
        )
        texts = {"x": X, "x2": X, "y": Y, "z": Z}

        def features(t):
            return dict(tok(t, padding=True, truncation=True, max_length=16, return_tensors="pt"))

        reference = sum(
            w * wrapped([features(texts[a]), features(texts[b])], labels=None)
            for (a, b), w in weights.items()
            if w
        )
    else:
        reference = sum(
            w * mnrl.compute_loss_from_embeddings([emb[a], emb[b]], labels=None)
            for (a, b), w in weights.items()
            if w
        )
    theirs = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5) and logs["loss"] == pytest.approx(
        loss.item()
    )
    assert all(
        (g is None) == (t is None) and (g is None or torch.allclose(g, t, atol=1e-5, rtol=1e-4))
        for g, t in zip(ours, theirs, strict=True)
    )


# ---------------------------------------------------------------- distributed equivalence
def _worker(rank: int, world: int, model_dir: str, gather: bool, out_dir: str, init_file: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg = cfg_for(model_dir, dropout=0.0, gather_negatives=gather)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    ddp = DDP(model)
    b = len(X) // world
    local = {k: v[rank * b : (rank + 1) * b] for k, v in BATCH.items()}
    loss, logs = compute_loss(ddp, tok, local, cfg)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"loss": logs["loss"], "grads": grads}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


def run_distributed(model_dir, gather: bool, tmp_path) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path / ("gather" if gather else "local")
    out.mkdir()
    mp.spawn(_worker, args=(2, str(model_dir), gather, str(out), str(out / "init")), nprocs=2, join=True)
    return {r: torch.load(out / f"rank{r}.pt") for r in range(2)}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_workers_with_gathered_negatives_equal_one_worker_with_double_batch(tiny_bert_dir, tmp_path):
    torch.set_num_threads(1)
    cfg = cfg_for(tiny_bert_dir, dropout=0.0)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    loss, logs = compute_loss(model, tok, BATCH, cfg)
    loss.backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    dist = run_distributed(tiny_bert_dir, True, tmp_path)
    for r in range(2):
        assert dist[r]["loss"] == pytest.approx(logs["loss"], abs=1e-5)
        assert set(dist[r]["grads"]) == set(ref)
        for name, g in ref.items():
            torch.testing.assert_close(dist[r]["grads"][name], g, atol=1e-5, rtol=1e-4, msg=name)

    local = run_distributed(tiny_bert_dir, False, tmp_path)
    assert abs(local[0]["loss"] - logs["loss"]) > 1e-3  # without gathering each worker sees only b negatives
    diffs = [float((local[0]["grads"][n] - g).abs().max()) for n, g in ref.items()]
    assert max(diffs) > 1e-4


@pytest.mark.parametrize("pooling", ["mean", "cls", "cls_before_pooler"])
def test_export_gives_the_embeddings_the_trainer_scored(pooling, tiny_bert_dir, tmp_path):
    """Per pooling mode, a trained model (one step, so the weights and SimCSE's MLP head moved)
    exported like a run's checkpoint and loaded with plain ``SentenceTransformer(folder)`` gives the
    embeddings the trainer's dev scoring computed, to 1e-5 - what a user gets is what was measured."""
    from sentence_transformers import SentenceTransformer

    from orchestrator.evaluation.encode import HFEncoder, test_time_pooling
    from trainers.sifter_simcse import export_model

    cfg = cfg_for(tiny_bert_dir, pooling=pooling, eval={"max_length": 32})
    torch.manual_seed(0)
    module, tok = build_model(cfg)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    loss, _ = compute_loss(module, tok, BATCH, cfg)
    loss.backward()
    opt.step()
    module.eval()
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": module.state_dict()}, ckpt / "model.pt")
    # the dev scorer's encoder (dev_score): the test-time pooling over the trained encoder
    scored = HFEncoder(
        module.encoder, tok, pooling=test_time_pooling(pooling), batch_size=8, max_length=cfg.eval.max_length
    ).encode(X)
    out = export_model(cfg, ckpt, tmp_path / "export")
    got = SentenceTransformer(str(out), device="cpu").encode(X, convert_to_numpy=True)
    assert got.shape == scored.shape
    assert abs(got - scored).max() < 1e-5
    if pooling == "cls":  # SimCSE's MLP head is training-only: the export is the raw [CLS] state
        with torch.no_grad():
            enc = tok(X, padding=True, return_tensors="pt")
            headed = module(enc["input_ids"], enc["attention_mask"]).numpy()
        assert abs(got - headed).max() > 1e-3


def test_backbone_view_keeps_its_backbone_under_the_length_limit():
    """Y = X + backbone; when both do not fit ``max_length``, the sentence part is cut and the
    appended backbone kept whole, so no Y that the augmentation made different from X tokenizes to X."""
    from orchestrator.models import load_tokenizer
    from trainers.sifter_simcse import backbone_view_ids, tokenize_views

    tok = load_tokenizer("default")
    long_x = (
        "the committee that was appointed by the regional council last spring finally published its long "
        "awaited report on the state of the old bridges across the river after months of delays"
    )
    backbone = "committee published report"
    y = f"{long_x} {backbone}"
    ids = backbone_view_ids(tok, long_x, y, 32)
    x_ids = tok(long_x, truncation=True, max_length=32)["input_ids"]
    b_ids = tok(backbone, add_special_tokens=False)["input_ids"]
    assert len(ids) == 32 and ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert ids[-1 - len(b_ids) : -1] == b_ids and ids != x_ids
    assert tok(y, truncation=True, max_length=32)["input_ids"] == x_ids  # what plain truncation did before
    cfg = ContrastiveConfig.model_validate({"model": {"name_or_path": "default", "max_length": 32}})
    batch = {
        "text": [long_x, X[0]],
        "backbone_view": [y, Y[0]],
        "deletion_view": ["committee published", Z[0]],
    }
    _, views, identical = tokenize_views(tok, batch, cfg)
    assert "y" in views and identical["y"] == 0
    # a short sentence keeps sentence and backbone both
    assert backbone_view_ids(tok, X[0], Y[0], 32) == tok(Y[0], truncation=True, max_length=32)["input_ids"]


def test_simcse_info_nce_equals_sentence_transformers_mnrl_on_the_same_embeddings():
    """One InfoNCE term is sentence-transformers' MultipleNegativesRankingLoss (cosine, in-batch
    negatives) at scale 1/τ, on the same embeddings - the loss and its gradient."""
    import torch
    from sentence_transformers.sentence_transformer.losses.multiple_negatives_ranking import (
        MultipleNegativesRankingLoss,
    )

    from trainers.sifter_simcse import info_nce

    torch.manual_seed(0)
    a, b = torch.randn(8, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    ours = info_nce(a, b, temperature=0.05)
    (ga, gb) = torch.autograd.grad(ours, (a, b))
    mnrl = MultipleNegativesRankingLoss(model=torch.nn.Identity(), scale=1 / 0.05)
    theirs = mnrl.compute_loss_from_embeddings([a, b], labels=None)
    (ta, tb) = torch.autograd.grad(theirs, (a, b))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert torch.allclose(ga, ta, atol=1e-6) and torch.allclose(gb, tb, atol=1e-6)
    assert info_nce(a, b, temperature=0.1).item() != pytest.approx(theirs.item(), rel=1e-3)  # τ matters
