"""STS evaluation harness: STS12-16, STS-B and SICK-R, as SentEval and SimCSE report them.

For each task the cosine similarity of the two sentence embeddings is correlated (Pearson and
Spearman) with the gold scores under the three SentEval aggregations:

* ``all``   - concatenate every subset, then correlate once (SimCSE's headline numbers);
* ``mean``  - correlate per subset, then average;
* ``wmean`` - per-subset correlations averaged with weights = subset sizes.

Tasks without subsets (STS-B, SICK-R) have one subset, so all three agree.
Correlations are fractions in [-1, 1]. The data files are the SentEval-processed TSVs copied
into ``data/sts/`` (see ``data/SOURCES.md``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr, spearmanr

from orchestrator.errors import DataError

DATA_DIR = Path(os.environ.get("SIEVE_DATA_DIR", Path(__file__).resolve().parents[2] / "data")) / "sts"

TASK_FILES = {
    "sts12": "sts12-test.tsv",
    "sts13": "sts13-test.tsv",
    "sts14": "sts14-test.tsv",
    "sts15": "sts15-test.tsv",
    "sts16": "sts16-test.tsv",
    "stsb": "stsb-test.tsv",
    "sickr": "sickr-test.tsv",
    "stsb_dev": "stsb-dev.tsv",
}
SEVEN_TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]


@dataclass
class STSData:
    name: str
    sentence1: list[str]
    sentence2: list[str]
    scores: np.ndarray
    subsets: list[str]

    def __len__(self) -> int:
        return len(self.scores)


def _text_lines(path: Path) -> list[str]:
    """The file's lines, or :class:`DataError` naming a missing file or the line with invalid UTF-8."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a BOM (spreadsheet exports) is not part of the header
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None
    return text.splitlines()


def _finite_number(raw: str, where: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise DataError(f"{where} {raw!r} is not a number") from None
    if not np.isfinite(value):
        raise DataError(f"{where} {raw!r} is not finite")
    return value


def read_sts_tsv(path: str | Path, name: str | None = None, score_column: str = "score") -> STSData:
    """Read a TSV with ``sentence1, sentence2, score`` (and optional ``subset``) columns
    (``score_column`` names the score: ``label`` for binary pair files).

    Every malformed input raises :class:`DataError` naming the file and line.
    """
    path = Path(path)
    lines = _text_lines(path)
    if not lines or not lines[0].strip():
        raise DataError(f"{path}: empty file (expected a header with sentence1, sentence2, {score_column})")
    header = lines[0].split("\t")
    required = ("sentence1", "sentence2", score_column)
    missing = [c for c in required if c not in header]
    if missing:
        raise DataError(f"{path}:1: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
    col = {c: header.index(c) for c in header}
    s1, s2, scores, subsets = [], [], [], []
    # tab-separated, nothing quoted: a split (the csv module would refuse a field over 128 KiB with a traceback)
    for lineno, row in enumerate((line.split("\t") for line in lines[1:]), start=2):
        if not row or all(not f.strip() for f in row):
            continue
        if len(row) < len(header):
            raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
        score = _finite_number(row[col[score_column]].strip(), f"{path}:{lineno}: {score_column}")
        s1.append(row[col["sentence1"]])
        s2.append(row[col["sentence2"]])
        scores.append(score)
        subsets.append(row[col["subset"]] if "subset" in col else "all")
    if not scores:
        raise DataError(f"{path}: no data rows after the header")
    if len(scores) < 2:
        raise DataError(f"{path}: 1 pair: a correlation needs at least 2")
    if min(scores) == max(scores):
        raise DataError(
            f"{path}: every {score_column} is {scores[0]:g}: a correlation with constant scores is undefined"
        )
    return STSData(name or path.stem, s1, s2, np.asarray(scores, dtype=np.float64), subsets)


def load_task(task: str, data_dir: str | Path | None = None) -> STSData:
    if task not in TASK_FILES:
        raise DataError(f"unknown STS task {task!r}: expected one of {', '.join(TASK_FILES)}")
    return read_sts_tsv(Path(data_dir or DATA_DIR) / TASK_FILES[task], name=task)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.clip(np.linalg.norm(a, axis=1, keepdims=True), 1e-12, None)
    b = b / np.clip(np.linalg.norm(b, axis=1, keepdims=True), 1e-12, None)
    return np.sum(a * b, axis=1)


def aggregate(sims: np.ndarray, gold: np.ndarray, subsets: list[str]) -> dict[str, dict[str, float]]:
    """Pearson and Spearman under the ``all`` / ``mean`` / ``wmean`` aggregations."""
    subsets_arr = np.asarray(subsets)
    names = list(dict.fromkeys(subsets))  # first-seen order
    per = {"pearson": [], "spearman": []}
    sizes = []
    for name in names:
        m = subsets_arr == name
        per["pearson"].append(float(pearsonr(sims[m], gold[m])[0]))
        per["spearman"].append(float(spearmanr(sims[m], gold[m])[0]))
        sizes.append(int(m.sum()))
    w = np.asarray(sizes, dtype=np.float64) / sum(sizes)
    return {
        "pearson": {
            "all": float(pearsonr(sims, gold)[0]),
            "mean": float(np.mean(per["pearson"])),
            "wmean": float(np.dot(w, per["pearson"])),
        },
        "spearman": {
            "all": float(spearmanr(sims, gold)[0]),
            "mean": float(np.mean(per["spearman"])),
            "wmean": float(np.dot(w, per["spearman"])),
        },
        "subsets": {
            n: {"n": s, "pearson": p, "spearman": r}
            for n, s, p, r in zip(names, sizes, per["pearson"], per["spearman"])
        },
    }


def evaluate_data(encoder, data: STSData, embeddings: dict[str, np.ndarray] | None = None) -> dict:
    """Encode both sides (unique sentences once) and correlate cosine similarity with the gold.
    ``embeddings``: sentence -> vector already encoded (by :func:`evaluate`, once across its tasks)."""
    if embeddings is None:
        embeddings = encode_unique(encoder, data.sentence1 + data.sentence2, desc=data.name)
    a = np.stack([embeddings[s] for s in data.sentence1])
    b = np.stack([embeddings[s] for s in data.sentence2])
    sims = cosine(a, b)
    result = aggregate(sims, data.scores, data.subsets)
    return {"n": len(data), **result}


def encode_unique(encoder, sentences: list[str], desc: str = "encoding") -> dict[str, np.ndarray]:
    """Each distinct sentence encoded once: sentence -> its embedding."""
    unique = list(dict.fromkeys(sentences))
    return dict(zip(unique, encoder.encode(unique, desc=desc), strict=True)) if unique else {}


def evaluate(
    encoder,
    tasks: list[str],
    *,
    data_dir: str | Path | None = None,
    extra_files: list[str | Path] | None = None,
) -> dict:
    """Run the STS tasks, and a user's own files (``extra_files``) beside them; ``avg`` is over the named
    ``tasks`` only (the 7-task average for the standard set: a user's file is scored, never averaged in, so
    the average means what a paper's does). A sentence that several tasks share is encoded once (the 7 test
    sets: 26,289 distinct sentences of 28,530 per-task ones)."""
    named = [load_task(task, data_dir) for task in tasks]
    datasets = named + [read_sts_tsv(f) for f in extra_files or []]
    embeddings = encode_unique(encoder, [s for d in datasets for s in d.sentence1 + d.sentence2], desc="STS")
    results = {d.name: evaluate_data(encoder, d, embeddings) for d in datasets}
    avg = {}
    if named:
        avg = {
            f"{k}_all": float(np.mean([results[d.name][k]["all"] for d in named]))
            for k in ("spearman", "pearson")
        }
    return {"tasks": results, "avg": avg}


def format_table(result: dict) -> str:
    """A readable Markdown table (x100, as papers print them)."""
    rows = [
        "| task | n | spearman all | spearman mean | spearman wmean | pearson all |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["tasks"].items():
        sp, pe = r["spearman"], r["pearson"]
        rows.append(
            f"| {name} | {r['n']} | {sp['all'] * 100:.2f} | {sp['mean'] * 100:.2f} | "
            f"{sp['wmean'] * 100:.2f} | {pe['all'] * 100:.2f} |"
        )
    if result.get("avg"):
        rows.append(
            f"| **avg** | | {result['avg']['spearman_all'] * 100:.2f} | | | "
            f"{result['avg']['pearson_all'] * 100:.2f} |"
        )
    return "\n".join(rows)


def flat_metrics(result: dict, prefix: str = "") -> dict[str, float]:
    """``{"stsb_spearman_all": ..., "avg_spearman_all": ...}`` for MLflow."""
    out = {}
    for name, r in result["tasks"].items():
        for metric in ("spearman", "pearson"):
            for agg in ("all", "mean", "wmean"):
                out[f"{prefix}{name}_{metric}_{agg}"] = r[metric][agg]
    for k, v in result.get("avg", {}).items():
        out[f"{prefix}avg_{k}"] = v
    return out
