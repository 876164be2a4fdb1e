"""The MLflow UI as a person sees it: a page rendered by headless Chromium (Debian's ``chromium`` package,
installed by ``make install`` where apt can) from a real ``mlflow ui`` on loopback, read back as its DOM.

No browser driver: ``chromium --headless --dump-dom`` runs the page's JavaScript (MLflow's UI is a React app
that fetches the registry over its REST API) for a virtual-time budget and prints the resulting DOM."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import BIN, free_port, wait_http


def chromium() -> str:
    """The browser, or a skip naming what to install (``make install`` installs it where apt can)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(
            "headless Chromium is not installed (Debian: apt-get install chromium; make install tries)"
        )
    return found


@contextmanager
def mlflow_ui(backend_uri: str, root: Path) -> Iterator[str]:
    """``mlflow ui`` on 127.0.0.1 over ``backend_uri`` (its URL), stopped on exit."""
    port = free_port()
    proc = subprocess.Popen(
        [
            str(BIN / "mlflow"),
            "ui",
            "--backend-store-uri",
            backend_uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=open(root / "mlflow-ui.log", "a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(20)


def rendered_dom(url: str, wait_ms: int = 20000) -> str:
    """The page's DOM after its scripts ran (``wait_ms`` of virtual time)."""
    res = subprocess.run(
        [
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            f"--virtual-time-budget={wait_ms}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout
