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


def summarise(name: str, outputs: Path, group_out: list[str]) -> tuple[dict, str]:
    report = outputs / "reports" / name
    rows = [r for r in json.loads((report / "trials.json").read_text()) if r.get("test")]
    base = json.loads((report / "base.json").read_text())
    settings: dict[str, list[dict]] = {}
    for r in rows:
        settings.setdefault(label_of(r["params"], group_out), []).append(r)
    keys = metric_keys(rows[0]["test"])
    seed_key = group_out[0] if group_out else None
    seed_of = lambda r: r["params"].get(seed_key)  # noqa: E731
    lines = ["| setting | n | dev ×100 | " + " | ".join(short(k) for k in keys) + " |",
             "|---|---:|---:|" + "---:|" * len(keys),
             f"| **{base['label']}** (untouched, this run) | – | {base['dev'] * 100:.2f} | "
             + " | ".join(f"{base['test'][k] * 100:.2f}" for k in keys) + " |"]
    data = {"base": base, "settings": {}}
    for label, rs in sorted(settings.items(), key=lambda kv: -np.mean([r["test"][keys[-1]] for r in kv[1]])):
        data["settings"][label] = {"trials": [{"trial": r["trial"], "seed": seed_of(r), "dev": r["best_dev"],
                                               "test": {k: r["test"][k] for k in keys}} for r in rs]}
        lines.append(f"| {label} | {len(rs)} | {fmt([r['best_dev'] for r in rs])} | "
                     + " | ".join(fmt([r["test"][k] for r in rs]) for k in keys) + " |")
    # paired differences: each setting − base (per seed), and every setting − the reference setting (same seed),
    # on the dev score and each headline test metric (the domain headline, if any, and the STS average)
    heads = [k for k in keys if not k.startswith("sts_")][:1] + [k for k in keys if k == "sts_avg_spearman_all"]
    diff_lines = ["| comparison | pairs | Δ dev ×100 | " + " | ".join(f"Δ {short(h)} ×100" for h in heads)
                  + " | seeds better (last column) |", "|---|---:|---:|" + "---:|" * len(heads) + "---:|"]
    data["paired"] = {}
    labels = list(data["settings"])
    ref = next((lb for lb in labels if lb.startswith("SimCSE")), labels[-1])
    pairs = [(lb, None) for lb in labels] + [(lb, ref) for lb in labels if lb != ref]
    for a, b in pairs:
        ra = {seed_of(r): r for r in settings[a]}
        if b is None:
            rb, common, name_ab = None, list(ra), f"{a} − base"
            dev = [ra[s]["best_dev"] - base["dev"] for s in common]
            tests = {h: [ra[s]["test"][h] - base["test"][h] for s in common] for h in heads}
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
    best = json.loads((outputs / "reports" / name / "trials.json").read_text())
    summary_md = (outputs / "reports" / name / "summary.md").read_text()
    group_out = ["train.seed"]
    data, table = summarise(name, outputs, group_out)
    if args.extra_base_pooling:
        config = json.loads(summary_md.split("```json\n", 1)[1].split("\n```", 1)[0])["config"]
        extra = extra_base(config["model"]["name_or_path"], args.extra_base_pooling,
                           {"method": config["method"], "config": config}, [])
        data["extra_base"] = extra
        keys = metric_keys(best[0]["test"])
        table += ("\n\nThe untouched model with the other pooling (measured by this script, same tasks):\n\n"
                  f"| {extra['label']} | dev {extra['dev'] * 100:.2f} | "
                  + " | ".join(f"{short(k)} {extra['test'][k] * 100:.2f}" for k in keys) + " |")
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
