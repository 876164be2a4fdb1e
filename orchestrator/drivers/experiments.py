"""The Siamese paper's Table 1 as a job: per experiment ORIG / NAIVE / SIAMESE, plus one ALL model
over every experiment's training set, each trained with Ray Train, evaluated by Δ cosine distance
(and same-class MAP) on the experiment's test sets, tracked in MLflow, the SIAMESE and ALL models
registered, and a results table + bar chart written.

ORIG - the untouched encoder, measured in the same run with the same pooling - is the base every
trained model stands beside; a registered model becomes ``candidate`` only when its dev Δ beats
ORIG's on the same held-out texts.

    cfg = load_config(ExperimentsConfig, "configs/siamese_experiments/smoke.yaml")
    run_experiments(cfg, name="siamese-smoke")
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import mlflow
import numpy as np
from matplotlib.figure import Figure  # no pyplot: a figure drawn to a file needs no backend or display
from mlflow import MlflowClient

from orchestrator import storage, tracking
from orchestrator.config import MethodConfig
from orchestrator.drivers import outbox
from orchestrator.drivers import publish as pub
from orchestrator.drivers.cluster import concurrent_trials, init_ray
from orchestrator.drivers.experiments_config import MODELS, ExperimentsConfig
from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import (
    build_trainer,
    export_and_test,
    fit,
    materializes,
    measure_bases,
    preflight,
)
from orchestrator.errors import ConfigError
from orchestrator.evaluation.suite import TestReport
from orchestrator.export import write_model_card
from orchestrator.spec import BaseResult
from orchestrator.storage import atomic_dir


def run_experiments(
    cfg: ExperimentsConfig,
    name: str,
    *,
    out_root: str | Path = "outputs",
    verbose: bool = False,
    resume: bool = False,
) -> dict:
    """Two phases. Train and test: ORIG measured, then every model trained, exported and tested, each
    result committed to ``<run.storage>/experiments/<name>/`` as it finishes (no tracking server needed).
    Publish: MLflow runs, registration and the report, every step idempotent. ``resume`` continues a
    job that was killed or lost its tracking server: finished models are not trained again, and a
    publish that already happened adds no run and no version."""
    recipe = get_method("siamese")
    probe = cfg.run_config(next(iter(cfg.experiments)), "siamese")
    exp_id = preflight(probe)  # tracking server, storage, model source: fail before any Ray work
    for e in cfg.experiments.values():  # every data file readable before anything trains
        for s in (e.train, *e.test):
            s.rows()
    state = storage.join(probe.run.storage, "experiments", name)
    if resume and not storage.exists(storage.join(state, "config.json")):
        raise ConfigError(f"--resume: no experiments {name!r} at {state}")
    if not resume and storage.exists(storage.join(state, "config.json")):
        raise ConfigError(f"experiments {name!r} already exist at {state}: pass --resume, or another --name")
    storage.write_bytes(storage.join(state, "config.json"), json.dumps(cfg.model_dump(mode="json")).encode())
    t0 = time.time()
    runs = [(exp, mode) for exp in cfg.experiments for mode in ("naive", "siamese") if mode in cfg.models]
    if "all" in cfg.models:
        runs.append((None, "all"))
    init_ray(quiet=not verbose)
    origs = {exp: _measured_orig(recipe, cfg, probe, exp, state) for exp in cfg.experiments}
    origs[None] = _orig_of_all(origs)  # ALL's dev texts and test sets are the union of the experiments'
    # The models are independent: as many train at once as the cluster fits (each a Ray Train run of its own,
    # started from a thread of this driver, as Tune starts trials); every one trains on the same threads as
    # alone, so its results are the same as trained one after another. Pairs first (seconds each):
    # whether any pair set streams during training decides whether a CPU stays free for its reads.
    models_dir = Path(out_root) / "models" / name
    pairs = {key: _pairs(recipe, cfg, probe, *key) for key in runs if not _committed(state, *key)}
    streams = any(not materializes(_run_config(cfg, probe, *key), shards) for key, shards in pairs.items())
    at_once = concurrent_trials(probe, cfg.models_at_once, streams=streams)
    with ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="model") as pool:
        futures = {
            key: pool.submit(_trained, recipe, cfg, probe, *key, name, state, models_dir, pairs.get(key))
            for key in runs
        }
        trained = {key: f.result() for key, f in futures.items()}
    try:
        return _publish(cfg, name, exp_id, origs, trained, Path(out_root), time.time() - t0)
    except Exception as exc:
        line = outbox.outage(
            exc,
            probe.tracking.tracking_uri,
            f"experiments {name!r}",
            state,
            f"python jobs/siamese_experiments.py --name {name} --resume",
        )
        raise line or exc  # noqa: B904 - the outage line replaces MLflow's retries' traceback


def _label(exp: str | None, mode: str) -> str:
    return f"{mode}-{exp}" if exp else "all"


def _measured_orig(recipe, cfg: ExperimentsConfig, probe, exp: str, state: str) -> BaseResult:
    """ORIG on one experiment's dev texts and test sets; kept in the job's state, so a resume reuses it."""
    uri = storage.join(state, f"orig-{exp}.json")
    if storage.exists(uri):
        d = json.loads(storage.read_bytes(uri))
        return BaseResult(d["dev"], TestReport(**d["test"]), d["label"])
    run_cfg = cfg.run_config(exp, "siamese")
    run_cfg.model.pooling = probe.model.pooling
    t0 = time.perf_counter()
    base = max(measure_bases(recipe, run_cfg), key=lambda b: b.dev)  # the run's pooling and the folder's own
    print(f"[orig-{exp}] measured in {time.perf_counter() - t0:.0f} s", flush=True)
    storage.write_bytes(
        uri, json.dumps({"dev": base.dev, "label": base.label, "test": asdict(base.test)}).encode()
    )
    return base


def _run_config(cfg: ExperimentsConfig, probe, exp: str | None, mode: str) -> MethodConfig:
    run_cfg = cfg.run_config(exp, "siamese" if mode == "all" else mode)
    run_cfg.model.pooling = probe.model.pooling
    return run_cfg


def _committed(state: str, exp: str | None, mode: str) -> bool:
    label = _label(exp, mode)
    return storage.exists(storage.join(state, f"{label}.json")) and storage.is_complete(
        storage.join(state, label)
    )


def _pairs(recipe, cfg: ExperimentsConfig, probe, exp: str | None, mode: str) -> str:
    t0 = time.perf_counter()
    shards = recipe.prepare_data(_run_config(cfg, probe, exp, mode), progress=False)
    print(f"[{_label(exp, mode)}] pairs {time.perf_counter() - t0:.0f} s", flush=True)
    return shards


def _trained(
    recipe,
    cfg: ExperimentsConfig,
    probe,
    exp: str | None,
    mode: str,
    name: str,
    state: str,
    models_dir: Path,
    shards: str | None,
) -> dict:
    """Train, export and test one model on its pairs (``shards``) - or, when the job's state holds it
    committed, fetch it back. Returns {"model_dir", "metrics", "headline", "history", "best_dev", "config"}."""
    label = _label(exp, mode)
    uri, result_uri, local = (
        storage.join(state, label),
        storage.join(state, f"{label}.json"),
        models_dir / label,
    )
    if _committed(state, exp, mode):
        if local.exists():
            shutil.rmtree(local)
        storage.get_dir(uri, local, require_complete=True)
        return {**json.loads(storage.read_bytes(result_uri)), "model_dir": local}
    run_cfg = _run_config(cfg, probe, exp, mode)
    t1 = time.perf_counter()
    outcome = fit(build_trainer(recipe, run_cfg, shards, name=f"{name}-{label}"), recipe, run_cfg)
    t2 = time.perf_counter()
    model_dir, report = export_and_test(recipe, run_cfg, outcome, local)
    print(
        f"[{label}] training (Ray Train, start to end) {t2 - t1:.0f} s, export + test "
        f"{time.perf_counter() - t2:.0f} s",
        flush=True,
    )  # where a run's time goes: training, against its export and test
    done = {
        "metrics": _sets_only(report.metrics),
        "headline": report.headline_value,
        "history": [{k: v for k, v in h.items() if isinstance(v, int | float)} for h in outcome.history],
        "best_dev": outcome.best_metrics.get(recipe.metric, float("nan")),
        "config": run_cfg.model_dump(mode="json"),
    }
    storage.put_dir(model_dir, uri)
    storage.write_bytes(
        result_uri, json.dumps(done).encode()
    )  # last: a model cut short is trained again on resume
    return {**done, "model_dir": model_dir}


def _publish(
    cfg: ExperimentsConfig, name: str, exp_id: str, origs: dict, trained: dict, out_root: Path, wall_s: float
) -> dict:
    """MLflow parent and child runs, registration, the report. Idempotent: runs are found by their tags
    (a child cut short is deleted and made again), versions by their key."""
    recipe = get_method("siamese")
    results: dict[str, dict[str, dict[str, float]]] = {}  # model → test set → metrics
    for exp in cfg.experiments:
        results.setdefault("orig", {}).update(_per_set(_sets_only(origs[exp].test.metrics)))
    registered, gates = {}, []
    parent = tracking.find_run(exp_id, {"sieve.sweep": name, "sieve.role": "experiments"})
    with mlflow.start_run(
        run_id=parent.info.run_id if parent else None, experiment_id=exp_id, run_name=None if parent else name
    ) as run:
        if parent is None:
            mlflow.set_tags({"sieve.sweep": name, "sieve.role": "experiments", "sieve.method": "siamese"})
            tracking.log_params({"experiments": cfg.model_dump(mode="json")})
        _child(exp_id, run.info.run_id, name, "orig", {}, results["orig"])
        for (exp, mode), done in trained.items():
            label = _label(exp, mode)
            results.setdefault(mode, {}).update(_per_set(done["metrics"]))
            reg_name = "siamese-all" if mode == "all" else f"siamese-{exp}"
            choice = pub.Choice(
                {
                    "trial": label,
                    "params": {},
                    "best_dev": done["best_dev"],
                    "checkpoint_path": "-",
                    "stopped_early": False,
                },
                done["best_dev"],
                origs[exp].dev,
                origs[exp].label,
                cfg.candidate_margin,
            )
            card = ""
            if (
                mode != "naive"
            ):  # Sieve's card in the folder before it is logged, and as the version's description
                test = TestReport(
                    "Δ cosine distance and same-class MAP",
                    {**done["metrics"], "delta_mean": done["headline"]},
                    "delta_mean",
                    "",
                )
                card = pub.model_card(
                    recipe=recipe,
                    cfg=recipe.config_cls.model_validate(done["config"]),
                    origin=f"experiments `{name}`, {label}",
                    params={"experiment": exp, "mode": mode},
                    test=test,
                    base=origs[exp],
                    choice=choice,
                    registered_name=reg_name,
                    champion=tracking.alias_tags(reg_name, "champion"),
                )
                write_model_card(done["model_dir"], card)
            model_uri = _child(
                exp_id,
                run.info.run_id,
                name,
                label,
                done["config"],
                _per_set(done["metrics"]),
                history=done["history"],
                model_dir=done["model_dir"] if mode != "naive" else None,
            )
            if mode == "naive":
                continue
            test_names = sorted({k.rpartition("_")[0] for k in done["metrics"]})
            reg = pub.register(
                model_uri,
                reg_name,
                choice,
                key=f"experiments:{name}:{label}",
                description=f"{name} {label}: Δ cos distance {done['headline'] * 100:.2f} (×100) on "
                f"{', '.join(test_names)}; ORIG {origs[exp].test.headline_value * 100:.2f}\n\n"
                + pub.mlflow_description(card),
                tags={
                    "experiments": name,
                    "test_metric": "delta_mean",
                    "test_score": f"{done['headline']:.6f}",
                    "base_test_score": f"{origs[exp].test.headline_value:.6f}",
                },
            )
            registered[reg["name"]] = reg["version"]
            line = pub.gate_line(choice, recipe.metric_label, reg)
            gates.append(line + ("" if reg["new"] else f" (published before: v{reg['version']} stands)"))
        report_dir = out_root / "reports" / name
        write_results(report_dir, name, cfg, results, registered, wall_s, gates)
        mlflow.log_artifacts(str(report_dir), "report")
        mlflow.log_metric("wall_s", wall_s)
    return {
        "name": name,
        "results": results,
        "registered": registered,
        "wall_s": wall_s,
        "gates": gates,
        "report": str(report_dir / "results.md"),
    }


def _orig_of_all(origs: dict) -> BaseResult:
    """ORIG for ALL, from the per-experiment measurements: ALL's dev Δ is the mean over the train
    sets' held-out parts, and its test sets are every experiment's."""
    metrics = {k: v for o in origs.values() for k, v in _sets_only(o.test.metrics).items()}
    metrics["delta_mean"] = float(np.mean([v for k, v in metrics.items() if k.endswith("_delta")]))
    test = TestReport("Δ cosine distance and same-class MAP", metrics, "delta_mean", "", {"siamese": metrics})
    label = next(iter(origs.values())).label
    return BaseResult(float(np.mean([o.dev for o in origs.values()])), test, label)


def _sets_only(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k != "delta_mean"}


def _per_set(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{"s140_delta": x, "s140_map": y}`` → ``{"s140": {"delta": x, "map": y}}``."""
    out: dict[str, dict[str, float]] = {}
    for k, v in metrics.items():
        s, _, m = k.rpartition("_")
        out.setdefault(s, {})[m] = v
    return out


def _child(exp_id, parent_id, name, label, params, per_set, *, history=(), model_dir=None) -> str | None:
    """One nested MLflow run; returns the logged model's URI (when ``model_dir`` is given). A finished run
    of this label (a resumed job's) is reused as it is; one cut short is deleted and made again."""
    tags = {"sieve.sweep": name, "sieve.trial": label, "sieve.role": "trial"}
    found = tracking.find_run(exp_id, tags)
    if found is not None:
        models = tracking.logged_models(found.info.run_id) if model_dir is not None else []
        if found.info.status == "FINISHED" and (model_dir is None or models):
            return f"models:/{models[0]}" if models else None
        MlflowClient().delete_run(found.info.run_id)
    with mlflow.start_run(experiment_id=exp_id, run_name=label, nested=True, parent_run_id=parent_id):
        mlflow.set_tags(tags)
        if params:
            tracking.log_params(params)
        for h in history:
            tracking.log_metrics(
                {k: v for k, v in h.items() if k not in ("step", "epoch") and isinstance(v, int | float)},
                step=int(h.get("step", 0)),
            )
        flat = {f"{s}_{m}": v for s, ms in per_set.items() for m, v in ms.items()}
        tracking.log_metrics(flat)
        if model_dir is not None:
            return tracking.log_sentence_encoder(model_dir, name="model").model_uri
        return None


def write_results(
    out_dir: Path,
    name: str,
    cfg: ExperimentsConfig,
    results: dict,
    registered: dict,
    wall_s: float,
    gates: list[str] | None = None,
) -> None:
    """results.md (table per metric; ORIG, measured in the same run, first), results.json and delta.png
    (grouped bars, like the paper's figures)."""
    models = [m for m in MODELS if m in results]
    rows = [(exp, t.name) for exp, e in cfg.experiments.items() for t in e.test]
    with atomic_dir(out_dir) as tmp:
        lines = [
            f"# Siamese adaptation experiments `{name}`",
            "",
            f"Wall time {wall_s / 60:.1f} min. Δ cosine distance ×100 (mean distance of different-class pairs "
            f"minus same-class pairs; higher = classes better separated) and same-class MAP ×100.",
            "",
        ]
        for metric, title in (("delta", "Δ cosine distance ×100"), ("map", "same-class MAP ×100")):
            lines += [
                f"## {title}",
                "",
                "| experiment | test set | " + " | ".join(m.upper() for m in models) + " |",
                "|---|---|" + "---:|" * len(models),
            ]
            for exp, test in rows:
                vals = [results[m].get(test, {}).get(metric) for m in models]
                cells = [f"{v * 100:.2f}" if v is not None else "–" for v in vals]
                lines.append(f"| {exp} | {test} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += (
            ["## Registered", ""]
            + [f"- {g}" for g in gates or []]
            + [f"- `{k}` version {v}" for k, v in registered.items() if not gates]
        )
        lines += ["", "![Δ cosine distance per test set](delta.png)", ""]
        (tmp / "results.md").write_text("\n".join(lines))
        (tmp / "results.json").write_text(
            json.dumps(
                {
                    "results": results,
                    "registered": registered,
                    "wall_s": wall_s,
                    "config": cfg.model_dump(mode="json"),
                },
                indent=2,
            )
        )
        fig = Figure(figsize=(1.8 + 1.6 * len(rows), 3.8))
        ax = fig.subplots()
        x = np.arange(len(rows))
        width = 0.8 / max(1, len(models))
        for i, m in enumerate(models):  # ORIG, the untouched model, is the first bar of every group
            bars = ax.bar(
                x + i * width,
                [results[m].get(t, {}).get("delta", np.nan) * 100 for _, t in rows],
                width,
                label=m.upper() + (" (untouched)" if m == "orig" else ""),
            )
            ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
        ax.set_xticks(x + width * (len(models) - 1) / 2, [f"{e}\n{t}" for e, t in rows], fontsize=8)
        ax.set_ylabel("Δ cosine distance ×100")
        ax.legend(fontsize=8)
        ax.set_title("Class separation by model")
        fig.tight_layout()
        fig.savefig(tmp / "delta.png", dpi=110)
