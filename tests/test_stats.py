"""Paired comparisons over seeds (orchestrator.stats): synthetic cases with a known answer."""

import math
import random

import pytest

from orchestrator.stats import gate, holm, paired_difference


def arms(effect: float, seeds=range(1, 9), spread: float = 2.0, noise: float = 0.05, rng_seed: int = 0):
    """Two arms sharing a large per-seed term (what pairing cancels), ``effect`` apart, each with small noise."""
    rng = random.Random(rng_seed)
    shared = {s: rng.gauss(0, spread) for s in seeds}
    a = {s: shared[s] + effect + rng.gauss(0, noise) for s in seeds}
    b = {s: shared[s] + rng.gauss(0, noise) for s in seeds}
    return a, b


@pytest.mark.parametrize("method", ["t", "bootstrap"])
def test_a_known_paired_difference_gets_its_mean_and_an_interval_that_covers_it(method):
    a, b = arms(0.5)
    d = paired_difference(a, b, method=method)
    assert d.n == 8 and d.mean == pytest.approx(0.5, abs=0.06)
    assert d.low < 0.5 < d.high and d.low > 0 and d.verdict == "higher"
    assert d.high - d.low < 0.3  # the shared seed term (sd 2) cancelled: pairing is what makes this narrow


def test_the_t_interval_is_the_textbook_one():
    d = paired_difference({1: 3.0, 2: 5.0, 3: 4.0}, {1: 1.0, 2: 2.0, 3: 2.0})  # differences 2, 3, 2
    half = 4.302652729911275 * math.sqrt(1 / 3) / math.sqrt(3)  # t_{0.975, 2} · sd / √n, sd = √(1/3)
    assert (d.mean, d.low, d.high) == pytest.approx((7 / 3, 7 / 3 - half, 7 / 3 + half))


def test_arms_that_differ_only_by_noise_are_indistinguishable():
    for k in range(5):
        a, b = arms(0.0, rng_seed=k)
        assert paired_difference(a, b).verdict == "indistinguishable", k


def test_pairing_is_by_seed_not_by_position():
    a, b = arms(0.5)
    shuffled = dict(reversed(list(b.items())))  # the same runs listed in another order
    assert paired_difference(a, shuffled) == paired_difference(a, b)
    # pairing each run with another seed's breaks the cancellation: the effect is lost in the seed noise
    broken = dict(zip(b, list(b.values())[1:] + list(b.values())[:1], strict=True))
    assert paired_difference(a, broken).verdict == "indistinguishable"
    with pytest.raises(ValueError, match=r"only in the first arm \[8\], only in the second \[9\]"):
        paired_difference(a, {**{s: v for s, v in b.items() if s != 8}, 9: 0.0})


def test_against_the_base_each_run_is_compared_with_the_one_measurement():
    d = paired_difference({1: 0.80, 2: 0.82, 3: 0.81}, 0.78)
    assert d.mean == pytest.approx(0.03) and d.verdict == "higher"
    one = paired_difference({1: 0.9}, 0.5)
    assert one.n == 1 and one.verdict == "indistinguishable"  # one seed says nothing of the noise


def test_the_registration_gate_needs_the_whole_interval_above_zero():
    a, b = arms(0.5)
    assert gate(paired_difference(a, b))
    a, b = arms(0.0, rng_seed=1)
    assert not gate(paired_difference(a, b))
    mean_up = paired_difference({1: 0.9, 2: 0.5, 3: 0.95}, 0.7)  # mean above the base, interval crossing it
    assert mean_up.mean > 0 and not gate(mean_up)


def _t2_quantile(p: float) -> float:
    """Student's t quantile with 2 degrees of freedom, in closed form: F(t) = 1/2 + t / (2·√(2 + t²))."""
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def _t2_p(t: float) -> float:
    """Two-sided p of t with 2 degrees of freedom: 1 − |t| / √(2 + t²)."""
    return 1 - abs(t) / math.sqrt(2 + t * t)


def test_holm_over_three_arms_and_three_seeds_equals_the_hand_computed_case():
    base = 0.0
    family = {
        "a": ({1: 1.0, 2: 1.2, 3: 1.4}, base),  # mean 1.2, sd 0.2
        "b": ({1: 0.5, 2: 0.9, 3: 0.7}, base),  # mean 0.7, sd 0.2: raw p 0.026 < 0.05, not after Holm
        "c": ({1: 0.1, 2: -0.3, 3: 0.5}, base),  # mean 0.1, sd 0.4
    }
    se = {"a": 0.2 / math.sqrt(3), "b": 0.2 / math.sqrt(3), "c": 0.4 / math.sqrt(3)}
    mean = {"a": 1.2, "b": 0.7, "c": 0.1}
    p = {k: _t2_p(mean[k] / se[k]) for k in family}
    assert p["a"] < p["b"] < p["c"] and p["b"] < 0.05  # the hand figures: 0.0091, 0.0261, 0.707
    want_p = {"a": 3 * p["a"], "b": max(3 * p["a"], 2 * p["b"]), "c": max(3 * p["a"], 2 * p["b"], p["c"])}
    levels = {"a": 1 - 0.05 / 3, "b": 1 - 0.05 / 2, "c": 0.95}  # each at its step: α/3, α/2, α
    got = holm(family)
    for k in family:
        half = _t2_quantile(0.5 + levels[k] / 2) * se[k]
        assert got[k].p_adjusted == pytest.approx(want_p[k], rel=1e-9), k
        assert got[k].raw.p == pytest.approx(p[k], rel=1e-9), k
        assert (got[k].interval.low, got[k].interval.high) == pytest.approx(
            (mean[k] - half, mean[k] + half), rel=1e-9
        ), k
        assert got[k].interval.confidence == pytest.approx(levels[k])
    assert got["a"].passes and not got["b"].passes and not got["c"].passes
    assert gate(got["b"].raw)  # unadjusted, b would have passed: the adjustment is what stops it
    assert got["b"].interval.low < 0 < got["b"].interval.high
    only = holm({"a": family["a"]})["a"]
    assert only.m == 1 and only.interval == only.raw and only.p_adjusted == pytest.approx(p["a"])


def test_holm_never_passes_an_arm_whose_step_follows_a_failed_one():
    # raw p 0.030 and 0.040 (3 seeds, sd 0.2): the first fails at α/2 (0.060), so Holm stops there - the second's
    # own step-level interval (95%) lies above 0, yet its adjusted p is the running maximum, 0.060
    got = holm({"first": ({1: 0.45, 2: 0.65, 3: 0.85}, 0.0), "second": ({1: 0.36, 2: 0.56, 3: 0.76}, 0.0)})
    first, second = got["first"], got["second"]
    assert first.raw.p == pytest.approx(_t2_p(0.65 / (0.2 / math.sqrt(3))))
    assert first.p_adjusted == pytest.approx(2 * first.raw.p) and first.p_adjusted > 0.05
    assert second.raw.p < 0.05 and second.interval.low > 0  # alone, at its step, it would pass
    assert second.p_adjusted == pytest.approx(first.p_adjusted)
    assert not first.passes and not second.passes
