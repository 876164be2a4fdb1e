"""How well an embedding separates the classes of a labelled set (the Siamese paper's evaluation).

* **Δ cosine distance** (the paper's Eq. 1-2): with cosine distance δ(a, b) = 1 − cos,

      Δ = mean δ over random different-class pairs − mean δ over random same-class pairs

  on ``n_pairs`` pairs of each kind (seeded; the paper uses 5,000), higher = classes better separated;
* **same-class MAP**: each query text ranks every other by cosine; average precision of its class.
"""

from __future__ import annotations

import numpy as np

from orchestrator.data.episodes import ClassIndex
from orchestrator.data.labelled import LabelledSet
from orchestrator.evaluation.domain import average_precision


def unit_rows(emb: np.ndarray) -> np.ndarray:
    return emb / np.clip(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12, None)


def delta_cosine_distance(
    emb: np.ndarray, labels: list[str], n_pairs: int, seed: int = 0, name: str = "test"
) -> dict:
    """Δ = mean cosine distance of different-class pairs − that of same-class pairs (n of each)."""
    ix = ClassIndex.build(name, list(zip(range(len(labels)), labels, strict=True)))
    unit = unit_rows(emb)
    same, diff = [], []
    for k in range(2 * n_pairs):
        a, b, y = ix.pair(k, seed)
        a, b = int(ix.texts[a]), int(ix.texts[b])
        (same if y else diff).append(1.0 - float(unit[a] @ unit[b]))
    return {
        "delta": float(np.mean(diff) - np.mean(same)),
        "same_distance": float(np.mean(same)),
        "different_distance": float(np.mean(diff)),
    }


def same_class_map(emb: np.ndarray, labels: list[str], max_queries: int = 1000, seed: int = 0) -> float:
    """Mean average precision of same-class neighbours (each query ranks every other text)."""
    unit = unit_rows(emb)
    lab = np.array(labels)
    queries = np.random.default_rng(seed).permutation(len(lab))[:max_queries]
    aps = []
    for q in queries:
        others = np.arange(len(lab)) != q
        rel = (lab[others] == lab[q]).astype(int)
        if rel.sum():
            aps.append(average_precision(unit[others] @ unit[q], rel))
    return float(np.mean(aps))


def evaluate_sets(encoder, sets: list[LabelledSet], n_pairs: int) -> dict[str, float]:
    """``<set>_delta`` and ``<set>_map`` for every labelled set (``encoder.encode(texts)``)."""
    out = {}
    for s in sets:
        rows = s.rows()
        emb = encoder.encode([t for t, _ in rows])
        labels = [y for _, y in rows]
        out[f"{s.name}_delta"] = delta_cosine_distance(emb, labels, n_pairs, seed=0, name=s.name)["delta"]
        out[f"{s.name}_map"] = same_class_map(emb, labels)
    return out
