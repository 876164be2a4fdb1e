"""The in-cluster MLflow server as the infra renders it, started for real on loopback.

``infra/mlflow/serve.py`` (the Deployment's entrypoint) runs MLflow's basic-auth app with the
``--allowed-hosts`` list read from ``infra/terraform/modules/mlflow/main.tf`` (namespace ``sieve``),
and a job calls it the way a Ray pod does: Host ``mlflow.sieve.svc:5000`` (what a client dialling
the module's tracking URI sends) and the credential MLflow resolves from
``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``. The database is a PostgreSQL on loopback
where the machine has one (SQLite otherwise); the Secrets Manager path that gives the cluster its RDS
URI is exercised against the moto endpoint.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from conftest import free_port
from test_terraform import INFRA, parse

MODULE = INFRA / "terraform" / "modules" / "mlflow"
SERVE = INFRA / "mlflow" / "serve.py"
NAMESPACE = "sieve"


def render(template: str, namespace: str = NAMESPACE, port: int | None = None) -> str:
    """Terraform's interpolation for the two references these strings use."""
    port = port if port is not None else module_locals()["port"]
    return template.replace("${var.namespace}", namespace).replace("${local.port}", str(port))


def module_locals() -> dict:
    (locals_,) = parse(MODULE / "main.tf")["locals"]  # one locals block
    return locals_


def rendered_allowed_hosts() -> list[str]:
    return [render(h) for h in module_locals()["allowed_hosts"]]


def in_cluster_host() -> str:
    """The Host header of a client that dials the module's tracking_uri output."""
    (out,) = [o for o in parse(MODULE / "outputs.tf")["output"] if "tracking_uri" in o]
    return urlsplit(render(out["tracking_uri"]["value"])).netloc


def test_rendered_hosts_carry_the_service_port():
    hosts = rendered_allowed_hosts()
    assert in_cluster_host() == "mlflow.sieve.svc:5000"
    assert in_cluster_host() in hosts and "127.0.0.1:5000" in hosts
    assert all(re.fullmatch(r"[a-z0-9.-]+:5000", h) for h in hosts), hosts


def test_the_old_value_is_caught():
    """A host list without the port rejects the in-cluster Host by MLflow's own rule."""
    from mlflow.server.security_utils import is_allowed_host_header

    old = ["mlflow", "mlflow.sieve", "mlflow.sieve.svc", "localhost:5000", "127.0.0.1:5000"]
    assert not is_allowed_host_header(old, in_cluster_host())
    assert is_allowed_host_header(rendered_allowed_hosts(), in_cluster_host())


def start(tmp: Path, port: int, env: dict, *extra: str, hosts: list[str] | None = None) -> subprocess.Popen:
    """serve.py on loopback; ``hosts``: the --allowed-hosts list (default: the one the infra renders)."""
    log = open(tmp / f"serve-{port}.log", "a")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [
            sys.executable,
            str(SERVE),
            "--port",
            str(port),
            "--workers",
            "1",
            "--allowed-hosts",
            ",".join(hosts or rendered_allowed_hosts()),
            "--artifacts-destination",
            str(tmp / "artifacts"),
            *extra,
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def wait_for_line(path: Path, needle: str, proc: subprocess.Popen, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if needle in text:
            return text
        if proc.poll() is not None:
            raise AssertionError(f"serve.py exited {proc.returncode}:\n{text[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {needle!r} in {path}")


@pytest.fixture(scope="module")
def served(tmp_path_factory, postgres_uri):
    tmp = tmp_path_factory.mktemp("mlflow-auth")
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_AUTH_ADMIN_USERNAME": "admin",
        "MLFLOW_AUTH_ADMIN_PASSWORD": "admin-password-1",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-1",
        "SIEVE_JOBS_USERNAME": "sieve-jobs",
        "SIEVE_JOBS_PASSWORD": "jobs-password-1",
    }
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        env.pop(k, None)
    # PostgreSQL as in the cluster (tracking and auth tables in one database), where the machine has it
    db = postgres_uri.rsplit("/", 1)[0] + "/serve" if postgres_uri else f"sqlite:///{tmp / 'mlflow.db'}"
    proc = start(tmp, port, env, "--backend-store-uri", db)
    try:
        text = wait_for_line(tmp / f"serve-{port}.log", "jobs user", proc)
        yield {
            "base": f"http://127.0.0.1:{port}",
            "tmp": tmp,
            "env": env,
            "db": db,
            "port": port,
            "log": text,
            "proc": proc,
        }
    finally:
        proc.terminate()
        proc.wait(30)


def job_credential(monkeypatch) -> tuple[str, str]:
    """What a Ray pod's MLflow client sends: resolved by MLflow from the pod's environment."""
    from mlflow.utils.credentials import get_default_host_creds

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "sieve-jobs")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "jobs-password-1")
    creds = get_default_host_creds("http://" + in_cluster_host())
    return creds.username, creds.password


def test_in_cluster_host_with_port_is_admitted_and_authenticated(served, monkeypatch):
    base, host = served["base"], in_cluster_host()
    assert "jobs user 'sieve-jobs': created" in served["log"]
    auth = job_credential(monkeypatch)
    assert requests.get(base + "/health", headers={"Host": host}, timeout=10).status_code == 200
    # The first API call a job makes, as the job makes it: admitted, authenticated, allowed.
    r = requests.post(
        base + "/api/2.0/mlflow/experiments/create",
        json={"name": "from-a-ray-pod"},
        headers={"Host": host},
        auth=auth,
        timeout=10,
    )
    assert r.status_code == 200, r.text
    r = requests.post(
        base + "/api/2.0/mlflow/registered-models/create",
        json={"name": "sieve-test"},
        headers={"Host": host},
        auth=auth,
        timeout=10,
    )
    assert r.status_code == 200, r.text


def test_refusals(served, monkeypatch):
    base, host = served["base"], in_cluster_host()
    auth = job_credential(monkeypatch)
    search = "/api/2.0/mlflow/experiments/search?max_results=1"
    assert requests.get(base + search, headers={"Host": host}, timeout=10).status_code == 401  # no credential
    assert (
        requests.get(
            base + search, headers={"Host": host}, auth=("sieve-jobs", "wrong"), timeout=10
        ).status_code
        == 401
    )
    for bad_host in ("mlflow.sieve.svc", "evil.example:5000", "mlflow.other.svc:5000"):
        r = requests.get(base + search, headers={"Host": bad_host}, auth=auth, timeout=10)
        assert r.status_code == 403, (bad_host, r.status_code)
    # The jobs user is not an admin: it cannot create users (or promote itself).
    r = requests.post(
        base + "/api/2.0/mlflow/users/create",
        json={"username": "x", "password": "y" * 12},
        headers={"Host": host},
        auth=auth,
        timeout=10,
    )
    assert r.status_code == 403, r.text


def test_a_host_outside_the_list_is_named_before_any_work(served, monkeypatch):
    """Our client from loopback on a test port sends a Host the rendered list does not hold: the
    preflight's probe says so in one line (``/health`` alone would have passed)."""
    from orchestrator import tracking
    from orchestrator.errors import TrackingError

    job_credential(monkeypatch)
    with pytest.raises(TrackingError, match=r"refused the Host header '127\.0\.0\.1:\d+' .*--allowed-hosts"):
        tracking.check_reachable(served["base"])


def test_the_jobs_credential_comes_from_the_environment(served, tmp_path, monkeypatch):
    """A server whose list admits our loopback Host: without MLFLOW_TRACKING_USERNAME/PASSWORD the
    preflight names the two variables; a wrong password is refused without being printed; the
    right one lets tracking.setup make the experiment."""
    import mlflow
    from mlflow.tracking import fluent
    from mlflow.tracking._tracking_service import utils as tracking_utils

    from orchestrator import tracking
    from orchestrator.errors import TrackingError

    # tracking.setup points MLflow (and MLFLOW_TRACKING_URI, for subprocesses) at this short-lived server:
    # put back what was there, or every later job subprocess would aim at a dead port
    before = (
        os.environ.get("MLFLOW_TRACKING_URI"),
        tracking_utils._tracking_uri,
        fluent._active_experiment_id,
    )
    port = free_port()
    for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(k, raising=False)
    proc = start(
        tmp_path,
        port,
        served["env"],
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'mlflow.db'}",
        hosts=[f"127.0.0.1:{port}"],
    )
    try:
        wait_for_line(tmp_path / f"serve-{port}.log", "jobs user", proc)
        uri = f"http://127.0.0.1:{port}"
        with pytest.raises(
            TrackingError, match="HTTP 401.*set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        ):
            tracking.setup(uri, "auth-check")
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "sieve-jobs")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "not-the-password")
        with pytest.raises(TrackingError, match="user 'sieve-jobs' and its password were refused") as err:
            tracking.setup(uri, "auth-check")
        assert "not-the-password" not in str(err.value)
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "jobs-password-1")
        assert tracking.setup(uri, "auth-check")
    finally:
        proc.terminate()
        proc.wait(30)
        mlflow.set_tracking_uri(before[1])
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if before[0] is not None:
            os.environ["MLFLOW_TRACKING_URI"] = before[0]
        fluent._active_experiment_id = before[2]


def test_restart_resets_the_jobs_password_to_the_secret(served):
    """A rotated Kubernetes secret takes effect on the next start; the old password stops working."""
    served["proc"].terminate()
    served["proc"].wait(30)
    port = free_port()
    env = {**served["env"], "SIEVE_JOBS_PASSWORD": "jobs-password-2"}
    proc = start(served["tmp"], port, env, "--backend-store-uri", served["db"])
    try:
        text = wait_for_line(served["tmp"] / f"serve-{port}.log", "jobs user", proc)
        assert "jobs user 'sieve-jobs': password updated" in text
        base, host = f"http://127.0.0.1:{port}", in_cluster_host()
        search = "/api/2.0/mlflow/experiments/search?max_results=1"
        assert (
            requests.get(
                base + search, headers={"Host": host}, auth=("sieve-jobs", "jobs-password-2"), timeout=10
            ).status_code
            == 200
        )
        assert (
            requests.get(
                base + search, headers={"Host": host}, auth=("sieve-jobs", "jobs-password-1"), timeout=10
            ).status_code
            == 401
        )
        assert "jobs-password" not in text and "admin-password" not in text  # no secret in the server's log
    finally:
        proc.terminate()
        proc.wait(30)


def test_database_credential_from_secrets_manager(s3_endpoint, tmp_path):
    """The cluster path: the URI is built from the RDS secret (moto's Secrets Manager on loopback)."""
    import boto3

    sys.path.insert(0, str(SERVE.parent))
    try:
        import serve
    finally:
        sys.path.pop(0)
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(
        Name=f"sieve/mlflow-db-{tmp_path.name}",
        SecretString=json.dumps(
            {
                "username": "mlflow",
                "password": "p@ss/w%rd",
                "host": "db.internal",
                "port": 5432,
                "dbname": "mlflow",
            }
        ),
    )["ARN"]
    uri = serve.backend_uri_from_secret(arn)
    assert uri == "postgresql+psycopg2://mlflow:p%40ss%2Fw%25rd@db.internal:5432/mlflow?sslmode=require"
    ini = serve.write_auth_config(uri, tmp_path)
    assert oct(ini.stat().st_mode & 0o777) == "0o600"
    import configparser

    cp = configparser.ConfigParser()
    cp.read(ini)
    assert cp["mlflow"]["database_uri"] == uri  # '%' survives configparser's interpolation
    bad = sm.create_secret(
        Name=f"sieve/mlflow-db-bad-{tmp_path.name}", SecretString=json.dumps({"username": "mlflow"})
    )["ARN"]
    with pytest.raises(SystemExit, match="lacks"):
        serve.backend_uri_from_secret(bad)


def test_no_secret_in_the_rendered_manifest():
    """The Deployment passes the secret ARN, never a credential; credentials come from secretKeyRef."""
    text = (MODULE / "main.tf").read_text()
    assert "--db-secret-arn" in text and "backend-store-uri" not in text
    assert len(module_locals()["secret_env"]) == 5 and text.count("secret_key_ref") == 1  # one dynamic block
