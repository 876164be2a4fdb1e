import os
import time
from pathlib import Path

import pytest

from orchestrator import storage
from orchestrator.errors import StorageError


def make_tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.bin").write_bytes(bytes(range(256)))
    return root


@pytest.mark.parametrize("where", ["local", "s3"])
def test_put_get_list_roundtrip(where, tmp_path, request):
    base = request.getfixturevalue("s3_bucket") if where == "s3" else str(tmp_path / "store")
    src = make_tree(tmp_path / "src")
    uri = storage.join(base, "ckpt", "step-3")
    assert not storage.is_complete(uri)
    storage.put_dir(src, uri)
    assert storage.is_complete(uri)
    assert storage.list_files(uri) == ["_COMPLETE", "a.txt", "sub/b.bin"]
    assert storage.list_dirs(storage.join(base, "ckpt")) == ["step-3"]
    out = storage.get_dir(uri, tmp_path / "out", require_complete=True)
    assert (out / "sub" / "b.bin").read_bytes() == bytes(range(256))
    storage.write_bytes(storage.join(base, "x.json"), b"{}")
    assert storage.read_bytes(storage.join(base, "x.json")) == b"{}"
    assert storage.exists(storage.join(base, "x.json")) and storage.exists(uri)
    storage.remove(uri)
    assert not storage.exists(uri)


def test_missing_key_error_names_uri(s3_bucket):
    uri = f"{s3_bucket}/nope/missing.json"
    with pytest.raises(StorageError) as exc:
        storage.read_bytes(uri)
    assert str(exc.value) == f"{uri}: no such key"
    with pytest.raises(StorageError, match="no such directory or it is empty"):
        storage.get_dir(f"{s3_bucket}/nope", "/tmp/unused-dir")


def test_incomplete_directory_is_refused(s3_bucket, tmp_path):
    uri = f"{s3_bucket}/partial"
    storage.write_bytes(f"{uri}/weights.bin", b"half")  # no commit marker: an interrupted upload
    with pytest.raises(StorageError, match="incomplete"):
        storage.get_dir(uri, tmp_path / "x", require_complete=True)


def test_unreachable_endpoint_fails_fast(monkeypatch, s3_endpoint):
    from conftest import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    t0 = time.time()
    with pytest.raises(StorageError, match="S3 endpoint unreachable"):
        storage.check_access("s3://some-bucket/prefix")
    assert time.time() - t0 < 30


def test_missing_bucket(s3_endpoint):
    with pytest.raises(StorageError, match="bucket-that-does-not-exist-xyz/p: no such bucket"):
        storage.check_access("s3://bucket-that-does-not-exist-xyz/p")


def test_missing_credentials(monkeypatch, s3_endpoint, tmp_path):
    # moto does not check keys by default, so a wrong key cannot be shown against it; a missing
    # one is a real client-side failure that must name the URI.
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(StorageError, match="s3://b/p: no AWS credentials found"):
        storage.check_access("s3://b/p")


def test_local_atomic_dir_keeps_previous_on_crash(tmp_path):
    out = tmp_path / "report"
    with storage.atomic_dir(out) as d:
        (d / "ok.txt").write_text("v1")
    with pytest.raises(RuntimeError):
        with storage.atomic_dir(out) as d:
            (d / "ok.txt").write_text("v2-partial")
            raise RuntimeError("crash mid-write")
    assert (out / "ok.txt").read_text() == "v1"
    assert [p.name for p in tmp_path.iterdir()] == ["report"]  # no temp left behind


def test_local_write_bytes_is_atomic(tmp_path):
    p = tmp_path / "m.json"
    storage.write_bytes(str(p), b"1")
    storage.write_bytes(str(p), b"2")
    assert p.read_bytes() == b"2" and os.listdir(tmp_path) == ["m.json"]


def test_pyarrow_filesystem_reads_s3(s3_bucket):
    storage.write_bytes(f"{s3_bucket}/pa/x.txt", b"hello")
    fs, path = storage.pyarrow_filesystem(f"{s3_bucket}/pa/x.txt")
    with fs.open_input_stream(path) as f:
        assert f.read() == b"hello"


@pytest.mark.parametrize("where", ["local", "s3"])
def test_interrupted_upload_is_never_complete_and_resume_takes_the_last_complete(
    where, tmp_path, request, monkeypatch
):
    """An upload that dies after its first file leaves a directory without the commit marker;
    it is not listed as complete, and the previous checkpoint still is."""
    import shutil

    base = request.getfixturevalue("s3_bucket") if where == "s3" else str(tmp_path / "store")
    src = make_tree(tmp_path / "src")
    parent = storage.join(base, "checkpoints")
    for step in (2, 4):
        storage.put_dir(src, storage.join(parent, f"step-{step:06d}"))
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionResetError("connection lost mid-upload")
        return real(*args, **kwargs)

    if where == "s3":
        client = storage.s3_client()
        real = client.upload_file
        monkeypatch.setattr(client, "upload_file", dying)
        monkeypatch.setattr(storage, "s3_client", lambda: client)
    else:
        real = shutil.copy2
        monkeypatch.setattr(shutil, "copy2", dying)
    with pytest.raises((StorageError, ConnectionResetError)):
        storage.put_dir(src, storage.join(parent, "step-000006"))
    monkeypatch.undo()
    interrupted = storage.join(parent, "step-000006")
    assert not storage.is_complete(interrupted)
    if where == "s3":
        assert storage.list_files(interrupted)  # half an upload really is there
    assert storage.is_complete(storage.join(parent, "step-000004"))  # the one before it stands


def test_a_checkpoint_on_s3_is_recorded_with_its_scheme_and_read_back(s3_bucket, tmp_path):
    """Ray keeps an S3 checkpoint's path as ``bucket/key``: recorded as such, a sweep's export read it as a
    local folder ("URI has empty scheme"; found by the two-node test)."""
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

    from orchestrator.drivers.recording import checkpoint_uri
    from orchestrator.drivers.train import checkpoint_at

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "state.json").write_text("{}")
    storage.put_dir(tmp_path / "ckpt", f"{s3_bucket}/runs/checkpoint_1")
    fs, path = storage.pyarrow_filesystem(f"{s3_bucket}/runs/checkpoint_1")
    uri = checkpoint_uri(Checkpoint(path, filesystem=fs))
    assert uri == f"{s3_bucket}/runs/checkpoint_1"
    again = checkpoint_at(uri)
    assert isinstance(again.filesystem, pafs.S3FileSystem) and again.path == path
    with again.as_directory() as local:
        assert (Path(local) / "state.json").read_text() == "{}"
    assert checkpoint_uri(Checkpoint(str(tmp_path / "ckpt"))) == str(tmp_path / "ckpt")  # local: unchanged


@pytest.mark.parametrize("where", ["local", "s3"])
def test_one_claim_per_name_and_a_dead_owners_claim_taken_over_only_when_asked(where, tmp_path, request):
    """The atomic create (local O_EXCL; S3 If-None-Match on moto) lets one claim in; the owner is named;
    a claim whose process is gone is refused until --take-over, which then holds it; at exit it goes back."""
    import json
    import socket
    import subprocess
    import sys

    from orchestrator import claims
    from orchestrator.errors import ConfigError

    base = request.getfixturevalue("s3_bucket") if where == "s3" else str(tmp_path / "store")
    uri = claims.claim_uri(base, "run")
    assert storage.create_exclusive(uri, b"first") and not storage.create_exclusive(uri, b"second")
    assert storage.read_bytes(uri) == b"first"  # the second writer changed nothing
    storage.remove(uri)

    claims.claim(base, "run", job="jobs/train.py")
    claims.claim(base, "run", job="jobs/train.py")  # this process again (a sweep, then its confirm): its own
    claims.release_all()
    assert not storage.exists(uri)

    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:  # a live owner
        owner = {"job": "jobs/train.py", "host": socket.gethostname(), "pid": other.pid, "started": "now"}
        storage.write_bytes(uri, json.dumps(owner).encode())
        with pytest.raises(
            ConfigError,
            match=rf"--name 'run' is claimed by jobs/train.py on .*, pid {other.pid}, started now \(still running; "
            r".*: wait for it to end, or pick another --name",
        ):
            claims.claim(base, "run", job="jobs/train.py", take_over=True)  # never taken from a live owner
        other.kill()
    storage.remove(uri)

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    owner = {
        "job": "jobs/compare.py",
        "host": socket.gethostname(),
        "pid": int(dead.stdout),
        "started": "then",
    }
    storage.write_bytes(uri, json.dumps(owner).encode())
    with pytest.raises(
        ConfigError, match=r"\(no longer running; .*\): if it no longer runs, pass --take-over"
    ):
        claims.claim(base, "run", job="jobs/compare.py")
    claims.claim(base, "run", job="jobs/compare.py", take_over=True)
    assert json.loads(storage.read_bytes(uri))["pid"] == os.getpid()
    claims.release_all()
    assert not storage.exists(uri)
