"""What a finished job hands the user, and the rule it follows: the best setting is chosen, set
against the untouched base model measured in the same run, and registered - the alias ``candidate``
moves only when it beats the base on the dev metric.

* :func:`choose` - best setting (trials grouped over seeds, full-budget trials first) vs the base;
* :func:`register` - log the model, register a version (tags: both scores, ``beats_base``), move
  ``candidate`` only when it beats the base;
* :func:`log_trials` - one nested MLflow run per trial.

A finished run that meets a tracking outage is kept and logged later: ``orchestrator/outbox.py``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import mlflow
import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric

from orchestrator import storage
from orchestrator.evaluation.suite import compare_table
from orchestrator.live_runs import create_child_run
from orchestrator.onnx_export import FILES as ONNX_FILES
from orchestrator.spec import BaseResult
from orchestrator.tracking import find_run, find_version, redact, set_alias
from orchestrator.tracking import register as register_version


# ---------------------------------------------------------------- the swept values
def flat_params(params: dict[str, Any]) -> dict[str, Any]:
    """Sampled params with bundles expanded: ``{"lambdas": {"lambda_xy": 1}}`` → ``{"lambda_xy": 1}``: a swept
    value is spelled as its config key in every output (labels, trial names, MLflow's ``sweep.<key>``)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        out.update(value if isinstance(value, dict) else {key: value})
    return out


# ---------------------------------------------------------------- the best setting against the base
def params_label(params: dict) -> str:
    """``lambda_xy=1, train.lr=3e-05``: every swept value under its config key."""
    return ", ".join(
        f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in flat_params(params).items()
    )


def setting_of(params: dict, group_out: list[str]) -> str:
    return json.dumps({k: v for k, v in params.items() if k not in group_out}, sort_keys=True, default=str)


def is_baseline(params: dict, baseline_params: dict) -> bool:
    return bool(baseline_params) and all(params.get(k) == v for k, v in baseline_params.items())


@dataclass
class Choice:
    best: dict  # the trial row to export and register (the best seed of the best setting)
    best_dev: float  # the best setting's dev score: mean over its seeds (its trial's own with one seed)
    base_dev: float | None  # the base's dev score (None: no base to compare with)
    base_label: str
    margin: float

    @property
    def beats_base(self) -> bool:
        return self.base_dev is None or self.best_dev > self.base_dev + self.margin


def ranked_settings(rows: list[dict], group_out: list[str], baseline_params: dict) -> list[list[dict]]:
    """The trials grouped by setting (their params less ``group_out``), best mean dev first; trials that ran the
    whole budget are preferred to ones ASHA stopped, and a baseline point of the grid is not a candidate."""
    scored = [r for r in rows if r["checkpoint_path"] and r["best_dev"] == r["best_dev"]]
    full = [r for r in scored if not r["stopped_early"]] or scored
    candidates = [r for r in full if not is_baseline(r["params"], baseline_params)] or full
    groups: dict[str, list[dict]] = {}
    for r in candidates:
        groups.setdefault(setting_of(r["params"], group_out), []).append(r)
    return sorted(groups.values(), key=lambda g: -float(np.mean([r["best_dev"] for r in g])))


def choose(
    rows: list[dict],
    *,
    group_out: list[str],
    base: BaseResult | None,
    baseline_params: dict,
    margin: float = 0.0,
) -> Choice:
    """The best setting by mean dev score over its seeds; trials that ran the whole budget are
    preferred to ones ASHA stopped (never set a stopped trial against a full one). The base is the
    untouched model (``base``) or, for a method whose baseline is a point of its grid (SIFTER-LSTM's
    plain LSTM), the mean over that point's seeds."""
    scored = [r for r in rows if r["checkpoint_path"] and r["best_dev"] == r["best_dev"]]
    best_group = ranked_settings(rows, group_out, baseline_params)[0]
    best = max(best_group, key=lambda r: r["best_dev"])
    best_dev = float(np.mean([r["best_dev"] for r in best_group]))
    if base is not None:
        return Choice(best, best_dev, base.dev, base.label, margin)
    baseline = [r for r in scored if is_baseline(r["params"], baseline_params)]
    base_dev = float(np.mean([r["best_dev"] for r in baseline])) if baseline else None
    label = f"baseline {json.dumps(baseline_params)} (mean of {len(baseline)} trials)" if baseline else "none"
    return Choice(best, best_dev, base_dev, label, margin)


def gate_line(choice: Choice, metric_label: str, registered: dict) -> str:
    """The job's last line: what became candidate, or that nothing beat the base."""
    ref = f"{registered['name']} v{registered['version']}"
    if choice.base_dev is None:
        return f"candidate: {ref} (no base model to compare with)"
    scores = f"{metric_label} {choice.best_dev * 100:.2f} vs {choice.base_dev * 100:.2f} for the {choice.base_label}"
    if choice.beats_base:
        return f"candidate: {ref} beats the base model ({scores})"
    return (
        f"the sweep found nothing better than the base model ({scores}, margin {choice.margin * 100:.2f}): "
        f"{ref} is registered with beats_base=false and does not become candidate"
    )


def scores_table(base: BaseResult | None, test, champion: dict | None = None) -> str:
    """The card's table: each headline test metric of the base (this run), this model, this − base, and - when
    ``champion`` was looked up (the tags of the version ``@champion`` held before this one, ``{}``: none) - the
    champion's score from its ``test_<metric>`` tags (its own run's measure), or a note that there is none."""
    if base is None:
        return test.table
    table = compare_table(base.test, test)
    if champion is None:
        return table
    version = champion.get("version")
    head, rule, *rows = table.split("\n")
    col = f"champion v{version}" if version else "champion"
    out = [f"{head} {col} |", f"{rule}---:|"]
    for row in rows:
        key = row.split("|")[1].strip()
        value = champion.get(f"test_{key}")
        out.append(f"{row} {float(value) * 100:.2f} |" if value is not None else f"{row} — |")
    note = (
        ""
        if version
        else "\n\nNo champion yet: set the alias `champion` on a version (the UI's version list, "
        "or `jobs/promote.py`) and the next card shows it here."
    )
    return "\n".join(out) + note


def mlflow_description(card: str) -> str:
    """A card as the registry shows it: without the YAML front matter (Hugging Face's metadata, which MLflow
    would print as text above the title)."""
    if card.startswith("---\n") and (end := card.find("\n---\n", 4)) != -1:
        return card[end + 5 :].lstrip("\n")
    return card


def as_list(settings: dict, prefix: str = "") -> list[str]:
    """A nested mapping as Markdown bullets, ``- key.sub: value`` (what a card shows where JSON would be a block of
    braces in the MLflow UI)."""
    out = []
    for k, v in settings.items():
        if isinstance(v, dict) and v:
            out += as_list(v, f"{prefix}{k}.")
        else:
            out.append(f"- {prefix}{k}: `{v if isinstance(v, str) else json.dumps(v, default=str)}`")
    return out


def trained_steps(history: list[dict]) -> int | None:
    """The last step a run reported (its reports' ``step``): what it trained, whatever ``max_steps`` asked."""
    return max((int(h["step"]) for h in history if isinstance(h.get("step"), int | float)), default=None)


def training_length(cfg, steps: int | None) -> str:
    """``20 steps``; ``4 steps (train.max_steps 20: the data gave 4)`` for a run its data cut short; epochs when
    the config sets no step count."""
    if not cfg.train.max_steps:
        return f"{steps} steps ({cfg.train.epochs} epochs)" if steps else f"{cfg.train.epochs} epochs"
    if steps is None or steps >= cfg.train.max_steps:
        return f"{cfg.train.max_steps} steps"
    return f"{steps} steps (train.max_steps {cfg.train.max_steps}: the data gave {steps})"


def model_card(
    *,
    recipe,
    cfg,
    origin: str,
    params: dict,
    test,
    base: BaseResult | None,
    choice: Choice,
    registered_name: str,
    champion: dict | None = None,
    steps: int | None = None,
) -> str:
    """The exported folder's README.md and the registered version's description, for every job that exports
    (``origin``: "sweep `s`, trial `t`", "train run `r`"): base model, method and its settings, training data,
    the scores beside the base model's (this run) and, for a registered version, the current champion's
    (:func:`scores_table`), licence."""
    pooling, data = recipe.pooling(cfg), recipe.training_data(cfg)
    library = (
        ["library_name: sentence-transformers"] if recipe.model_format == "sentence-transformers" else []
    )
    lines = [
        "---",
        "language: en",
        *library,
        f"tags: [sieve, {recipe.name}]",
        "---",
        "",
        f"# {registered_name}",
        "",
        f"Trained by Sieve's `{recipe.name}` recipe (`trainers/`) from `{recipe.base_model(cfg)}`"
        + (f" with `{pooling}` pooling" if pooling else "")
        + f"; {origin}.",
        "",
        "## Setting",
        "",
        *(as_list(params) or ["- (the method's defaults)"]),
        "",
        f"Training: {training_length(cfg, steps)}, "
        f"batch {cfg.train.batch_size} × {cfg.scaling.num_workers} workers, learning rate {cfg.train.lr:g}.",
        "",
    ]
    if dims := getattr(cfg, "matryoshka_dims", None):  # a Matryoshka-trained encoder: each size is servable
        lines += [
            "## Embedding sizes (Matryoshka)",
            "",
            f"Trained at {', '.join(map(str, sorted(dims, reverse=True)))} dimensions: the first d coordinates alone "
            "are an embedding. Load it at a size with `SentenceTransformer(path, truncate_dim=d)`; the test figures "
            "for each size are the `_dim<d>` metrics of the run.",
            "",
        ]
    if variants := getattr(getattr(cfg, "export", None), "onnx", None):  # the folder's servable copies
        files = ", ".join(f"`onnx/{ONNX_FILES[v]}` ({v})" for v in variants)
        lines += [
            "## ONNX",
            "",
            f"{files}: inputs `input_ids`, `attention_mask` (this folder's tokenizer), output `sentence_embedding`. "
            "Load with ONNX Runtime - `onnxruntime.InferenceSession(path)` - or Sieve's "
            "`orchestrator.onnx_export.OnnxEncoder(folder, variant).encode(texts)`.",
            "",
        ]
    if data is not None:
        lines += ["## Training data", "", *as_list(data)[:40], ""]
    lines += [f"## Evaluation ({recipe.metric_label} for the choice; test below)", ""]
    if choice.base_dev is not None:
        lines += [
            f"Dev: {choice.best_dev * 100:.2f} vs {choice.base_dev * 100:.2f} for the {choice.base_label}"
            f" - {'beats' if choice.beats_base else 'does not beat'} it.",
            "",
        ]
    lines += [
        scores_table(base, test, champion),
        "",
        "## Licence",
        "",
        "The base model's licence applies to these weights (the packaged all-MiniLM-L6-v2: "
        "Apache-2.0); the training and evaluation data keep theirs (`data/SOURCES.md`).",
        "",
    ]
    # a URI's password or a secret's value in an override never reaches a card
    return redact("\n".join(lines))


def register(
    model_uri: str,
    name: str,
    choice: Choice,
    *,
    description: str,
    tags: dict[str, str],
    key: str | None = None,
) -> dict:
    """Register a version with both scores in its tags; ``candidate`` moves only when it beats the base.
    ``key`` (tag ``sieve.publish``) makes it idempotent: a version already registered with that key is
    reused - a resumed job registers nothing new, and finishes what a crash cut (the alias)."""
    tags = {
        **tags,
        "beats_base": str(choice.beats_base).lower(),
        "dev_score": f"{choice.best_dev:.6f}",
        **({"base_dev_score": f"{choice.base_dev:.6f}"} if choice.base_dev is not None else {}),
        **({"sieve.publish": key} if key else {}),
    }
    alias = "candidate" if choice.beats_base else None
    existing = find_version(name, {"sieve.publish": key}) if key else None
    if existing is not None:
        if alias:
            set_alias(name, alias, existing)
        return {
            "name": name,
            "version": existing,
            "alias": alias,
            "beats_base": choice.beats_base,
            "new": False,
        }
    version = register_version(model_uri, name, alias=alias, description=description[:5000], tags=tags)
    return {"name": name, "version": version, "alias": alias, "beats_base": choice.beats_base, "new": True}


# ---------------------------------------------------------------- a finished job's record
PUBLISHED = (
    "published.json"  # in a sweep's (or comparison's) storage, written last: trained, tested, published
)


def write_published(where: str, summary: dict, console: str) -> None:
    storage.write_bytes(
        storage.join(where, PUBLISHED),
        json.dumps({"summary": summary, "console": console}, default=str).encode(),
    )


def answer_published(where: str, what: str, t0: float) -> bool:
    """``--resume`` of a job that finished and published: its recorded console output, in seconds (no Ray, no
    corpus, no base measured again). False when it has not finished publishing (resume as usual)."""
    uri = storage.join(where, PUBLISHED)
    if not storage.exists(uri):
        return False
    print(json.loads(storage.read_bytes(uri))["console"])
    print(
        f"{what} had finished and was published: nothing trained, nothing new registered "
        f"(its record {uri}, read in {time.time() - t0:.1f} s)"
    )
    return True


# what Tune adds to every report: bookkeeping, not measurements
TUNE_KEYS = {
    "timestamp",
    "checkpoint_dir_name",
    "done",
    "training_iteration",
    "trial_id",
    "date",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "hostname",
    "node_ip",
    "time_since_restore",
    "iterations_since_restore",
    "checkpoint_path",
    "step",
    "epoch",
    "should_checkpoint",
}


def log_trials(exp_id: str, parent_id: str, name: str, rows: list[dict], metric: str) -> None:
    """Complete every trial's nested run: the runs the trials made when they started (and logged into
    while training) get their final numbers; a trial that could not reach MLflow gets its run now,
    with every evaluation from the recorded reports. Idempotent: a resumed sweep adds no run."""
    client = MlflowClient()
    for r in rows:
        tags = {"sieve.sweep": name, "sieve.trial": r["trial"], "sieve.role": "trial"}
        run = find_run(exp_id, tags)
        if run is None:
            run_id = create_child_run(
                exp_id,
                parent_id,
                r["trial"],
                tags,
                {"sweep": flat_params(r["params"])},
                mlflow.get_tracking_uri(),
            )
        else:
            run_id = run.info.run_id
        logged = {m.step for m in client.get_metric_history(run_id, metric)}  # live, while it trained
        for h in r["history"]:  # only the evaluations an outage kept from the run: each step once
            if (step := int(h.get("step", 0))) not in logged:
                client.log_batch(
                    run_id,
                    metrics=[
                        Metric(k, float(v), 0, step)
                        for k, v in h.items()
                        if k not in TUNE_KEYS and isinstance(v, int | float) and math.isfinite(v)
                    ],
                )
        final = {
            "best_" + metric: r["best_dev"],
            "evaluations": len(r["history"]),
            "stopped_early": float(r["stopped_early"]),
            **{f"test_{k}": v for k, v in r.get("test", {}).items()},
        }
        client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), 0, 0) for k, v in final.items() if v == v and not math.isinf(v)],
        )
        if r["error"]:
            client.set_tag(run_id, "sieve.error", r["error"])
        client.set_terminated(run_id, "FAILED" if r["error"] else "FINISHED")


def top_settings(rows: list[dict], group_out: list[str], baseline_params: dict, k: int) -> list[dict]:
    """The explore stage's ``k`` best settings by mean dev over their trials: each an arm ``rank1``.. with the
    params of its best trial (a swept seed is set again per confirm seed), its label and dev figures."""
    out = []
    for i, group in enumerate(ranked_settings(rows, group_out, baseline_params)[:k], start=1):
        best = max(group, key=lambda r: r["best_dev"])
        shown = {key: v for key, v in best["params"].items() if key not in group_out}
        out.append(
            {
                "arm": f"rank{i}",
                "params": best["params"],
                "setting": setting_of(best["params"], group_out),
                "label": params_label(shown) or "(the base config)",
                "dev_mean": float(np.mean([r["best_dev"] for r in group])),
                "trials": [r["trial"] for r in group],
            }
        )
    return out


def explore_table(settings: list[dict], rows: list[dict], group_out: list[str], metric_label: str) -> str:
    """The explore stage's ranking on dev (every setting), the confirmed ones marked with their arm."""
    confirmed = {s["setting"]: s["arm"] for s in settings}
    groups = {}
    for r in rows:
        if r["checkpoint_path"] and r["best_dev"] == r["best_dev"]:
            groups.setdefault(setting_of(r["params"], group_out), []).append(r)
    ranked = sorted(groups.items(), key=lambda kv: -float(np.mean([r["best_dev"] for r in kv[1]])))
    lines = [
        f"| setting | trials | {metric_label} ×100 (mean) | confirmed as |",
        "|---|---:|---:|---|",
    ]
    for key, group in ranked:
        shown = {k: v for k, v in group[0]["params"].items() if k not in group_out}
        lines.append(
            f"| {params_label(shown) or '(the base config)'} | {len(group)} | "
            f"{np.mean([r['best_dev'] for r in group]) * 100:.2f} | {confirmed.get(key, '–')} |"
        )
    return "\n".join(lines)
