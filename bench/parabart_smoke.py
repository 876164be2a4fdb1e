"""ParaBART vs its λ_adv = 0 ablation vs the untrained encoder, from the smoke sweep: STS Pearson
(the paper's metric), QQP-Easy / QQP-Hard accuracy, and the TreeDepth / TopConst probes.

Run the sweep first (the ``seeds`` preset: 3 paired seeds of each variant), then this script on its name:

    python jobs/parabart_sweep.py --preset seeds --name parabart-seeds
    python bench/parabart_smoke.py --name parabart-seeds --preset seeds

``--name`` again adds another sweep's trials (e.g. the ``seeds_confusion`` preset's variant over the same seeds);
each sweep measured the untouched encoder itself, and the script refuses sweeps whose base figures differ.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
from pathlib import Path

from _common import ROOT, write_results

TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]


def evaluate_extra(model_dir: str) -> dict:
    from orchestrator.evaluation import syntax
    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.models import load_encoder

    model, tok = load_encoder(model_dir, add_pooling_layer=False)
    enc = HFEncoder(model, tok, pooling="mean", batch_size=128, max_length=64)
    return {**syntax.qqp_easy_hard(enc), **syntax.probes(enc)}


COLUMNS = [
    ("sts_avg", "STS avg"),
    ("sts_senteval", "SentEval avg"),
    ("qqp_easy_best_acc", "QQP-Easy best"),
    ("qqp_hard_best_acc", "QQP-Hard best"),
    ("probe_tree_depth_acc", "TreeDepth ↓"),
    ("probe_top_const_acc", "TopConst ↓"),
    ("probe_bshift_ours_acc", "BShift ↓"),
]


def paired(a: dict, b) -> str:
    """Mean of the paired differences a − b (×100, by seed; ``b`` a number: the base) with its 95% t interval."""
    from orchestrator.stats import paired_difference

    return paired_difference(a, b).describe(scale=100)


def summary(rows: list[dict]) -> list[str]:
    """Mean ± std per variant over seeds, D's loss beside the average bag's, and paired differences (same seed)
    against "w/o adversarial loss" and against the base (measured once, in the same run)."""
    import statistics

    base, trials = rows[0], rows[1:]
    variants = list(dict.fromkeys(r["variant"] for r in trials))
    md = [
        "## Over seeds (mean ± std; the base measured once in the same run)",
        "",
        "| variant | n | "
        + " | ".join(c for _, c in COLUMNS)
        + " | D valid loss | average-bag loss | ū mean cosine |",
        "|---|---:|" + "---:|" * (len(COLUMNS) + 3),
        "| base (untouched E_sem) | 1 | "
        + " | ".join(f"{base[k] * 100:.2f}" for k, _ in COLUMNS)
        + " | | | |",
    ]
    for v in variants:
        rs = [r for r in trials if r["variant"] == v]

        def ms(vals, scale=100.0):
            vals = [x * scale for x in vals if x is not None]
            if not vals:
                return "-"
            d = 2 if scale != 1 else 4
            return f"{statistics.fmean(vals):.{d}f} ± {statistics.stdev(vals) if len(vals) > 1 else 0:.{d}f}"

        md.append(
            f"| {v} | {len(rs)} | "
            + " | ".join(ms([r[k] for r in rs]) for k, _ in COLUMNS)
            + f" | {ms([r['d_valid_loss'] for r in rs], 1)} | {ms([r['avg_bag_loss'] for r in rs], 1)}"
            f" | {ms([r['u_cosine_mean'] for r in rs], 1)} |"
        )
    md += [
        "",
        "Paired differences ×100, mean [95% t interval] over seeds:",
        "",
        "| variant | against | STS avg | SentEval avg | QQP-Hard best | TopConst |",
        "|---|---|---|---|---|---|",
    ]
    ref = "w/o adversarial loss"
    keys = ["sts_avg", "sts_senteval", "qqp_hard_best_acc", "probe_top_const_acc"]
    for v in variants:
        rs = {r["seed"]: r for r in trials if r["variant"] == v}
        md.append(
            f"| {v} | base | "
            + " | ".join(paired({s: r[k] for s, r in rs.items()}, base[k]) for k in keys)
            + " |"
        )
        if v != ref:
            other = {r["seed"]: r for r in trials if r["variant"] == ref}
            md.append(
                f"| {v} | {ref} | "
                + " | ".join(
                    paired({s: r[k] for s, r in rs.items()}, {s: r[k] for s, r in other.items()})
                    for k in keys
                )
                + " |"
            )
    return verdict(base, trials) + [""] + md


def verdict(base: dict, trials: list[dict]) -> list[str]:
    """The issue's targets and the base comparison, said plainly from the figures."""
    import statistics

    from orchestrator.stats import paired_difference

    def mean(v, k):
        return statistics.fmean(r[k] for r in trials if r["variant"] == v)

    no_al = "w/o adversarial loss"
    fulls = [v for v in dict.fromkeys(r["variant"] for r in trials) if v.startswith("ParaBART")]
    if not fulls or not any(r["variant"] == no_al for r in trials):
        return []
    lines = ["## Verdict", ""]
    for full in fulls:
        gap = (mean(full, "sts_avg") - mean(no_al, "sts_avg")) * 100
        top = (mean(full, "probe_top_const_acc") - mean(no_al, "probe_top_const_acc")) * 100
        lines += [
            f'- {full}\'s mean STS avg is {gap:+.2f} points from "w/o adversarial loss" (target: within 1.0): '
            f"**{'met' if abs(gap) <= 1.0 else 'not met'}**.",
            f'- TopConst: {full} {top:+.2f} points against "w/o adversarial loss" (target: below it): '
            f"**{'met' if top < 0 else 'not met'}**.",
        ]
    for v in dict.fromkeys(r["variant"] for r in trials):
        d = paired_difference({r["seed"]: r["sts_avg"] for r in trials if r["variant"] == v}, base["sts_avg"])
        word = {"higher": "beats", "lower": "is below", "indistinguishable": "is indistinguishable from"}[
            d.verdict
        ]
        lines.append(
            f"- {v} {word} the untouched encoder on STS avg: {d.describe(scale=100)} (95% t interval over seeds)."
        )
    return lines


def base_folder(base: dict) -> str:
    """The untouched model's folder, from the base label ``base (<model>, <pooling>)``."""
    from orchestrator.models import resolve_model_source

    return str(resolve_model_source(base["label"].split("(", 1)[1].split(",", 1)[0]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", action="append", help="the sweep's name (again: another sweep's trials too)")
    ap.add_argument(
        "--preset", default="seeds", help="the sweep preset the run used (for the command line printed)"
    )
    ap.add_argument("--outputs", default=str(ROOT / "outputs"))
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="take QQP and the probes of a model this file's last run "
        "measured (same sweep, same trial) from bench/results/parabart_smoke.json instead of again",
    )
    args = ap.parse_args()
    cache: dict = {}
    if args.reuse and (last := ROOT / "bench" / "results" / "parabart_smoke.json").is_file():
        old = json.loads(last.read_text())
        for sweep in old.get("sweeps", [old.get("sweep")]):
            cache.update({(sweep, r.get("trial")): r for r in old["rows"]})

    def extra(sweep: str | None, trial: str | None, folder: str) -> dict:
        if (hit := cache.get((sweep, trial))) is not None:
            return {k: v for k, v in hit.items() if k.startswith(("qqp_", "probe_"))}
        return evaluate_extra(folder)

    out, names = Path(args.outputs), args.name or ["parabart-smoke"]
    trials = [
        {**t, "sweep": n}
        for n in names
        for t in json.loads((out / "reports" / n / "trials.json").read_text())
    ]
    bases = [
        json.loads((out / "reports" / n / "base.json").read_text()) for n in names
    ]  # each sweep measured it
    base = bases[0]
    if any((b["dev"], b["test"]) != (base["dev"], base["test"]) for b in bases[1:]):
        raise SystemExit(f"the sweeps {names} measured different untouched encoders: not read side by side")
    rows = [
        {
            "model": f"{base['label']}: untouched E_sem, this run",
            "dev_stsb_spearman": base["dev"],
            "sts": {t: base["test"][f"sts_{t}_pearson_all"] for t in TASKS},
            "sts_avg": base["test"]["sts_avg_pearson_all"],
            "sts_senteval": base["test"]["sts_senteval_avg_pearson"],
            **extra(names[0], None, base_folder(base)),
        }
    ]
    for i, t in enumerate(trials):
        if not t.get("test"):
            continue
        first = (
            i == 0 or trials[i - 1]["sweep"] != t["sweep"]
        )  # a sweep's best trial is exported under its name
        folder = (
            out / "models" / t["sweep"] if first else out / "models" / f"{t['sweep']}-trials" / t["trial"]
        )
        v = t["params"].get("variant", t["params"])
        confusion = v.get("adversary_objective") == "confusion"
        label = (
            ("ParaBART, confusion term" if confusion else "ParaBART")
            if v.get("lambda_adv")
            else "w/o adversarial loss"
            if v.get("syntax_guidance", True)
            else "w/o AL and SG"
        )
        last = t["history"][-1] if t.get("history") else {}
        rows.append(
            {
                "model": f"{label} (λ_adv={v.get('lambda_adv'):g}, syntax guidance {v.get('syntax_guidance', True)})",
                "variant": label,
                "seed": t["params"].get("train.seed"),
                "trial": t["trial"],
                "dev_stsb_spearman": t["best_dev"],
                "selected_step": (t.get("best") or {}).get("step"),
                "d_valid_loss": last.get("valid_loss_adv"),
                "avg_bag_loss": last.get("valid_loss_adv_average_bag"),
                "u_cosine_mean": last.get("u_cosine_mean"),
                "u_norm_mean": last.get("u_norm_mean"),
                "sts": {k: t["test"][f"sts_{k}_pearson_all"] for k in TASKS},
                "sts_avg": t["test"]["sts_avg_pearson_all"],
                "sts_senteval": t["test"]["sts_senteval_avg_pearson"],
                **extra(t["sweep"], t["trial"], str(folder)),
            }
        )
        print(rows[-1])
    md = [
        f"# ParaBART smoke (`{'`, `'.join(names)}`): STS Pearson, QQP-Easy/Hard, probes (all ×100)",
        "",
        f"Sweep: `python jobs/parabart_sweep.py --preset {args.preset} --name {names[0]}` (120 steps, batch 16, "
        "bert2bert from MiniLM, the paper's learning rates, the checkpoint with the lowest paraphrase validation "
        "loss L_para; training pairs: the shipped mix of MRPC train, PAWS-X en dev, PIT-2015 dev and QQP duplicates "
        "disjoint from the QQP-Easy/Hard pool, both ways, shuffled: 17,710 directed pairs); then "
        f"`python bench/parabart_smoke.py {' '.join('--name ' + n for n in names)}{' --reuse' if args.reuse else ''}`. Mean pooling everywhere. STS: Pearson ×100, SimCSE's "
        "\"all\" per task; 'SentEval avg' = the paper's aggregation (Pearson averaged over each task's subsets, then "
        "tasks).",
        "",
    ]
    md += summary(rows)
    md += [
        "",
        "## Every trial",
        "",
        "| model | seed | STS-B dev ρ | " + " | ".join(TASKS) + " | STS avg | SentEval avg | QQP-Easy best | "
        "QQP-Hard best | QQP-Easy dev-thr | QQP-Hard dev-thr | TreeDepth ↓ | TopConst ↓ | BShift (ours) ↓ |",
        "|---|---|" + "---:|" * (len(TASKS) + 10),
    ]
    for r in rows:
        md.append(
            f"| {r['model']} | {r.get('seed', '')} | {r['dev_stsb_spearman'] * 100:.2f} | "
            + " | ".join(f"{r['sts'][k] * 100:.2f}" for k in TASKS)
            + f" | {r['sts_avg'] * 100:.2f} | {r['sts_senteval'] * 100:.2f} | {r['qqp_easy_best_acc'] * 100:.2f}"
            f" | {r['qqp_hard_best_acc'] * 100:.2f} | {r['qqp_easy_dev_threshold_acc'] * 100:.2f}"
            f" | {r['qqp_hard_dev_threshold_acc'] * 100:.2f} | {r['probe_tree_depth_acc'] * 100:.2f}"
            f" | {r['probe_top_const_acc'] * 100:.2f} | {r['probe_bshift_ours_acc'] * 100:.2f} |"
        )
    md += [
        "",
        "QQP: 2,397 duplicates sharing top-level constituents (Easy), 2,397 not sharing (Hard), each with the same "
        "2,397 non-duplicates, from the QQP BiMPM dev sample parsed by spaCy (`data/paraphrase/qqp-easy-hard.tsv`). "
        "'best' = best accuracy over thresholds −1…1 (the paper's, optimistic); 'dev-thr' = threshold chosen on a "
        "random half, accuracy on the other half. Probes: MLP (50 hidden) on frozen embeddings, 3,914 PTB-sample "
        "sentences, 20% held out; BShift (ours): the same sentences, half with two adjacent words swapped "
        "(`data/probes/bshift-ptb.tsv`); lower = less syntax in the embedding.",
        "",
        "Smoke scale (120 steps × 16 = 1,920 of the 17,710 pairs) says little about the method; the paper "
        "trains BART-base on 1M ParaNMT pairs for many epochs.",
    ]
    write_results("parabart_smoke", {"sweeps": names, "rows": rows}, "\n".join(md))


if __name__ == "__main__":
    main()
