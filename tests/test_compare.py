"""``jobs/compare.py``'s statistics and checks without Ray: the leaderboard from synthetic runs with a known
answer, the pairing by seed, the registration gate both ways, and the refusals of arms that are not
comparable. The job end to end (Ray, MLflow, a driver killed and resumed): tests/e2e/test_compare_job.py."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.config import REPO_ROOT as ROOT
from orchestrator.config import validate
from orchestrator.drivers.compare_plan import arm_config, check_comparable
from orchestrator.errors import ConfigError
from orchestrator.job_files import CompareJobConfig
from orchestrator.results import leaderboard as lb

H = "sts_avg_spearman_all"


def runs(
    effect: float,
    seeds=range(1, 6),
    spread: float = 0.03,
    noise: float = 0.001,
    rng_seed: int = 0,
    loss: float = 0.5,
    shared: dict | None = None,
) -> dict:
    """Runs whose headline is a seed term shared by every arm (what pairing cancels) + ``effect`` + noise."""
    rng = random.Random(rng_seed)
    shared = shared or {s: random.Random(1000 + s).gauss(0, spread) for s in seeds}
    out = {}
    for s in seeds:
        v = 0.75 + shared[s] + effect + rng.gauss(0, noise)
        out[s] = {
            "test": {"sts_stsb_spearman_all": v + 0.01, H: v},
            "dev": v + 0.05,
            "loss_first": 2.0,
            "loss_last": loss,
        }
    return out


BASE = {
    "mean": {"label": "base (default, mean)", "dev": 0.80, "test": {"sts_stsb_spearman_all": 0.76, H: 0.75}}
}


def board(**arms):
    return lb.build(
        [lb.ArmRuns(n, "sifter_simcse", "mean", r) for n, r in arms.items()],
        BASE,
        reference="simcse",
        headline=H,
    )


def row(b, arm):
    return next(r for r in b["rows"] if r["arm"] == arm)


def test_a_known_paired_difference_is_found_with_an_interval_that_covers_it():
    b = board(simcse=runs(0.0, rng_seed=1), sifter=runs(0.004, rng_seed=2))
    d = row(b, "sifter")["vs_reference"]
    assert d["n"] == 5 and d["mean"] == pytest.approx(0.004, abs=0.0015)
    assert d["low"] < 0.004 < d["high"] and d["verdict"] == "higher"
    assert [r["arm"] for r in b["rows"]] == ["sifter", "simcse"]  # ranked by the mean headline
    # the seed term (sd 0.03) is 7× the effect: unpaired, the arms' std would swamp it
    assert row(b, "sifter")["std"][H] > 0.01 and d["high"] - d["low"] < 0.004


def test_arms_that_differ_only_by_noise_are_indistinguishable():
    for k in range(5):
        b = board(simcse=runs(0.0, rng_seed=10 + k), sifter=runs(0.0, rng_seed=20 + k))
        assert row(b, "sifter")["vs_reference"]["verdict"] == "indistinguishable", k
        assert "indistinguishable" in lb.markdown(b)


def test_pairing_uses_the_same_seed_on_both_sides():
    sim, sif = runs(0.0, rng_seed=1), runs(0.004, rng_seed=2)
    listed_backwards = dict(reversed(list(sif.items())))
    assert (
        row(board(simcse=sim, sifter=listed_backwards), "sifter")["vs_reference"]
        == row(board(simcse=sim, sifter=sif), "sifter")["vs_reference"]
    )
    # each SIFTER run set against another seed's SimCSE run: the effect drowns in the seed term
    seeds = list(sif)
    broken = {s: sif[seeds[(i + 1) % len(seeds)]] for i, s in enumerate(seeds)}
    assert row(board(simcse=sim, sifter=broken), "sifter")["vs_reference"]["verdict"] == "indistinguishable"


def test_a_failed_run_drops_its_pair_and_n_says_so():
    sif = runs(0.004, rng_seed=2)
    del sif[3]
    b = board(simcse=runs(0.0, rng_seed=1), sifter=sif)
    assert row(b, "sifter")["vs_reference"]["n"] == 4 and row(b, "sifter")["n"] == 4


def test_the_registration_gate_both_ways():
    up = board(simcse=runs(0.0, rng_seed=1), sifter=runs(0.05, rng_seed=2, spread=0.002))
    assert row(up, "sifter")["gate"] and lb.winner(up)["arm"] == "sifter"
    assert "→ passed" in lb.gate_text(row(up, "sifter"), H)
    # mean above the base, but the interval reaches below it: not registered
    spread_out = {s: {"test": {H: v}, "dev": v} for s, v in {1: 0.90, 2: 0.70, 3: 0.80}.items()}
    wide = board(simcse=runs(0.0, seeds=[1, 2, 3], rng_seed=1), sifter=spread_out)
    r = row(wide, "sifter")
    assert r["mean"][H] > BASE["mean"]["test"][H] and r["vs_base"]["low"] < 0 and not r["gate"]
    assert "→ not passed" in lb.gate_text(r, H)
    with pytest.raises(ValueError, match="register.arm 'nope'"):
        lb.winner(up, "nope")


def test_several_arms_against_one_base_are_gated_on_the_holm_adjusted_interval():
    # three arms against one base, three seeds: 'b' (raw p 0.026) passes unadjusted, not after Holm (p 0.052)
    def fixed(values):
        return {s: {"test": {H: 0.75 + v}, "dev": 0.8} for s, v in zip((1, 2, 3), values, strict=True)}

    b = lb.build(
        [
            lb.ArmRuns("a", "m", "mean", fixed([0.010, 0.012, 0.014])),
            lb.ArmRuns("b", "m", "mean", fixed([0.005, 0.009, 0.007])),
            lb.ArmRuns("c", "m", "mean", fixed([0.001, -0.003, 0.005])),
        ],
        BASE,
        reference="c",
        headline=H,
    )
    a, bb = row(b, "a"), row(b, "b")
    assert bb["vs_base"]["low"] > 0 and bb["vs_base"]["adjusted"]["low"] < 0  # raw above 0, adjusted not
    assert bb["vs_base"]["adjusted"]["m"] == 3 and bb["vs_base"]["adjusted"]["p"] > 0.05
    assert a["gate"] and not bb["gate"] and not row(b, "c")["gate"]
    assert "Holm" in lb.markdown(b) and "after Holm's adjustment over the 3 arms" in lb.gate_text(bb, H)
    # against the reference 'c' two arms are compared: a family of two
    assert a["vs_reference"]["adjusted"]["m"] == 2 and row(b, "c")["vs_reference"] is None
    # one arm against the base is a family of one: nothing to adjust, the raw interval gates
    alone = lb.build(
        [lb.ArmRuns("b", "m", "mean", fixed([0.005, 0.009, 0.007]))], BASE, reference=None, headline=H
    )
    assert "adjusted" not in row(alone, "b")["vs_base"] and row(alone, "b")["gate"]


def test_per_seed_scores_are_in_the_json_and_recompute_the_leaderboards_interval():
    import json

    from orchestrator.stats import paired_difference

    b = board(simcse=runs(0.0, rng_seed=1), sifter=runs(0.004, rng_seed=2))
    data = json.loads(lb.dumps(b))  # what the result file keeps
    sif, sim = row(data, "sifter"), row(data, "simcse")
    assert set(sif["per_seed"]) == {"1", "2", "3", "4", "5"}
    mine = {s: v[H] for s, v in sif["per_seed"].items()}
    ref = {s: v[H] for s, v in sim["per_seed"].items()}
    again = paired_difference(mine, ref)
    assert (again.mean, again.low, again.high) == pytest.approx(
        (sif["vs_reference"]["mean"], sif["vs_reference"]["low"], sif["vs_reference"]["high"]), rel=1e-12
    )
    base = data["bases"]["mean"]["test"][H]
    vs_base = paired_difference(mine, base)
    assert (vs_base.low, vs_base.high) == pytest.approx(
        (sif["vs_base"]["low"], sif["vs_base"]["high"]), rel=1e-12
    )
    assert (
        sif["per_seed"]["3"]["sts_stsb_spearman_all"]
        == runs(0.004, rng_seed=2)[3]["test"]["sts_stsb_spearman_all"]
    )


def test_a_saturated_arm_is_flagged_in_the_leaderboard():
    b = board(simcse=runs(0.0, loss=1.3e-5), sifter=runs(0.0, rng_seed=3, loss=0.4))
    assert row(b, "simcse")["saturated"] and not row(b, "sifter")["saturated"]
    md = lb.markdown(b)
    assert "**saturated**" in md and md.count("**saturated**") == 1
    assert "base (default, mean)" in md and "(reference)" in md


def test_one_seed_gives_no_interval_and_no_gate():
    b = board(simcse=runs(0.0, seeds=[1]), sifter=runs(0.05, seeds=[1]))
    assert not row(b, "sifter")["gate"] and "1 pair: no interval" in lb.markdown(b)


# ---------------------------------------------------------------- the compare file
def job(**kw):
    data = {
        "seeds": [1, 2],
        "arms": {
            "simcse": {"method": "simcse", "config": "configs/simcse/smoke.yaml"},
            "sifter": {"method": "sifter_simcse", "config": "configs/sifter_simcse/smoke.yaml"},
        },
        **kw,
    }
    return validate(CompareJobConfig, data, "compare.yaml")


def arms_of(j):
    return {n: arm_config(j, n, "compare.yaml", []) for n in j.arms}


def test_arms_on_equal_terms_pass_and_each_difference_is_refused_by_name():
    check_comparable(arms_of(job()), "compare.yaml")
    for key, value, what in [
        ("train.max_steps", 80, "step budget"),
        ("model.name_or_path", "/elsewhere", "base model"),
        ("eval.tasks", ["stsb"], "test tasks"),
        ("train.batch_size", 8, "global batch"),
    ]:
        j = job()
        j.arms["sifter"].overrides[key] = value
        with pytest.raises(ConfigError, match=f"arm 'sifter' differs from arm 'simcse' in the {what}"):
            check_comparable(arms_of(j), "compare.yaml")


def test_a_sentences_budget_compares_batch_sizes_at_equal_epochs():
    """``budget: sentences``: arms may differ in steps and global batch when their product is equal (batch sizes
    compared at equal epochs); a different product is refused by name, and the default budget refuses both."""

    def batch_arms(budget: str, steps: int):
        j = job(budget=budget)
        j.arms["sifter"].overrides.update(
            {"train.max_steps": steps, "train.batch_size": 64, "train.grad_cache": {"mini_batch": 16}}
        )
        j.common_overrides.update({"train.max_steps": 40, "train.batch_size": 8})
        return arms_of(j)

    check_comparable(batch_arms("sentences", 5), "compare.yaml", "sentences")  # 40 × 16 = 5 × 128
    with pytest.raises(
        ConfigError,
        match=r"differs from arm 'simcse' in the training sentences \(train.max_steps × "
        r"train.batch_size × scaling.num_workers\): 1280 vs 640",
    ):
        check_comparable(batch_arms("sentences", 10), "compare.yaml", "sentences")
    with pytest.raises(ConfigError, match="differs from arm 'simcse' in the step budget"):
        check_comparable(batch_arms("steps", 5), "compare.yaml", "steps")


def test_bad_compare_files_get_one_clear_line():
    with pytest.raises(ConfigError, match="seeds must be distinct"):
        job(seeds=[1, 1])
    with pytest.raises(ConfigError, match="unknown_key"):
        job(unknown_key=3)
    j = job()
    j.arms["sifter"].overrides["lambda_xyz"] = 1
    with pytest.raises(ConfigError, match="lambda_xyz"):
        arms_of(j)
    with pytest.raises(ConfigError, match="unknown method 'simsce'"):
        arms_of(job(arms={"a": {"method": "simsce", "config": "configs/simcse/smoke.yaml"}}))


def test_an_arm_read_a_weaker_way_is_set_against_the_strongest_base_too_and_gated_on_it():
    """MiniLM read with [CLS] scores below MiniLM read with mean: an arm trained and read with [CLS] that beats
    the [CLS] base but not the mean one is shown against both, and is not registered (never hidden behind a
    weaker baseline)."""
    bases = {
        "cls_before_pooler": {"label": "base (default, cls)", "dev": 0.79, "test": {H: 0.70}},
        "mean": {"label": "base (default, mean)", "dev": 0.86, "test": {H: 0.79}},
    }
    cls_runs = runs(0.0, spread=0.002)  # ≈ 0.75: +5 over the [CLS] base, −4 under the mean one
    b = lb.build(
        [lb.ArmRuns("sifter", "sifter_simcse", "cls_before_pooler", cls_runs)],
        bases,
        reference=None,
        headline=H,
    )
    r = b["rows"][0]
    assert b["strongest_base"] == "mean" and r["vs_base"]["verdict"] == "higher"
    assert r["vs_strongest_base"]["verdict"] == "lower" and not r["gate"]
    assert "read its strongest way" in lb.gate_text(r, H) and "→ not passed" in lb.gate_text(r, H)
    assert "**base (default, mean)** at 79.00" in lb.markdown(b)
    same = lb.build(
        [lb.ArmRuns("sifter", "sifter_simcse", "mean", runs(0.05, spread=0.002))],
        bases,
        reference=None,
        headline=H,
    )
    assert same["rows"][0]["vs_strongest_base"] is None and same["rows"][0]["gate"]


def test_the_registered_winner_gets_sieves_card_beside_the_base_read_its_way_and_the_champion():
    """One card writer for every export - the comparison's winner too."""
    from orchestrator.config import REPO_ROOT, load_config
    from orchestrator.drivers.compare_publish import winner_card
    from orchestrator.drivers.registry import get_method

    recipe = get_method("sifter_simcse")
    cfg = load_config(recipe.config_cls, REPO_ROOT / "configs" / "sifter_simcse" / "smoke.yaml")
    b = board(sifter=runs(0.02), simcse=runs(0.0))
    r = row(b, "sifter")
    rep = {"seed": 3, "test": runs(0.02)[3]["test"]}
    card = winner_card(recipe, cfg, "cmp", b, r, rep, "sifter-simcse", champion={})
    assert (
        "comparison `cmp`, arm `sifter`, seed 3" in card
        and "Trained by Sieve's `sifter_simcse` recipe" in card
    )
    base, got = BASE["mean"]["test"][H] * 100, rep["test"][H] * 100
    assert f"| {H} | {base:.2f} | {got:.2f} | {got - base:+.2f} | — |" in card and "No champion yet" in card
    assert f"Dev: {r['dev_mean'] * 100:.2f} vs 80.00 for the base (default, mean)" in card
    held = winner_card(
        recipe, cfg, "cmp", b, r, rep, "sifter-simcse", champion={"version": "2", f"test_{H}": "0.7"}
    )
    assert f"| {got - base:+.2f} | 70.00 |" in held and "champion v2" in held


def test_an_arm_without_a_dev_score_shows_none_not_its_last_step():
    """TSDAE's protocol has no dev set: its runs keep their last checkpoint and their row's ``best_dev`` is that
    step (100) - the leaderboard showed "dev ×100: 10000.00". It shows "–" now; an arm with a dev keeps it."""
    from orchestrator.config import REPO_ROOT, load_config
    from orchestrator.drivers.compare import ComparePlan, leaderboard
    from orchestrator.drivers.registry import get_method

    def arm(method: str):
        return get_method(method), load_config(
            get_method(method).config_cls, REPO_ROOT / "configs" / method / "smoke.yaml"
        )

    arms = {"tsdae": arm("tsdae"), "simcse": arm("simcse")}  # one recipe without a dev score, one with
    job = CompareJobConfig.model_validate(
        {
            "seeds": [1, 2],
            "arms": {n: {"method": n, "config": "-"} for n in arms},
            "reference": "tsdae",
            "headline": H,
        }
    )
    rows = [
        {"arm": arm, "seed": s, "test": {H: 0.7 + 0.01 * s}, "best_dev": dev, "history": [{"loss": 1.0}]}
        for arm, dev in (("tsdae", 100), ("simcse", 0.85))
        for s in (1, 2)
    ]
    plan = ComparePlan("cmp", job, arms, "0")
    b = leaderboard(plan, rows, BASE)
    assert math.isnan(row(b, "tsdae")["dev_mean"]) and row(b, "simcse")["dev_mean"] == pytest.approx(0.85)
    line = next(
        ln for ln in lb.markdown(b).splitlines() if ln.startswith("| tsdae") or ln.startswith("| **tsdae")
    )
    assert "10000" not in line and "| – |" in line


@pytest.mark.parametrize("preset", sorted(p.stem for p in (ROOT / "configs" / "compare").glob("*.yaml")))
def test_every_compare_preset_resolves(preset, monkeypatch, capsys):
    """Each shipped compare file validates - every arm's config, the arms comparable, the reference an arm -
    as ``--print-config`` resolves it (no Ray, no training)."""
    import sys

    from orchestrator.drivers import compare

    monkeypatch.delenv("SIEVE_STORAGE", raising=False)
    monkeypatch.setattr(sys, "argv", ["compare", "--preset", preset, "--print-config"])
    assert compare.main("doc") == 0
    assert capsys.readouterr().out.startswith("seeds:")
