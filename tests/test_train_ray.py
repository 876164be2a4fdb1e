"""SimCSE / SIFTER-SimCSE under Ray Train on a real local cluster: DDP and DeepSpeed ZeRO-3
(CPU, gloo), checkpoints, a crash-and-resume, export, and the STS table."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.drivers.registry import get_method
from orchestrator.drivers.train import build_trainer, export_and_test, fit
from trainers.sifter_simcse import ContrastiveConfig

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def tiny_cfg(model_dir, tmp_path, **kw) -> ContrastiveConfig:
    base = {
        "model": {"name_or_path": str(model_dir), "max_length": 16, "pooling": "cls"},
        "train": {"lr": 1e-4, "batch_size": 8, "max_steps": 6, "eval_steps": 2},
        "scaling": {"num_workers": 2, "cpus_per_worker": 1},
        "eval": {"batch_size": 256, "max_length": 32},
        "run": {"storage": str(tmp_path / "store"), "max_failures": 1, "num_to_keep": 2},
    }
    for k, v in kw.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return ContrastiveConfig.model_validate(base)


def test_ddp_run_checkpoints_export_and_sts(tiny_bert_dir, tiny_shards, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    method = get_method("sifter_simcse")
    cfg = tiny_cfg(tiny_bert_dir, tmp_path)
    outcome = fit(build_trainer(method, cfg, tiny_shards, name="ddp"), method, cfg)
    steps = [int(r["step"]) for r in outcome.history]
    assert steps == [2, 4, 6]
    assert len({r["stsb_dev_spearman"] for r in outcome.history}) == 3  # every evaluation saw a moved model
    assert outcome.best_metrics["stsb_dev_spearman"] == max(r["stsb_dev_spearman"] for r in outcome.history)
    # the step profile travels with every report: its parts add up to no more than the loop's time
    last = outcome.history[-1]
    parts = [
        last[k] for k in ("time_ingest_s", "time_forward_s", "time_backward_step_s", "time_eval_report_s")
    ]
    assert (
        all(p >= 0 for p in parts) and parts[1] > 0 and parts[2] > 0 and parts[3] > 0
    )  # 2 evals before the last
    assert sum(parts) <= last["train_s"] + 1e-6
    out, test = export_and_test(method, cfg, outcome, tmp_path / "model", tasks=["stsb"])
    assert test.detail["sts"]["tasks"]["stsb"]["n"] == 1379 and test.headline == "sts_avg_spearman_all"
    assert exported_dev(out, cfg) == pytest.approx(outcome.best_metrics["stsb_dev_spearman"], abs=1e-6)
    assert AutoModel.from_pretrained(out).config.hidden_size == 32
    st = SentenceTransformer(str(out), device="cpu")
    assert st.encode(["a test sentence"]).shape == (1, 32)
    assert json.loads((out / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"
    # the same run with worker 1 killed at step 5 resumes from the step-4 checkpoint and ends with the
    # uninterrupted run's dev score (within 0.001 points ×100) and last training loss (1e-6): the model, the
    # optimiser and every RNG state travel in the checkpoint. The careless resume that shows this bound bites is
    # the ZeRO-3 test's (the RNG states are saved and restored by one path for both engines)
    crashed = fit_at_once(
        [crash_trainer(method, cfg, tiny_shards, tmp_path, "ddp-crash", monkeypatch)], method, cfg
    )[0]
    assert_resumed_exactly(crashed, outcome)


def assert_resumed_exactly(resumed, clean, careless=None):
    """The resumed run's last dev score and training loss are the uninterrupted run's; a careless resume
    (given) ends with another loss. What tells them apart is the last step's loss (steps 5-6 ran after the
    restart, with dropout masks from the restored - or not - RNG states): the tiny model's dev Spearman moves
    too little for that (a careless resume moved it 0.008 points in one run, 0.00015 in another)."""
    dev, loss = clean.history[-1]["stsb_dev_spearman"], clean.history[-1]["loss"]
    exact = abs(resumed.history[-1]["stsb_dev_spearman"] - dev) * 100
    exact_loss = abs(resumed.history[-1]["loss"] - loss)
    sloppy_loss = abs(careless.history[-1]["loss"] - loss) if careless else None
    assert exact < 0.001 and exact_loss < 1e-6 and (careless is None or sloppy_loss > 1e-3), (
        exact,
        exact_loss,
        sloppy_loss,
    )


def exported_dev(folder: Path, cfg) -> float:
    """STS-B dev of an exported folder, scored as the trainer scores its checkpoints: what a user loads is
    what was selected."""
    from orchestrator.models import load_encoder
    from trainers.protocol import STS_DEV

    encoder, tokenizer = load_encoder(str(folder), add_pooling_layer=False)
    return STS_DEV.dev_score(encoder, tokenizer, cfg)


def crash_trainer(method, cfg, shards, tmp_path, name, monkeypatch, **env):
    """A trainer whose worker 1 crashes once at step 5 (the test hooks travel in the workers' runtime env,
    read when the trainer is built); ``fit_at_once`` checks the crash happened and the run resumed."""
    marker = tmp_path / f"{name}-failed-once"
    hooks = {"SIEVE_FAIL_AT_STEP": "5", "SIEVE_FAIL_RANK": "1", "SIEVE_FAIL_MARKER": str(marker), **env}
    for k, v in hooks.items():
        monkeypatch.setenv(k, v)
    try:
        trainer = build_trainer(method, cfg, shards, name=name)
    finally:
        for k in hooks:
            monkeypatch.delenv(k)
    trainer.crash_marker = marker
    return trainer


def fit_at_once(trainers, method, cfg):
    """Train several runs at the same time (threads of this driver, as the Siamese job does)."""
    with ThreadPoolExecutor(len(trainers)) as pool:
        outcomes = list(pool.map(lambda t: fit(t, method, cfg), trainers))
    for t, outcome in zip(trainers, outcomes):
        if (marker := getattr(t, "crash_marker", None)) is not None:
            assert marker.exists()  # worker 1 really crashed at step 5
            last = outcome.history[-1]
            assert int(last["step"]) == 6 and int(last["restarts"]) == 1  # resumed from the step-4 checkpoint
    return outcomes


def test_deepspeed_zero3_resumes_exactly_and_a_careless_resume_does_not(
    tiny_bert_dir, tiny_shards, tmp_path, monkeypatch
):
    """Stage 3, the one whose checkpoint is sharded parameters (our save/load path is the same DeepSpeed engine
    call for 2 and 3): a crash at step 5 resumed from the step-4 checkpoint ends where the uninterrupted run ends
    - the DDP test's bound on the dev score and the last loss - and holds the same weights; the same crash
    resumed without restoring the RNG states (the negative control) ends with another loss."""
    method = get_method("sifter_simcse")
    cfg = tiny_cfg(tiny_bert_dir, tmp_path, deepspeed={"stage": 3})
    faithful = crash_trainer(method, cfg, tiny_shards, tmp_path, "zero3", monkeypatch)
    careless = crash_trainer(
        method, cfg, tiny_shards, tmp_path, "zero3-no-rng", monkeypatch, SIEVE_SKIP_RNG_RESTORE="1"
    )
    outcome, sloppy = fit_at_once([faithful, careless], method, cfg)
    with outcome.best_checkpoint.as_directory() as d:
        assert (Path(d) / "ds").is_dir()
    out, test = export_and_test(method, cfg, outcome, tmp_path / "model", tasks=["stsb"])
    assert (out / "model.safetensors").is_file() and test.headline == "sts_avg_spearman_all"
    # the merged ZeRO-3 shards are the weights rank 0 evaluated (gathered into a plain copy) at that step
    assert exported_dev(out, cfg) == pytest.approx(outcome.best_metrics["stsb_dev_spearman"], abs=1e-6)
    clean = fit(build_trainer(method, cfg, tiny_shards, name="zero3-clean"), method, cfg)
    assert_resumed_exactly(outcome, clean, careless=sloppy)
    # the weights: the resumed run's chosen checkpoint (the same step), merged from its shards, is the
    # uninterrupted run's
    from trainers.checkpoint import load_module_state

    assert outcome.best_metrics["step"] == clean.best_metrics["step"]
    with outcome.best_checkpoint.as_directory() as a, clean.best_checkpoint.as_directory() as b:
        mine, theirs = load_module_state(Path(a)), load_module_state(Path(b))
    assert mine.keys() == theirs.keys() and max((mine[k] - theirs[k]).abs().max().item() for k in mine) < 1e-6


class StandInTrainer:
    """A trainer whose ``fit()`` raises the given errors in turn, then returns a result. A stand-in: a node lost
    while Ray Train starts its workers cannot be provoked on demand (it was seen on the two-node cluster, the node
    killed as a trial's workers came up: ``ControllerError`` around an ``ActorUnavailableError``)."""

    class Result:
        checkpoint = "ckpt"
        best_checkpoints: list = []
        return_value = [{"step": 2}]

        def get_best_checkpoint(self, metric, mode):
            return self.checkpoint

    def __init__(self, *errors):
        self.errors, self.calls = list(errors), 0

    def fit(self):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.Result()


def test_a_run_whose_controller_lost_a_node_is_started_again_and_no_other_error_is(tmp_path, capsys):
    from ray.exceptions import ActorUnavailableError
    from ray.train import ControllerError

    method = get_method("sifter_simcse")
    cfg = tiny_cfg("unused", tmp_path, run={"max_failures": 2})

    def lost():
        return ControllerError(
            ActorUnavailableError("The actor is temporarily unavailable: RpcError: Socket closed", None)
        )

    trainer = StandInTrainer(lost(), lost())  # within run.max_failures: started again each time, then trained
    assert fit(trainer, method, cfg).history == [{"step": 2}] and trainer.calls == 3
    assert capsys.readouterr().out.count("started again from the run's last checkpoint") == 2

    trainer = StandInTrainer(lost(), lost(), lost())  # past it: the third failure is the run's error
    with pytest.raises(ControllerError):
        fit(trainer, method, cfg)
    assert trainer.calls == 3

    trainer = StandInTrainer(
        ControllerError(ValueError("a bug in the controller's input"))
    )  # not a lost node
    with pytest.raises(ControllerError, match="a bug"):
        fit(trainer, method, cfg)
    assert trainer.calls == 1
