import json

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from orchestrator.errors import DataError
from orchestrator.evaluation import sts
from orchestrator.evaluation.encode import HFEncoder

ROOT = sts.DATA_DIR.parents[1]


def test_aggregations_on_hand_computed_toy():
    # subset A: perfectly monotone (spearman 1); subset B: perfectly reversed (spearman -1), 2x larger
    sims = np.array([0.1, 0.2, 0.3, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    gold = np.array([1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    subsets = ["A"] * 3 + ["B"] * 6
    r = sts.aggregate(sims, gold, subsets)
    assert r["spearman"]["mean"] == pytest.approx(0.0)  # (1 + -1) / 2
    assert r["spearman"]["wmean"] == pytest.approx((3 * 1 + 6 * -1) / 9)  # -1/3
    assert r["spearman"]["all"] == pytest.approx(spearmanr(sims, gold)[0])
    assert r["pearson"]["mean"] == pytest.approx((1.0 + -1.0) / 2)
    assert r["pearson"]["all"] == pytest.approx(pearsonr(sims, gold)[0])
    assert r["subsets"]["B"]["n"] == 6


class BagOfWordsEncoder:
    """A cheap, deterministic encoder (hashed word counts) for testing the aggregation on real data."""

    def encode(self, sentences, desc=""):
        out = np.zeros((len(sentences), 512), dtype=np.float32)
        for i, s in enumerate(sentences):
            for w in s.lower().split():
                out[i, sum(map(ord, w)) * 2654435761 % 512] += 1.0
        return out


def test_all_differs_from_mean_on_real_sts12():
    r = sts.evaluate(BagOfWordsEncoder(), ["sts12"])["tasks"]["sts12"]
    assert r["n"] == 3108 and len(r["subsets"]) == 5
    assert abs(r["spearman"]["all"] - r["spearman"]["mean"]) > 1e-3
    assert abs(r["spearman"]["wmean"] - r["spearman"]["mean"]) > 1e-4


class CountingEncoder(BagOfWordsEncoder):
    def __init__(self):
        self.encoded = []

    def encode(self, sentences, desc=""):
        self.encoded += list(sentences)
        return super().encode(sentences, desc)


def test_a_sentence_several_tasks_share_is_encoded_once_with_the_same_figures():
    enc = CountingEncoder()
    together = sts.evaluate(enc, sts.SEVEN_TASKS)
    assert len(enc.encoded) == len(set(enc.encoded)) == 26289  # of 28,530 per-task unique sentences
    for task in sts.SEVEN_TASKS:
        alone = sts.evaluate_data(BagOfWordsEncoder(), sts.load_task(task))
        assert together["tasks"][task] == alone, task


def test_task_sizes_match_senteval():
    sizes = {t: len(sts.load_task(t)) for t in sts.SEVEN_TASKS}
    assert sizes == {
        "sts12": 3108,
        "sts13": 1500,
        "sts14": 3750,
        "sts15": 3000,
        "sts16": 1186,
        "stsb": 1379,
        "sickr": 4927,
    }


@pytest.mark.slow
def test_stsb_mean_pooling_equals_sentence_transformers(default_encoder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from orchestrator.models import default_model_path

    model, tok = default_encoder
    data = sts.load_task("stsb")
    ours = sts.evaluate_data(HFEncoder(model, tok, pooling="mean", max_length=256, batch_size=32), data)
    st = SentenceTransformer(str(default_model_path()), device="cpu")
    st.max_seq_length = 256
    ev = EmbeddingSimilarityEvaluator(
        data.sentence1,
        data.sentence2,
        data.scores.tolist(),
        similarity_fn_names=["cosine"],
        write_csv=False,
        batch_size=32,
    )
    ref = ev(st)
    ref_spearman = next(v for k, v in ref.items() if k.endswith("spearman_cosine"))
    ref_pearson = next(v for k, v in ref.items() if k.endswith("pearson_cosine"))
    assert ours["spearman"]["all"] == pytest.approx(ref_spearman, abs=1e-4)
    assert ours["pearson"]["all"] == pytest.approx(ref_pearson, abs=1e-4)
    assert ours["spearman"]["all"] == pytest.approx(0.8203, abs=5e-4)  # published all-MiniLM-L6-v2 STS-B


@pytest.mark.parametrize(
    "content,match",
    [
        ("sentence1\tsentence2\n a\tb\n", r"bad\.tsv:1: missing column\(s\) score"),
        (
            "sentence1\tsentence2\tscore\na\tb\t3.0\nc\td\tnot-a-number\n",
            r"bad\.tsv:3: score 'not-a-number' is not a number",
        ),
        ("", r"bad\.tsv: empty file"),
        ("sentence1\tsentence2\tscore\n", r"bad\.tsv: no data rows"),
        ("sentence1\tsentence2\tscore\na\tb\n", r"bad\.tsv:2: expected 3 tab-separated fields, got 2"),
    ],
)
def test_bad_input_names_file_and_line(tmp_path, content, match):
    p = tmp_path / "bad.tsv"
    p.write_text(content)
    with pytest.raises(DataError, match=match):
        sts.read_sts_tsv(p)


def test_invalid_utf8_names_line(tmp_path):
    p = tmp_path / "bad.tsv"
    p.write_bytes(b"sentence1\tsentence2\tscore\na\tb\t1\n\xff\xfe\tc\t2\n")
    with pytest.raises(DataError, match=r"bad\.tsv:3: not valid UTF-8"):
        sts.read_sts_tsv(p)


def run_cli(jobs, *args, cwd=None):
    """``python jobs/evaluate.py ARGS`` as its own process, forked by the session's job server."""
    return jobs.run([ROOT / "jobs" / "evaluate.py", *args], cwd=cwd, timeout=300)


# evaluate.py's one-line refusals (a bad --sts-file row, a hub id) are cases of the bad-input catalogue
# (tests/test_reliability.py), run there as forks of one process.


def test_cli_writes_json_schema(tmp_path, tiny_bert_dir, job_server):
    pairs = tmp_path / "pairs.tsv"
    rows = ["sentence1\tsentence2\tscore"] + [f"a cat sat {i}\ta dog ran {i % 3}\t{i % 5}" for i in range(20)]
    pairs.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.json"
    res = run_cli(
        job_server,
        "--model",
        str(tiny_bert_dir),
        "--pooling",
        "mean",
        "--tasks",
        "stsb",
        "--sts-file",
        str(pairs),
        "--json",
        str(out),
        "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    result = json.loads(out.read_text())
    assert result["model"] == str(tiny_bert_dir) and result["pooling"] == "mean"
    assert set(result["tasks"]) == {"stsb", "pairs"}
    assert result["tasks"]["stsb"]["n"] == 1379
    assert set(result["tasks"]["stsb"]["spearman"]) >= {"all", "mean", "wmean"}
    assert -1 <= result["avg"]["spearman_all"] <= 1 and "pearson_all" in result["avg"]
    # the average is the named tasks': your file is scored beside them, never averaged in
    assert result["avg"]["spearman_all"] == result["tasks"]["stsb"]["spearman"]["all"]
    assert "| stsb | 1379 |" in res.stdout
    # your file alone (no --tasks): only it is scored - no STS suite, no average
    res = run_cli(job_server, "--model", str(tiny_bert_dir), "--sts-file", str(pairs), "--json", str(out))
    assert res.returncode == 0, res.stderr
    alone = json.loads(out.read_text())
    assert set(alone["tasks"]) == {"pairs"} and alone["avg"] == {} and "| **avg** |" not in res.stdout
    assert alone["tasks"]["pairs"] == result["tasks"]["pairs"]


def test_cli_scores_a_baseline_beside_the_model_read_both_ways(tmp_path, tiny_bert_dir, job_server):
    """``--baseline`` scores the starting model in the same call, with the model's pooling and, when its
    folder saved another, with that one too; the difference per task. The same folder as both: +0.00 at the
    same reading, and the other reading's own figures."""
    out = tmp_path / "out.json"
    res = run_cli(
        job_server,
        "--model",
        str(tiny_bert_dir),
        "--baseline",
        str(tiny_bert_dir),
        "--pooling",
        "cls_before_pooler",
        "--tasks",
        "stsb",
        "--json",
        str(out),
        "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    result = json.loads(out.read_text())
    same, own = result["baselines"]
    assert (same["pooling"], own["pooling"]) == ("cls_before_pooler", "mean")  # the tiny folder saved mean
    assert same["tasks"]["stsb"]["spearman"]["all"] == result["tasks"]["stsb"]["spearman"]["all"]
    assert own["tasks"]["stsb"]["spearman"]["all"] != result["tasks"]["stsb"]["spearman"]["all"]
    assert "baseline " + str(tiny_bert_dir) + " read with cls_before_pooler" in res.stdout
    assert "| **avg** |" in res.stdout and "+0.00 |" in res.stdout


def test_same_seed_same_numbers(tiny_bert_dir):
    """Seeded random init → identical evaluation numbers, twice in one process."""
    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.models import load_tokenizer
    from orchestrator.seed import seed_everything

    tok = load_tokenizer(str(tiny_bert_dir))
    data = sts.load_task("stsb_dev")
    results = []
    for _ in range(2):
        seed_everything(123)
        model = BertModel(
            BertConfig(
                vocab_size=tok.vocab_size,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
            )
        )
        results.append(sts.evaluate_data(HFEncoder(model, tok, pooling="mean"), data))
    assert results[0]["spearman"] == results[1]["spearman"]
    seed_everything(124)
    other = BertModel(
        BertConfig(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    )
    assert (
        sts.evaluate_data(HFEncoder(other, tok, pooling="mean"), data)["spearman"] != results[0]["spearman"]
    )
    torch.use_deterministic_algorithms(False)


def test_cli_defaults_to_the_folders_saved_pooling_and_refuses_a_new_pooler(
    tmp_path, tiny_bert_dir, job_server
):
    """Evaluate.py scores a model the way it was saved (a sentence-transformers folder records its
    pooling) unless told otherwise, and refuses ``--pooling cls`` over pooler weights that would be
    freshly initialised - one line, no number from a random layer."""
    from transformers import AutoTokenizer, BertModel

    from orchestrator.export import export_encoder

    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "sentence1\tsentence2\tscore\n"
        + "".join(f"a cat sat {i}\ta dog ran {i % 3}\t{i % 5}\n" for i in range(12))
    )
    encoder = BertModel.from_pretrained(
        str(tiny_bert_dir), add_pooling_layer=False
    )  # as the trainers save it
    folder = export_encoder(
        encoder,
        AutoTokenizer.from_pretrained(str(tiny_bert_dir)),
        tmp_path / "cls-model",
        pooling="cls_before_pooler",
    )
    for model, expected in ((folder, "cls_before_pooler"), (tiny_bert_dir, "mean")):
        out = tmp_path / f"{expected}.json"
        res = run_cli(
            job_server,
            "--model",
            str(model),
            "--tasks",
            "",
            "--sts-file",
            str(pairs),
            "--json",
            str(out),
            "--no-progress",
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert json.loads(out.read_text())["pooling"] == expected
    res = run_cli(
        job_server, "--model", str(folder), "--pooling", "cls", "--tasks", "", "--sts-file", str(pairs)
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "has no pooler weights" in last

    # exported as the trainers export (their base named): every weight the base had is in the folder - its
    # pooler untouched, so nothing is "newly initialized" on load - and cls pooling is still refused
    import torch
    from transformers import AutoModel

    folder = export_encoder(
        encoder,
        AutoTokenizer.from_pretrained(str(tiny_bert_dir)),
        tmp_path / "trained",
        pooling="mean",
        base=str(tiny_bert_dir),
    )
    loaded, info = AutoModel.from_pretrained(str(folder), output_loading_info=True)
    base = AutoModel.from_pretrained(str(tiny_bert_dir))
    assert info["missing_keys"] == [] or info["missing_keys"] == set(), info
    assert torch.equal(loaded.pooler.dense.weight, base.pooler.dense.weight)
    res = run_cli(
        job_server, "--model", str(folder), "--pooling", "cls", "--tasks", "", "--sts-file", str(pairs)
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        "pooler is its base model's, never trained with this encoder" in res.stderr.strip().splitlines()[-1]
    )


def test_encoding_batches_sentences_of_one_token_length_and_matches_unbatched(tiny_bert_dir):
    """Batches are sorted by token count, not characters: a long word of few tokens and a short
    sentence of many must not share a batch with each other's lengths. The embeddings equal one
    sentence at a time (no padding at all), in the caller's order."""
    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.errors import SieveError
    from orchestrator.models import load_tokenizer
    from orchestrator.seed import seed_everything

    tok = load_tokenizer(str(tiny_bert_dir))
    seed_everything(7)
    model = BertModel(
        BertConfig(
            vocab_size=tok.vocab_size,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
        )
    ).eval()
    # characters and tokens disagree: long words of one token each, short letters of one token each
    sentences = ["a b c d e f g h", "cat", "a b c d e f g", "the", "understandings", "a b c"]
    lengths = [len(x) for x in tok(sentences)["input_ids"]]
    assert sorted(range(6), key=lambda i: -len(sentences[i])) != sorted(range(6), key=lambda i: -lengths[i])

    def widths_and_embeddings(enc):
        widths = []
        hook = model.register_forward_pre_hook(
            lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True
        )
        try:
            return widths, enc.encode(sentences)
        finally:
            hook.remove()

    widths, emb = widths_and_embeddings(HFEncoder(model, tok, pooling="mean", batch_size=2))
    assert widths == sorted(lengths, reverse=True)[::2], (
        widths,
        lengths,
    )  # each batch as wide as its longest
    chars = HFEncoder(model, tok, pooling="mean", batch_size=2, sort_by="chars")
    assert chars.lengths(sentences) == [len(s) for s in sentences]
    char_widths, char_emb = widths_and_embeddings(chars)
    assert sum(widths) < sum(char_widths), (widths, char_widths)  # fewer padded tokens computed
    single = HFEncoder(model, tok, pooling="mean", batch_size=1).encode(sentences)  # no padding at all
    np.testing.assert_allclose(emb, single, atol=1e-5)
    np.testing.assert_allclose(char_emb, single, atol=1e-5)
    with pytest.raises(SieveError, match="sort_by 'words'"):
        HFEncoder(model, tok, sort_by="words")
    torch.use_deterministic_algorithms(False)


def test_a_field_of_megabytes_is_read_as_text_and_a_bad_score_beside_it_still_names_its_line(tmp_path):
    """A 2 MB sentence (the csv module refuses fields over 128 KiB, with a traceback) is data like any
    other; what follows it is still checked line by line."""
    big = "word " * 400_000
    p = tmp_path / "big.tsv"
    p.write_text(f"sentence1\tsentence2\tscore\n{big}\tb\t3.0\nc\td\t1.0\n")
    data = sts.read_sts_tsv(p)
    assert data.sentence1[0] == big and list(data.scores) == [3.0, 1.0]
    p.write_text(f"sentence1\tsentence2\tscore\n{big}\tb\t3.0\nc\td\thigh\n")
    with pytest.raises(DataError, match=r"big\.tsv:3: score 'high' is not a number"):
        sts.read_sts_tsv(p)


def test_a_matryoshka_config_is_tested_at_every_size_as_sentence_transformers_truncates():
    """``matryoshka_dims`` [384, 64]: the test stage reports each figure again for the first 64 dimensions
    (``_dim64``), equal to sentence-transformers' evaluator on the model loaded with ``truncate_dim=64``; the
    headline stays the whole embedding's."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import EmbeddingSimilarityEvaluator

    from orchestrator.evaluation.domain import evaluate_encoder
    from orchestrator.models import default_model_path
    from trainers.supervised_contrastive import SupervisedContrastiveConfig

    cfg = SupervisedContrastiveConfig.model_validate(
        {"train_pairs": {"path": "x"}, "matryoshka_dims": [384, 64], "eval": {"domain": [], "batch_size": 32}}
    )
    report = evaluate_encoder(cfg, default_model_path(), tasks=["stsb"])
    data = sts.load_task("stsb")
    st = SentenceTransformer(str(default_model_path()), device="cpu", truncate_dim=64)
    st.max_seq_length = cfg.eval.max_length
    ref = EmbeddingSimilarityEvaluator(
        data.sentence1, data.sentence2, data.scores.tolist(), similarity_fn_names=["cosine"], write_csv=False
    )(st)
    assert report.metrics["sts_stsb_spearman_all_dim64"] == pytest.approx(
        next(v for k, v in ref.items() if k.endswith("spearman_cosine")), abs=1e-4
    )
    assert report.headline == "sts_avg_spearman_all" and "sts_stsb_spearman_all_dim384" not in report.metrics
    assert report.metrics["sts_stsb_spearman_all_dim64"] < report.metrics["sts_stsb_spearman_all"]
