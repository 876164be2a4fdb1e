"""Fault injection for the tests that prove a run resumes (unset in real runs: every hook is a no-op)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist


def hooks_set() -> bool:
    """Whether a test set any hook (the loop installs its fault-injection callback only then)."""
    return any(os.environ.get(k) for k in ("SIEVE_STEP_DELAY_S", "SIEVE_HOLD_AT_STEP", "SIEVE_FAIL_AT_STEP"))


def maybe_inject_failure(step: int) -> None:
    """Crash this worker once at ``SIEVE_FAIL_AT_STEP`` (rank ``SIEVE_FAIL_RANK``, default 1).

    Used by the fault-injection tests to prove that a run resumes from its last checkpoint; the
    marker file ``SIEVE_FAIL_MARKER`` makes it fire only once across restarts. Unset in real runs.
    """
    if delay := os.environ.get("SIEVE_STEP_DELAY_S"):  # tests: keep a run going while they watch MLflow
        time.sleep(float(delay))
    maybe_hold(step)
    at = os.environ.get("SIEVE_FAIL_AT_STEP")
    rank, size = (
        (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    )
    if not at or step != int(at) or rank != int(os.environ.get("SIEVE_FAIL_RANK", "1")) % size:
        return
    if (marker := Path(os.environ.get("SIEVE_FAIL_MARKER", "/tmp/sieve-fail-marker"))).exists():
        return
    marker.write_text(str(step))
    # let the controller collect the previous report first (Ray Train polls workers): a crash right
    # after a report may otherwise lose it, and the run would restart from the checkpoint before
    time.sleep(float(os.environ.get("SIEVE_FAIL_DELAY_S", "5")))
    os._exit(1)  # a hard crash, like a killed worker process


def maybe_hold(step: int) -> None:
    """Stop before ``SIEVE_HOLD_AT_STEP`` on the first attempt only, until killed (at most ``SIEVE_HOLD_S``).

    The node-loss test kills a node while the trial waits here, after the previous step's checkpoint
    is taken: a race against a step delay once let a busy machine kill the node after the last step.
    The marker file ``SIEVE_HOLD_MARKER``, written by the first worker to arrive, lets the restarted
    trial run through. The other workers wait in their next collective.
    """
    at = os.environ.get("SIEVE_HOLD_AT_STEP")
    if not at or step != int(at):
        return
    marker = Path(os.environ.get("SIEVE_HOLD_MARKER", "/tmp/sieve-hold-marker"))
    if marker.exists():
        return
    marker.write_text(str(step))
    time.sleep(float(os.environ.get("SIEVE_HOLD_S", "300")))
