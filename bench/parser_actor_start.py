"""Start of the corpus pipeline's spaCy parser actors: loaded as they are now (spaCy imported without
torch) vs as before da0b305 (torch imported first, as spaCy's thinc did), side by side in one run.

Each round starts two fresh 1-CPU actors at once - a corpus build's two parser actors - and times
them from creation until both have built their parser and parsed one sentence; the in-actor time of
the parser's construction is recorded too. The two ways alternate, the one that goes first switching
each round, after a warm-up of each (file caches).

    python bench/parser_actor_start.py [--rounds 4]
"""

from __future__ import annotations

import os

os.environ["OMP_NUM_THREADS"] = "1"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import argparse
import statistics
import sys
import time

import ray
from _common import write_results


@ray.remote(num_cpus=1)
class Starter:
    def __init__(self, torch_first: bool):
        t0 = time.perf_counter()
        if torch_first:  # what spaCy's import did before: thinc imported torch
            import torch  # noqa: F401
        from orchestrator.data.corpus import CorpusConfig, ParseAugment

        self.actor = ParseAugment(CorpusConfig().model_dump())
        self.init_s = time.perf_counter() - t0
        self.torch = "torch" in sys.modules

    def ready(self) -> dict:
        self.actor.parser.parse_batch(["The parser is ready to work."])
        return {"init_s": self.init_s, "torch": self.torch}


def pair(torch_first: bool) -> dict:
    t0 = time.perf_counter()
    actors = [Starter.remote(torch_first) for _ in range(2)]
    out = ray.get([a.ready.remote() for a in actors])
    wall = time.perf_counter() - t0
    for a in actors:
        ray.kill(a)
    assert all(o["torch"] == torch_first for o in out), out
    time.sleep(1.0)  # the killed actors' processes leave
    return {"wall_s": wall, "init_s": max(o["init_s"] for o in out)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    from orchestrator.drivers.cluster import init_ray

    init_ray()  # a local Ray with 4 logical CPUs on this 2-core machine
    pair(True), pair(False)  # warm-up: file caches for both ways
    runs: dict[str, list[dict]] = {"torch_first": [], "without_torch": []}
    for r in range(args.rounds):
        for torch_first in (True, False) if r % 2 == 0 else (False, True):
            runs["torch_first" if torch_first else "without_torch"].append(pair(torch_first))
    ray.shutdown()
    mean = {k: {m: statistics.mean(x[m] for x in v) for m in ("wall_s", "init_s")} for k, v in runs.items()}
    ratio = mean["torch_first"]["wall_s"] / mean["without_torch"]["wall_s"]
    each = lambda k, m: ", ".join(f"{x[m]:.2f}" for x in runs[k])  # noqa: E731
    md = f"""# Corpus parser actors' start: spaCy without torch vs with torch imported first

Command: `python bench/parser_actor_start.py --rounds {args.rounds}` (two fresh 1-CPU actors at once, as a corpus
build starts them, timed from creation until both have built their parser and parsed a sentence;
{args.rounds} rounds, the way that goes first alternating, after a warm-up of each). Machine: {os.cpu_count()} CPUs.

| parser actors | pair ready, mean s (each round) | parser construction in the actor, mean s (each round) |
|---|---:|---:|
| torch imported first (before da0b305: spaCy's thinc imported it) | {mean["torch_first"]["wall_s"]:.2f} ({each("torch_first", "wall_s")}) | {mean["torch_first"]["init_s"]:.2f} ({each("torch_first", "init_s")}) |
| spaCy imported without torch (now) | {mean["without_torch"]["wall_s"]:.2f} ({each("without_torch", "wall_s")}) | {mean["without_torch"]["init_s"]:.2f} ({each("without_torch", "init_s")}) |

The pair is ready **{ratio:.2f}x** as fast, {mean["torch_first"]["wall_s"] - mean["without_torch"]["wall_s"]:.1f} s earlier; a corpus build's parser
actors start while the input is read and sorted, so the build gains up to that much.
"""
    write_results(
        "parser_actor_start",
        {"rounds": args.rounds, "runs": runs, "mean": mean, "ratio_ready_torch_first_over_without": ratio},
        md,
    )


if __name__ == "__main__":
    main()
