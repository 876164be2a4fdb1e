"""Connecting to Ray: the same code runs on a laptop and on a cluster, and joins only the cluster it is told to.

* ``RAY_ADDRESS`` set (``ray job submit`` sets it; ``RAY_ADDRESS=auto`` joins a ``ray start`` cluster on
  this machine; ``host:port`` any other): connect to it.
* Otherwise start a private local Ray - never someone else's cluster that happens to run on the machine -
  with at least 4 logical CPUs: on a 2-core machine two 1-CPU actors would otherwise take every CPU and a
  Ray Data read task would never run: the job would hang without a word.
* A cluster that goes away mid-job ends the job with one line naming its address (exit code 2): without it
  the driver hangs in ``ray.get`` until Ray gives up with "Failed to connect to GCS".
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

import ray
import torch
from ray.autoscaler.sdk import request_resources

from orchestrator.claims import release_all
from orchestrator.errors import ConfigError

MIN_LOCAL_CPUS = 4
# the test hooks of trainers/fault_injection.py (unset in real runs), passed on to every Ray worker of a job
TEST_HOOKS = ("SIEVE_FAIL_", "SIEVE_HOLD_", "SIEVE_STEP_DELAY", "SIEVE_SKIP_RNG")


def fault_hooks() -> dict[str, str]:
    """The driver's test-hook variables: a Tune trial's actor is spawned by a raylet, not by the driver,
    so without the job's runtime env it never sees them (a step delay set for the node-loss test never
    reached its trial - the race it was meant to prevent stayed)."""
    return {k: v for k, v in os.environ.items() if k.startswith(TEST_HOOKS)}


_WATCH_STOP = threading.Event()  # set by shutdown_ray: a cluster we stop ourselves has not gone away


def shutdown_ray() -> None:
    """Disconnect before a job prints its results, so that late worker log lines cannot follow them."""
    _WATCH_STOP.set()
    if ray.is_initialized():
        ray.shutdown()


def watch_cluster(gcs_address: str, *, every_s: float = 2.0, grace_s: float = 10.0) -> threading.Thread:
    """A daemon thread that ends the process with one line (exit code 2) once the cluster's GCS at
    ``gcs_address`` has refused connections for ``grace_s``; it stops quietly after :func:`shutdown_ray` or
    when Ray is no longer initialised. A TCP connect: a busy GCS still accepts, a dead one refuses at once."""
    host, port = gcs_address.rsplit(":", 1)

    def watch() -> None:
        lost_since = None
        while not _WATCH_STOP.wait(every_s):
            if not ray.is_initialized():
                return
            try:
                socket.create_connection((host, int(port)), timeout=every_s).close()
                lost_since = None
            except OSError:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since >= grace_s and not _WATCH_STOP.is_set():
                    print(
                        f"error: the Ray cluster at {gcs_address} went away mid-job (its GCS refused connections "
                        f"for {grace_s:.0f} s); the job stops here - a sweep, comparison or experiments job "
                        "continues from its storage with --resume",
                        file=sys.stderr,
                        flush=True,
                    )
                    release_all()  # os._exit skips atexit: the job's claim on its name goes back here
                    os._exit(2)

    _WATCH_STOP.clear()
    thread = threading.Thread(target=watch, name="sieve-cluster-watch", daemon=True)
    thread.start()
    return thread


def init_ray(*, num_cpus: int | None = None, quiet: bool = False, needs=()) -> None:
    """``quiet``: worker processes' logs stay in Ray's log files (errors still surface as exceptions).
    ``needs``: the configs the job will train (:func:`check_resources`), checked once connected."""
    global _PRIVATE
    if ray.is_initialized():
        check_resources(needs)
        return
    kwargs = {"log_to_driver": not quiet}
    if hooks := fault_hooks():
        kwargs["runtime_env"] = {"env_vars": hooks}
    if joins_cluster():
        ray.init(**kwargs)
        _PRIVATE = False
    else:  # a new private local cluster (address="local": even when another one runs on this machine)
        cpus = local_node(num_cpus)["CPU"]  # what preflight checked the job's workers against
        # Ray Train's preemption watcher (an actor per worker group, polling for drained nodes) has nothing to
        # watch on one machine: ~2 CPU-s of every run (bench/results/train_startup.md)
        os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
        ray.init(address="local", num_cpus=cpus, include_dashboard=True, dashboard_host="127.0.0.1", **kwargs)
        _PRIVATE = True
    watch_cluster(ray.get_runtime_context().gcs_address)
    check_resources(needs)


_PRIVATE = True  # the job started its own local Ray, which never adds a node


def joins_cluster() -> bool:
    """``RAY_ADDRESS`` names a cluster to join (else the job starts a private local Ray)."""
    address = os.environ.get("RAY_ADDRESS")
    return bool(address) and address != "local"


def local_node(num_cpus: int | None = None) -> dict[str, float]:
    """The resources :func:`init_ray` gives a private local Ray, known before it starts (Ray counts the GPUs
    CUDA shows it)."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"CPU": num_cpus or max(MIN_LOCAL_CPUS, os.cpu_count() or 1), "GPU": gpus}


def worker_bundle(scaling) -> dict[str, float]:
    """What one training worker asks Ray for (``scaling`` is a config's ScalingBlock)."""
    bundle = {"CPU": scaling.cpus_per_worker, **scaling.resources_per_worker}
    if scaling.use_gpu:
        bundle.setdefault("GPU", 1)
    return bundle


def _short_of(scaling, nodes: list[dict]) -> str | None:
    """Why ``scaling``'s workers cannot all be placed on ``nodes`` (each node's resources), naming the key and
    both numbers; None when they can."""
    bundle = worker_bundle(scaling)
    if any(all(n.get(k, 0) >= v for k, v in bundle.items()) for n in nodes):
        held = sum(min(int(n.get(k, 0) // v) for k, v in bundle.items()) for n in nodes)
        if held < scaling.num_workers:
            return f"scaling.num_workers={scaling.num_workers}: the Ray cluster's nodes hold {held} workers of {bundle}"
        return None
    for key, per in bundle.items():  # the first thing no node has enough of
        most = max((n.get(key, 0) for n in nodes), default=0)
        if most < per:
            name = {"CPU": f"scaling.cpus_per_worker={per:g}", "GPU": "scaling.use_gpu=true"}.get(
                key, f"scaling.resources_per_worker.{key}={per:g}"
            )
            return f"{name}: each worker needs {per:g} {key}, and no node of the Ray cluster has more than {most:g}"
    return f"scaling: no node of the Ray cluster has all of {bundle} at once"


def _nodes() -> list[dict]:
    """Each live node's resources; before Ray starts, the one node the private local Ray will have."""
    if not ray.is_initialized():
        return [local_node()]
    return [n["Resources"] for n in ray.nodes() if n["Alive"]]


def check_resources(cfgs, *, poll_s: float = 5.0) -> None:
    """Before any worker is placed (Ray would wait for it without a word, forever): each config's workers fit
    the cluster's nodes, or the job stops in one line naming the key and both numbers. A cluster the job joined
    may add nodes (KubeRay's autoscaler): there the job asks for them and waits ``scaling.wait_for_nodes_s``."""
    private = _PRIVATE or not ray.is_initialized()
    for scaling in {c.scaling.model_dump_json(): c.scaling for c in cfgs}.values():
        short = _short_of(scaling, _nodes())
        if short is not None and not private:
            short = _wait_for_nodes(scaling, short, poll_s)
        if short is not None:
            waited = "" if private else f" (waited scaling.wait_for_nodes_s={scaling.wait_for_nodes_s:g} s)"
            raise ConfigError(f"{short}{waited}; nothing was trained")


def _wait_for_nodes(scaling, short: str, poll_s: float) -> str | None:
    """Ask the autoscaler for the workers' bundles and wait for a fit; the request is withdrawn either way (Ray
    Train's placement group asks for what it needs): what is still short, or None."""
    print(f"{short}: waiting up to {scaling.wait_for_nodes_s:g} s for the cluster to add one", flush=True)
    request_resources(bundles=[worker_bundle(scaling)] * scaling.num_workers)
    deadline = time.monotonic() + scaling.wait_for_nodes_s
    try:
        while short is not None and time.monotonic() < deadline:
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
            short = _short_of(scaling, _nodes())
        return short
    finally:
        request_resources(bundles=[])


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
