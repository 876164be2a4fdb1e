"""ParaBART's evaluations beyond STS: does the embedding hold meaning without syntax?

* **QQP-Easy / QQP-Hard** (the paper's robustness test): duplicate question pairs whose two
  sentences share their top-level constituents (Easy) or do not (Hard), each mixed with the same
  random non-duplicates. Cosine similarity classifies a pair as duplicate above a threshold; we
  report the best accuracy over thresholds −1 … 1 (step 0.01) as the paper does, and - because
  picking the threshold on the test pairs is optimistic - the accuracy on a held-out half at the
  threshold chosen on the other half.
* **Probes** (the paper's Table 2): TreeDepth and TopConst labels of PTB sentences predicted from
  the frozen embedding by an MLP with one 50-unit hidden layer (scikit-learn), accuracy on a
  held-out 20%. Lower is better for a syntax-free semantic embedding.

The derived data (``data/paraphrase/qqp-easy-hard.tsv``, ``data/probes/ptb-probes.tsv``) is built
once by :func:`build_qqp_easy_hard` and :func:`build_probes` (spaCy / gold PTB trees) and shipped.
"""

from __future__ import annotations

import csv
import random
from collections import Counter
from pathlib import Path

import numpy as np

from orchestrator.data import constituency as C
from orchestrator.data.parsing import SpacyParser
from orchestrator.evaluation.domain import cosine_rows, encode_unique

DATA = Path(__file__).resolve().parents[2] / "data"
QQP_EASY_HARD = DATA / "paraphrase" / "qqp-easy-hard.tsv"
PTB_PROBES = DATA / "probes" / "ptb-probes.tsv"
BSHIFT = DATA / "probes" / "bshift-ptb.tsv"


def _read(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


# ---------------------------------------------------------------- building the derived sets
def build_qqp_easy_hard(qqp_tsv: Path, out: Path, *, seed: int = 0, limit: int | None = None) -> dict:
    """Parse both questions of every pair (spaCy), split duplicates by top-level constituents."""
    rows = _read(qqp_tsv)[:limit]
    parser = SpacyParser()
    texts = sorted({r[k] for r in rows for k in ("sentence1", "sentence2")})
    tops = {
        t: " ".join(C.top_constituents(C.constituency(p)))
        for t, p in zip(texts, parser.parse_batch(texts), strict=True)
    }
    easy = [r for r in rows if r["label"] == "1" and tops[r["sentence1"]] == tops[r["sentence2"]]]
    hard = [r for r in rows if r["label"] == "1" and tops[r["sentence1"]] != tops[r["sentence2"]]]
    neg = [r for r in rows if r["label"] == "0"]
    rng = random.Random(seed)
    n = min(len(easy), len(hard), len(neg))
    picked = (
        [(r, "easy") for r in rng.sample(easy, n)]
        + [(r, "hard") for r in rng.sample(hard, n)]
        + [(r, "negative") for r in rng.sample(neg, n)]
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write("sentence1\tsentence2\tlabel\tsubset\ttop1\ttop2\n")
        for r, subset in picked:
            f.write(
                f"{r['sentence1']}\t{r['sentence2']}\t{r['label']}\t{subset}\t"
                f"{tops[r['sentence1']]}\t{tops[r['sentence2']]}\n"
            )
    return {"pairs": len(rows), "easy": len(easy), "hard": len(hard), "negative": len(neg), "per_subset": n}


def tree_depth(tree) -> int:
    kids = [k for k in tree[1] if isinstance(k, tuple)]
    return 1 + max((tree_depth(k) for k in kids), default=0)


def _leaves(node) -> list[str]:
    return [w for k in node[1] for w in (_leaves(k) if isinstance(k, tuple) else [k])]


def build_probes(ptb_trees: Path, out: Path) -> dict:
    """TreeDepth (clipped to 5…12) and TopConst (19 most frequent sequences + OTHER) per PTB sentence."""
    rows = []
    for line in ptb_trees.read_text(encoding="utf-8").splitlines():
        tree = C.clean_ptb(C.read_bracketed(line))
        if tree is None:
            continue
        words = _leaves(tree)
        rows.append((" ".join(words), min(12, max(5, tree_depth(tree))), "-".join(C.top_constituents(tree))))
    common = {c for c, _ in Counter(r[2] for r in rows).most_common(19)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write("sentence\ttree_depth\ttop_const\n")
        for s, d, t in rows:
            f.write(f"{s}\t{d}\t{t if t in common else 'OTHER'}\n")
    return {"sentences": len(rows)}


def build_bshift(probes_tsv: Path, out: Path, *, seed: int = 0) -> dict:
    """Our BShift-style probe (SentEval's BigramShift, rebuilt on data we ship - labelled as ours):
    from each PTB-sample sentence of at least 4 words, half (seeded) get two adjacent words swapped
    (label ``I``, inverted), the rest stay (``O``); the probe predicts which from the embedding."""
    rng = random.Random(seed)
    rows = []
    for r in _read(probes_tsv):
        words = r["sentence"].split()
        if len(words) < 4:
            continue
        if rng.random() < 0.5:
            k = rng.randrange(len(words) - 1)
            while words[k] == words[k + 1] and k + 2 < len(words):
                k += 1
            words[k], words[k + 1] = words[k + 1], words[k]
            rows.append((" ".join(words), "I"))
        else:
            rows.append((" ".join(words), "O"))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write("sentence\tbshift\n")
        f.writelines(f"{s}\t{y}\n" for s, y in rows)
    return {"sentences": len(rows), "inverted": sum(y == "I" for _, y in rows)}


# ---------------------------------------------------------------- evaluating an encoder
THRESHOLDS = np.round(np.arange(-1.0, 1.0001, 0.01), 2)


def best_threshold_accuracy(sims: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(best accuracy over THRESHOLDS, the threshold that gives it)."""
    acc = [(float(((sims >= t) == labels).mean()), float(t)) for t in THRESHOLDS]
    return max(acc, key=lambda x: (x[0], -abs(x[1])))


def qqp_easy_hard(encoder, path: Path = QQP_EASY_HARD, seed: int = 0) -> dict[str, float]:
    rows = _read(path)
    emb = encode_unique(encoder, [r[k] for r in rows for k in ("sentence1", "sentence2")])
    sims = cosine_rows(
        np.stack([emb[r["sentence1"]] for r in rows]), np.stack([emb[r["sentence2"]] for r in rows])
    )
    labels = np.array([int(r["label"]) for r in rows])
    subset = np.array([r["subset"] for r in rows])
    out = {}
    for name in ("easy", "hard"):
        idx = np.flatnonzero((subset == name) | (subset == "negative"))
        acc, thr = best_threshold_accuracy(sims[idx], labels[idx])
        perm = np.random.default_rng(seed).permutation(idx)
        dev, test = perm[: len(perm) // 2], perm[len(perm) // 2 :]
        _, dev_thr = best_threshold_accuracy(sims[dev], labels[dev])
        out[f"qqp_{name}_best_acc"] = acc
        out[f"qqp_{name}_dev_threshold_acc"] = float(((sims[test] >= dev_thr) == labels[test]).mean())
    return out


def probe_accuracy(emb: np.ndarray, labels: list[str], seed: int = 0) -> float:
    """Held-out (20%) accuracy of an MLP with one 50-unit hidden layer on the frozen embedding."""
    from sklearn.model_selection import train_test_split  # lazy: only the probes need scikit-learn
    from sklearn.neural_network import MLPClassifier  # lazy: see above

    xtr, xte, ytr, yte = train_test_split(
        emb, np.array(labels), test_size=0.2, random_state=seed, stratify=None
    )
    clf = MLPClassifier(hidden_layer_sizes=(50,), max_iter=300, random_state=seed, early_stopping=True)
    clf.fit(xtr, ytr)
    return float(clf.score(xte, yte))


def probes(encoder, path: Path = PTB_PROBES, seed: int = 0, bshift: Path | None = BSHIFT) -> dict[str, float]:
    """TreeDepth and TopConst on the PTB sample, and our BShift-style probe (``bshift``)."""
    rows = _read(path)
    emb = encoder.encode([r["sentence"] for r in rows])
    out = {
        f"probe_{task}_acc": probe_accuracy(emb, [r[task] for r in rows], seed)
        for task in ("tree_depth", "top_const")
    }
    if bshift is not None:
        shifted = _read(bshift)
        out["probe_bshift_ours_acc"] = probe_accuracy(
            encoder.encode([r["sentence"] for r in shifted]), [r["bshift"] for r in shifted], seed
        )
    return out
