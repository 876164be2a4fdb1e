"""The supervised contrastive recipe: its loss against sentence-transformers' MultipleNegativesRankingLoss on the
same inputs (with and without given negatives), two workers gathered = one worker with the whole batch, and its
rows refused with their line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from st_model import AsSentenceTransformer

from orchestrator.data.pairs import TrainingRows
from trainers.supervised_contrastive import SupervisedContrastiveConfig, compute_loss, multiple_negatives_loss

ANCHORS = [
    "how do i learn to play the guitar ?",
    "what is the best way to lose weight ?",
    "why is the sky blue ?",
    "how can i improve my english ?",
    "what should i eat for breakfast ?",
    "how do airplanes fly ?",
    "is coffee bad for you ?",
    "how do i start a small business ?",
]
POSITIVES = [
    "what is the easiest way to learn guitar ?",
    "how can i lose weight fast ?",
    "what makes the sky look blue ?",
    "what can i do to get better at english ?",
    "what is a healthy breakfast ?",
    "what keeps a plane in the air ?",
    "is drinking coffee unhealthy ?",
    "what do i need to open a small shop ?",
]
NEGATIVES = [
    "how do i tune a violin ?",
    "how can i gain weight ?",
    "why is the sea salty ?",
    "how can i learn french ?",
    "what should i cook for dinner ?",
    "how do birds fly ?",
    "is tea good for you ?",
    "how do i close a business ?",
]


def cfg_for(model_dir, negatives: int = 0, **kw) -> SupervisedContrastiveConfig:
    pairs = {"path": "unused.tsv", "negative_columns": [f"neg{m}" for m in range(negatives)]}
    return SupervisedContrastiveConfig.model_validate(
        {
            "model": {"name_or_path": str(model_dir), "max_length": 16, "pooling": "mean"},
            "train_pairs": pairs,
            **kw,
        }
    )


def batch_for(negatives: int) -> dict:
    return {"anchor": ANCHORS, "positive": POSITIVES, **({"negative_0": NEGATIVES} if negatives else {})}


def mnrl(temperature: float):
    from sentence_transformers.sentence_transformer.losses.multiple_negatives_ranking import (
        MultipleNegativesRankingLoss,
    )

    return MultipleNegativesRankingLoss(model=torch.nn.Identity(), scale=1 / temperature)


def build(cfg):
    from trainers.encoder import build_pooled_encoder

    torch.manual_seed(0)
    return build_pooled_encoder(cfg)


@pytest.mark.parametrize("negatives", [0, 1])
def test_the_loss_is_sentence_transformers_mnrl_on_the_same_inputs(tiny_bert_dir, negatives):
    """Through the recipe's ``compute_loss`` on the tiny model (dropout off): every column encoded alone, then
    MNRL (scale 1/τ) on [anchors, positives(, negatives)] - the loss to 1e-6 and every weight's gradient."""
    cfg = cfg_for(tiny_bert_dir, negatives)
    model, tok = build(cfg)
    model.eval()  # no dropout: the two encodings must see the same network
    loss, logs = compute_loss(model, tok, batch_for(negatives), cfg)
    ours = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    def embed(texts):
        enc = tok(texts, padding=True, truncation=True, max_length=16, return_tensors="pt")
        return model(enc["input_ids"], enc["attention_mask"])

    columns = [ANCHORS, POSITIVES, *([NEGATIVES] if negatives else [])]
    reference = mnrl(cfg.temperature).compute_loss_from_embeddings([embed(c) for c in columns], labels=None)
    theirs = torch.autograd.grad(reference, list(model.parameters()), allow_unused=True)
    assert loss.item() == pytest.approx(reference.item(), abs=1e-6) and logs["loss"] == pytest.approx(
        loss.item()
    )
    assert all(
        (g is None) == (t is None) and (g is None or torch.allclose(g, t, atol=1e-5, rtol=1e-4))
        for g, t in zip(ours, theirs, strict=True)
    )


def test_the_loss_from_features_against_a_hand_computation():
    """Two anchors, their positives and one negative each, τ = 0.5: cross-entropy over cos/τ, by hand."""
    a = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    p = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    n = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])
    # cos(a_i, [p_0, p_1, n_0, n_1]) / 0.5
    logits = torch.tensor([[2.0, 1.41421356, 0.0, -2.0], [0.0, 1.41421356, 2.0, 0.0]])
    expected = -(torch.log_softmax(logits, 1)[0, 0] + torch.log_softmax(logits, 1)[1, 1]) / 2
    assert multiple_negatives_loss(a, p, [n], 0.5).item() == pytest.approx(expected.item(), rel=1e-6)


# ---------------------------------------------------------------- distributed equivalence
def _worker(rank: int, world: int, model_dir: str, out_dir: str, init_file: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg = cfg_for(model_dir, negatives=1)
    model, tok = build(cfg)
    model.eval()
    b = len(ANCHORS) // world
    local = {k: v[rank * b : (rank + 1) * b] for k, v in batch_for(1).items()}
    ddp = DDP(model)  # held: a DDP dropped before the backward takes its gradient hooks with it
    loss, logs = compute_loss(ddp, tok, local, cfg)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.save({"loss": logs["loss"], "grads": grads}, Path(out_dir) / f"rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_workers_with_gathered_negatives_equal_one_worker_with_the_whole_batch(tiny_bert_dir, tmp_path):
    """2 workers × 4 rows (anchor, positive, one negative), every embedding gathered: each worker's loss is the
    one-worker loss on the 8 rows, and DDP's averaged gradient is its gradient."""
    import torch.multiprocessing as mp

    torch.set_num_threads(1)
    cfg = cfg_for(tiny_bert_dir, negatives=1)
    model, tok = build(cfg)
    model.eval()
    loss, logs = compute_loss(model, tok, batch_for(1), cfg)
    loss.backward()
    ref = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    mp.spawn(
        _worker, args=(2, str(tiny_bert_dir), str(tmp_path), str(tmp_path / "init")), nprocs=2, join=True
    )
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt")
        assert got["loss"] == pytest.approx(logs["loss"], abs=1e-5)
        assert set(got["grads"]) == set(ref)
        for name, g in ref.items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- rows
def test_rows_are_read_with_their_negatives_and_a_bad_row_names_its_line(tmp_path):
    from orchestrator.errors import DataError

    good = tmp_path / "pairs.tsv"
    good.write_text("q\tpos\tneg\tlabel\nwho ?\tthem .\tus .\t1\nwhy ?\tbecause .\tso .\t0\n")
    rows = TrainingRows(
        path=str(good),
        anchor_column="q",
        positive_column="pos",
        negative_columns=["neg"],
        where={"label": ["1"]},
    )
    assert rows.rows() == [["who ?", "them .", "us ."]]
    bad = tmp_path / "bad.tsv"
    bad.write_text("q\tpos\nwho ?\tthem .\nwhy ?\t \n")
    with pytest.raises(DataError, match=rf"^{bad}:3: empty pos$"):
        TrainingRows(path=str(bad), anchor_column="q", positive_column="pos").rows()
    with pytest.raises(DataError, match=rf"^{bad}:1: missing column\(s\) neg"):
        TrainingRows(path=str(bad), anchor_column="q", positive_column="pos", negative_columns=["neg"]).rows()


def test_a_beir_folders_training_qrels_are_the_rows(tmp_path):
    """Each query with each of its relevant passages (title + text), a 0-score row left out; a bad line refused
    with its file and line; negative columns refused for a BEIR folder."""
    from orchestrator.config import validate
    from orchestrator.errors import ConfigError, DataError

    folder = tmp_path / "mine"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "Cats", "text": "they purr"}\n{"_id": "d2", "text": "dogs bark"}\n'
        '{"_id": "d3", "text": "fish swim"}\n'
    )
    (folder / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "what purrs"}\n{"_id": "q2", "text": "pets"}\n'
    )
    qrels = folder / "qrels" / "train.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td1\t1\nq2\td2\t2\nq2\td3\t0\n")
    rows = TrainingRows(path=str(folder), format="beir").rows()
    assert rows == [["what purrs", "Cats they purr"], ["pets", "Cats they purr"], ["pets", "dogs bark"]]
    qrels.write_text("query-id\tcorpus-id\tscore\nq1\td9\t1\n")
    with pytest.raises(DataError, match=r"train.tsv:2: corpus-id 'd9' is not in corpus.jsonl"):
        TrainingRows(path=str(folder), format="beir").rows()
    with pytest.raises(ConfigError, match="negative_columns and where are for a TSV"):
        validate(TrainingRows, {"path": "x", "format": "beir", "negative_columns": ["neg"]}, "x.yaml")


def test_matryoshka_is_sentence_transformers_matryoshka_loss_around_mnrl(tiny_bert_dir):
    """``matryoshka_dims`` [32, 16, 8] with weights [1, 0.5, 0.25] through the recipe's ``compute_loss`` equals
    ``MatryoshkaLoss(MultipleNegativesRankingLoss)`` on the same tiny model and texts: the loss to 1e-6, every
    weight's gradient; and it is not the plain MNRL (the dimensions count)."""
    from sentence_transformers.sentence_transformer.losses.matryoshka import MatryoshkaLoss
    from sentence_transformers.sentence_transformer.losses.multiple_negatives_ranking import (
        MultipleNegativesRankingLoss,
    )

    dims, weights = [32, 16, 8], [1.0, 0.5, 0.25]
    cfg = cfg_for(tiny_bert_dir, 1, matryoshka_dims=dims, matryoshka_weights=weights)
    model, tok = build(cfg)
    model.eval()
    loss, logs = compute_loss(model, tok, batch_for(1), cfg)
    ours = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)

    st = AsSentenceTransformer(model, 32)
    reference = MatryoshkaLoss(
        st, MultipleNegativesRankingLoss(st, scale=1 / cfg.temperature), dims, matryoshka_weights=weights
    )
    features = [
        dict(tok(c, padding=True, truncation=True, max_length=16, return_tensors="pt"))
        for c in (ANCHORS, POSITIVES, NEGATIVES)
    ]
    theirs_loss = reference(features, labels=None)
    theirs = torch.autograd.grad(theirs_loss, list(model.parameters()), allow_unused=True)
    assert loss.item() == pytest.approx(theirs_loss.item(), abs=1e-6)
    assert set(logs) >= {"loss_dim32", "loss_dim16", "loss_dim8"}
    assert all(
        (g is None) == (t is None) and (g is None or torch.allclose(g, t, atol=1e-5, rtol=1e-4))
        for g, t in zip(ours, theirs, strict=True)
    )
    plain, _ = compute_loss(model, tok, batch_for(1), cfg_for(tiny_bert_dir, 1))
    assert abs(plain.item() - loss.item()) > 1e-3


def test_matryoshka_dims_are_refused_where_they_cannot_be_trained(tiny_bert_dir):
    from orchestrator.config import validate
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError, match="matryoshka_dims must be distinct positive sizes"):
        validate(
            SupervisedContrastiveConfig, {"train_pairs": {"path": "x"}, "matryoshka_dims": [64, 64]}, "c.yaml"
        )
    with pytest.raises(ConfigError, match=r"matryoshka_weights \[1.0\]: one weight"):
        validate(
            SupervisedContrastiveConfig,
            {"train_pairs": {"path": "x"}, "matryoshka_dims": [64, 32], "matryoshka_weights": [1.0]},
            "c.yaml",
        )
    cfg = cfg_for(tiny_bert_dir, 0, matryoshka_dims=[64, 8])
    with pytest.raises(
        ConfigError, match=r"matryoshka_dims: 64 is larger than the embedding of .*tiny-bert \(32\)"
    ):
        cfg.check_matryoshka(cfg.model.name_or_path)


def test_the_card_of_a_matryoshka_model_lists_its_sizes_and_how_to_load_one():
    from card import card_for

    def card(**kw) -> str:
        return card_for(SupervisedContrastiveConfig.model_validate({"train_pairs": {"path": "x"}, **kw}))

    text = card(matryoshka_dims=[64, 384, 128])
    assert "Trained at 384, 128, 64 dimensions" in text and "truncate_dim=d" in text
    assert "Matryoshka" not in card()
