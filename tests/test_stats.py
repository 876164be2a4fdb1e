"""Paired comparisons over seeds (orchestrator.stats): synthetic cases with a known answer."""

import math
import random

import pytest

from orchestrator.stats import gate, paired_difference


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
