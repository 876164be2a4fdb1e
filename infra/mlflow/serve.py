"""Entrypoint of the in-cluster MLflow server (infra/terraform/modules/mlflow runs it).

    python infra/mlflow/serve.py --db-secret-arn ARN --artifacts-destination s3://BUCKET/mlflow \
        --allowed-hosts mlflow.sieve.svc:5000,... [--host 0.0.0.0 --port 5000]

1. The database credential comes from Secrets Manager (``--db-secret-arn``, read through the pod's
   IRSA role) or, for local runs and tests, ``--backend-store-uri``. It reaches the server in the
   ``MLFLOW_BACKEND_STORE_URI`` environment variable and a 0600 config file on the pod's in-memory
   /tmp: never argv (visible in ``ps``), a manifest, a log line or Terraform state.
2. MLflow's basic-auth app guards every API: the admin credential is read by MLflow itself from
   ``MLFLOW_AUTH_ADMIN_USERNAME`` / ``MLFLOW_AUTH_ADMIN_PASSWORD`` (a Kubernetes secret); the auth
   tables live in the same database (their own alembic version table). The forms' CSRF key is
   ``MLFLOW_FLASK_SERVER_SECRET_KEY`` (same secret).
3. Once the server answers, the non-admin jobs user (``SIEVE_JOBS_USERNAME`` /
   ``SIEVE_JOBS_PASSWORD``, the secret the Ray pods get as ``MLFLOW_TRACKING_USERNAME`` /
   ``MLFLOW_TRACKING_PASSWORD``) is created, or its password reset to the secret's value.
4. The process then waits on the server and passes SIGTERM on, exiting with its status.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from base64 import b64encode
from pathlib import Path


def log(msg: str) -> None:
    print(f"[serve] {msg}", file=sys.stderr, flush=True)


def backend_uri_from_secret(arn: str) -> str:
    """``postgresql+psycopg2://user:pass@host:port/db?sslmode=require`` from the RDS secret (JSON)."""
    import boto3  # the image has it (S3 artifacts); lazy so --help works without AWS libraries

    raw = boto3.client("secretsmanager").get_secret_value(SecretId=arn)["SecretString"]
    s = json.loads(raw)
    missing = {"username", "password", "host", "port", "dbname"} - set(s)
    if missing:
        raise SystemExit(f"{arn}: the database secret lacks {sorted(missing)}")
    user, pw = urllib.parse.quote(s["username"], safe=""), urllib.parse.quote(s["password"], safe="")
    # the driver named: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, the image has psycopg2
    return f"postgresql+psycopg2://{user}:{pw}@{s['host']}:{s['port']}/{s['dbname']}?sslmode=require"


def write_auth_config(backend_uri: str, directory: Path) -> Path:
    """MLflow's basic-auth config: users in the tracking database, everyone authenticated may read."""
    path = directory / "basic_auth.ini"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = {backend_uri.replace('%', '%%')}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
    return path


def call(
    base: str, path: str, *, method: str, auth: tuple[str, str], body: dict, host: str
) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method)
    req.add_header("Content-Type", "application/json")
    req.add_header("Host", host)
    req.add_header("Authorization", "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback http
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"mlflow server exited with status {proc.returncode} before answering /health")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2):  # noqa: S310 - loopback http
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise SystemExit(f"mlflow server did not answer {base}/health within {timeout_s:.0f} s")


def ensure_jobs_user(base: str, host: str, admin: tuple[str, str], jobs: tuple[str, str]) -> str:
    """Create the jobs user, or set its password to the secret's (the secret is the truth)."""
    status, body = call(
        base,
        "/api/2.0/mlflow/users/create",
        method="POST",
        auth=admin,
        body={"username": jobs[0], "password": jobs[1]},
        host=host,
    )
    if status == 200:
        return "created"
    if body.get("error_code") != "RESOURCE_ALREADY_EXISTS":
        raise SystemExit(
            f"creating MLflow user {jobs[0]!r} failed: HTTP {status} {body.get('error_code', '')}"
        )
    status, body = call(
        base,
        "/api/2.0/mlflow/users/update-password",
        method="PATCH",
        auth=admin,
        body={"username": jobs[0], "password": jobs[1]},
        host=host,
    )
    if status != 200:
        raise SystemExit(
            f"updating MLflow user {jobs[0]!r} failed: HTTP {status} {body.get('error_code', '')}"
        )
    return "password updated"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--db-secret-arn", help="Secrets Manager secret with username/password/host/port/dbname")
    src.add_argument("--backend-store-uri", help="database URI given directly (local runs, tests)")
    ap.add_argument("--artifacts-destination", required=True)
    ap.add_argument("--allowed-hosts", required=True, help="comma-separated Host headers, with ports")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--startup-timeout", type=float, default=180)
    args = ap.parse_args(argv)

    env = dict(os.environ)
    for name in (
        "MLFLOW_AUTH_ADMIN_USERNAME",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
        "SIEVE_JOBS_USERNAME",
        "SIEVE_JOBS_PASSWORD",
    ):
        if not env.get(name):
            raise SystemExit(f"{name} is not set (the mlflow-admin / mlflow-jobs Kubernetes secrets)")
    backend = args.backend_store_uri or backend_uri_from_secret(args.db_secret_arn)
    private = Path(tempfile.mkdtemp(prefix="mlflow-auth-"))  # 0700, on the in-memory /tmp in the pod
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(write_auth_config(backend, private))
    env["MLFLOW_BACKEND_STORE_URI"] = backend
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--app-name",
        "basic-auth",
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--workers",
        str(args.workers),
        "--artifacts-destination",
        args.artifacts_destination,
        "--serve-artifacts",
        "--allowed-hosts",
        args.allowed_hosts,
        # uvicorn kills a worker that misses a 5 s health ping; importing MLflow on a busy node takes
        # longer, and the workers were killed and restarted in a loop (seen on 2 loaded cores)
        "--uvicorn-opts",
        "--timeout-worker-healthcheck 120",
    ]
    log(
        f"starting MLflow (basic-auth) on {args.host}:{args.port}, artifacts {args.artifacts_destination}, "
        f"allowed hosts {args.allowed_hosts}"
    )
    proc = subprocess.Popen(cmd, env=env)  # noqa: S603 - fixed argv
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        base = f"http://127.0.0.1:{args.port}"
        wait_healthy(base, proc, args.startup_timeout)
        # Host as a port-forwarding person sends it: one of the rendered allowed hosts.
        host = next(
            (h for h in args.allowed_hosts.split(",") if h.startswith("127.0.0.1:")), f"127.0.0.1:{args.port}"
        )
        admin = (env["MLFLOW_AUTH_ADMIN_USERNAME"], env["MLFLOW_AUTH_ADMIN_PASSWORD"])
        jobs = (env["SIEVE_JOBS_USERNAME"], env["SIEVE_JOBS_PASSWORD"])
        log(f"jobs user {jobs[0]!r}: {ensure_jobs_user(base, host, admin, jobs)}")
    except BaseException:
        proc.terminate()
        proc.wait(30)
        raise
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
