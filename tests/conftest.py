"""Shared fixtures: real services on loopback, started once per test session.

* ``s3_endpoint``: a real S3-compatible HTTP server (``moto_server``) on 127.0.0.1.
* ``postgres_uri``: a real PostgreSQL on 127.0.0.1 (MLflow's backend in the cluster), or None on a
  machine without PostgreSQL.
* ``mlflow_server``: a real ``mlflow server`` on 127.0.0.1: on PostgreSQL with 2 workers, as the
  cluster runs it, where PostgreSQL exists; SQLite with 1 worker otherwise.
* ``ray_cluster``: a real local Ray head (``ray start --head``) shared by every Ray test.
Nothing here is mocked.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

import orchestrator  # noqa: F401 - the jobs' environment defaults (offline hub, Train V2), before any test imports

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")  # the tests read what a run logged at once

# Ray reads its auth settings when it is imported, and test modules import the drivers (and so ray) at
# collection time: the session's token file and mode are set here, before any of them. The token is
# private to this test session (the ray_cluster fixture's head is started with it).
_RAY_DIR = Path(tempfile.mkdtemp(prefix="sieve-ray-auth-"))
RAY_TOKEN_FILE = _RAY_DIR / "auth_token"
RAY_TOKEN_FILE.write_text(secrets.token_hex(32))
RAY_TOKEN_FILE.chmod(0o600)
os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(RAY_TOKEN_FILE)})


SERVICE_FIXTURES = {"ray_cluster", "tiny_shards", "mlflow_server", "postgres_uri", "s3_endpoint", "s3_bucket"}


def pytest_collection_modifyitems(config, items):
    """A test that needs a service (the Ray cluster, MLflow, PostgreSQL, the S3 endpoint) is marked ``services``:
    ``make test-fast`` runs the rest - no Ray, no server - as the inner loop."""
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


def pytest_unconfigure(config):
    """The session's token is a secret: not left behind in /tmp once the session (and its cluster) ended."""
    shutil.rmtree(_RAY_DIR, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except Exception:  # noqa: BLE001
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s")


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """A moto S3 server on loopback; sets the AWS env vars for this process and children."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    proc = subprocess.Popen(
        [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ENDPOINT_URL": url,
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        wait_http(url + "/moto-api/", 30, proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_bucket(s3_endpoint, request):
    import re

    import boto3

    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[:40].strip("-")
    name = f"test-{name}-{os.getpid()}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return f"s3://{name}"


def postgres_bin() -> Path | None:
    """The newest PostgreSQL server binaries on the machine (Debian's layout, else the PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if found:
        return found[-1].parent
    which = shutil.which("initdb")
    return Path(which).parent if which and shutil.which("pg_ctl") else None


@pytest.fixture(scope="session")
def postgres_uri():
    """A throwaway PostgreSQL cluster on 127.0.0.1 (trust auth on loopback: a test database), with an
    empty ``mlflow`` database; None where the machine has no PostgreSQL. initdb refuses root, so as
    root the server runs as the ``postgres`` user."""
    pg = postgres_bin()
    if pg is None:
        yield None
        return
    import psycopg2

    root = Path(tempfile.mkdtemp(prefix="sieve-pg-", dir="/tmp"))  # not under pytest's 0700 tree
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    try:
        try:
            subprocess.run(
                [*as_user, str(pg / "initdb"), "-D", str(data), "-U", "mlflow", "--auth=trust", "-E", "UTF8"],
                check=True,
                capture_output=True,
                timeout=120,
            )
            subprocess.run(
                [
                    *as_user,
                    str(pg / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(root / "server.log"),
                    "-w",
                    "-o",
                    f"-p {port} -k {root} -c listen_addresses=127.0.0.1",
                    "start",
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            conn = psycopg2.connect(host="127.0.0.1", port=port, user="mlflow", dbname="postgres")
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("CREATE DATABASE mlflow")  # the mlflow_server fixture's
                cur.execute("CREATE DATABASE serve")  # infra/mlflow/serve.py's, in tests/infra
            conn.close()
        except (
            subprocess.SubprocessError,
            OSError,
            psycopg2.Error,
        ) as exc:  # a machine whose PostgreSQL cannot start
            detail = getattr(exc, "stderr", b"") or b""
            print(
                f"\nwarning: PostgreSQL at {pg} did not start ({exc}; {detail.decode(errors='replace')[-300:]}); "
                "MLflow tests use SQLite",
                file=sys.stderr,
            )
            yield None
            return
        # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; the stack (and the image) has psycopg2
        yield f"postgresql+psycopg2://mlflow@127.0.0.1:{port}/mlflow"
    finally:
        subprocess.run(
            [*as_user, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def start_mlflow_server(root: Path, port: int, backend: str, workers: int = 1) -> subprocess.Popen:
    """``mlflow server`` on 127.0.0.1:``port`` (artifacts and log under ``root``), answering /health; a
    process group of its own, so that a test can kill it (and start it again on the same store)."""
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "server",
            "--backend-store-uri",
            backend,
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
            str(workers),
            # uvicorn kills a worker that misses a 5 s health ping; on loaded cores importing MLflow takes
            # longer, and the workers were killed and restarted until the fixture gave up
            "--uvicorn-opts",
            "--timeout-worker-healthcheck 120",
        ],
        stdout=open(root / "server.log", "a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
    except BaseException:
        os.killpg(proc.pid, 9)  # a server that never answered is not left behind
        raise
    return proc


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, postgres_uri):
    """A real MLflow tracking server on 127.0.0.1 (about 15 s to start): PostgreSQL and 2 workers like
    the cluster's, where PostgreSQL exists; SQLite and 1 worker otherwise."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    backend, workers = (postgres_uri, 2) if postgres_uri else (f"sqlite:///{root / 'db.sqlite'}", 1)
    proc = start_mlflow_server(root, port, backend, workers)
    url = f"http://127.0.0.1:{port}"
    try:
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:  # a loaded machine: do not fail the session over it
            os.killpg(proc.pid, 9)
            proc.wait(20)


_TORCH_THREADS: list[int] = []  # torch's thread count as the session found it


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test that pins torch to 1 thread (golden values are recorded at 1) does not leave every later test of
    the session on 1 thread: it did, and the in-process evaluations after it (the STS harness against
    sentence-transformers, each driver-side export and test) ran on one of the two cores."""
    import torch

    if not _TORCH_THREADS:
        _TORCH_THREADS.append(torch.get_num_threads())
    yield
    if torch.get_num_threads() != _TORCH_THREADS[0]:
        torch.set_num_threads(_TORCH_THREADS[0])


@pytest.fixture
def embedded_tracking(tmp_path, monkeypatch):
    """An embedded MLflow store in a fresh directory (cwd moved there)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture(scope="session")
def default_encoder():
    from orchestrator.models import load_encoder

    return load_encoder("default")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    """A tiny random BERT with MiniLM's real vocabulary, saved as a model folder (seeded)."""
    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.export import export_encoder
    from orchestrator.models import load_tokenizer

    out = tmp_path_factory.mktemp("tiny") / "tiny-bert"
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
    export_encoder(BertModel(cfg), tok, out, pooling="mean")
    return out


def stop_ray_processes(temp_dir: str, timeout_s: float = 5, graceful: bool = True, also=None) -> None:
    """SIGTERM, then SIGKILL, every process whose command line names ``temp_dir``, or for which ``also``
    (a test of the joined command line) holds (``graceful=False``: SIGKILL only, as a lost machine says no
    goodbye).

    gcs_server and raylet do not exit on SIGTERM within 30 s (measured); the test cluster holds
    nothing worth a graceful drain, so they get ``timeout_s`` before SIGKILL."""
    import psutil

    mine = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if any(temp_dir in part for part in cmdline) or (also is not None and also(" ".join(cmdline))):
                mine.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    for proc in mine:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate() if graceful else proc.kill()

    def gone(proc) -> bool:  # a zombie (its parent, also ours, died first) is gone for our purposes
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(gone(p) for p in mine):
        time.sleep(0.2)
    for proc in mine:
        if not gone(proc):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory, s3_endpoint):
    """A real local Ray head (4 logical CPUs, token auth on, dashboard on loopback), shared by all tests.

    Jobs and tests connect through ``RAY_ADDRESS`` with a session-private token file. The S3
    endpoint's variables are in the head's environment, as a cluster's pod identity would be.
    """
    port, dashboard, client = free_port(), free_port(), free_port()
    # Every port the head's agents open, chosen free: the defaults (agent HTTP 52365, ...) are fixed, so a
    # second Ray on the machine (another test run, a user's `ray start`) made this head's job agent fail to
    # bind, and `ray job submit` answer "No available agent to submit job" for minutes.
    agent_ports = [
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--ray-client-server-port={client}",
    ]
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(RAY_TOKEN_FILE)}  # set at import (above)
    # no Ray Train preemption watcher (an actor per worker group polling for drained nodes; no test drains one,
    # and a job's private local Ray runs without it too): ~2 CPU-s of each of the suite's ~50 worker groups
    env["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"
    os.environ.update(env)
    # the venv's bin first on PATH: `ray job submit` entrypoints resolve `python` from ray start's PATH
    start_env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    # a private temp dir (short: Ray's socket paths live under it) identifies this cluster's
    # processes, so teardown stops them alone - never `ray stop`, which kills every Ray on the machine
    temp_dir = tempfile.mkdtemp(prefix="sieve-ray-", dir="/tmp")
    import ray

    try:  # from here on, whatever fails, the cluster's processes are stopped (a leftover head confuses later runs)
        # a lost node is noticed after 5 health checks 1 s apart (Ray's default: 3 s apart, 15 s for the two-node
        # test to see its killed node go); a busy live node still has each check's 10 s timeout to answer
        health = json.dumps({"health_check_period_ms": 1000})
        subprocess.run(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--num-cpus=4",
                f"--port={port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--temp-dir={temp_dir}",
                "--disable-usage-stats",
                f"--system-config={health}",
                *agent_ports,
            ],
            check=True,
            capture_output=True,
            timeout=120,
            env=start_env,
        )
        os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
        os.environ["SIEVE_TEST_DASHBOARD"] = f"http://127.0.0.1:{dashboard}"
        os.environ["SIEVE_TEST_RAY_TEMP"] = temp_dir  # its session logs, for tests that search them
        ray.init()
        yield os.environ["RAY_ADDRESS"]
    finally:
        ray.shutdown()
        # the head's Ray client server names neither the temp dir nor anything but its port: it outlived the
        # suite (seen: still running after a full run) and held the fixed default port, 10001, for the next
        stop_ray_processes(
            temp_dir, also=lambda cmd: "ray.util.client.server" in cmd and f"--port={client}" in cmd.split()
        )
        shutil.rmtree(temp_dir, ignore_errors=True)
        for k in ["RAY_ADDRESS", "SIEVE_TEST_DASHBOARD", "SIEVE_TEST_RAY_TEMP"]:
            os.environ.pop(k, None)


def ray_state_report() -> str:
    """What the session's Ray cluster holds now: resources, nodes, live actors and placement groups, tasks
    not yet scheduled, and the resource requests Ray Data and Ray Train have made to Ray Data's
    autoscaling coordinator (it splits the cluster between them: a stale request starves the others).
    Each part on its own, so one that fails does not hide the rest."""
    import ray
    from ray.util import state

    def coordinator_requests(actor):  # runs inside the coordinator actor
        now = time.time()
        return {
            str(k): {
                "priority": r.priority,
                "wants": r.requested_resources,
                "expires_in_s": round(r.expiration_time - now),
                "reserved": r.reserved_resources,
            }
            for k, r in actor._ongoing_reqs.items()
        }

    parts = {
        "available": lambda: ray.available_resources(),
        "total": lambda: ray.cluster_resources(),
        "nodes": lambda: [(n["NodeID"][:8], n["Alive"], n["Resources"].get("CPU")) for n in ray.nodes()],
        "actors": lambda: [
            (a.class_name, a.state, a.job_id, (a.node_id or "")[:8], a.required_resources)
            for a in state.list_actors(filters=[("state", "!=", "DEAD")], detail=True, limit=500)
        ],
        "placement groups": lambda: [
            (p.placement_group_id[:8], p.state, p.creator_job_id, p.bundles)
            for p in state.list_placement_groups(detail=True, limit=500)
            if p.state != "REMOVED"
        ],
        "tasks not running": lambda: [
            (t.name, t.state, t.job_id, t.required_resources)
            for t in state.list_tasks(detail=True, limit=500)
            if t.state.startswith("PENDING")
        ],
        "coordinator requests": lambda: ray.get(
            ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator").__ray_call__.remote(
                coordinator_requests
            ),
            timeout=10,
        ),
    }
    lines = []
    for what, get in parts.items():
        try:
            lines.append(f"{what}: {get()}")
        except Exception as e:  # noqa: BLE001 - a report, not a check
            lines.append(f"{what}: (could not read: {e!r})")
    return "\n".join(lines)


@pytest.fixture(autouse=True)
def _ray_state_before_timeout(request):
    """A test on the Ray cluster that is about to run out of time prints what the cluster holds (to the test's
    captured stderr, which a failure shows): a hang seen once in CI (two corpus builds that needed 2 parser
    actors waited 300 s each, after the e2e tests; a 1-actor build between them passed) left nothing to read."""
    if "ray_cluster" not in request.fixturenames:
        yield
        return
    marker = request.node.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(request.config.getini("timeout") or 0)
    if limit <= 0:
        yield
        return
    import threading

    after = max(limit - 45, limit * 0.75)  # before pytest-timeout's limit, which also counts fixtures' set-up

    def report():
        print(
            f"\n{request.node.nodeid}: {after:.0f} s in, {limit:.0f} s allowed; the Ray cluster now:\n"
            f"{ray_state_report()}",
            file=sys.stderr,
            flush=True,
        )

    timer = threading.Timer(after, report)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest.fixture(scope="session")
def job_server(tmp_path_factory):
    """Job processes forked from one that imported the jobs' libraries once (tests/job_server.py): an end-to-end
    test's ``python jobs/x.py`` without ~8 s of imports per start."""
    from forked import JobServer

    server = JobServer(Path(tempfile.mkdtemp(prefix="sieve-jobs-", dir="/tmp")))  # short: a socket path
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_shards(ray_cluster, tmp_path_factory):
    """160 WikiSplit sentences through the real corpus pipeline (spaCy, one actor)."""
    from orchestrator.data.corpus import CorpusConfig, run_pipeline

    root = tmp_path_factory.mktemp("corpus")
    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()[:160]
    (root / "c.txt").write_text("\n".join(lines) + "\n")
    run_pipeline(
        CorpusConfig(input=str(root / "c.txt"), parser={"workers": 1, "cpus_per_worker": 0.5}),
        str(root / "aug"),
        progress=False,
    )
    return str(root / "aug")
