"""Evaluate an encoder on the STS tasks, with the pooling it was saved with (or the one you name).

    python jobs/evaluate.py --model default --tasks sts12,sts13,sts14,sts15,sts16,stsb,sickr --json OUT.json
    python jobs/evaluate.py --model PATH --pooling cls_before_pooler --sts-file my_pairs.tsv
    python jobs/evaluate.py --model models:/sifter-simcse@champion --log-to-run   # the registry's champion
    python jobs/evaluate.py --model outputs/models/mine --baseline default --sts-file my_pairs.tsv  # beside its base
    python jobs/evaluate.py --model outputs/models/mine --sts-file my_pairs.tsv --tasks stsb,sickr  # and two STS sets
    python jobs/evaluate.py --model outputs/models/mine --baseline default --beir my_beir_folder

``--pooling`` defaults to the model folder's own saved pooling (a sentence-transformers folder
records it; a plain transformers folder has none, and then ``mean`` is used). ``cls`` reads the
model's pooler layer and is refused when the folder has no pooler weights.

With ``--sts-file`` or ``--beir`` your own data alone is scored (seconds); ``--tasks`` adds STS sets. The
average (``avg``) is over the named STS tasks only: a file of yours is scored beside them, never in it.

``--baseline`` scores a second model - the one you started from - in the same call, on the same tasks, read
with the same pooling (and, when its folder saved another, read that way too: a baseline is never shown only
at its weaker reading); the table then gives the difference per task.

``--beir FOLDER`` scores your own retrieval data, a BEIR folder (``corpus.jsonl``, ``queries.jsonl``,
``qrels/test.tsv``; checked line by line before a model is loaded): nDCG@10, MRR@10, recall@1/5/10/100, MAP@100.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import _bootstrap
import mlflow

from orchestrator import storage, tracking
from orchestrator.drivers.cli import HelpFormatter
from orchestrator.errors import ConfigError
from orchestrator.evaluation import sts
from orchestrator.evaluation.beir import BeirEvaluator, read_beir
from orchestrator.evaluation.encode import POOLINGS, HFEncoder
from orchestrator.models import MLFLOW_SCHEMES, load_encoder, resolve_model_source, saved_pooling
from orchestrator.seed import seed_everything


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument(
        "--model",
        default="default",
        help="local folder, s3:// URI, models:/name@alias, runs:/id/path, or 'default'",
    )
    ap.add_argument(
        "--tracking-uri", help="MLflow tracking URI for models:/ and runs:/ (default: env, else ./mlruns)"
    )
    ap.add_argument(
        "--log-to-run",
        action="store_true",
        help="log the scores to the run that logged the model (models:/ or runs:/ sources)",
    )
    ap.add_argument(
        "--pooling", choices=POOLINGS, help="default: the model folder's saved pooling, else mean"
    )
    ap.add_argument(
        "--tasks",
        help=f"comma-separated STS tasks; '' for none (default: the seven, {','.join(sts.SEVEN_TASKS)} - or none "
        "when --sts-file or --beir names your own data)",
    )
    ap.add_argument(
        "--sts-file", action="append", default=[], help="extra TSV(s) with sentence1, sentence2, score"
    )
    ap.add_argument(
        "--beir",
        action="append",
        default=[],
        metavar="FOLDER",
        help="a BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv; local or s3://) scored as retrieval",
    )
    ap.add_argument(
        "--baseline",
        help="a second model (e.g. 'default', the one you started from) scored in the "
        "same call with the same pooling and tasks; the table shows the difference",
    )
    ap.add_argument("--json", help="write results here (local path or s3://)")
    ap.add_argument("--batch-size", type=int, default=64, help="sentences per forward pass")
    ap.add_argument("--max-length", type=int, default=128, help="tokens per sentence (longer ones are cut)")
    ap.add_argument("--seed", type=int, default=42, help="torch / numpy / python seed")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = ap.parse_args()
    for flag, value, low, high in (
        ("--batch-size", args.batch_size, 1, 1 << 16),
        ("--max-length", args.max_length, 1, 8192),
        ("--seed", args.seed, 0, 2**32 - 1),
    ):
        if not low <= value <= high:
            raise ConfigError(f"{flag} {value}: expected {low} to {high}")
    return args


def checked_tasks(args: argparse.Namespace) -> list[str]:
    """The tasks to score, once every input file, flag and the output path are checked: bad input fails before
    a model is loaded."""
    if args.tasks is None:  # your own files alone are scored in seconds; the STS suite only when asked
        args.tasks = "" if args.sts_file or args.beir else ",".join(sts.SEVEN_TASKS)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in sts.TASK_FILES]
    if unknown:
        raise ConfigError(
            f"--tasks: unknown task(s) {', '.join(unknown)} (known: {', '.join(sts.TASK_FILES)})"
        )
    if not tasks and not args.sts_file and not args.beir:
        raise ConfigError("--tasks is empty and no --sts-file or --beir given: nothing to evaluate")
    # Validate every input file and the output path before loading the model (fail fast on bad input).
    for f in args.sts_file:
        sts.read_sts_tsv(f)
    for folder in args.beir:
        read_beir(folder)
    for flag in ("model", "tracking_uri", "json", "baseline"):
        value = getattr(args, flag)
        if value is not None and not value.strip():
            raise ConfigError(f"--{flag.replace('_', '-')} is empty")
    if args.json and not storage.is_s3(args.json):
        out = Path(args.json)
        if out.is_dir():
            raise ConfigError(f"--json {args.json}: is a folder; give a file path (e.g. {out / 'sts.json'})")
        above = out.parent
        while not above.exists():  # the folders that are missing are made; one that is a file cannot be
            above = above.parent
        if not above.is_dir():
            raise ConfigError(f"--json {args.json}: {above} is a file, not a folder")
    return tasks


def main() -> int:
    args = parse_args()
    tasks = checked_tasks(args)
    seed_everything(args.seed)
    if args.model.startswith(MLFLOW_SCHEMES):
        tracking.setup(args.tracking_uri, "sieve")
    elif args.log_to_run:
        raise ConfigError("--log-to-run needs a models:/ or runs:/ model (the run that logged it)")
    pooling = args.pooling or saved_pooling(resolve_model_source(args.model)) or "mean"
    if args.baseline:  # resolved (and refused, if it is no model) before anything is scored
        own = saved_pooling(resolve_model_source(args.baseline))
    result = score(args, args.model, pooling, tasks)
    print(f"pooling: {pooling}" + ("" if args.pooling else " (the model's own)"))
    if result["tasks"]:
        print(sts.format_table(result))
    if result.get("retrieval"):
        print(retrieval_table(result))
    if args.baseline:
        readings = [pooling] + ([own] if own and own != pooling else [])
        result["baselines"] = [score(args, args.baseline, p, tasks) for p in readings]
        for b in result["baselines"]:
            print(f"\n{args.model} − baseline {args.baseline} read with {b['pooling']}, ×100:")
            if result["tasks"]:
                print(difference_table(result, b))
            if result.get("retrieval"):
                print(retrieval_table(result, b))
    record(args, result)
    return 0


def record(args: argparse.Namespace, result: dict) -> None:
    """The scores to MLflow (the active run; with ``--log-to-run``, the run that logged the model) and to
    ``--json``."""
    if mlflow.active_run() is not None:
        mlflow.log_metrics({**sts.flat_metrics(result), **retrieval_metrics(result)})
    if args.log_to_run:
        run_id = tracking.run_of(args.model)
        mlflow.MlflowClient().log_batch(
            run_id,
            metrics=[
                mlflow.entities.Metric(f"eval_{k}", v, 0, 0)
                for k, v in {**sts.flat_metrics(result, "sts_"), **retrieval_metrics(result)}.items()
            ],
        )
        print(f"logged to run {run_id}")
    if args.json:
        storage.write_bytes(args.json, json.dumps(result, indent=2).encode())
        print(f"wrote {args.json}")


def score(args, model_ref: str, pooling: str, tasks: list[str]) -> dict:
    model, tokenizer = load_encoder(
        model_ref, add_pooling_layer=pooling == "cls", require_pooler=pooling == "cls"
    )
    encoder = HFEncoder(
        model,
        tokenizer,
        pooling=pooling,
        batch_size=args.batch_size,
        max_length=args.max_length,
        progress=not args.no_progress,
    )
    result = {"model": model_ref, "pooling": pooling, "tasks": {}}
    if tasks or args.sts_file:
        result.update(sts.evaluate(encoder, tasks, extra_files=args.sts_file))
    if args.beir:
        result["retrieval"] = {
            name: BeirEvaluator(name, folder)(encoder) for name, folder in beir_tasks(args)
        }
    return result


def beir_tasks(args) -> list[tuple[str, str]]:
    """(task name, folder) per ``--beir``: ``beir_<folder name>``, numbered where two folders share a name."""
    names = [f"beir_{Path(f.rstrip('/')).name or 'data'}" for f in args.beir]
    return [
        (n if names.count(n) == 1 else f"{n}_{i + 1}", f) for i, (n, f) in enumerate(zip(names, args.beir))
    ]


def retrieval_metrics(result: dict) -> dict[str, float]:
    return {k: v for metrics in result.get("retrieval", {}).values() for k, v in metrics.items()}


def retrieval_table(result: dict, base: dict | None = None) -> str:
    """Every retrieval metric ×100 (beside the baseline's, with the difference, when one is given)."""
    ours = retrieval_metrics(result)
    if base is None:
        return "\n".join(
            ["| retrieval | ×100 |", "|---|---:|", *(f"| {k} | {v * 100:.2f} |" for k, v in ours.items())]
        )
    theirs = retrieval_metrics(base)
    rows = ["| retrieval | baseline | model | model − baseline |", "|---|---:|---:|---:|"]
    rows += [
        f"| {k} | {theirs[k] * 100:.2f} | {v * 100:.2f} | {(v - theirs[k]) * 100:+.2f} |"
        for k, v in ours.items()
    ]
    return "\n".join(rows)


def difference_table(result: dict, base: dict) -> str:
    """Spearman ``all`` per task (×100): the baseline, the model, the model − the baseline."""
    rows = ["| task | baseline | model | model − baseline |", "|---|---:|---:|---:|"]
    pairs = [
        (t, base["tasks"][t]["spearman"]["all"], r["spearman"]["all"]) for t, r in result["tasks"].items()
    ]
    if result.get("avg"):
        pairs.append(("**avg**", base["avg"]["spearman_all"], result["avg"]["spearman_all"]))
    rows += [f"| {t} | {b * 100:.2f} | {m * 100:.2f} | {(m - b) * 100:+.2f} |" for t, b, m in pairs]
    return "\n".join(rows)


if __name__ == "__main__":
    _bootstrap.run(main)
