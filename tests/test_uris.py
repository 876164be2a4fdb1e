"""URIs with credentials: shown redacted, used without them, refused over plain http to another machine; and the
tracking preflight never hands a resolver (or a message) the password."""

from __future__ import annotations

import socket

import pytest

from orchestrator import tracking
from orchestrator.errors import ConfigError, TrackingUnreachable
from orchestrator.uris import check_transport, redact, without_credentials

CANARY = "canary-pw-7f3a"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://user:s3cret@127.0.0.1:5000/x", "http://user:***@127.0.0.1:5000/x"),
        (
            "https://tok3n@mlflow.example.com/",
            "https://***@mlflow.example.com/",
        ),  # a lone token: hidden whole
        (
            "postgresql://sieve:p@ss@db:5432/mlflow",
            "postgresql://sieve:***@db:5432/mlflow",
        ),  # a raw '@' in it
        (
            "MLflow tracking server http://u:pw@h:1 unreachable; s3://bucket/key@v1 kept",
            "MLflow tracking server http://u:***@h:1 unreachable; s3://bucket/key@v1 kept",
        ),
        ("mail me at a@b.org, or http://127.0.0.1:9", "mail me at a@b.org, or http://127.0.0.1:9"),
    ],
)
def test_redact_hides_the_password_and_only_it(text, shown):
    assert redact(text) == shown


def test_without_credentials_takes_out_the_userinfo_unquoted():
    assert without_credentials("http://u:p%40x@127.0.0.1:9/api?q=1") == (
        "http://127.0.0.1:9/api?q=1",
        "u",
        "p@x",
    )
    assert without_credentials("https://[::1]:8443/") == ("https://[::1]:8443/", None, None)
    assert without_credentials("sqlite:////tmp/mlflow.db") == ("sqlite:////tmp/mlflow.db", None, None)


def test_a_password_over_plain_http_to_another_machine_is_refused(monkeypatch):
    monkeypatch.delenv("SIEVE_ALLOW_PLAINTEXT_CREDENTIALS", raising=False)
    with pytest.raises(
        ConfigError, match=r"http://u:\*\*\*@mlflow.example.com: a password over plain http"
    ) as e:
        check_transport(f"http://u:{CANARY}@mlflow.example.com", "tracking URI")
    assert CANARY not in str(e.value)
    for fine in (
        f"https://u:{CANARY}@mlflow.example.com",
        f"http://u:{CANARY}@localhost:5000",
        "http://h:5000",
    ):
        check_transport(fine, "tracking URI")
    monkeypatch.setenv("SIEVE_ALLOW_PLAINTEXT_CREDENTIALS", "1")
    check_transport(f"http://u:{CANARY}@mlflow.example.com", "tracking URI")


def test_the_tracking_preflight_resolves_the_host_alone_and_never_shows_the_password(monkeypatch):
    """Issue 56: the userinfo went to ``getaddrinfo`` as part of the host name, and the refusal printed it."""
    asked = []
    real = socket.getaddrinfo

    def recording(host, *args, **kw):  # the real resolver, each host name it is asked for recorded
        asked.append(str(host))
        return real(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", recording)
    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://sieve:{CANARY}@127.0.0.1:9")
    uri = tracking.resolve_tracking_uri()
    assert uri == "http://127.0.0.1:9"
    assert (
        tracking.os.environ["MLFLOW_TRACKING_USERNAME"],
        tracking.os.environ["MLFLOW_TRACKING_PASSWORD"],
    ) == (
        "sieve",
        CANARY,
    )  # where MLflow's client reads basic auth from
    with pytest.raises(TrackingUnreachable) as e:
        tracking.check_reachable(uri, timeout_s=2)
    assert asked and all(CANARY not in h and "@" not in h for h in asked), asked
    assert CANARY not in str(e.value) and "127.0.0.1:9" in str(e.value)
    # a config dumped as params: a URI in it redacted by its shape (this password is in no environment variable)
    params = tracking.clean_params({"tracking": {"tracking_uri": "http://u:not-in-env-pw@h:1"}})
    assert params == {"tracking.tracking_uri": "http://u:***@h:1"}
