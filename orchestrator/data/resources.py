"""What the corpus pipeline's actors reserve on the cluster they find.

The parser actors start with the execution, and Ray Data's read and sort tasks (1 CPU each; the sort's is
fixed by Ray Data) feed them. Where the free CPUs cannot hold the actors and one such task besides, the actors
take what is left and wait for rows from tasks that wait for a CPU: a deadlock, with no message, for as long as
something else holds CPUs. Reproduced with 1 CPU held by another actor on a 4-CPU cluster (the read task pending,
the actors idle); CI showed the same signature (two builds of 2 actors of 1 CPU each waited until the tests' 300 s
limit, while a 1-actor build between them ran), what held its CPUs unknown. So the actors then share what the
task leaves: the parse runs as before, more actors to a core.
"""

from __future__ import annotations

import math

import ray

DEDUP_CPUS = 0.1  # the one dedup actor's reservation (it only compares keys)
TASK_CPUS = 1.0  # what one of Ray Data's read or sort tasks reserves
MIN_PARSER_CPUS = 0.1


def free_cpus() -> float:
    """The cluster's free CPUs now (no cluster yet: Ray Data starts a local one, every CPU free)."""
    return ray.available_resources().get("CPU", 0.0) if ray.is_initialized() else math.inf


def parser_cpus(workers: int, cpus_per_worker: float, free: float) -> float:
    """What each of ``workers`` parser actors reserves: ``cpus_per_worker`` where ``free`` CPUs hold them, the
    dedup actor and one task; else each one's share of what is left, never under ``MIN_PARSER_CPUS`` (below
    that the build waits for CPUs, as Ray makes it)."""
    if free >= workers * cpus_per_worker + DEDUP_CPUS + TASK_CPUS:
        return cpus_per_worker
    return max(MIN_PARSER_CPUS, math.floor(100 * (free - DEDUP_CPUS - TASK_CPUS) / workers) / 100)
