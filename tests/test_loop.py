"""The shared training loop (``trainers/loop.py``) on one process: when it evaluates, what every report carries,
and a restart that skips the batches its checkpoint already trained and ends where an uninterrupted run ends.

Ray Train's two calls are stood in for here - ``ray.train.report`` keeps the reported metrics and writes the
checkpoint with the real ``Stepper.save`` into a folder; ``get_checkpoint`` hands the last folder back - so that
the loop's schedule is tested in seconds; the real calls, a crash and a resume run in ``tests/test_train_ray.py``."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from trainers import common, loop
from trainers.sifter_simcse import ContrastiveConfig

X = torch.linspace(-1, 1, 24).reshape(12, 2)
Y = X @ torch.tensor([[2.0], [-1.0]])


class Ray:
    """Stands in for Ray Train: the reports in order, each checkpoint saved by the stepper in its own folder."""

    def __init__(self, root, resume_from=None):
        self.root, self.reports, self.resume_from = root, [], resume_from

    def report(self, metrics, stepper, state):
        folder = self.root / f"ckpt-{len(self.reports)}"
        stepper.save(folder, state)
        self.reports.append((metrics, folder))

    @contextmanager
    def resumed(self):
        yield self.resume_from


def run(
    tmp_path,
    monkeypatch,
    *,
    epochs=2,
    batches_per_epoch=(5, 5),
    eval_steps=3,
    resume=None,
    seen=None,
    crash_before=None,
    nan_at=None,
    ray=None,
    made=None,
):
    cfg = ContrastiveConfig.model_validate(
        {"train": {"batch_size": 2, "epochs": epochs, "eval_steps": eval_steps, "lr": 0.05}}
    )
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    if made is not None:
        made.append(module)
    stepper = common.make_stepper(module, cfg, rows_per_worker=10)
    ray = ray or Ray(tmp_path, resume)
    monkeypatch.setattr(loop, "report", ray.report)
    monkeypatch.setattr(loop, "resumed_checkpoint", ray.resumed)

    def batches(epoch):
        for i in range(batches_per_epoch[epoch]):
            yield (epoch, i)

    def loss_fn(batch, state):
        epoch, i = batch
        if state["step"] + 1 == crash_before:
            raise RuntimeError("the worker died")
        (seen if seen is not None else []).append(batch)
        x, y = X[2 * i : 2 * i + 2], Y[2 * i : 2 * i + 2]
        loss = ((stepper.model(x) - y) ** 2).mean()
        if state["step"] + 1 == nan_at:  # what a far too large learning rate comes to
            loss = loss * float("nan")
        return loss, {"loss": loss.item()}

    def dev(m):
        with torch.no_grad():
            return -((m(X) - Y) ** 2).mean().item()

    history = loop.train_loop(
        cfg,
        stepper,
        rows_per_worker=10,
        loss_fn=loss_fn,
        dev_fn=dev,
        metric="dev",
        build_plain=lambda: None,
        batches=batches,
    )
    return history, ray, module


def test_evaluates_every_eval_steps_and_at_the_last_step(tmp_path, monkeypatch):
    history, ray, _ = run(tmp_path, monkeypatch)
    assert [h["step"] for h in history] == [
        3,
        6,
        9,
        10,
    ]  # 2 epochs x 5 batches, eval every 3, and the last step
    assert [m["step"] for m, _ in ray.reports] == [3, 6, 9, 10] and [h["epoch"] for h in history] == [
        0,
        1,
        1,
        1,
    ]
    last = history[-1]
    assert last["best_dev"] == max(h["dev"] for h in history) and last["restarts"] == 0
    for key in (
        "loss",
        "lr",
        "train_s",
        "time_setup_s",
        "time_ingest_s",
        "time_ingest_first_s",
        "time_forward_s",
        "time_backward_step_s",
        "time_eval_report_s",
    ):
        assert last[key] >= 0, key
    assert (
        last["time_eval_report_s"] > 0
    )  # three evaluations and reports happened before the last step's logs
    assert history[-1]["dev"] > history[0]["dev"]  # it trains: the dev loss falls


def test_data_that_ends_early_is_evaluated_once_more_at_its_end(tmp_path, monkeypatch):
    """Planned: 5 steps; the shard gives 4 batches. The last partial interval (step 4) is evaluated at the
    epoch's end, once."""
    history, _, _ = run(tmp_path, monkeypatch, epochs=1, batches_per_epoch=(4,))
    assert [h["step"] for h in history] == [3, 4]


def test_a_restart_skips_the_trained_batches_and_ends_where_an_uninterrupted_run_ends(tmp_path, monkeypatch):
    seen_clean = []
    clean, _, clean_module = run(tmp_path / "clean", monkeypatch, seen=seen_clean)
    first = Ray(tmp_path / "first")
    with pytest.raises(RuntimeError, match="the worker died"):  # after step 6's report and checkpoint
        run(tmp_path / "first", monkeypatch, crash_before=7, ray=first)
    folder = first.reports[-1][1]
    assert first.reports[-1][0]["step"] == 6
    seen = []
    resumed, _, module = run(tmp_path / "again", monkeypatch, resume=folder, seen=seen)
    assert (
        seen[0] == (1, 1) and seen == seen_clean[6:]
    )  # step 7 is epoch 1's second batch: the first is skipped
    assert [h["step"] for h in resumed] == [3, 6, 9, 10] and resumed[-1][
        "restarts"
    ] == 1  # history came along
    assert resumed[-1]["dev"] == pytest.approx(clean[-1]["dev"], abs=1e-6)
    assert torch.allclose(module.weight, clean_module.weight, atol=1e-6)


def test_a_nan_loss_stops_training_before_its_step_and_names_it(tmp_path, monkeypatch):
    from orchestrator.errors import TrainingDiverged

    ray = Ray(tmp_path)
    with pytest.raises(
        TrainingDiverged, match=r"the loss is nan at step 5 \(train.lr 0.05\): training stops"
    ):
        run(tmp_path, monkeypatch, nan_at=5, ray=ray, made=(made := []))
    assert [m["step"] for m, _ in ray.reports] == [3]  # the evaluations before it, nothing after
    assert all(torch.isfinite(p).all() for p in made[0].parameters())  # the NaN step was never taken
