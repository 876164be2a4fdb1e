"""MLflow tracking and registry, with an embedded default that needs no server.

* Tracking URI: the config's, else ``MLFLOW_TRACKING_URI``, else the embedded store
  ``sqlite:///<cwd>/mlruns/mlflow.db`` with artifacts in ``<cwd>/mlruns/artifacts`` (the
  registry works on it; ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db`` shows it).
* An ``http(s)://`` server is checked before any work starts; unreachable → one line naming
  the URI within a few seconds.
* Params are flattened (``train.lr``) and anything that looks like a secret is redacted, by key
  name and by value (the values of secret environment variables never leave the process).
* Models are registered by version with aliases (``candidate``, ``champion``), never stages.
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException, RestException

from orchestrator.config import flatten
from orchestrator.errors import StorageError, TrackingError, TrackingUnreachable
from orchestrator.uris import check_transport, without_credentials
from orchestrator.uris import redact as redact_uris

EMBEDDED_DIRNAME = "mlruns"
SECRET_ENV_VARS = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "RAY_AUTH_TOKEN",
    "HF_TOKEN",
    "DATABRICKS_TOKEN",
)
_SECRET_KEY = re.compile(r"(secret|password|passwd|token|credential|api[_-]?key|access[_-]?key)", re.I)
REDACTED = "***"
MAX_PARAM_LEN = 6000


def embedded_uri(base: str | Path | None = None) -> str:
    root = Path(base or Path.cwd()) / EMBEDDED_DIRNAME
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root.resolve() / 'mlflow.db'}"


def embedded_artifact_root(tracking_uri: str) -> str | None:
    """For the embedded SQLite store: ``<dir of db>/artifacts`` as a file URI."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri[len("sqlite:///") :])
    return (db.parent / "artifacts").resolve().as_uri()


def resolve_tracking_uri(configured: str | None = None) -> str:
    """The tracking URI to use: the configured one, else ``MLFLOW_TRACKING_URI``, else the embedded store. A
    ``user:password@`` in it is taken out (MLflow reads it from ``MLFLOW_TRACKING_USERNAME`` / ``_PASSWORD``,
    as every process this one starts does), so no request, log line or message carries it."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or embedded_uri()
    clean, user, password = without_credentials(uri)
    if user is None and password is None:
        return uri
    check_transport(uri, "tracking URI")
    if user is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"] = user
    if password is not None:
        os.environ["MLFLOW_TRACKING_PASSWORD"] = password
    return clean


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the URI, when an HTTP tracking server does not answer ``/health``."""
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - http(s) only
            if resp.status >= 500:
                raise TrackingError(f"MLflow tracking server {uri} unhealthy (HTTP {resp.status})")
    except urllib.error.HTTPError as exc:
        if exc.code >= 500:
            raise TrackingError(f"MLflow tracking server {uri} unhealthy (HTTP {exc.code})") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingUnreachable(f"MLflow tracking server {uri} unreachable ({reason})") from None
    check_admitted(uri, timeout_s)


def check_admitted(uri: str, timeout_s: float = 5.0) -> None:
    """``/health`` is exempt from authentication and Host checks; one API call is not. A server behind
    MLflow's basic-auth app (infra/) that refuses the credential, or a Host it does not allow, fails
    here in one line instead of on the run's first logging call."""
    req = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        req.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s):  # noqa: S310 - http(s) only
            return
    except urllib.error.HTTPError as exc:
        body = exc.read(500).decode(errors="replace").lower()
        if exc.code == 401:
            who = (
                f"user {user!r} and its password were refused"
                if user and password
                else "no credential given: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
            )
            raise TrackingError(
                f"MLflow tracking server {uri} requires authentication (HTTP 401): {who}"
            ) from None
        if exc.code == 403 and "host" in body:
            host = urllib.parse.urlsplit(uri).netloc
            raise TrackingError(
                f"MLflow tracking server {uri} refused the Host header {host!r} (HTTP 403): "
                f"add it, with its port, to the server's --allowed-hosts"
            ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError):
        return  # /health answered; a flaky probe is not worth failing the job for


UNREACHABLE = re.compile(
    r"Max retries exceeded|Connection refused|Failed to establish a new connection|"
    r"Connection aborted|RemoteDisconnected|Name or service not known|timed out"
)


def is_unreachable(exc: BaseException) -> bool:
    """True for a tracking server that is not there (refused, reset, unresolvable, timing out) - after
    MLflow's own retries - as opposed to a server that answered with an error."""
    if isinstance(exc, TrackingError):
        return isinstance(exc, TrackingUnreachable)
    if isinstance(exc, ConnectionError | TimeoutError | urllib.error.URLError):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"ConnectionError", "MaxRetryError", "NewConnectionError", "ProtocolError"}) or (
        isinstance(exc, MlflowException) and bool(UNREACHABLE.search(str(exc)))
    )


TRANSIENT = {
    "TEMPORARILY_UNAVAILABLE",
    "REQUEST_LIMIT_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "DEADLINE_EXCEEDED",
    "UNAUTHENTICATED",
    "CUSTOMER_UNAUTHORIZED",
    "PERMISSION_DENIED",
}  # cured by waiting or a credential


def is_outage(exc: BaseException) -> bool:
    """True when logging failed for a reason that waiting (or fixing the server, its database or the
    credentials) cures: the server is not there or answered 5xx, the database is away, a credential was
    refused, a rate limit; or the artifact store could not be used. False when the record itself was
    refused (an invalid value, a run deleted meanwhile) or the client failed on it: sending it again
    would fail the same way. MLflow's client raises its own refusals as plain ``MlflowException`` with
    the default INTERNAL_ERROR code, so only the server's answer (``RestException``) is read as a status."""
    if isinstance(exc, StorageError) or is_unreachable(exc):
        return True
    if isinstance(exc, MlflowException):
        return exc.error_code in TRANSIENT or (
            isinstance(exc, RestException) and exc.get_http_status_code() >= 500
        )
    if type(exc).__module__.split(".")[0] in ("botocore", "boto3"):  # the S3 artifact store
        return True
    return isinstance(exc, OSError) and not isinstance(
        exc, FileNotFoundError | IsADirectoryError | NotADirectoryError
    )


@contextmanager
def _first_use_lock(uri: str) -> Iterator[None]:
    """Two jobs started at once on one embedded store both create (and migrate) the fresh SQLite file and
    the experiment - seen as "Migration expected to match one row ... in 'alembic_version'". They take
    turns through a lock file beside the database; a server store needs none."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri[len("sqlite:///") :])
    lock = db.with_name(db.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


EXPERIMENT_KIND, MODEL_TRAINING = (
    "mlflow.experimentKind",
    "custom_model_development",
)  # the UI's experiment types


def setup(tracking_uri: str | None = None, experiment: str = "sieve", *, check: bool = True) -> str:
    """Point MLflow at the resolved URI, make sure the experiment exists; return the experiment id."""
    uri = resolve_tracking_uri(tracking_uri)
    if check:
        check_reachable(uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        with _first_use_lock(uri):
            exp = mlflow.get_experiment_by_name(experiment)
            if exp is None:  # a model-training experiment: the UI opens on its runs, not on a GenAI overview
                exp_id = mlflow.create_experiment(
                    experiment,
                    artifact_location=embedded_artifact_root(uri),
                    tags={EXPERIMENT_KIND: MODEL_TRAINING},
                )
            else:
                exp_id = exp.experiment_id
                if (note := moved_store_note(uri, exp.artifact_location)) is not None:
                    print(note, file=sys.stderr, flush=True)
    except Exception as exc:  # noqa: BLE001
        # one line: a server that is not MLflow's answers with a page of HTML, which MLflow quotes in full
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(" Response body:")[0][:200]
        hint = " - is it an MLflow tracking server?" if "error code 404" in said else ""
        raise TrackingError(
            f"MLflow tracking server {uri}: cannot use experiment {experiment!r} ({said}){hint}"
        ) from None
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


def moved_store_note(tracking_uri: str, artifact_location: str) -> str | None:
    """One line when an embedded store was moved (copied to another folder or machine): MLflow records artifact
    locations as absolute paths (it resolves relative ones on creation), so the experiment's runs - old and new -
    still read and write artifacts at the old place. None where nothing moved, or for a server."""
    here = embedded_artifact_root(tracking_uri)
    if here is None or not artifact_location.startswith("file://"):
        return None
    store = Path(tracking_uri[len("sqlite:///") :]).parent.resolve()
    if Path(urllib.parse.urlparse(artifact_location).path).is_relative_to(store):
        return None
    return (
        f"warning: the embedded MLflow store {tracking_uri} was moved: its experiment's artifacts are at "
        f"{artifact_location}, not under {store} (MLflow keeps absolute artifact paths); copy them there, or "
        "start a new store (another working directory) for new runs"
    )


def secret_values() -> set[str]:
    return {v for k in SECRET_ENV_VARS if (v := os.environ.get(k)) and len(v) >= 4}


def redact(value: Any, key: str = "") -> Any:
    """Hide secrets: by key name (``aws_secret``…) and by value (any secret env var's value)."""
    if key and _SECRET_KEY.search(key.split(".")[-1]):
        return REDACTED
    if isinstance(value, str):
        for secret in secret_values():
            value = value.replace(secret, REDACTED)
        value = redact_uris(value)  # a URI's user:password@
    return value


def clean_params(params: dict[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in flatten(params).items():
        v = redact(v, k)
        text = str(v) if not isinstance(v, str) else v
        out[k] = text[:MAX_PARAM_LEN]
    return out


def log_params(params: dict[str, Any]) -> None:
    mlflow.log_params(clean_params(params))


def log_metrics(metrics: dict[str, float], step: int | None = None) -> None:
    finite = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}
    mlflow.log_metrics(finite, step=step)


def log_sentence_encoder(model_dir: str | Path, name: str = "model", *, registered_name: str | None = None):
    """Log an exported encoder folder as an MLflow sentence-transformers model (pyfunc: text → vector).

    Returns the ``ModelInfo``; ``mlflow.pyfunc.load_model(info.model_uri).predict([...])`` gives
    the embeddings, and the folder itself loads with ``SentenceTransformer``. The folder's ONNX copies
    (``export.onnx``) go beside it, to the run's ``<name>_onnx/`` artifacts.
    """
    from sentence_transformers import SentenceTransformer  # lazy: a heavy import, needed only to log a model

    from orchestrator.models import loading  # lazy: transformers, as above

    with loading():
        st = SentenceTransformer(str(model_dir), device="cpu", trust_remote_code=False)
    info = mlflow.sentence_transformers.log_model(
        st,
        name=name,
        registered_model_name=registered_name,
        input_example=["A man is playing a guitar."],
        pip_requirements=SERVING_REQUIREMENTS,
    )  # named: inferring them from the environment takes many seconds
    if (Path(model_dir) / "onnx").is_dir():  # export.onnx's copies, beside the model in the run's artifacts
        mlflow.log_artifacts(str(Path(model_dir) / "onnx"), artifact_path=f"{name}_onnx")
    return info


def logged_models(run_id: str, name: str = "model") -> list[str]:
    """The model ids of the complete (READY) models named ``name`` that ``run_id`` logged. MLflow 3 keeps a
    logged model beside the run, not among its artifacts, so ``list_artifacts`` never shows it; a model
    whose upload was cut short stays PENDING and does not count."""
    client = MlflowClient()
    exp = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models(
        experiment_ids=[exp], filter_string=f"source_run_id = '{run_id}' AND name = '{name}'"
    )
    return [m.model_id for m in found if str(m.status).endswith("READY")]


SERVING_REQUIREMENTS = ["torch==2.13.0", "transformers==5.23.0", "sentence-transformers==6.2.0"]


MODEL_DESCRIPTION = (
    "Versions registered by Sieve's jobs. Aliases: **candidate** - the newest version that beat the untouched base "
    "model in the job that registered it (the jobs move it); **champion** - the version in use, moved only by a "
    "person. To promote: `python jobs/promote.py --model {name} --from-alias candidate` (refuses a version whose "
    "`test_score` tag is below the champion's unless `--force`), or set the alias `champion` on a version in this "
    "page's version list (Aliases → Add) - which skips that check, so compare the versions' `test_score` tags "
    "first. Each version's description is its model card: what was trained, on what, and its scores beside the "
    "base's."
)


def register(
    model_uri: str,
    name: str,
    *,
    alias: str | None = None,
    description: str | None = None,
    tags: dict[str, str] | None = None,
) -> int:
    """Register ``model_uri`` as a new version of ``name``; optionally point ``alias`` at it. The registered
    model gets :data:`MODEL_DESCRIPTION` (what its aliases mean, how to promote) when it has none."""
    try:
        mv = mlflow.register_model(model_uri, name, tags=tags)
        client = MlflowClient()
        if not client.get_registered_model(name).description:
            client.update_registered_model(name, description=MODEL_DESCRIPTION.format(name=name))
        if description:
            client.update_model_version(name, mv.version, description=description)
        if alias:
            set_alias(name, alias, int(mv.version))
    except Exception as exc:  # noqa: BLE001
        raise TrackingError(f"cannot register {model_uri} as {name!r}: {exc}") from None
    return int(mv.version)


def alias_version(name: str, alias: str) -> int | None:
    """The version ``alias`` points at, or None when the alias (or model) does not exist."""
    try:
        return int(MlflowClient().get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def set_alias(name: str, alias: str, version: int, attempts: int = 5) -> None:
    """Point ``alias`` at ``version``. MLflow's SQL store sets an alias with a read then an insert, so
    two jobs setting one alias at once on PostgreSQL (the cluster's store, several server workers)
    can collide on the alias key; the loser retries - setting an alias is idempotent - and the
    last writer wins, as with one worker."""
    for attempt in range(attempts):
        try:
            MlflowClient().set_registered_model_alias(name, alias, str(version))
            return
        except MlflowException as exc:
            if attempt == attempts - 1 or not re.search(
                r"UniqueViolation|duplicate key|UNIQUE constraint", str(exc)
            ):
                raise
            time.sleep(0.2 * (attempt + 1))


def find_run(experiment_id: str, tags: dict[str, str]):
    """The newest run in the experiment carrying all ``tags`` (None if there is none)."""
    flt = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = mlflow.search_runs(
        [experiment_id], filter_string=flt, order_by=["start_time DESC"], max_results=1, output_format="list"
    )
    return runs[0] if runs else None


def run_of(model_uri: str) -> str:
    """The run that logged a ``models:/name@alias``, ``models:/name/3`` or ``runs:/<id>/...`` model."""
    if model_uri.startswith("runs:/"):
        return model_uri[len("runs:/") :].split("/", 1)[0]
    ref = model_uri[len("models:/") :]
    client = MlflowClient()
    if "@" in ref:
        name, alias = ref.split("@", 1)
        return client.get_model_version_by_alias(name, alias).run_id
    name, version = ref.rsplit("/", 1)
    return client.get_model_version(name, version).run_id


def find_version(name: str, tags: dict[str, str]) -> int | None:
    """The newest version of ``name`` carrying all ``tags`` (None when the model or such a version does not exist)."""
    try:
        versions = MlflowClient().search_model_versions(f"name = '{name}'")
    except MlflowException:
        return None
    found = [int(v.version) for v in versions if all(v.tags.get(k) == val for k, val in tags.items())]
    return max(found) if found else None


def alias_tags(name: str, alias: str) -> dict[str, str]:
    """The tags of the version ``alias`` points at, plus ``version``; empty when there is none."""
    version = alias_version(name, alias)
    if version is None:
        return {}
    return {**MlflowClient().get_model_version(name, str(version)).tags, "version": str(version)}


def version_metric(name: str, version: int, key: str) -> float | None:
    tags = MlflowClient().get_model_version(name, str(version)).tags
    return float(tags[key]) if key in tags else None
