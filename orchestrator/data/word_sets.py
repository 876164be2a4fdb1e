"""Word sets for SIFTER-LSTM's short-circuited input gate: an opinion lexicon, the training data's most
class-telling words, and a control - random words matched to the lexicon in size and frequency.

The control answers "is it the lexicon or the gate?": a gate forced open on *any* words that occur as
often as the lexicon's might help (or hurt) as much. :func:`frequency_matched` draws, for each lexicon word
that occurs in the training text, one non-lexicon word of the same frequency band (token count within a
factor of 2: the same ``floor(log2(count))``), so both sets open the gate on as many distinct words and on
about as many tokens. Lexicon words that never occur in the training text get no counterpart: a random
unseen word could only be drawn from outside the data, and neither set opens the gate on training text there.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from pathlib import Path

from orchestrator.config import repo_path
from orchestrator.errors import DataError

WORDLIKE = re.compile(r"[a-z]")  # a candidate holds a letter: no punctuation or bare numbers


def words(text: str) -> list[str]:
    """A sentence's words as the gate sees them (SST-2 is tokenised: whitespace split)."""
    return text.split()


def lexicon_words(paths: list[str]) -> set[str]:
    out = set()
    for p in paths:
        path = Path(repo_path(p))
        if not path.is_file():
            raise DataError(f"{p}: lexicon file not found")
        out |= {
            w.strip().lower()
            for w in path.read_text(encoding="utf-8").splitlines()
            if w.strip() and not w.startswith(";")
        }
    return out


def train_data_words(rows: list[tuple[str, int]], top_k: int, min_count: int) -> set[str]:
    """Words whose smoothed log-odds of appearing in one class vs the rest is largest."""
    counts: dict[int, Counter] = {}
    for text, y in rows:
        counts.setdefault(y, Counter()).update({w.lower() for w in words(text)})
    total = Counter()
    for c in counts.values():
        total.update(c)
    size = {y: sum(c.values()) for y, c in counts.items()}  # once, not per word
    all_size = sum(size.values())
    score = {}
    for w, n in total.items():
        if n < min_count or not WORDLIKE.search(w):
            continue
        best = 0.0
        for y, c in counts.items():
            p_in = (c[w] + 1) / (size[y] + 2)
            p_out = (n - c[w] + 1) / (all_size - size[y] + 2)
            best = max(best, abs(math.log(p_in / p_out)))
        score[w] = best
    return set(sorted(score, key=lambda w: (-score[w], w))[:top_k])


def token_counts(texts: list[str]) -> Counter:
    return Counter(w.lower() for t in texts for w in words(t))


def band(count: int) -> int:
    return int(math.log2(count))


def frequency_matched(lexicon: set[str], texts: list[str], seed: int) -> set[str]:
    """One random non-lexicon word of the training text per lexicon word that occurs there, from the same
    frequency band (``floor(log2(token count))``); a band that runs out lends from the nearest band with
    words left. Deterministic for a seed."""
    counts = token_counts(texts)
    targets = sorted((w for w in lexicon if counts[w] > 0), key=lambda w: (counts[w], w))
    pool: dict[int, list[str]] = {}
    for w in sorted(counts):
        if w not in lexicon and WORDLIKE.search(w):
            pool.setdefault(band(counts[w]), []).append(w)
    rng = random.Random(seed)
    for ws in pool.values():
        rng.shuffle(ws)
    chosen = set()
    for w in targets:
        b = band(counts[w])
        left = [k for k in pool if pool[k]]
        if not left:
            break
        nearest = min(left, key=lambda k: (abs(k - b), k))
        chosen.add(pool[nearest].pop())
    return chosen
