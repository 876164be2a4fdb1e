"""What one Ray Train run costs before and after its training (#22.4: "repeated Ray Train launches").

A train function that only imports a recipe (``trainers.sifter_simcse``: what every worker imports before its
first step) and reports once, run by ``TorchTrainer.fit()`` with 2 workers x 1 CPU (the smoke sweeps' trials),
on a fresh local Ray cluster. Measured per fit: the wall time, when the train function starts and when the
recipe is imported (seconds after ``fit()`` is called), and the CPU time of every process the run started,
grouped by what it is (a poller reads each process's CPU time every 0.2 s; the last fraction of a second of a
process that exits between two reads is missed).

Variants, each on its own fresh cluster (the switches are read by the processes Ray starts), differing in what the
train function's config carries and in Ray Train's preemption watcher:
``typed-config``: the method's typed config (a ``ContrastiveConfig``), as the drivers handed it to Ray Train
until 2026-12-07 - the controller, unpickling it, imports the recipe's module; ``payload``: the config as
``orchestrator.drivers.train.train_function`` packs it now (the recipe and config as bytes, opened on the
workers); ``payload-no-watcher``: also ``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0``, as a job's private local Ray
and the test suite's head run. Run in the order A B C C B A, each variant's fits averaged, so the side that
runs first is not favoured.

    python bench/train_startup.py [--fits 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from _common import ROOT, write_results

VARIANTS = {
    "typed-config": {"SIEVE_BENCH_CONFIG": "typed"},
    "payload": {"SIEVE_BENCH_CONFIG": "payload"},
    "payload-no-watcher": {"SIEVE_BENCH_CONFIG": "payload", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"},
}
ROLES = [
    ("RayTrainWorker", "train workers (ray + torch + the recipe's imports)"),
    ("TrainController", "Train controller"),
    ("PlacementGroupCleaner", "placement-group cleaner actor"),
    ("DatasetManager", "dataset manager actor (created with no datasets too)"),
    ("SynchronizationActor", "synchronization actor"),
    ("PreemptionWatcher", "preemption watcher actor"),
    ("AutoscalingCoordinator", "autoscaling coordinator actor"),
    ("SplitCoordinator", "split coordinator actor"),
    ("IDLE", "idle pooled workers"),
    ("raylet", "raylet"),
    ("gcs_server", "GCS"),
    ("dashboard", "dashboard and its agents"),
]


def role(cmdline: str) -> str:
    for key, _ in ROLES:
        if key in cmdline:
            return key
    return "other" if cmdline else "?"


class CpuByRole:
    """CPU seconds every process spent between ``start()`` and ``stop()`` (a process alive before, such as a
    pooled idle worker Ray hands to an actor, counts from ``start()``), by the role it last had."""

    def __init__(self, since: float, exclude: int):
        self.exclude, self.seen, self._stop = exclude, {}, threading.Event()
        self.before = {key: cpu for key, (cpu, _) in self._read().items()}
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _read(self) -> dict:
        import psutil

        out = {}
        for p in psutil.process_iter(["pid", "cmdline", "cpu_times", "create_time"]):
            i = p.info
            if i["pid"] == self.exclude or i["cpu_times"] is None:
                continue
            out[(i["pid"], i["create_time"])] = (
                i["cpu_times"].user + i["cpu_times"].system,
                role(" ".join(i["cmdline"] or [])),
            )
        return out

    def _poll(self) -> None:
        while not self._stop.is_set():
            for key, (cpu, r) in self._read().items():
                self.seen[key] = (cpu - self.before.get(key, 0.0), r)
            time.sleep(0.2)

    def start(self) -> CpuByRole:
        self._thread.start()
        return self

    def stop(self) -> dict[str, dict]:
        self._stop.set()
        self._thread.join()
        out: dict[str, dict] = {}
        for cpu, r in self.seen.values():
            if cpu < 0.05:  # a process that did nothing during the run is not one it started or used
                continue
            out.setdefault(r, {"processes": 0, "cpu_s": 0.0})
            out[r]["processes"] += 1
            out[r]["cpu_s"] += cpu
        return out


def child(fits: int) -> None:
    """One variant: a fresh local Ray, ``fits`` runs of the recipe-importing train function."""
    import ray

    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    marks = os.path.join(os.environ["SIEVE_BENCH_TMP"], "marks")

    def train_fn(config: dict) -> None:
        import ray.train

        started = time.time() - config["t"]
        import trainers.sifter_simcse  # noqa: F401 - what a worker imports before its first step

        with open(f"{marks}-{config['i']}-{ray.train.get_context().get_world_rank()}", "w") as f:
            json.dump({"fn_start_s": started, "imported_s": time.time() - config["t"]}, f)
        ray.train.report({"done": 1})

    from orchestrator.drivers.train import train_function
    from trainers.sifter_simcse import ContrastiveConfig, SIFTERSimCSERecipe

    cfg = ContrastiveConfig.model_validate(
        {"model": {"name_or_path": "unused"}, "run": {"storage": os.environ["SIEVE_BENCH_TMP"]}}
    )
    if os.environ["SIEVE_BENCH_CONFIG"] == "typed":
        carried = {"method_config": cfg}
    else:
        carried = train_function(SIFTERSimCSERecipe, cfg)[1]
    time.sleep(5)  # the cluster's own start-up settles
    reads = read_corpus(int(os.environ["SIEVE_BENCH_ROUND"]) % 2 == 1)
    rows = []
    for i in range(fits):
        t = time.time()
        cpu = CpuByRole(t, os.getpid()).start()
        TorchTrainer(
            train_fn,
            train_loop_config={"t": t, "i": i, **carried},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
            run_config=RunConfig(name=f"startup-{i}", storage_path=os.environ["SIEVE_BENCH_TMP"]),
        ).fit()
        wall = time.time() - t
        time.sleep(1)  # processes that exit at the run's end are read once more
        ranks = [json.load(open(f"{marks}-{i}-{r}")) for r in (0, 1)]
        rows.append(
            {
                "wall_s": wall,
                "fn_start_s": max(r["fn_start_s"] for r in ranks),
                "imported_s": max(r["imported_s"] for r in ranks),
                "cpu_by_role": cpu.stop(),
            }
        )
    ray.shutdown()
    print("RESULT " + json.dumps({"fits": rows, "reads": reads}), flush=True)


def read_corpus(in_process_first: bool) -> dict[str, list[float]]:
    """How a small training corpus gets into the object store before a run (``build_trainer``): Ray Data's
    ``read_parquet(...).materialize()`` (read tasks) vs ``read_in_process`` (this process reads, puts one
    block per file). One shard file of the TSDAE smoke corpus's size (4,000 WikiSplit lines, 3 text columns);
    each way twice in this fresh process (the first call pays the imports and the task workers' start),
    the two ways in turn, which one first alternating by round."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray.data

    from orchestrator.drivers.train import read_in_process

    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text(encoding="utf-8").splitlines()
    folder = os.path.join(os.environ["SIEVE_BENCH_TMP"], "shards")
    os.makedirs(folder)
    pq.write_table(
        pa.table(
            {
                "text": lines,
                "backbone_view": [t + " " + t[: len(t) // 2] for t in lines],
                "deletion_view": [" ".join(t.split()[::2]) for t in lines],
            }
        ),
        os.path.join(folder, "000000-0000.parquet"),
    )
    cols = ["text", "deletion_view"]
    ways = {
        "materialize": lambda: ray.data.read_parquet(folder).select_columns(cols).materialize(),
        "in_process": lambda: read_in_process(pafs.LocalFileSystem(), folder, cols),
    }
    order = ["in_process", "materialize"] if in_process_first else ["materialize", "in_process"]
    out: dict[str, list[float]] = {k: [] for k in ways}
    for name in order * 2:
        t = time.time()
        assert ways[name]().count() == len(lines)
        out[name].append(time.time() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fits", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args.fits)
    import tempfile

    names = list(VARIANTS)
    order = [n for r in range(args.rounds) for n in (names if r % 2 == 0 else names[::-1])]
    runs: dict[str, list] = {n: [] for n in names}
    reads: list[dict] = []
    for name in order:
        with tempfile.TemporaryDirectory(prefix="sieve-startup-") as tmp:
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "RAY_USAGE_STATS_ENABLED": "0",
                "SIEVE_BENCH_TMP": tmp,
                "SIEVE_BENCH_ROUND": str(len(reads)),
                "PYTHONPATH": str(ROOT),
                **VARIANTS[name],
            }
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--fits", str(args.fits)],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            ).stdout
        got = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
        rows = got["fits"]
        reads.append(got["reads"])
        print(
            name,
            [round(r["wall_s"], 1) for r in rows],
            {k: [round(x, 2) for x in v] for k, v in got["reads"].items()},
            flush=True,
        )
        runs[name] += rows

    def mean(name: str, key: str) -> float:
        return statistics.mean(r[key] for r in runs[name])

    def cpu(name: str, key: str) -> float:
        return statistics.mean(r["cpu_by_role"].get(key, {}).get("cpu_s", 0.0) for r in runs[name])

    def procs(name: str, key: str) -> float:
        return statistics.mean(r["cpu_by_role"].get(key, {}).get("processes", 0) for r in runs[name])

    keys = [k for k, _ in ROLES] + ["other"]
    first = {k: statistics.mean(r[k][0] for r in reads) for k in ("materialize", "in_process")}
    again = {k: statistics.mean(r[k][1] for r in reads) for k in ("materialize", "in_process")}
    res = {
        "fits_per_variant": len(runs[names[0]]),
        "order": order,
        "variants": VARIANTS,
        "runs": runs,
        "corpus_reads": reads,
        "corpus_read_first_s": first,
        "corpus_read_again_s": again,
        "means": {
            n: {
                "wall_s": mean(n, "wall_s"),
                "fn_start_s": mean(n, "fn_start_s"),
                "imported_s": mean(n, "imported_s"),
                "cpu_s": {k: cpu(n, k) for k in keys},
                "cpu_total_s": sum(cpu(n, k) for k in keys),
            }
            for n in names
        },
    }
    m = res["means"]
    lines = [
        f"# One Ray Train run's fixed cost: start-up and teardown around an empty train function "
        f"({os.cpu_count()} cores)",
        "",
        f"Command: `.venv/bin/python bench/train_startup.py --fits {args.fits} --rounds {args.rounds}` "
        f"(each variant on its own fresh local Ray, 4 logical CPUs; order {' '.join(order)}; "
        f"{res['fits_per_variant']} fits per variant, means). The train function imports the recipe "
        "(`trainers.sifter_simcse`) on 2 workers x 1 CPU and reports once: everything a smoke trial "
        "pays besides its steps and evaluations. `typed-config`: its config carries the method's typed config, as "
        "the drivers passed it until 2026-12-07 (the controller, unpickling it, imports the recipe's module); "
        "`payload`: the config as `train_function` packs it now; `payload-no-watcher`: also without Ray Train's "
        "preemption watcher, as a job's private local Ray and the test suite run.",
        "",
        "| variant | fit() wall s | train function starts at s | recipe imported at s | CPU s, all processes "
        "the run started |",
        "|---|---:|---:|---:|---:|",
    ]
    for n in names:
        lines.append(
            f"| {n} | {m[n]['wall_s']:.1f} | {m[n]['fn_start_s']:.1f} | {m[n]['imported_s']:.1f} | "
            f"{m[n]['cpu_total_s']:.1f} |"
        )
    lines += [
        "",
        "CPU seconds per run by the processes it started or used (means per run; a poller reads them every 0.2 s, "
        "so a process that lives less long can be missed, as the train workers' counts below 2 show: lower "
        "bounds, and the totals above move by several seconds from run to run), variant by variant:",
        "",
        "| process | " + " | ".join(f"{n} CPU s (processes)" for n in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for k, label in ROLES + [("other", "other processes on the machine meanwhile")]:
        if any(cpu(n, k) > 0.05 for n in names):
            lines.append(
                f"| {label} | " + " | ".join(f"{cpu(n, k):.1f} ({procs(n, k):.1f})" for n in names) + " |"
            )
    lines += [
        "",
        f"Reading a small training corpus into the object store before a run (`build_trainer`; one "
        f"shard file of 4,000 rows, 2 of its 3 text columns; means over {len(reads)} fresh processes, "
        "which way first alternating):",
        "",
        "| way | first call in a fresh process, s | second call, s |",
        "|---|---:|---:|",
        f"| Ray Data `read_parquet(...).materialize()` (read tasks) | {first['materialize']:.2f} | "
        f"{again['materialize']:.2f} |",
        f"| `read_in_process` (this process reads, `ray.data.from_arrow`) | {first['in_process']:.2f} | "
        f"{again['in_process']:.2f} |",
    ]
    write_results("train_startup", res, "\n".join(lines))


if __name__ == "__main__":
    main()
