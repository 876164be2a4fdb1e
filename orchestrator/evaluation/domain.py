"""Domain evaluation: what TSDAE's paper argues STS alone cannot show.

An evaluator is anything with a ``name`` and ``__call__(encoder) -> dict[str, float]`` (fractions,
higher is better); :func:`get_evaluator` builds one by name. Two kinds exist:

* :class:`PairAPEvaluator` - binary paraphrase pairs. Cosine similarity of the two sentences'
  embeddings is ranked against the 0/1 labels and scored by **average precision**, as the
  TSDAE paper does for TwitterPara (SemEval-2015 PIT test and the Twitter URL corpus):

      AP = Σ_k (R_k − R_{k−1}) · P_k

  over the distinct score thresholds in descending order (R_k, P_k: recall and precision of
  "score ≥ threshold k"). Ties are one threshold, so this equals
  ``sklearn.metrics.average_precision_score`` exactly (``tests/test_domain_eval.py``).

* :class:`RerankingEvaluator` - a query with positive and negative candidates, scored by mean
  average precision of the cosine ranking (AskUbuntu's and SciDocs' form in the TSDAE paper).
  AskUbuntu, CQADupStack and SciDocs texts are not available on these machines: the evaluator
  reads a JSONL file (``{"query": ..., "positive": [...], "negative": [...]}`` per line) from a
  configured path, and asking for one without a path is a clear error, not a silent skip.

Built-in names: ``twitterpara`` (PIT-2015 test + Twitter URL test, and their mean, the paper's
TwitterPara number), ``twitterpara_pit``, ``twitterpara_url``, ``twitterpara_pit_dev`` (for model
selection), and ``askubuntu`` / ``cqadupstack`` / ``scidocs`` with ``path=...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from orchestrator.errors import DataError
from orchestrator.evaluation.beir import BeirEvaluator, json_lines
from orchestrator.evaluation.encode import HFEncoder, test_time_pooling
from orchestrator.evaluation.retrieval import QQP_DEV, RetrievalEvaluator
from orchestrator.evaluation.sts import read_sts_tsv
from orchestrator.evaluation.suite import TestReport, sts_report
from orchestrator.models import load_encoder, pooling_for

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "twitterpara"
PAIR_FILES = {
    "twitterpara_pit": "pit2015-test.tsv",
    "twitterpara_url": "twitterurl-test.tsv",
    "twitterpara_pit_dev": "pit2015-dev.tsv",
}
RERANKING = ("askubuntu", "cqadupstack", "scidocs")


def average_precision(scores, labels) -> float:
    """AP of ranking ``scores`` against binary ``labels`` (ties form one threshold)."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise ValueError("scores and labels must be 1-D and of equal length")
    if not np.isin(labels, (0, 1)).all():
        raise ValueError("labels must be 0 or 1")
    positives = int(labels.sum())
    if positives == 0:
        return 0.0
    order = np.argsort(-scores, kind="mergesort")
    s, y = scores[order], labels[order]
    tp = np.cumsum(y)
    last_of_tie = np.r_[s[1:] != s[:-1], True]  # one threshold per distinct score
    tp = tp[last_of_tie]
    seen = (np.arange(1, len(s) + 1))[last_of_tie]
    precision = tp / seen
    recall = tp / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return np.sum(a * b, axis=1)


def encode_unique(encoder, texts: list[str]) -> dict[str, np.ndarray]:
    """Each distinct sentence encoded once (TwitterPara repeats a topic's sentence many times)."""
    unique = list(dict.fromkeys(texts))
    return dict(zip(unique, encoder.encode(unique), strict=True))


@dataclass
class PairAPEvaluator:
    name: str
    path: Path

    def load(self):
        data = read_sts_tsv(self.path, self.name, score_column="label")
        bad = np.flatnonzero(~np.isin(data.scores, (0, 1)))
        if len(bad):
            raise DataError(f"{self.path}:{bad[0] + 2}: label {data.scores[bad[0]]:g} is not 0 or 1")
        return data

    def scores(self, encoder) -> tuple[np.ndarray, np.ndarray]:
        """(cosine of each pair, its 0/1 label)."""
        data = self.load()
        emb = encode_unique(encoder, data.sentence1 + data.sentence2)
        sims = cosine_rows(
            np.stack([emb[t] for t in data.sentence1]), np.stack([emb[t] for t in data.sentence2])
        )
        return sims, data.scores.astype(int)

    def __call__(self, encoder) -> dict[str, float]:
        return {f"{self.name}_ap": average_precision(*self.scores(encoder))}


@dataclass
class TwitterParaEvaluator:
    """The paper's TwitterPara score: the mean of the PIT-2015 and Twitter URL test APs."""

    name: str = "twitterpara"
    data_dir: Path = DATA_DIR

    def __call__(self, encoder) -> dict[str, float]:
        out = {}
        for sub in ("twitterpara_pit", "twitterpara_url"):
            out.update(PairAPEvaluator(sub, self.data_dir / PAIR_FILES[sub])(encoder))
        out["twitterpara_ap"] = (out["twitterpara_pit_ap"] + out["twitterpara_url_ap"]) / 2
        return out


@dataclass
class RerankingEvaluator:
    name: str
    path: Path

    def load(self) -> list[dict]:
        if not self.path.is_file():
            raise DataError(
                f"{self.path}: no such file ({self.name} needs its JSONL of query/positive/negative)"
            )
        rows = []
        for lineno, row in json_lines(str(self.path)):
            if not isinstance(row.get("query"), str) or not row.get("positive"):
                raise DataError(
                    f'{self.path}:{lineno}: expected {{"query": str, "positive": [..], "negative": [..]}}'
                )
            rows.append(row)
        if not rows:
            raise DataError(f"{self.path}: no queries")
        return rows

    def __call__(self, encoder) -> dict[str, float]:
        rows = self.load()
        texts = [t for r in rows for t in [r["query"], *r["positive"], *r.get("negative", [])]]
        emb = encode_unique(encoder, texts)
        aps = []
        for r in rows:
            cands = [*r["positive"], *r.get("negative", [])]
            sims = cosine_rows(np.stack([emb[r["query"]]] * len(cands)), np.stack([emb[c] for c in cands]))
            aps.append(average_precision(sims, [1] * len(r["positive"]) + [0] * len(r.get("negative", []))))
        return {f"{self.name}_map": float(np.mean(aps))}


def get_evaluator(name: str, path: str | None = None):
    if name == "twitterpara":
        return TwitterParaEvaluator(data_dir=Path(path) if path else DATA_DIR)
    if name in PAIR_FILES:
        return PairAPEvaluator(name, Path(path) if path else DATA_DIR / PAIR_FILES[name])
    if (
        name == "qqp_retrieval"
    ):  # duplicate-question retrieval (nDCG@10 ...), or one built from another pair file
        return RetrievalEvaluator(name, Path(path) if path else QQP_DEV)
    if name.startswith("beir"):  # your own retrieval data, a BEIR folder
        if not path:
            raise DataError(f"domain evaluator {name!r}: give its BEIR folder (eval.domain_paths.{name})")
        return BeirEvaluator(name, path)
    if name in RERANKING:
        if not path:
            raise DataError(
                f"domain evaluator {name!r}: its texts are not shipped; give its JSONL path "
                f"(eval.domain_paths.{name})"
            )
        return RerankingEvaluator(name, Path(path))
    known = ["twitterpara", *PAIR_FILES, "qqp_retrieval", *RERANKING, "beir_<name> (a BEIR folder)"]
    raise DataError(f"unknown domain evaluator {name!r}: expected one of {', '.join(known)}")


def check_domain_tasks(names: list[str], paths: dict[str, str] | None = None) -> None:
    """Before any work: every domain task exists, and a BEIR folder is read through (streamed) and checked (file and
    line)."""
    for name in names:
        evaluator = get_evaluator(name, (paths or {}).get(name))
        if isinstance(evaluator, BeirEvaluator):
            evaluator.check()


def domain_report(encoder, names: list[str], paths: dict[str, str] | None = None):
    metrics: dict[str, float] = {}
    for name in names:
        metrics.update(get_evaluator(name, (paths or {}).get(name))(encoder))
    rows = ["| metric | ×100 |", "|---|---:|"] + [f"| {k} | {v * 100:.2f} |" for k, v in metrics.items()]
    headline = "twitterpara_ap" if "twitterpara_ap" in metrics else next(iter(metrics))
    return TestReport(
        "Domain tasks (average precision ×100)", metrics, headline, "\n".join(rows), {"domain": metrics}
    )


def evaluate_encoder(cfg, model_dir, tasks: list[str] | None = None) -> TestReport:
    """The final test of an exported encoder folder, read with the config's test-time pooling: the domain
    tasks of ``eval.domain`` (when any: their headline leads) and the STS tasks (``tasks`` or ``eval.tasks``); with
    ``matryoshka_dims`` (a Matryoshka-trained method's config), every figure again at each smaller size
    (``<metric>_dim<d>``; the headline stays the whole embedding's)."""
    model, tok = load_encoder(str(model_dir))
    pooling = test_time_pooling(pooling_for(cfg))
    enc = HFEncoder(
        model, tok, pooling=pooling, batch_size=cfg.eval.batch_size, max_length=cfg.eval.max_length
    )
    sizes = sorted(
        (d for d in getattr(cfg, "matryoshka_dims", []) if d < model.config.hidden_size), reverse=True
    )
    cache: dict = {}  # a Matryoshka model: every test again at each smaller size, each text list encoded once
    report = test_report(Truncated(enc, None, cache) if sizes else enc, cfg, tasks, pooling)
    for d in sizes:
        cut = test_report(Truncated(enc, d, cache), cfg, tasks, pooling)
        report = report.merged(
            TestReport(
                f"the first {d} dimensions",
                {f"{k}_dim{d}": v for k, v in cut.metrics.items()},
                report.headline,
                cut.table,
                {},
            )
        )
    return report


def test_report(enc, cfg, tasks: list[str] | None, pooling: str) -> TestReport:
    report = sts_report(enc, tasks or cfg.eval.tasks, pooling)
    return (
        domain_report(enc, cfg.eval.domain, cfg.eval.domain_paths).merged(report)
        if cfg.eval.domain
        else report
    )


class Truncated:
    """An encoder read at its first ``dim`` coordinates (a Matryoshka size; cosine scores normalise them; None:
    all); a list of texts is encoded once for all sizes (``cache``)."""

    def __init__(self, encoder: HFEncoder, dim: int | None, cache: dict):
        self.encoder, self.dim, self.cache = encoder, dim, cache

    def encode(self, sentences, desc: str = "encoding"):
        key = tuple(sentences)
        if key not in self.cache:
            self.cache[key] = self.encoder.encode(sentences, desc)
        return self.cache[key][:, : self.dim]
