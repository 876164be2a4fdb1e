"""Faults: what happens and how long recovery takes (#11), measured in one run on this machine.

1. A training worker killed mid-run (2 workers, tiny seeded BERT, 6 steps, checkpoints every 2):
   the same run without and with worker 1 hard-crashing at step 5, for DDP and DeepSpeed ZeRO-2 -
   wall time of each (the difference is the cost of the restart) and the final STS-B dev score
   of each (equal when the resume is exact: RNG states travel in the checkpoint).
2. Tracking server unreachable at start: seconds until ``jobs/train.py`` exits, and its message.
3. S3 endpoint unreachable at start: the same.
4. Tracking server gone after training: seconds to keep the run in a pending file.

Second pass (#18), ``--second-pass`` (measured on its own, appended to the table):
5. MLflow killed mid-sweep (a real server, killed while the first of two trials trains): how the job
   ends, then the server restarted and ``--resume``: its wall time, versions and child runs after it.
6. Two builds of one corpus at once (two processes, two local Rays, one content address): both end,
   which build readers get, wall time of the pair against one build alone.
7. A model download cut halfway (the cache left as a killed download leaves it: weights truncated,
   no commit marker): the next read fetches it again; its time against a cached read.

    python bench/faults.py
    python bench/faults.py --second-pass
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write_results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_model(out: Path) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.export import export_encoder
    from orchestrator.models import load_tokenizer

    tok = load_tokenizer("default")
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=tok.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return export_encoder(BertModel(cfg), tok, out, pooling="mean")


def job(args: list[str], cwd: Path, env: dict | None = None) -> tuple[float, int, str]:
    t0 = time.time()
    res = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    return time.time() - t0, res.returncode, (res.stderr.strip().splitlines() or [""])[-1]


def main() -> None:
    if "--second-pass" in sys.argv:
        return second_pass()
    from orchestrator.data.corpus import CorpusConfig, run_pipeline
    from orchestrator.drivers.cluster import init_ray
    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import build_trainer, fit
    from trainers.sifter_simcse import ContrastiveConfig

    tmp = Path(tempfile.mkdtemp(prefix="sieve-faults-"))
    model = tiny_model(tmp / "tiny")
    init_ray(quiet=True)
    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()[:160]
    (tmp / "c.txt").write_text("\n".join(lines) + "\n")
    shards = str(tmp / "aug")
    run_pipeline(
        CorpusConfig(input=str(tmp / "c.txt"), parser={"workers": 1, "cpus_per_worker": 0.5}),
        shards,
        progress=False,
    )
    method = get_method("sifter_simcse")
    rows = []
    for label, ds in (("DDP", {}), ("DeepSpeed ZeRO-2", {"stage": 2})):
        result = {}
        for crash in (False, True):
            cfg = ContrastiveConfig.model_validate(
                {
                    "model": {"name_or_path": str(model), "max_length": 16},
                    "train": {"lr": 1e-4, "batch_size": 8, "max_steps": 6, "eval_steps": 2},
                    "scaling": {"num_workers": 2, "cpus_per_worker": 1},
                    "deepspeed": ds,
                    "eval": {"batch_size": 256, "max_length": 32},
                    "run": {"storage": str(tmp / "store"), "max_failures": 1},
                }
            )
            if crash:
                os.environ.update(
                    SIEVE_FAIL_AT_STEP="5",
                    SIEVE_FAIL_RANK="1",
                    SIEVE_FAIL_MARKER=str(tmp / f"marker-{len(rows)}"),
                )
            t0 = time.time()
            out = fit(
                build_trainer(method, cfg, shards, name=f"{label[:3]}-{crash}-{time.time_ns()}"), method, cfg
            )
            result[crash] = {
                "wall_s": time.time() - t0,
                "dev": out.history[-1]["stsb_dev_spearman"],
                "restarts": out.history[-1]["restarts"],
            }
            for k in ("SIEVE_FAIL_AT_STEP", "SIEVE_FAIL_RANK", "SIEVE_FAIL_MARKER"):
                os.environ.pop(k, None)
        rows.append(
            {
                "fault": f"worker 1 killed at step 5 ({label}, 2 workers)",
                "clean": result[False],
                "crashed": result[True],
            }
        )
        print(rows[-1])

    dead = f"http://127.0.0.1:{free_port()}"
    t, rc, msg = job([str(ROOT / "jobs" / "train.py"), "--method", "simcse", "--tracking-uri", dead], tmp)
    starts = [{"fault": "MLflow unreachable at start (train job)", "seconds": t, "exit": rc, "message": msg}]
    t, rc, msg = job(
        [
            str(ROOT / "jobs" / "train.py"),
            "--method",
            "simcse",
            "--storage",
            "s3://sieve-bench/x",
            "--tracking-uri",
            f"sqlite:///{tmp / 'm.db'}",
        ],
        tmp,
        {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
        },
    )
    starts.append(
        {"fault": "S3 endpoint unreachable at start (train job)", "seconds": t, "exit": rc, "message": msg}
    )

    from orchestrator import outbox

    record = outbox.run_record(
        experiment="faults",
        run_name="bench",
        method="simcse",
        params={"a": 1},
        history=[{"step": 2, "loss": 1.0}],
        metrics={"x": 1.0},
    )
    t0 = time.time()
    outbox.log_or_defer(record, dead, str(tmp / "pending"))
    deferred = time.time() - t0

    md = [
        "# Faults and recovery (`python bench/faults.py`, 2-core CPU)",
        "",
        "| fault | what happened | time |",
        "|---|---|---|",
    ]
    for r in rows:
        c, k = r["clean"], r["crashed"]
        md.append(
            f"| {r['fault']} | resumed from the step-4 checkpoint ({k['restarts']} restart) and finished; final STS-B "
            f"dev {k['dev'] * 100:.3f} vs {c['dev'] * 100:.3f} uninterrupted (Δ {abs(k['dev'] - c['dev']) * 100:.3f} "
            f"points) | run {k['wall_s']:.0f} s vs {c['wall_s']:.0f} s: restart cost {k['wall_s'] - c['wall_s']:.0f} s |"
        )
    for s in starts:
        md.append(
            f"| {s['fault']} | exit {s['exit']}, one line: `{s['message'][:140]}` | {s['seconds']:.1f} s |"
        )
    md.append(
        f"| MLflow gone after training | run kept in `outputs/tracking-pending/<name>.json`, one warning; "
        f"`jobs/sync_tracking.py` logs it later (tested) | {deferred:.1f} s |"
    )
    md += [
        "| driver killed mid-sweep | `--resume` finishes; finished trials not re-run; one MLflow child per trial "
        "(`tests/e2e/test_sweep.py`) | the unfinished trial restarts from its last checkpoint |",
        "| checkpoint upload interrupted | folders without `_COMPLETE` are never listed as complete or resumed "
        "(`tests/test_storage.py`) | – |",
        "| bad config / data / model path | one line naming the key, file:line or URI, exit 2, nothing written "
        "(24 cases, `tests/test_reliability.py`) | < 2 s each |",
    ]
    write_results(
        "faults", {"worker_faults": rows, "start_faults": starts, "defer_s": deferred}, "\n".join(md)
    )


BIN = Path(sys.executable).parent


def wait_http(url: str, timeout_s: float) -> None:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} did not answer in {timeout_s} s")


def mlflow_server(root: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'db.sqlite'}",
            "--default-artifact-root",
            str(root / "artifacts"),
            "--serve-artifacts",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--uvicorn-opts",
            "--timeout-worker-healthcheck 120",
        ],
        stdout=open(root / "server.log", "a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_http(f"http://127.0.0.1:{port}/health", 120)
    return proc


def mlflow_down_mid_sweep(tmp: Path, model: Path) -> dict:
    import signal

    import yaml

    root = tmp / "mlflow"
    root.mkdir()
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = mlflow_server(root, port)
    cfg = {
        "method": "sifter_simcse",
        "base": str(ROOT / "configs" / "sifter_simcse" / "smoke.yaml"),
        "base_overrides": {
            "model.name_or_path": str(model),
            "model.max_length": 16,
            "train.batch_size": 8,
            "train.max_steps": 4,
            "train.eval_steps": 2,
            "data.limit": 120,
            "data.parser_workers": 1,
            "eval.tasks": ["stsb"],
            "eval.max_length": 32,
        },
        "sweep": {
            "num_samples": 1,
            "scheduler": {"type": "fifo"},
            "space": {
                "lambdas": {
                    "grid": [
                        {"lambda_xx": 0, "lambda_xy": 1, "lambda_xz": 1, "lambda_yz": 1},
                        {"lambda_xx": 1, "lambda_xy": 0, "lambda_xz": 0, "lambda_yz": 0},
                    ]
                }
            },
        },
    }
    (tmp / "sweep.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [
        sys.executable,
        str(ROOT / "jobs" / "sifter_sweep.py"),
        "--config",
        str(tmp / "sweep.yaml"),
        "--name",
        "outage",
        "--no-progress",
        "--storage",
        str(tmp / "store"),
        "--tracking-uri",
        uri,
    ]
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
    t0 = time.time()
    job_proc = subprocess.Popen(
        cmd, cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    invocations = tmp / "store" / "sweeps" / "outage" / "invocations"
    while not (invocations.is_dir() and any(invocations.iterdir())):
        if job_proc.poll() is not None:
            raise SystemExit(job_proc.stdout.read()[-3000:])
        time.sleep(0.5)
    os.killpg(server.pid, signal.SIGKILL)  # the server dies while trial 1 trains
    killed_at = time.time() - t0
    out, _ = job_proc.communicate(timeout=900)
    first = {
        "exit": job_proc.returncode,
        "last_line": out.strip().splitlines()[-1],
        "wall_s": time.time() - t0,
        "killed_at_s": killed_at,
    }
    server = mlflow_server(root, port)  # back, same store
    t0 = time.time()
    res = subprocess.run([*cmd, "--resume"], cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    resume_s = time.time() - t0
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment_by_name("sieve")
    children = client.search_runs([exp.experiment_id], "tags.`sieve.role` = 'trial'")
    versions = client.search_model_versions("name = 'sifter-simcse'")
    trained = len({p.name.rsplit("-", 1)[0] for p in invocations.iterdir()})
    starts = len(list(invocations.iterdir()))
    os.killpg(server.pid, signal.SIGKILL)
    return {
        "fault": "MLflow server killed mid-sweep (while trial 1 of 2 trained)",
        **first,
        "resume_exit": res.returncode,
        "resume_s": resume_s,
        "resume_last_line": res.stdout.strip().splitlines()[-1],
        "children": len(children),
        "versions": len(versions),
        "trials_trained": trained,
        "training_starts": starts,
    }


def concurrent_corpus_builds(tmp: Path) -> dict:
    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()[:400]
    (tmp / "cc.txt").write_text("\n".join(lines) + "\n")
    code = (
        "import os, sys, json; os.environ['RAY_ADDRESS'] = 'local'; sys.path.insert(0, sys.argv[1]); "
        "from orchestrator.drivers.cluster import init_ray; init_ray(quiet=True); "
        "from orchestrator.data.corpus import CorpusConfig, run_pipeline; from orchestrator import storage; "
        "cfg = CorpusConfig(input=sys.argv[2], parser={'workers': 1, 'cpus_per_worker': 1}); "
        "print(storage.build_committed(sys.argv[3], lambda out: run_pipeline(cfg, out, progress=False)))"
    )

    def build(out: str, n: int) -> tuple[float, list]:
        t0 = time.time()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(ROOT), str(tmp / "cc.txt"), out],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        res = [(p.communicate(timeout=600), p.returncode) for p in procs]
        return time.time() - t0, res

    alone_s, _ = build(str(tmp / "alone"), 1)
    pair_s, res = build(str(tmp / "shared"), 2)
    from orchestrator import storage

    current = storage.resolve_build(str(tmp / "shared"))
    got = [out.strip().splitlines()[-1] if rc == 0 else err[-300:] for (out, err), rc in res]
    import json as _json

    manifest = _json.loads(Path(current, "manifest.json").read_text())
    return {
        "fault": "two builds of one corpus at once (400 sentences, 2 processes)",
        "exits": [rc for _, rc in res],
        "both_got_current": all(g == current for g in got),
        "attempts": len(list((tmp / "shared" / "attempts").iterdir())),
        "rows": manifest["written"],
        "pair_s": pair_s,
        "alone_s": alone_s,
    }


def cut_download(tmp: Path) -> dict:
    import boto3

    from orchestrator import models

    port = free_port()
    moto = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="y",
        AWS_DEFAULT_REGION="us-east-1",
    )
    wait_http(f"http://127.0.0.1:{port}/moto-api/", 30)
    from orchestrator import storage

    boto3.client("s3").create_bucket(Bucket="models")
    storage.put_dir(models.resolve_model_source("default"), "s3://models/minilm")
    t0 = time.time()
    local = Path(models.resolve_model_source("s3://models/minilm", tmp / "cache"))
    first_s = time.time() - t0
    weights = max(local.rglob("*.safetensors"), key=lambda p: p.stat().st_size)
    size = weights.stat().st_size
    with open(weights, "r+b") as fh:  # what a download killed halfway leaves
        fh.truncate(size // 2)
    (local / storage.COMPLETE_MARKER).unlink()
    t0 = time.time()
    again = Path(models.resolve_model_source("s3://models/minilm", tmp / "cache"))
    refetch_s = time.time() - t0
    t0 = time.time()
    models.resolve_model_source("s3://models/minilm", tmp / "cache")
    cached_s = time.time() - t0
    ok = max(again.rglob("*.safetensors"), key=lambda p: p.stat().st_size).stat().st_size == size
    models.load_encoder(str(again))  # it loads
    moto.terminate()
    return {
        "fault": "model download cut halfway (weights truncated, no commit marker)",
        "refetched_whole": ok,
        "first_s": first_s,
        "refetch_s": refetch_s,
        "cached_s": cached_s,
        "size_mb": size / 2**20,
    }


def second_pass() -> None:
    import json

    tmp = Path(tempfile.mkdtemp(prefix="sieve-faults2-"))
    model = tiny_model(tmp / "tiny")
    rows = [mlflow_down_mid_sweep(tmp, model)]
    print(rows[-1], flush=True)
    rows.append(concurrent_corpus_builds(tmp))
    print(rows[-1], flush=True)
    rows.append(cut_download(tmp))
    print(rows[-1], flush=True)
    m, c, d = rows
    md = [
        "",
        "## Second pass (#18): `python bench/faults.py --second-pass`",
        "",
        "| fault | what happened | what was lost | recovery |",
        "|---|---|---|---|",
        f"| {m['fault']} | training went on (live logging buffered); the job ended with exit {m['exit']} and one "
        f"line: `{m['last_line'][:160]}…`; server restarted, `--resume` (exit {m['resume_exit']}): "
        f"{m['children']} child runs, {m['versions']} version | nothing: {m['trials_trained']} trials trained, "
        f"{m['training_starts']} training starts in all | resume {m['resume_s']:.0f} s (publishes, trains nothing) |",
        f"| {c['fault']} | exits {c['exits']}; both returned the build `CURRENT` names: {c['both_got_current']}; "
        f"{c['attempts']} attempt folders (the later one is left unused), {c['rows']} rows | nothing | pair "
        f"{c['pair_s']:.0f} s vs one build alone {c['alone_s']:.0f} s |",
        f"| {d['fault']} | the next read found no commit marker and fetched the model again "
        f"({d['size_mb']:.0f} MiB weights, whole: {d['refetched_whole']}); it loads | nothing | re-fetch "
        f"{d['refetch_s']:.1f} s (first fetch {d['first_s']:.1f} s, cached read {d['cached_s']:.2f} s) |",
        "| a resume after publish was cut (after export, log, register or alias) | completed by the next "
        "`--resume` without duplicates: tested for sweeps (`tests/e2e/test_sweep.py`, `tests/test_tracking.py`) "
        "and the experiments job (`tests/test_siamese.py`) | nothing | as the MLflow row's resume |",
        # measured by tests/e2e/test_two_nodes.py (`pytest -s` prints these figures), not here: it needs the
        # test's two-node cluster
        "| a worker node lost (2 Ray nodes on loopback, 2-worker trial STRICT_SPREAD over both, model, corpus "
        "and runs on S3; the second node SIGKILLed after the trial's step-2 checkpoint reached the bucket; "
        "`pytest -s tests/e2e/test_two_nodes.py`, one run) | the head noticed after 15.0 s; a fresh node joined "
        "at 19.6 s; the trial resumed on it from the step-2 checkpoint in S3 (1 restart), finished at step 6 and "
        "was registered (version 1); the new node fetched the model from S3 into its own cache | the steps "
        "trained since the last checkpoint (step 2) | job ended 42.2 s after the loss |",
    ]
    finished = ROOT / "bench" / "results" / "resume_finished.json"  # measured by bench/resume_finished.py
    if finished.is_file():
        r = {row["run"].split(",")[0].split(" (")[0]: row for row in json.loads(finished.read_text())["rows"]}
        fast, full = r["`--resume`"], r["`--resume` without the record"]
        md.append(
            f"| `--resume` of a sweep that had finished and published (`bench/resume_finished.py`, the smoke "
            f"sweep) | answered from its record (`published.json`): no Ray, no corpus, no base measured, "
            f"nothing trained or registered (exit {fast['exit']}) "
            f"| nothing | **{fast['wall_s']:.1f} s**, against {full['wall_s']:.1f} s for the whole resume "
            "path it took before (#39.4) |"
        )
    path = ROOT / "bench" / "results" / "faults.json"
    data = json.loads(path.read_text())
    data["second_pass"] = rows
    path.write_text(json.dumps(data, indent=2) + "\n")
    md_path = ROOT / "bench" / "results" / "faults.md"
    text = md_path.read_text().split("\n## Second pass", 1)[0].rstrip("\n")
    md_path.write_text(text + "\n" + "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--second-pass", action="store_true", help="faults 5-7 (measured on their own, appended)")
    ap.parse_args()
    main()
