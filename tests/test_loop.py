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

    def report(self, metrics, stepper=None, state=None):
        if stepper is None:  # a report without a checkpoint
            self.reports.append((metrics, None))
            return
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


COLLAPSE_TRAIN = {"batch_size": 2, "epochs": 1, "eval_steps": 2, "lr": 0.1, "lr_schedule": "constant"}
POINTS = torch.eye(4)  # four orthogonal inputs


def mean_cosine(m) -> torch.Tensor:
    """The mean pairwise cosine of the four inputs' embeddings (over the 12 ordered pairs)."""
    u = torch.nn.functional.normalize(m(POINTS), dim=-1)
    return ((u @ u.T).sum() - 4) / 12


def collapse_run(guard: dict | None) -> tuple[list[dict], float]:
    """(the loop's history, the untouched dev score) for a linear encoder on :data:`POINTS`: four healthy steps push the
    embeddings apart, then a planted loss pulls them together; dev = minus the mean cosine."""
    cfg = ContrastiveConfig.model_validate(
        {"train": {**COLLAPSE_TRAIN, **({"collapse_guard": guard} if guard else {})}}
    )
    torch.manual_seed(0)
    encoder = torch.nn.Linear(4, 4)
    stepper = common.make_stepper(encoder, cfg, rows_per_worker=40)
    with torch.no_grad():
        untouched = -mean_cosine(encoder).item()

    def loss_fn(batch, state):
        c = mean_cosine(stepper.model)
        loss = c if state["step"] < 4 else -c  # apart, then the planted collapse
        return loss, {"loss": loss.item()}

    history = loop.train_loop(
        cfg,
        stepper,
        rows_per_worker=40,
        loss_fn=loss_fn,
        dev_fn=lambda m: {"dev": -mean_cosine(m).item(), "u_cosine_mean": mean_cosine(m).item()},
        metric="dev",
        build_plain=lambda: None,
        batches=lambda epoch: ((epoch, i) for i in range(20)),
    )
    return history, untouched


@pytest.mark.parametrize("guard", [None, {"max_cosine": 0.9}, {"dev_margin": 0.1}])
def test_the_collapse_guard_stops_a_run_driven_together_and_keeps_no_checkpoint_of_it(
    tmp_path, monkeypatch, guard
):
    """Unguarded (the control) the planted collapse (:func:`collapse_run`) trains to its end with the embeddings
    collapsed; guarded by the cosine bound, or by a dev margin under the untouched model's dev (measured before
    the first step), it stops at the first evaluation past the bound with one line, that evaluation reports no
    checkpoint and is never the best, and the checkpoints it kept are all from before the fall."""
    ray = Ray(tmp_path)
    monkeypatch.setattr(loop, "report", ray.report)
    monkeypatch.setattr(loop, "resumed_checkpoint", ray.resumed)
    history, untouched = collapse_run(guard)
    cos = [h["u_cosine_mean"] for h in history]
    if guard is None:
        assert history[-1]["step"] == 20 and cos[-1] > 0.9 and "collapse_guard" not in ray.reports[-1][0]
        return
    last, folder = ray.reports[-1]
    assert (
        history[-1]["step"] < 20
        and folder is None
        and last["collapse_guard"].startswith("collapse guard: stopped")
    )
    if "max_cosine" in guard:
        assert cos[-1] > 0.9 and all(c <= 0.9 for c in cos[:-1])
    else:
        assert f"{untouched:.4f}" in last["collapse_guard"]  # the dev of the model before its first step
        assert history[-1]["dev"] < untouched - 0.1 and all(h["dev"] >= untouched - 0.1 for h in history[:-1])
    assert all(f is not None for _, f in ray.reports[:-1]) and len(ray.reports) >= 3  # the healthy ones kept
    assert history[-1]["best_dev"] == max(h["dev"] for h in history[:-1])


def _guarded_rank(rank: int, out_dir: str, init: str) -> None:
    """One of two gloo ranks training the planted collapse under DDP with the cosine guard; rank 0 alone reads
    the dev score (as in a real run), so rank 1 learns of the stop only from rank 0."""
    import os
    from pathlib import Path

    import ray.train.torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
    ray.train.torch.prepare_model = torch.nn.parallel.DistributedDataParallel  # no Ray Train context here
    loop.report = lambda metrics, stepper=None, state=None: None
    loop.resumed_checkpoint = Ray(Path(out_dir)).resumed
    history, _ = collapse_run({"max_cosine": 0.9})
    Path(out_dir, f"rank{rank}").write_text(str(history[-1]["step"]))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_collapse_guard_stops_every_worker_at_the_same_step(tmp_path):
    """Two workers under DDP: the one that reads the dev score decides, and both stop at that evaluation (a
    worker that trained on alone would wait for its partner's gradients for ever)."""
    import torch.multiprocessing as mp

    mp.spawn(_guarded_rank, args=(str(tmp_path), str(tmp_path / "init")), nprocs=2, join=True)
    steps = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    assert steps[0] == steps[1] < 20
