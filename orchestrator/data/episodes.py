"""Pair episodes for Siamese adaptation: balanced same-class / different-class text pairs from
labelled data sets, generated on Ray Data and written as parquet shards + ``manifest.json``.

For a data set with classes c (sizes n_c), pair k of N is

* **same-class** when k is even: a class drawn with probability ∝ n_c among classes with at
  least two texts, then two distinct texts of it;
* **different-class** when k is odd: two distinct classes drawn ∝ n_c, one text of each;

with the random draws of pair k made by a generator seeded with (seed, data set, k). So exactly
half the pairs are positive, and the pairs are the same whatever the number of blocks or workers.
**ALL** mode draws N pairs from each of several data sets (the Siamese paper: 70,000 pairs for
one set, 10,000 per set for ALL). Rows with empty text are skipped and counted; singleton classes
are counted (they can only appear in different-class pairs); a data set with fewer than two
classes, or with no class of two texts, is a clear :class:`DataError`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from orchestrator import storage
from orchestrator.data.labelled import LabelledSet, rows_to_shards, split_rows
from orchestrator.errors import DataError


@dataclass
class ClassIndex:
    """A data set's texts grouped by label, with the counts the manifest reports."""

    name: str
    texts: list[str]
    labels: list[str]
    classes: list[str]
    members: list[np.ndarray]  # indices of each class's texts
    skipped_empty: int = 0

    @classmethod
    def build(cls, name: str, rows: list[tuple[str, object]]) -> ClassIndex:
        texts, labels, empty = [], [], 0
        for text, label in rows:
            if not str(text).strip():
                empty += 1
                continue
            texts.append(str(text))
            labels.append(str(label))
        classes = sorted(set(labels))
        if len(classes) < 2:
            raise DataError(f"data set {name!r}: {len(classes)} class(es) {classes}; pairs need at least two")
        lab = np.array(labels)
        members = [np.flatnonzero(lab == c) for c in classes]
        if not any(len(m) >= 2 for m in members):
            raise DataError(f"data set {name!r}: no class has two texts, so no same-class pair exists")
        return cls(name, texts, labels, classes, members, empty)

    @property
    def singletons(self) -> list[str]:
        return [c for c, m in zip(self.classes, self.members, strict=True) if len(m) == 1]

    def pair(self, k: int, seed: int) -> tuple[int, int, float]:
        """Pair ``k`` as (text index a, text index b, 1.0 same / 0.0 different)."""
        salt = int(hashlib.sha256(self.name.encode()).hexdigest()[:8], 16)
        rng = np.random.default_rng([seed, salt, k])
        sizes = np.array([len(m) for m in self.members], dtype=float)
        if k % 2 == 0:
            eligible = np.where(sizes >= 2, sizes, 0.0)
            c = rng.choice(len(sizes), p=eligible / eligible.sum())
            a, b = rng.choice(self.members[c], size=2, replace=False)
            return int(a), int(b), 1.0
        c1, c2 = rng.choice(len(sizes), size=2, replace=False, p=sizes / sizes.sum())
        return int(rng.choice(self.members[c1])), int(rng.choice(self.members[c2])), 0.0


def make_pairs(index: ClassIndex, n_pairs: int, seed: int, start: int = 0) -> list[tuple[str, str, float]]:
    """Pairs ``start .. start + n_pairs - 1`` of the data set (plain Python; Ray Data calls this per block)."""
    out = []
    for k in range(start, start + n_pairs):
        a, b, y = index.pair(k, seed)
        out.append((index.texts[a], index.texts[b], y))
    return out


def write_episodes(
    sets: dict[str, list[tuple[str, object]]], n_pairs: int, output: str, *, seed: int = 0, blocks: int = 4
) -> dict:
    """Generate ``n_pairs`` pairs per data set on Ray Data and write shards + manifest to ``output``.

    ``sets``: data set name → (text, label) rows (several names = ALL mode)."""
    import ray.data  # lazy: the driver generates; the Siamese recipe imports this module where no Ray runs

    indexes = {name: ClassIndex.build(name, rows) for name, rows in sets.items()}
    refs = {name: ray.put(ix) for name, ix in indexes.items()}

    def gen(batch: dict) -> dict:
        out = {"text_a": [], "text_b": [], "label": [], "dataset": []}
        for name, k in zip(batch["dataset"], batch["k"], strict=True):
            ix = ray.get(refs[str(name)])
            a, b, y = ix.pair(int(k), seed)
            out["text_a"].append(ix.texts[a])
            out["text_b"].append(ix.texts[b])
            out["label"].append(y)
            out["dataset"].append(str(name))
        return out

    items = [{"dataset": name, "k": k} for name in indexes for k in range(n_pairs)]
    ds = ray.data.from_items(items, override_num_blocks=blocks).map_batches(gen, batch_size=1024)
    fs, path = storage.pyarrow_filesystem(storage.join(output, "shards"))
    ds.write_parquet(path, filesystem=fs)
    labels = ds.groupby("dataset").sum("label").take_all()
    manifest = {
        "pairs_per_set": n_pairs,
        "seed": seed,
        "sets": {
            name: {
                "texts": len(ix.texts),
                "classes": len(ix.classes),
                "skipped_empty": ix.skipped_empty,
                "singleton_classes": ix.singletons,
            }
            for name, ix in indexes.items()
        },
        "same_class_pairs": {str(r["dataset"]): int(r["sum(label)"]) for r in labels},
        "rows": n_pairs * len(indexes),
    }
    storage.write_bytes(storage.join(output, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest


def episodes_key(sets: dict[str, list], n_pairs: int, seed: int) -> str:
    h = hashlib.sha256(json.dumps([sorted(sets.items()), n_pairs, seed], default=str).encode())
    return h.hexdigest()[:16]


def prepare_episodes(sets: dict[str, list], n_pairs: int, storage_root: str, *, seed: int = 0) -> str:
    """Content-addressed ``<storage>/episodes/<hash>``: written once, reused when its manifest exists."""
    out = storage.join(storage.absolute(storage_root), "episodes", episodes_key(sets, n_pairs, seed))
    return storage.build_committed(out, lambda folder: write_episodes(sets, n_pairs, folder, seed=seed))


def prepare_siamese_data(
    train_sets: list[LabelledSet],
    *,
    pairs: bool,
    n_pairs: int,
    dev_fraction: float,
    seed: int,
    storage_root: str,
) -> str:
    """The train part of every set (``split_rows``): as pair episodes (SIAMESE / ALL), or as
    (text, label) shards of the one set (NAIVE's classifier)."""
    parts = {s.name: split_rows(s.rows(), dev_fraction, seed)[0] for s in train_sets}
    if pairs:
        return prepare_episodes(parts, n_pairs, storage_root, seed=seed)
    return rows_to_shards(next(iter(parts.values())), storage_root, source=train_sets[0].path)
