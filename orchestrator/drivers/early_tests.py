"""Testing a sweep's trials while the sweep still runs (``test_every_trial``): each finished trial is exported and
tested on a thread of the driver as soon as a core would otherwise idle, instead of every test after the last
trial."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch

from orchestrator import storage
from orchestrator.config import MethodConfig
from orchestrator.drivers.engine import reports_uri, trial_row
from orchestrator.drivers.train import Beside, worker_cores
from orchestrator.evaluation.suite import TestReport


class EarlyTests:
    """A sweep that tests every trial tests each one as it finishes, on a thread of the driver, while the
    last trials still train and leave a core idle - instead of every test after the last trial (a sweep's last
    trial often trains alone on part of the machine, and the tests would then wait for it, one after the
    other). The test is the same call on the same checkpoint (the evaluation is
    deterministic and its figures do not depend on the thread count: ``test_perf_switches``); a test that
    fails here is run again after the sweep, where its error surfaces as before.

    The cores left idle are counted as :func:`idle_cores` counts them for the base measured beside training:
    this machine's torch threads less the workers of the trials that can still run at once (so nothing moves
    while trials wait for a slot, nor on a GPU run)."""

    def __init__(self, base: MethodConfig, recipe, test: Callable[[dict], TestReport]):
        """``test(row)``: the trial's checkpoint exported and tested (the sweep job's own export)."""
        self.base, self.recipe, self.test = base, recipe, test
        self.per_trial = worker_cores(base)
        self.cores = torch.get_num_threads()  # this machine's, as idle_cores() counts them
        self.total, self.concurrent, self.sweep_dir = 0, 1, ""
        self.ended: set[str] = set()
        self.waiting: list[tuple[str, dict]] = []
        self.tested: dict[str, tuple[str, TestReport]] = {}
        self.running: tuple[str, str, Beside] | None = None

    def configure(self, *, total: int, concurrent: int, sweep_dir: str) -> None:
        self.total, self.concurrent, self.sweep_dir = total, concurrent, sweep_dir

    def finished(self, trial: str, params: dict, ok: bool) -> None:
        self.ended.add(trial)
        if ok:
            self.waiting.append((trial, params))
        self.poll()

    def poll(self) -> None:
        if self.running is not None and self.running[2].done():
            self._collect()
        if self.running is not None or not self.waiting or self.base.scaling.use_gpu:
            return
        still, threads = spare_threads(
            self.cores, self.per_trial, self.concurrent, self.total, len(self.ended)
        )
        if threads < 1:
            return
        trial, params = self.waiting.pop(0)
        records = reports_uri(self.sweep_dir, trial)
        if not storage.exists(records):
            return
        row = trial_row(
            trial,
            params,
            json.loads(storage.read_bytes(records)),
            self.recipe.metric,
            self.recipe.selection_metric(self.base),
        )
        if row["checkpoint_path"] is None:
            return
        beside = f"beside the {still} trial(s) still training" if still else "(every trial has ended)"
        print(f"[{trial}] tested now, on {threads} thread(s) {beside}", flush=True)
        self.running = (trial, row["checkpoint_path"], Beside(lambda: self.test(row), threads))

    def _collect(self) -> None:
        trial, path, beside = self.running
        self.running = None
        try:
            self.tested[trial] = (path, beside.result())
        except Exception as exc:  # noqa: BLE001 - tested again after the sweep, where the error surfaces
            print(
                f"[{trial}] its test failed beside training ({str(exc).splitlines()[0][:200]}): "
                "tested again after the sweep",
                flush=True,
            )

    def finish(self) -> dict[str, tuple[str, TestReport]]:
        """Wait for the test under way; {trial: (checkpoint path, its test report)}."""
        if self.running is not None:
            self._collect()
        return self.tested


def spare_threads(cores: int, per_trial: int, concurrent: int, total: int, ended: int) -> tuple[int, int]:
    """(trials that can still train at once, threads they leave idle) once ``ended`` of ``total`` trials ended,
    ``concurrent`` running at most, each on ``per_trial`` cores of this machine's ``cores``."""
    still = min(concurrent, max(0, total - ended))
    return still, cores - still * per_trial
