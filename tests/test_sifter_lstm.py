"""SIFTER-LSTM: the short-circuit is exact, the cell is nn.LSTM when 𝕏 is empty, word sets,
and a Ray Train run that exports, reloads, tests and logs an MLflow pyfunc."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import torch

from trainers.sifter_lstm import (
    Batcher,
    SifterLSTM,
    SifterLSTMConfig,
    build_model,
    lexicon_words,
    train_data_words,
)


def copied(ref: torch.nn.LSTM) -> SifterLSTM:
    cell = SifterLSTM(ref.input_size, ref.hidden_size)
    with torch.no_grad():
        for ours, theirs in [
            ("weight_ih", "weight_ih_l0"),
            ("weight_hh", "weight_hh_l0"),
            ("bias_ih", "bias_ih_l0"),
            ("bias_hh", "bias_hh_l0"),
        ]:
            getattr(cell, ours).copy_(getattr(ref, theirs))
    return cell


def test_cell_equals_torch_lstm_when_the_set_is_empty():
    torch.manual_seed(0)
    ref = torch.nn.LSTM(24, 16, batch_first=True).double()
    cell = copied(ref).double()
    x = torch.randn(5, 9, 24, dtype=torch.double)
    out_ref, (h_ref, c_ref) = ref(x)
    out, h, c = cell(x, torch.zeros(5, 9, dtype=torch.bool))
    assert torch.allclose(out, out_ref, atol=1e-6) and torch.allclose(h, h_ref[0], atol=1e-6)
    assert torch.allclose(c, c_ref[0], atol=1e-6)
    # padded batch: h_T at each sequence's last real step = packed nn.LSTM's h_n
    lengths = torch.tensor([9, 3, 7, 1, 5])
    valid = torch.arange(9)[None, :] < lengths[:, None]
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    _, (h_packed, _) = ref(packed)
    _, h, _ = cell(x, None, valid)
    assert torch.allclose(h, h_packed[0], atol=1e-6)
    # float32 as trained: still within 1e-6
    ref32, x32 = ref.float(), x.float()
    assert torch.allclose(copied(ref32)(x32)[0], ref32(x32)[0], atol=1e-6)


def test_input_gate_is_exactly_one_for_words_in_the_set():
    torch.manual_seed(1)
    cell = SifterLSTM(8, 6)
    x_w = torch.randn(4, 24)
    h, c = torch.randn(4, 6), torch.randn(4, 6)
    short = torch.tensor([[True], [False], [True], [False]])
    h_new, c_new, i = cell.step(x_w, h, c, short)
    gates = x_w + h @ cell.weight_hh.t()
    gi, gf, gg, go = gates.chunk(4, dim=1)
    learned = torch.sigmoid(gi)
    assert torch.equal(i[0], torch.ones(6)) and torch.equal(i[2], torch.ones(6))  # exactly 1
    assert torch.allclose(i[1], learned[1]) and torch.allclose(i[3], learned[3])
    expected_c = torch.sigmoid(gf) * c + torch.where(short, torch.ones_like(learned), learned) * torch.tanh(
        gg
    )
    assert torch.allclose(c_new, expected_c, atol=1e-7)
    assert torch.allclose(c_new[0], torch.sigmoid(gf[0]) * c[0] + torch.tanh(gg[0]), atol=1e-7)
    assert not torch.allclose(c_new[1], torch.sigmoid(gf[1]) * c[1] + torch.tanh(gg[1]), atol=1e-3)


def test_empty_set_is_the_baseline_bit_for_bit(tiny_bert_dir):
    texts = ["a charming and often affecting journey .", "unflinchingly bleak and desperate"]
    base = {"embeddings_from": str(tiny_bert_dir), "hidden_size": 16}
    torch.manual_seed(0)
    sifter, b1, _ = build_model(
        SifterLSTMConfig.model_validate({**base, "short_circuit": True}), word_set=set()
    )
    torch.manual_seed(0)
    plain, b2, _ = build_model(
        SifterLSTMConfig.model_validate({**base, "short_circuit": False}), word_set={"charming"}
    )
    sifter.eval(), plain.eval()
    assert torch.equal(sifter(*b1(texts)), plain(*b2(texts)))
    torch.manual_seed(0)
    with_set, b3, _ = build_model(SifterLSTMConfig.model_validate(base), word_set={"charming", "bleak"})
    with_set.eval()
    assert not torch.equal(with_set(*b3(texts)), plain(*b2(texts)))  # the short-circuit changes the output


def test_batcher_marks_every_piece_of_a_set_word(tiny_bert_dir):
    from orchestrator.models import load_tokenizer

    tok = load_tokenizer(str(tiny_bert_dir))
    word = "unflinchingly"
    pieces = tok.tokenize(word)
    assert len(pieces) > 1
    ids, short, valid = Batcher(tok, {word, "bleak"}, 64)([f"{word} bleak and desperate", "fine"])
    n = len(pieces)
    assert short[0, : n + 1].all() and not short[0, n + 1 :].any()  # all pieces + "bleak"
    assert valid[0].sum() == n + 3 and valid[1].sum() == 1 and not short[1].any()
    assert ids[1, 1:].eq(0).all()  # padded


def test_word_sets():
    words = lexicon_words(
        ["data/lexicon/opinion_lexicon_positive.txt", "data/lexicon/opinion_lexicon_negative.txt"]
    )
    assert {"good", "bad", "charming", "bleak"} <= words and "the" not in words and len(words) > 6700
    rows = (
        [("great fun film", 1)] * 6 + [("dull boring film", 0)] * 6 + [("the film", 1), ("the film", 0)] * 3
    )
    derived = train_data_words(rows, top_k=4, min_count=5)
    assert derived == {"great", "fun", "dull", "boring"}  # 'film' and 'the' are in both classes


def test_the_frequency_matched_control_has_the_lexicons_size_and_frequency_profile():
    """The control word set (``word_set.source: random_matched``) on the shipped SST-2 sample and the Hu & Liu
    lexicon: as many distinct words as the lexicon has in the training text, none of them the lexicon's, each
    frequency band (floor(log2 count)) within 2 words of the lexicon's, the tokens it opens the gate on within
    10% of the lexicon's; the same set for a seed, another for another seed."""
    from orchestrator.data.labelled import read_labelled
    from orchestrator.data.word_sets import band, frequency_matched, token_counts

    lexicon = lexicon_words(
        ["data/lexicon/opinion_lexicon_positive.txt", "data/lexicon/opinion_lexicon_negative.txt"]
    )
    texts = [t for t, _ in read_labelled("data/sst2/train_sample.tsv", text_column="sentence")]
    counts = token_counts(texts)
    seen = {w for w in lexicon if counts[w]}
    control = frequency_matched(lexicon, texts, seed=1)
    assert len(seen) > 500 and len(control) == len(seen) and not control & lexicon
    assert all(counts[w] > 0 for w in control)
    profile = lambda ws: Counter(band(counts[w]) for w in ws)  # noqa: E731
    assert all(abs(profile(control)[b] - n) <= 2 for b, n in profile(seen).items()), (
        profile(seen),
        profile(control),
    )
    tokens = lambda ws: sum(counts[w] for w in ws)  # noqa: E731
    assert abs(tokens(control) - tokens(seen)) <= 0.1 * tokens(seen)
    assert frequency_matched(lexicon, texts, seed=1) == control != frequency_matched(lexicon, texts, seed=2)


def test_bad_labelled_files(tmp_path):
    from orchestrator.data.labelled import read_labelled
    from orchestrator.errors import DataError

    p = tmp_path / "x.tsv"
    p.write_text("sentence\tlabel\ngood\t1\nbad\tneg\n")
    with pytest.raises(DataError, match=r"x\.tsv:3: label 'neg' is not an integer class"):
        read_labelled(str(p), text_column="sentence")
    p.write_text("text\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match=r"x\.tsv:1: missing column\(s\) sentence"):
        read_labelled(str(p), text_column="sentence")


def test_sentiment_model_learns(tiny_bert_dir):
    """A few Adam steps on 64 SST-2 rows lower the loss (the training signal reaches every part)."""
    from orchestrator.data.labelled import read_labelled
    from trainers.sifter_lstm import compute_loss

    torch.manual_seed(0)
    cfg = SifterLSTMConfig.model_validate(
        {"embeddings_from": str(tiny_bert_dir), "hidden_size": 32, "dropout": 0.0}
    )
    model, batcher, _ = build_model(cfg)
    rows = read_labelled("data/sst2/train_sample.tsv", text_column="sentence", limit=64)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss, _ = compute_loss(model, batcher, [t for t, _ in rows], [y for _, y in rows], cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.85 * losses[0]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sifter_lstm_under_ray_train_exports_and_logs(
    ray_cluster, tiny_bert_dir, tmp_path, embedded_tracking
):
    import mlflow

    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import build_trainer, export_and_test, fit
    from trainers.sifter_lstm import load_exported

    method = get_method("sifter_lstm")
    cfg = SifterLSTMConfig.model_validate(
        {
            "embeddings_from": str(tiny_bert_dir),
            "hidden_size": 32,
            "train": {"lr": 3e-3, "batch_size": 16, "max_steps": 6, "eval_steps": 3},
            "scaling": {"num_workers": 2, "cpus_per_worker": 1},
            "data": {"limit": 200},
            "run": {"storage": str(tmp_path / "store")},
        }
    )
    shards = method.prepare_data(cfg)
    assert method.prepare_data(cfg) == shards  # content-addressed: written once
    outcome = fit(build_trainer(method, cfg, shards, name="lstm"), method, cfg)
    assert [int(r["step"]) for r in outcome.history] == [3, 6]
    out, report = export_and_test(method, cfg, outcome, tmp_path / "model")
    # the exported folder is the selected checkpoint: its dev accuracy is the one training reported for it
    assert report.metrics["dev_accuracy"] == pytest.approx(outcome.best_metrics["dev_accuracy"], abs=1e-12)
    assert report.headline == "test_accuracy" and report.headline_value == report.metrics["test_accuracy"]
    model, batcher, loaded = load_exported(out)
    assert loaded == cfg and batcher.word_set and "good" in batcher.word_set
    # logged the way the train job logs its run (a record replayed into MLflow): the model is the method's own
    # pyfunc, not a transformers folder - this path refused it ("has no config.json") and the job called that
    # a tracking outage
    from orchestrator import outbox
    from orchestrator.drivers.registry import log_model
    from orchestrator.tracking import logged_models

    record = outbox.run_record(
        experiment="sieve",
        run_name="lstm",
        method="sifter_lstm",
        params={},
        history=[],
        metrics=report.metrics,
        model_dir=str(out),
        model_format="sieve-lstm",
    )
    run_id = outbox.replay(
        record, f"sqlite:///{tmp_path / 'mlflow.db'}", log_model
    )  # its own store, whatever tests ran before
    [model_id] = logged_models(run_id, "model")
    info = mlflow.models.get_model_info(f"models:/{model_id}")
    probs = mlflow.pyfunc.load_model(info.model_uri).predict(["a charming journey .", "bleak and dull"])
    assert len(probs) == 2 and all(0 <= p <= 1 for p in probs)
    # it loads in a fresh process elsewhere, where Sieve's packages come only from the model's code paths
    import json
    import subprocess
    import sys

    other = tmp_path / "elsewhere"
    other.mkdir()
    res = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent / "pyfunc_check.py"),
            mlflow.get_tracking_uri(),
            info.model_uri,
            "a charming journey .",
            "bleak and dull",
        ],
        cwd=other,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == pytest.approx(probs, abs=1e-6)
