"""Step 3 of ``jobs/compare.py``: a finished comparison published - every trial as a nested MLflow run, the
arms' means and paired differences on the parent run, the leaderboard (Markdown, JSON, plot) as its artifacts
and UI description, and, when the registration gate passes, the winner's representative run (the seed nearest
its arm's mean) exported, carded beside the base and the champion, and registered once."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import mlflow

from orchestrator import tracking
from orchestrator.config import config_hash
from orchestrator.drivers.compare_plan import ComparePlan, seeded
from orchestrator.drivers.train import Outcome, checkpoint_at, export_and_test, export_dir
from orchestrator.evaluation.suite import TestReport
from orchestrator.export import write_model_card
from orchestrator.results import leaderboard as lb
from orchestrator.results import publish as pub
from orchestrator.spec import BaseResult
from trainers.recipe import Recipe


@dataclass
class CompareResult:
    rows: list[dict]  # every trial, with its arm, seed and test metrics
    board: dict
    wall_s: float


def publish(plan: ComparePlan, result: CompareResult, parent_id: str, out: str | None = None) -> dict:
    board = result.board
    for name, (recipe, _) in plan.arms.items():
        pub.log_trials(
            plan.exp_id, parent_id, plan.name, [r for r in result.rows if r["arm"] == name], recipe.metric
        )
    h = board["headline"]
    metrics = {}
    for r in board["rows"]:
        metrics[f"{r['arm']}_{h}_mean"] = r["mean"][h]
        for side in ("vs_base", "vs_reference"):
            if r[side] is not None:
                metrics.update({f"{r['arm']}_{side}_{k}": r[side][k] for k in ("mean", "low", "high")})
                if (adj := r[side].get("adjusted")) is not None:
                    metrics.update({f"{r['arm']}_{side}_holm_{k}": adj[k] for k in ("low", "high", "p")})
    tracking.log_metrics({k: v for k, v in metrics.items() if v is not None and math.isfinite(v)})
    md = lb.markdown(board)
    report_dir = Path("outputs") / "reports" / plan.name
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "leaderboard.md").write_text(f"# Comparison `{plan.name}`\n\n{md}\n")
    (report_dir / "leaderboard.json").write_text(lb.dumps(board))
    lb.plot(board, report_dir / "leaderboard.png")
    registered = register(plan, result, parent_id) if plan.job.registration else None
    gate = lb.gate_text(lb.winner(board, plan.job.registration.arm), h) if plan.job.registration else None
    if registered:
        gate += f" → registered {registered['name']} v{registered['version']} @{registered['alias']}"
    mlflow.log_artifacts(str(report_dir), "leaderboard")
    mlflow.log_metric("wall_s", result.wall_s)
    mlflow.set_tag(
        "mlflow.note.content", (f"{gate}\n\n" if gate else "") + md
    )  # the parent run's UI description
    if out:
        write_out(Path(out), plan, board, md, result.wall_s)
    return {
        "comparison": plan.name,
        "trials": len(result.rows),
        "failed": [r["trial"] for r in result.rows if not r["test"]],
        "ranked": [r["arm"] for r in board["rows"]],
        "report": str(report_dir / "leaderboard.md"),
        "wall_s": round(result.wall_s, 1),
        "registered": registered,
        "gate": gate,
        "leaderboard": md,
    }


def register(plan: ComparePlan, result: CompareResult, parent_id: str) -> dict | None:
    """The winner's representative run (the seed closest to its arm's mean) registered when the gate passes;
    idempotent (a resumed comparison registers nothing twice)."""
    row = lb.winner(result.board, plan.job.registration.arm)
    if not row["gate"]:
        return None
    h = result.board["headline"]
    recipe, base = plan.arms[row["arm"]]
    runs = [r for r in result.rows if r["arm"] == row["arm"] and r["test"]]
    rep = min(runs, key=lambda r: abs(r["test"][h] - row["mean"][h]))
    cfg = seeded(base, rep["seed"])
    reg_name = plan.job.registration.name or cfg.tracking.registry_model_name or recipe.name.replace("_", "-")
    tags = {
        "compare": plan.name,
        "arm": row["arm"],
        "method": plan.method_label(row["arm"]),  # a start stage's method first (tsdae → sbert)
        "seed": str(rep["seed"]),
        "run_id": parent_id,
        "config_hash": config_hash(cfg),
        "test_metric": h,
        "test_score": f"{rep['test'][h]:.6f}",
        "gate_low": f"{(row['vs_base'].get('adjusted') or row['vs_base'])['low']:.6f}",  # what the gate read
    }
    version = tracking.find_version(reg_name, {"compare": plan.name})
    if version is None:
        model_dir = export_dir(cfg, plan.name)
        outcome = Outcome(checkpoint_at(rep["checkpoint_path"]), rep["best"], rep["history"])
        export_and_test(
            recipe,
            cfg,
            outcome,
            model_dir,  # tested in its trial: not measured again
            tested=TestReport("test (measured in its trial)", rep["test"], rep["headline"], "", {}),
        )
        card = winner_card(
            recipe,
            cfg,
            plan.name,
            result.board,
            row,
            rep,
            reg_name,
            champion=tracking.alias_tags(reg_name, "champion"),
        )
        write_model_card(model_dir, card)
        info = recipe.log_model(model_dir, name="winner_model")
        desc = (
            f"comparison {plan.name}: {lb.gate_text(row, h)}\n\n{pub.mlflow_description(card)}\n\n"
            f"## The comparison\n\n{lb.markdown(result.board)}"
        )
        version = tracking.register(
            info.model_uri, reg_name, alias=plan.job.registration.alias, description=desc[:5000], tags=tags
        )
    return {
        "name": reg_name,
        "version": version,
        "alias": plan.job.registration.alias,
        "arm": row["arm"],
        "seed": rep["seed"],
    }


def winner_card(
    recipe: type[Recipe],
    cfg,
    name: str,
    board: dict,
    row: dict,
    rep: dict,
    reg_name: str,
    champion: dict | None,
) -> str:
    """Sieve's card (:func:`publish.model_card`) for the run of arm ``row`` registered from comparison ``name``:
    its test figures beside the base read the arm's way (this comparison's measure) and the champion's."""
    h = board["headline"]
    b = board["bases"].get(row["pooling"])
    base = BaseResult(b["dev"], TestReport(b["label"], b["test"], h, ""), b["label"]) if b else None
    mean_dev = row.get("dev_mean")  # None: no run of the arm had a dev score (TSDAE's protocol)
    scored = b is not None and mean_dev is not None and b.get("dev") is not None
    return pub.model_card(
        recipe=recipe,
        cfg=cfg,
        origin=f"comparison `{name}`, arm `{row['arm']}`, seed {rep['seed']} (the run "
        "nearest its arm's mean)",
        params={"arm": row["arm"], "seed": rep["seed"]},
        test=TestReport("test (measured in its trial)", rep["test"], h, ""),
        base=base,
        choice=pub.Choice(
            rep, mean_dev if scored else math.nan, b["dev"] if scored else None, b["label"] if b else "", 0.0
        ),
        registered_name=reg_name,
        champion=champion,
        steps=pub.trained_steps(rep.get("history", [])),
    )


def write_out(md_path: Path, plan: ComparePlan, board: dict, md: str, wall_s: float) -> None:
    md_path.parent.mkdir(parents=True, exist_ok=True)
    command = "python " + " ".join(["jobs/compare.py", *sys.argv[1:]])
    md_path.write_text(
        f"# Comparison `{plan.name}`\n\nCommand: `{command}`. Wall time {wall_s / 60:.1f} min on "
        f"{os.cpu_count()} cores.\n\n{md}\n"
    )
    md_path.with_suffix(".json").write_text(
        lb.dumps(
            {
                **board,
                "name": plan.name,
                "command": command,
                "wall_s": wall_s,
                "job": plan.job.model_dump(mode="json"),
            }
        )
    )
    lb.plot(board, md_path.with_suffix(".png"))
