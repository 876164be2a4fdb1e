"""A seeded comparison of settings against the untouched base model, from a sweep that tested every
trial (``test_every_trial``): per setting mean ± std over seeds on every test task, and paired
differences (same seed) between settings and against the base, with their spread.

    python bench/method_compare.py --preset compare                       # runs jobs/sifter_sweep.py --preset compare
    python bench/method_compare.py --job tsdae_sweep --preset compare --result tsdae_pooling_cpu
    python bench/method_compare.py --name NAME                            # an existing sweep's outputs only

The base row is the sweep's own measurement of the untouched model (same run, same pooling, same
tasks); with ``--extra-base-pooling`` the base is also measured with another pooling here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import ROOT, write_results

SIFTER_LABELS = {
    (0, 1, 1, 1): "SIFTER (X-Y + X-Z + Y-Z)", (1, 0, 0, 0): "SimCSE (X-X')", (0, 1, 0, 0): "X-Y only",
    (0, 0, 1, 0): "X-Z only", (0, 0, 0, 1): "Y-Z only",
}


def label_of(params: dict, group_out: list[str]) -> str:
    lam = params.get("lambdas")
    if isinstance(lam, dict):
        key = tuple(int(lam.get(k, 0)) for k in ("lambda_xx", "lambda_xy", "lambda_xz", "lambda_yz"))
        return SIFTER_LABELS.get(key, json.dumps(lam))
    rest = {k: v for k, v in params.items() if k not in group_out}
    return ", ".join(f"{k}={v}" for k, v in rest.items()) or "(all)"


def metric_keys(metrics: dict) -> list[str]:
    """Per-task Spearman 'all' and the average, then every non-STS metric (domain AP, ...)."""
    sts = [k for k in metrics if k.startswith("sts_") and k.endswith("_spearman_all") and not k.startswith("sts_avg")]
    other = [k for k in metrics if not k.startswith("sts_")]
    return other + sts + [k for k in ("sts_avg_spearman_all",) if k in metrics]


def short(key: str) -> str:
    return key.removeprefix("sts_").removesuffix("_spearman_all").replace("avg", "7-task avg")


def fmt(values) -> str:
    v = np.asarray(values, dtype=float) * 100
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}" if len(v) > 1 else f"{v.mean():.2f}"


def pooling_of(base_label: str) -> str:
    """``base (default, mean)`` → ``mean``."""
    return base_label.rsplit(", ", 1)[-1].rstrip(")")


def summarise(name: str, outputs: Path, group_out: list[str], extra_bases: list[dict] = ()) -> tuple[dict, str]:
    """Every setting against the base measured with the same pooling (the strongest base where the setting
    does not choose a pooling), and against a reference setting, per seed."""
    report = outputs / "reports" / name
    rows = [r for r in json.loads((report / "trials.json").read_text()) if r.get("test")]
    measured = json.loads((report / "base.json").read_text())
    bases = [measured, *measured.get("others", []), *extra_bases]
    strongest = max(bases, key=lambda b: b["dev"])
    by_pooling = {pooling_of(b["label"]): b for b in bases}
    base_for = lambda r: by_pooling.get(r["params"].get("model.pooling"), strongest)  # noqa: E731
    base = strongest
    settings: dict[str, list[dict]] = {}
    for r in rows:
        settings.setdefault(label_of(r["params"], group_out), []).append(r)
    keys = metric_keys(rows[0]["test"])
    seed_key = group_out[0] if group_out else None
    seed_of = lambda r: r["params"].get(seed_key)  # noqa: E731
    lines = ["| setting | n | dev ×100 | " + " | ".join(short(k) for k in keys) + " |",
             "|---|---:|---:|" + "---:|" * len(keys)]
    lines += [f"| **{b['label']}** (untouched, this run{'; the strongest' if b is strongest and len(bases) > 1 else ''})"
              f" | – | {b['dev'] * 100:.2f} | " + " | ".join(f"{b['test'][k] * 100:.2f}" for k in keys) + " |"
              for b in sorted(bases, key=lambda b: -b["dev"])]
    data = {"base": base, "bases": bases, "settings": {}}
    for label, rs in sorted(settings.items(), key=lambda kv: -np.mean([r["test"][keys[-1]] for r in kv[1]])):
        data["settings"][label] = {"trials": [{"trial": r["trial"], "seed": seed_of(r), "dev": r["best_dev"],
                                               "test": {k: r["test"][k] for k in keys}} for r in rs]}
        lines.append(f"| {label} | {len(rs)} | {fmt([r['best_dev'] for r in rs])} | "
                     + " | ".join(fmt([r["test"][k] for r in rs]) for k in keys) + " |")
    # paired differences: each setting − base (per seed), and every setting − the reference setting (same seed),
    # on the dev score and each headline test metric (the domain headline, if any, and the STS average)
    domain = [k for k in keys if not k.startswith("sts_")]
    heads = ([k for k in domain if k == "twitterpara_ap"] or domain)[:1] + [k for k in keys if k == "sts_avg_spearman_all"]
    diff_lines = ["| comparison | pairs | Δ dev ×100 | " + " | ".join(f"Δ {short(h)} ×100" for h in heads)
                  + " | seeds better (last column) |", "|---|---:|---:|" + "---:|" * len(heads) + "---:|"]
    data["paired"] = {}
    labels = list(data["settings"])
    ref = next((lb for lb in labels if lb.startswith("SimCSE")), labels[-1])
    pairs = [(lb, None) for lb in labels] + [(lb, ref) for lb in labels if lb != ref]
    for a, b in pairs:
        ra = {seed_of(r): r for r in settings[a]}
        if b is None:
            bs = base_for(settings[a][0])
            rb, common, name_ab = None, list(ra), f"{a} − {bs['label']}"
            dev = [ra[s]["best_dev"] - bs["dev"] for s in common]
            tests = {h: [ra[s]["test"][h] - bs["test"][h] for s in common] for h in heads}
        else:
            rb = {seed_of(r): r for r in settings[b]}
            common, name_ab = sorted(set(ra) & set(rb), key=str), f"{a} − {b}"
            dev = [ra[s]["best_dev"] - rb[s]["best_dev"] for s in common]
            tests = {h: [ra[s]["test"][h] - rb[s]["test"][h] for s in common] for h in heads}
        better = sum(d > 0 for d in tests[heads[-1]])
        data["paired"][name_ab] = {"dev": dev, **tests}
        diff_lines.append(f"| {name_ab} | {len(common)} | {fmt(dev)} | " + " | ".join(fmt(tests[h]) for h in heads)
                          + f" | {better}/{len(common)} |")
    return data, "\n".join(lines) + "\n\n### Paired differences (same seed; std over the pairs)\n\n" + "\n".join(diff_lines)


def extra_base(model: str, pooling: str, sweep_cfg: dict, tasks: list[str]) -> dict:
    """The untouched model with another pooling, on the same test tasks (here, in this run)."""
    sys.path.insert(0, str(ROOT))
    from orchestrator.drivers.registry import get_method

    spec = get_method(sweep_cfg["method"])
    cfg = spec.config_cls.model_validate({**sweep_cfg["config"], "model": {**sweep_cfg["config"]["model"],
                                                                          "name_or_path": model, "pooling": pooling}})
    result = spec.evaluate_base(cfg)
    return {"label": result.label, "dev": result.dev, "test": result.test.metrics}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", default="sifter_sweep")
    ap.add_argument("--preset", default="compare")
    ap.add_argument("--name", help="an existing sweep: summarise its outputs, run nothing")
    ap.add_argument("--result", default="method_compare_cpu")
    ap.add_argument("--extra-base-pooling", help="also measure the base model with this pooling")
    ap.add_argument("--reuse-extra", action="store_true",
                    help="take that measurement from the previous result file of the same sweep (no re-run)")
    ap.add_argument("--outputs", default=str(ROOT / "outputs"))
    args = ap.parse_args()
    name, t0, wall = args.name, time.time(), None
    command = f"python jobs/{args.job}.py --preset {args.preset}"
    if name is None:
        name = f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}"
        subprocess.run([sys.executable, str(ROOT / "jobs" / f"{args.job}.py"), "--preset", args.preset, "--name", name,
                        "--no-progress"], check=True, cwd=Path(args.outputs).parent)
        wall = (time.time() - t0) / 60
    outputs = Path(args.outputs)
    summary_md = (outputs / "reports" / name / "summary.md").read_text()
    group_out = ["train.seed"]
    extras = []
    if args.extra_base_pooling:  # sweeps now measure every pooling themselves; kept for older sweeps' outputs
        previous = ROOT / "bench" / "results" / f"{args.result}.json"
        old = json.loads(previous.read_text()) if args.reuse_extra and previous.is_file() else {}
        if old.get("sweep") == name and old.get("extra_base"):
            extras, wall = [{**old["extra_base"], "sweep": name}], wall or old.get("wall_min")
        else:
            config = json.loads(summary_md.split("```json\n", 1)[1].split("\n```", 1)[0])["config"]
            extras = [{**extra_base(config["model"]["name_or_path"], args.extra_base_pooling,
                                    {"method": config["method"], "config": config}, []), "sweep": name}]
    data, table = summarise(name, outputs, group_out, extras)
    if extras:
        data["extra_base"] = extras[0]
        table += ("\n\nThe base with the other pooling was measured by this script right after the sweep (same model, "
                  "tasks and code); the sweep itself measured the other.")
    lines = [f"# Seeded comparison `{name}` (2-core CPU)", "",
             f"Command: `{command} --name {name}` then `python bench/method_compare.py --name {name}"
             f" --result {args.result}` (or both at once: `python bench/method_compare.py --job {args.job} "
             f"--preset {args.preset} --result {args.result}`)." + (f" Wall time {wall:.1f} min." if wall else ""), "",
             "Every trial ran the same number of steps and was tested on every task; numbers are ×100, mean ± std "
             "over seeds (sample std). The base row is the untouched model measured in the same run with the same "
             "pooling and tasks.", "", table]
    write_results(args.result, {"sweep": name, "command": command, "wall_min": wall, **data}, "\n".join(lines))


if __name__ == "__main__":
    main()
