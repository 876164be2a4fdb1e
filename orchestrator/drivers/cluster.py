"""Connecting to Ray: the same code runs on a laptop and on a cluster.

* Under ``ray job submit`` (``RAY_ADDRESS`` set) or with a ``ray start`` cluster on this machine,
  connect to it.
* Otherwise start a local Ray with at least 4 logical CPUs: on a 2-core machine two 1-CPU
  actors would otherwise take every CPU and a Ray Data read task would never run (a silent
  hang seen here). ``RAY_ADDRESS=local`` always starts a new private local cluster (with the
  same CPU floor), e.g. to run a job beside another job's cluster on one machine.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # before ray is imported

import psutil  # noqa: E402
import ray  # noqa: E402

MIN_LOCAL_CPUS = 4


def gcs_running() -> bool:
    """Whether a Ray head runs on this machine. Ray's ``address="auto"`` would otherwise follow a stale
    ``/tmp/ray/ray_current_cluster`` left by a killed cluster and wait a minute for a dead GCS."""
    for proc in psutil.process_iter(["name"]):
        try:
            if "gcs_server" in (proc.info["name"] or ""):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def shutdown_ray() -> None:
    """Disconnect before a job prints its results, so that late worker log lines cannot follow them."""
    if ray.is_initialized():
        ray.shutdown()


def init_ray(*, num_cpus: int | None = None, quiet: bool = False) -> None:
    """``quiet``: worker processes' logs stay in Ray's log files (errors still surface as exceptions)."""
    if ray.is_initialized():
        return
    kwargs = {"log_to_driver": not quiet}
    address = os.environ.get("RAY_ADDRESS")
    if address and address != "local":
        ray.init(**kwargs)
        return
    if address == "local":  # a new private local cluster, even when another one runs on this machine
        cpus = num_cpus or max(MIN_LOCAL_CPUS, os.cpu_count() or 1)
        ray.init(address="local", num_cpus=cpus, include_dashboard=True, dashboard_host="127.0.0.1", **kwargs)
        return
    if gcs_running():  # a `ray start` cluster on this machine
        try:
            ray.init(address="auto", **kwargs)
            return
        except ConnectionError:
            pass
    cpus = num_cpus or max(MIN_LOCAL_CPUS, os.cpu_count() or 1)
    ray.init(num_cpus=cpus, include_dashboard=True, dashboard_host="127.0.0.1", **kwargs)


def concurrent_trials(cfg, requested: int | None, streams: bool = True) -> int:
    """How many training runs of ``cfg`` (a MethodConfig) fit at once - a sweep's trials, the Siamese
    job's models: each needs its workers plus 1 CPU for the trial's driver, and, when
    the corpus ``streams`` during training, 1 CPU stays free for Ray Data's read tasks (with every CPU
    held by trials, the workers' ingest waits forever - a silent hang seen with 1-worker trials on 4
    logical CPUs). A corpus read before the workers start needs no CPU while they train: on 4 logical
    CPUs, two 1-worker trials run at once instead of one (the sentiment sweep's LSTM trains on 1
    thread: the second core was idle)."""
    if requested:
        return requested
    res = ray.cluster_resources()
    per_trial_cpu = cfg.scaling.num_workers * cfg.scaling.cpus_per_worker + 1
    fits = int(max(0.0, res.get("CPU", 1) - (1 if streams else 0)) // per_trial_cpu)
    if cfg.scaling.use_gpu:
        fits = min(fits, int(res.get("GPU", 0) // cfg.scaling.num_workers))
    return max(1, fits)
