"""Paired comparisons over seeds: is the difference between two arms (or an arm and the base) real?

Two arms trained with the same seed see the same data order and the same start for their new parts,
so the seed-to-seed noise they share cancels in their difference. :func:`paired_difference` pairs
the runs by seed (never by position), takes the per-seed differences and gives their mean with a 95%
interval: Student's t over the pairs (the default), or a seeded percentile bootstrap. An interval that
contains 0 is "indistinguishable". Against the untouched base, measured once, the differences are
each run's score less the base's (the base has no seed noise of its own).

:func:`gate` is the registration rule: an arm is promoted over the base only when the *lower* bound
of its interval against the base is above 0.

:func:`holm` adjusts a *family* - several arms each set against one reference (or the base) - for the number
of comparisons: Holm's step-down p-values, and beside each its interval at the level of its step (the
arm with the i-th smallest p of m at confidence 1 − α/(m − i + 1)). Every interval here covers the
seed-to-seed variation of training on fixed test sets, not the sampling of the test sets themselves.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class PairedDifference:
    """Mean of the per-seed differences a − b and its interval [low, high]; ``n`` pairs."""

    n: int
    mean: float
    low: float
    high: float
    confidence: float = 0.95
    method: str = "t"
    p: float = math.nan  # two-sided p of "no difference" (nan: one pair)

    @property
    def verdict(self) -> str:
        if self.low <= 0 <= self.high:
            return "indistinguishable"
        return "higher" if self.mean > 0 else "lower"

    def describe(self, scale: float = 1.0, digits: int = 2) -> str:
        """``+0.52 [+0.10, +0.94] higher`` (``scale``: e.g. 100 for figures kept as fractions)."""
        f = f"{{:+.{digits}f}}"
        return (
            f"{f.format(self.mean * scale)} [{f.format(self.low * scale)}, {f.format(self.high * scale)}] "
            f"{self.verdict}"
        )


def _pairs(a: Mapping, b: Mapping | float) -> list[float]:
    if not isinstance(b, Mapping):  # the base: one measurement
        return [float(a[s]) - float(b) for s in sorted(a)]
    if set(a) != set(b):
        only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        raise ValueError(
            f"runs are paired by seed, and the seeds differ: only in the first arm {only_a}, "
            f"only in the second {only_b}"
        )
    return [float(a[s]) - float(b[s]) for s in sorted(a)]


def t_quantile(p: float, df: int) -> float:
    from scipy import stats  # lazy: only comparisons need scipy

    return float(stats.t.ppf(p, df))


def t_sf(x: float, df: int) -> float:
    from scipy import stats  # lazy: only comparisons need scipy

    return float(stats.t.sf(x, df))


def paired_difference(
    a: Mapping,
    b: Mapping | float,
    *,
    confidence: float = 0.95,
    method: str = "t",
    resamples: int = 10_000,
    seed: int = 0,
) -> PairedDifference:
    """The difference ``a − b`` over runs keyed by seed (``b`` a number: the base, measured once).

    ``method="t"``: mean ± t_{n−1}·sd/√n; ``"bootstrap"``: the percentile interval of ``resamples`` seeded
    resamples of the pairs. One pair gives an unbounded interval (nothing is known of the noise)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} outside (0, 1)")
    diffs = _pairs(a, b)
    n = len(diffs)
    if n == 0:
        raise ValueError("no runs to compare")
    mean = statistics.fmean(diffs)
    if n == 1:
        return PairedDifference(1, mean, -math.inf, math.inf, confidence, method)
    if method == "t":
        se = statistics.stdev(diffs) / math.sqrt(n)
        half = t_quantile(0.5 + confidence / 2, n - 1) * se
        p = (0.0 if mean else 1.0) if se == 0 else 2 * t_sf(abs(mean) / se, n - 1)
        return PairedDifference(n, mean, mean - half, mean + half, confidence, method, p)
    if method == "bootstrap":
        rng = random.Random(seed)
        means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
        lo = means[int(math.floor((1 - confidence) / 2 * (resamples - 1)))]
        hi = means[int(math.ceil((0.5 + confidence / 2) * (resamples - 1)))]
        # the percentile interval's own p: twice the smaller tail of resampled means on either side of 0
        tail = min(sum(m <= 0 for m in means), sum(m >= 0 for m in means)) / resamples
        return PairedDifference(n, mean, lo, hi, confidence, method, min(1.0, 2 * tail))
    raise ValueError(f"unknown interval method {method!r} (t | bootstrap)")


def gate(against_base: PairedDifference) -> bool:
    """Register over the base only when the whole interval is above 0 (its lower bound > 0)."""
    return against_base.low > 0


@dataclass(frozen=True)
class Adjusted:
    """One comparison of a family, Holm-adjusted: its raw difference, Holm's step-down p (monotone in the
    step order, ``min(1, ·)``) and its interval at its step's level, ``1 − α/(m − rank + 1)``."""

    raw: PairedDifference
    p_adjusted: float
    interval: PairedDifference  # the same mean, the step-level interval
    m: int  # the family's size

    @property
    def passes(self) -> bool:
        """Above 0 after the adjustment: the adjusted p below α *and* the step-level interval above 0 (an arm
        whose step comes after a failed one never passes: Holm stops at the first it cannot reject)."""
        return self.p_adjusted < 1 - self.raw.confidence and self.interval.low > 0


def holm(
    family: Mapping[str, tuple[Mapping, Mapping | float]],
    *,
    confidence: float = 0.95,
    method: str = "t",
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Adjusted]:
    """Holm's adjustment of ``family[name] = (a, b)``, each a :func:`paired_difference`. A comparison of one
    pair has p nan: it is ranked last and never passes. A family of one is returned unadjusted."""
    raw = {
        k: paired_difference(a, b, confidence=confidence, method=method, resamples=resamples, seed=seed)
        for k, (a, b) in family.items()
    }
    m, alpha = len(raw), 1 - confidence
    order = sorted(raw, key=lambda k: raw[k].p if math.isfinite(raw[k].p) else math.inf)
    out, running = {}, 0.0
    for rank, k in enumerate(order):  # rank 0: the smallest p, tested at α / m
        steps = m - rank
        p = raw[k].p if math.isfinite(raw[k].p) else 1.0
        running = max(running, min(1.0, steps * p))
        level = 1 - alpha / steps
        a, b = family[k]
        step = (
            raw[k]
            if steps == 1
            else paired_difference(a, b, confidence=level, method=method, resamples=resamples, seed=seed)
        )
        out[k] = Adjusted(raw[k], running, step, m)
    return {k: out[k] for k in family}
