"""The training loop every recipe shares, and the callbacks that hang off it.

The loop itself only resumes, steps and counts: each batch's loss, the optimiser step, ``step += 1``. Everything
else is a :class:`Callback`, called in list order at four points of a step - ``on_batch`` (a batch arrived),
``on_forward`` (its loss is computed), ``on_step`` (the optimiser stepped; callbacks add to the step's ``logs``),
``after_step`` (every ``on_step`` has run) - and at the end of an epoch and of training:

- :class:`Timing`: where the worker's time goes (ingest, forward, backward + step, what follows a step), with
  every report; ``bench/train_throughput.py`` reads them.
- :class:`LiveLog`: the step's losses to the driver's MLflow run every ``log_steps``, with samples per second.
- :class:`Evaluation`: every ``eval_steps`` (and at the end) the dev score on rank 0, then a Ray Train report
  with a checkpoint; the reports' list travels in the checkpoint state, so it survives a restart.
  With ``train.collapse_guard`` set it also measures the untouched model's dev before the first step, and stops
  the run at an evaluation that falls below it by the margin or whose embeddings' cosine passes the bound.
- :class:`FaultInjection`: installed only when a test sets a ``SIEVE_`` hook (a crash or a hold at a step).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from orchestrator.errors import TrainingDiverged
from trainers import common
from trainers.common import autocast, rank, world_size
from trainers.fault_injection import hooks_set, maybe_inject_failure


class Callback:
    """A no-op at every point of the loop: a callback overrides the points it needs."""

    def on_batch(self, state: dict) -> None: ...

    def on_forward(self, state: dict) -> None: ...

    def on_step(self, state: dict, logs: dict) -> None: ...

    def after_step(self, state: dict, logs: dict) -> None: ...

    def on_epoch_end(self, state: dict, logs: dict) -> None: ...

    def on_end(self, state: dict, logs: dict) -> None: ...


def train_loop(
    cfg, stepper, *, rows_per_worker: int, loss_fn, dev_fn, build_plain, metric: str, batches
) -> list[dict]:
    """Train ``cfg.train`` steps/epochs from the last checkpoint, if any; returns every evaluation's metrics.

    ``loss_fn(batch, state) -> (loss, logs)``: the method's loss on one batch (``state`` has ``step`` and
    ``epoch``, e.g. to seed per-epoch noise). ``dev_fn(module)``: the dev score ``metric`` (a float), or a dict
    of dev metrics that includes ``metric`` - run on rank 0 only, higher is better. ``build_plain()``: a fresh
    module for ZeRO-3 evaluation. ``batches(epoch)``: an iterator of batches (:func:`trainers.common.setup_worker`).
    """
    steps_per_epoch = max(1, rows_per_worker // cfg.train.batch_size)
    total_steps = cfg.train.planned_steps(rows_per_worker)
    state = {"step": 0, "epoch": 0, "best_dev": -math.inf, "restarts": 0, "history": []}
    with resumed_checkpoint() as ckpt_dir:
        if ckpt_dir is not None:
            state = stepper.load(ckpt_dir)
            state["restarts"] = state.get("restarts", 0) + 1
    live = live_run() if rank() == 0 else None  # the MLflow run the driver made for this training, if any
    callbacks = [
        Timing(stepper),
        *([FaultInjection()] if hooks_set() else []),
        LiveLog(live, cfg, state["step"]),
        Evaluation(cfg, stepper, live, dev_fn, build_plain, metric, total_steps),
    ]
    stepper.module.train()
    logs: dict = {}
    skip = state["step"] - state["epoch"] * steps_per_epoch  # batches of this epoch trained before a restart
    while state["step"] < total_steps and state["epoch"] < cfg.train.epochs and not state.get("stopped"):
        for batch in batches(state["epoch"]):
            if skip > 0:
                skip -= 1
                continue
            for c in callbacks:
                c.on_batch(state)
            with autocast(cfg):
                loss, logs = loss_fn(batch, state)
            stop_if_diverged(cfg, state, logs)
            for c in callbacks:
                c.on_forward(state)
            stepper.step(loss)
            state["step"] += 1
            for c in callbacks:
                c.on_step(state, logs)
            for c in callbacks:
                c.after_step(state, logs)
            if state["step"] >= total_steps or state.get("stopped"):
                break
        else:  # the epoch's data ran out
            state["epoch"] += 1
            skip = 0
            for c in callbacks:
                c.on_epoch_end(state, logs)
    for c in callbacks:
        c.on_end(state, logs)
    return state["history"]


# ---------------------------------------------------------------- the callbacks
class Timing(Callback):
    """Seconds spent, summed over the run and added to every step's logs: waiting for the next batch (of which
    the first batch: the ingest's start-up), the loss (tokenize + forward), backward + step (DDP's all-reduce),
    and what follows a step (live logging, evaluation, report, checkpoint); ``train_s`` since the loop began,
    ``time_setup_s`` before it (the model built, the checkpoint resumed)."""

    def __init__(self, stepper):
        self.stepper = stepper
        self.start = self.mark = time.perf_counter()
        self.setup_s = self.start - common.WORKER_START[0] if common.WORKER_START else 0.0
        self.spent = dict.fromkeys(
            ("time_ingest_s", "time_forward_s", "time_backward_step_s", "time_eval_report_s"), 0.0
        )

    def _lap(self, key: str) -> float:
        now = time.perf_counter()
        lap, self.mark = now - self.mark, now
        self.spent[key] += lap
        return lap

    def on_batch(self, state):
        self.spent.setdefault("time_ingest_first_s", self._lap("time_ingest_s"))

    def on_forward(self, state):
        self._lap("time_forward_s")

    def on_step(self, state, logs):
        self._lap("time_backward_step_s")
        logs.update(
            lr=self.stepper.optimizer.param_groups[0]["lr"],
            train_s=self.mark - self.start,
            time_setup_s=self.setup_s,
            **self.spent,
        )

    def after_step(self, state, logs):
        self._lap("time_eval_report_s")


class FaultInjection(Callback):
    """The tests' crash / hold / delay before a step (``trainers/fault_injection.py``)."""

    def on_batch(self, state):
        maybe_inject_failure(state["step"] + 1)


class LiveLog(Callback):
    """The step's logs to the driver's MLflow run every ``log_steps``, with samples per second over the window."""

    def __init__(self, live, cfg, step: int):
        self.live, self.every = live, cfg.train.log_steps
        self.rows_per_step = cfg.train.batch_size * world_size()
        self.window_t, self.window_step = time.perf_counter(), step

    def on_step(self, state, logs):
        if self.live is None or state["step"] % self.every:
            return
        rate = (
            (state["step"] - self.window_step)
            * self.rows_per_step
            / max(time.perf_counter() - self.window_t, 1e-9)
        )
        self.live.log({**logs, "samples_per_s": rate}, state["step"])
        self.window_t, self.window_step = time.perf_counter(), state["step"]

    def on_end(self, state, logs):
        if self.live is not None:
            self.live.close()  # what never reached MLflow is in the history the driver logs at the end


class Evaluation(Callback):
    """Every ``eval_steps``, at the last step, and after the last epoch's partial interval: the dev score
    (rank 0, on every core the workers have) and a report with a checkpoint (every rank writes its share)."""

    def __init__(self, cfg, stepper, live, dev_fn, build_plain, metric, total_steps):
        self.cfg, self.stepper, self.live, self.dev_fn, self.build_plain = (
            cfg,
            stepper,
            live,
            dev_fn,
            build_plain,
        )
        self.metric, self.total_steps = metric, total_steps

    def on_batch(self, state):
        guard = self.cfg.train.collapse_guard
        if guard.dev_margin and "guard_base" not in state:  # the untouched model's dev, before the first step
            name = guard.dev_metric or self.metric
            state["guard_base"] = self.dev(name).get(name)

    def on_step(self, state, logs):
        if state["step"] % self.cfg.train.eval_steps == 0 or state["step"] >= self.total_steps:
            self.evaluate(state, logs)

    def dev(self, metric) -> dict[str, float]:
        with self.stepper.eval_module(self.build_plain) as evaluated, eval_threads(self.cfg):
            dev = self.dev_fn(evaluated) if rank() == 0 else {metric: float("nan")}
        self.stepper.module.train()
        return {k: float(v) for k, v in dev.items()} if isinstance(dev, dict) else {metric: float(dev)}

    def collapsed(self, state, dev: dict[str, float]) -> str:
        """Why the run stops here (rank 0 decides, every rank hears it), or ''."""
        guard, why = self.cfg.train.collapse_guard, ""
        if rank() == 0:
            name = guard.dev_metric or self.metric
            base, now = state.get("guard_base"), dev.get(name)
            cosine = dev.get(guard.cosine_metric)
            if guard.dev_margin and base is not None and now is not None and now < base - guard.dev_margin:
                why = f"{name} {now:.4f} is more than {guard.dev_margin:g} below the untouched model's {base:.4f}"
            elif guard.max_cosine is not None and cosine is not None and cosine > guard.max_cosine:
                why = (
                    f"{guard.cosine_metric} {cosine:.4f} passed {guard.max_cosine:g}: the embeddings collapse"
                )
        if world_size() > 1:
            box = [why]
            torch.distributed.broadcast_object_list(box, src=0)
            why = box[0]
        if why:
            return (
                f"collapse guard: stopped at step {state['step']}: {why}; this evaluation keeps no checkpoint, "
                "the best kept one is from before"
            )
        return ""

    def on_epoch_end(self, state, logs):
        if state["epoch"] >= self.cfg.train.epochs and state["step"] % self.cfg.train.eval_steps != 0:
            self.evaluate(state, logs)  # the last partial eval interval

    def evaluate(self, state, logs):
        metric = self.metric
        dev = self.dev(metric)
        guard = self.cfg.train.collapse_guard
        stop = self.collapsed(state, dev) if guard.dev_margin or guard.max_cosine is not None else ""
        # a method may train without any dev score (TSDAE's protocol); a stopped evaluation never counts as the best
        if rank() == 0 and metric in dev and not stop:
            state["best_dev"] = max(state["best_dev"], dev[metric])
        metrics = {
            **logs,
            "step": state["step"],
            "epoch": state["epoch"],
            **dev,
            f"best_{metric}": state["best_dev"],
            "restarts": state["restarts"],
        }
        if self.live is not None:
            self.live.log({k: v for k, v in metrics.items() if k not in ("step", "epoch")}, state["step"])
        state["history"].append(metrics)
        if stop:
            state["stopped"] = stop
            if rank() == 0:
                print(stop, flush=True)
            report({**metrics, "collapse_guard": stop})
            return
        report(metrics, self.stepper, dict(state))


# ---------------------------------------------------------------- what the loop and the callbacks use
def stop_if_diverged(cfg, state: dict, logs: dict) -> None:
    """A NaN or infinite loss (every recipe logs its loss as a float) stops training before its step: each
    later step would train on it. Raised on the worker; the job prints it as its one line."""
    if not math.isfinite(logs.get("loss", 0.0)):
        raise TrainingDiverged(
            f"the loss is {logs['loss']} at step {state['step'] + 1} (train.lr {cfg.train.lr:g}): "
            "training stops here; a lower train.lr (or fp32: perf.bf16=off) usually cures it"
        )


@contextmanager
def eval_threads(cfg):
    """On CPU, rank 0 evaluates alone while the other workers wait for it: it may use their cores too."""
    if torch.cuda.is_available() or rank() != 0:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(
        max(before, min(os.cpu_count() or 1, int(cfg.scaling.cpus_per_worker * world_size())))
    )
    try:
        yield
    finally:
        torch.set_num_threads(before)


def live_run():
    """The MLflow run to log into while training (named by the driver in the workers' environment)."""
    run_id, uri = os.environ.get("SIEVE_MLFLOW_RUN_ID"), os.environ.get("SIEVE_MLFLOW_TRACKING_URI")
    if not (run_id and uri):
        return None
    from orchestrator.live_runs import LiveRun  # MLflow in the process that logs only (~1.3 CPU-s to import)

    return LiveRun(run_id, uri)


def report(metrics: dict, stepper=None, state: dict | None = None) -> None:
    """``ray.train.report`` with (optionally) a checkpoint written by every rank that has a share."""
    import ray.train  # lazy: the recipes import without Ray where none runs (bench/gpu.sh's image)

    if stepper is None:
        ray.train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as tmp:
        stepper.save(Path(tmp), state or {})  # a rank with no share of the state reports no checkpoint
        ray.train.report(
            metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp) if any(Path(tmp).iterdir()) else None
        )


@contextmanager
def resumed_checkpoint():
    """The latest reported checkpoint as a local directory (or None on a fresh start)."""
    import ray.train  # lazy: as in report

    ckpt = ray.train.get_checkpoint()
    if ckpt is None:
        yield None
        return
    with ckpt.as_directory() as d:
        yield Path(d)
