"""Local paths and ``s3://`` URIs behind one small API.

S3-compatible stores (MinIO, moto, Ceph) are reached by the standard ``AWS_ENDPOINT_URL``
variable, which boto3 and pyarrow both honour; credentials come from the usual AWS chain and
are never logged.

Directories are written *then committed*: :func:`put_dir` uploads every file and writes the
``_COMPLETE`` marker last, so a reader that checks :func:`is_complete` never sees a half
written checkpoint. Local directories are written to a temporary sibling and renamed.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs

from orchestrator.errors import DataError, NoSuchKey, StorageError, StorageUnreachable

COMPLETE_MARKER = "_COMPLETE"


def is_s3(uri: str | os.PathLike) -> bool:
    return str(uri).startswith("s3://")


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → (``bucket``, ``a/b``)."""
    if not is_s3(uri):
        raise StorageError(f"{uri}: not an s3:// URI")
    rest = uri[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"{uri}: missing bucket name")
    return bucket, key.strip("/")


def join(base: str, *parts: str) -> str:
    if is_s3(base):
        return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(base, *parts))


def absolute(uri: str) -> str:
    """An ``s3://`` URI as it is; a local path made absolute (Ray workers run in other directories)."""
    return uri if is_s3(uri) else str(Path(uri).resolve())


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def s3_client():
    """A boto3 client that fails fast (short timeouts, no retry storm) when the endpoint is down."""
    import boto3  # lazy: only S3 needs it, and the GPU bench's image (recipes, no S3) has none
    from botocore.config import Config  # lazy: as above

    cfg = Config(connect_timeout=3, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
    # A fresh session each time: boto3's default session caches credentials, so rotated or
    # removed keys would go unnoticed.
    return boto3.session.Session().client("s3", endpoint_url=_endpoint(), config=cfg)


def _s3_error(uri: str, exc: Exception) -> StorageError:
    from botocore.exceptions import (  # lazy: as s3_client
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    if isinstance(exc, EndpointConnectionError):
        return StorageUnreachable(f"{uri}: S3 endpoint unreachable ({_endpoint() or 'AWS default'})")
    if isinstance(exc, NoCredentialsError):
        return StorageError(f"{uri}: no AWS credentials found")
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in {"NoSuchKey", "404", "NotFound"}:
            return NoSuchKey(f"{uri}: no such key")
        if code == "NoSuchBucket":
            return StorageError(f"{uri}: no such bucket")
        if code in {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"}:
            return StorageError(f"{uri}: access denied ({code}); check the AWS credentials")
        return StorageError(f"{uri}: S3 error {code or exc}")
    return StorageError(f"{uri}: {type(exc).__name__}: {exc}")


def check_access(uri: str) -> None:
    """Fail before any work starts when ``uri`` cannot be reached or written.

    On S3 this lists the URI's own prefix (one key) rather than HEAD the bucket: a job role scoped
    to prefixes (``s3:ListBucket`` conditioned on ``s3:prefix``, as infra/ grants it) may list
    ``runs/`` and is refused HeadBucket."""
    if is_s3(uri):
        bucket, key = split_s3(uri)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        try:
            s3_client().list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except Exception as exc:  # noqa: BLE001 - mapped to one clear message
            raise _s3_error(uri, exc) from None
    else:
        path = Path(uri)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{uri}: cannot create directory ({exc.strerror})") from None
        if not os.access(path, os.W_OK):
            raise StorageError(f"{uri}: directory is not writable")


def read_bytes(uri: str) -> bytes:
    if is_s3(uri):
        bucket, key = split_s3(uri)
        try:
            return s3_client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
    try:
        return Path(uri).read_bytes()
    except FileNotFoundError:
        raise StorageError(f"{uri}: no such file") from None


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object; locally via a temporary file and an atomic rename."""
    if is_s3(uri):
        bucket, key = split_s3(uri)
        try:
            s3_client().put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def create_exclusive(uri: str, data: bytes) -> bool:
    """Write ``uri`` only if nothing is there, atomically against any other writer: False when it exists. Local:
    ``O_CREAT | O_EXCL``; S3: a conditional write (``If-None-Match: *``), answered 412 when the key exists."""
    if is_s3(uri):
        from botocore.exceptions import ClientError  # lazy: as s3_client

        bucket, key = split_s3(uri)
        try:
            s3_client().put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {
                "PreconditionFailed",
                "412",
                "ConditionalRequestConflict",
            }:
                return False
            raise _s3_error(uri, exc) from None
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def exists(uri: str) -> bool:
    if is_s3(uri):
        bucket, key = split_s3(uri)
        client = s3_client()
        try:
            client.head_object(Bucket=bucket, Key=key)
            return True
        except Exception as exc:  # noqa: BLE001
            err = _s3_error(uri, exc)
            if isinstance(err, NoSuchKey):
                # maybe a "directory": any object below the prefix?
                resp = client.list_objects_v2(Bucket=bucket, Prefix=key.rstrip("/") + "/", MaxKeys=1)
                return resp.get("KeyCount", 0) > 0
            raise err from None
    return Path(uri).exists()


def list_files(uri: str) -> list[str]:
    """Relative paths of every file below ``uri`` (recursive, sorted)."""
    if is_s3(uri):
        bucket, prefix = split_s3(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        out: list[str] = []
        try:
            paginator = s3_client().get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                out += [obj["Key"][len(prefix) :] for obj in page.get("Contents", [])]
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
        return sorted(out)
    root = Path(uri)
    if not root.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def list_dirs(uri: str) -> list[str]:
    """Names of the immediate sub-directories of ``uri``."""
    if is_s3(uri):
        bucket, prefix = split_s3(uri)
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        try:
            paginator = s3_client().get_paginator("list_objects_v2")
            names: set[str] = set()
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
                names.update(cp["Prefix"][len(prefix) :].strip("/") for cp in page.get("CommonPrefixes", []))
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
        return sorted(names)
    root = Path(uri)
    return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def object_signature(uri: str) -> str:
    """One object's size and ETag (what changes when it is re-uploaded), without reading it."""
    bucket, key = split_s3(uri)
    try:
        head = s3_client().head_object(Bucket=bucket, Key=key)
    except Exception as exc:  # noqa: BLE001
        raise _s3_error(uri, exc) from None
    return f"{head['ContentLength']}:{head.get('ETag', '')}"


def listing_signature(uri: str) -> str:
    """What changes when the objects below ``uri`` change: their keys, sizes and ETags (hashed)."""
    bucket, prefix = split_s3(uri)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    entries = []
    try:
        for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            entries += [
                f"{o['Key']}\t{o['Size']}\t{o.get('ETag', '')}"
                for o in page.get("Contents", [])
                if not o["Key"].endswith(COMPLETE_MARKER)
            ]
    except Exception as exc:  # noqa: BLE001
        raise _s3_error(uri, exc) from None
    if not entries:
        raise StorageError(f"{uri}: no such directory or it is empty")
    return hashlib.sha256("\n".join(sorted(entries)).encode()).hexdigest()


def is_complete(uri: str) -> bool:
    """True once a directory was fully written (its commit marker exists)."""
    return exists(join(uri, COMPLETE_MARKER))


def put_dir(local_dir: str | Path, uri: str) -> None:
    """Copy a local directory to ``uri`` and commit it (marker written last)."""
    local_dir = Path(local_dir)
    if not local_dir.is_dir():
        raise StorageError(f"{local_dir}: not a directory")
    files = [p for p in sorted(local_dir.rglob("*")) if p.is_file() and p.name != COMPLETE_MARKER]
    if is_s3(uri):
        bucket, prefix = split_s3(uri)
        client = s3_client()
        try:
            for p in files:
                key = "/".join(filter(None, [prefix, str(p.relative_to(local_dir)).replace(os.sep, "/")]))
                client.upload_file(str(p), bucket, key)
            client.put_object(Bucket=bucket, Key=f"{prefix}/{COMPLETE_MARKER}".lstrip("/"), Body=b"")
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
        return
    with atomic_dir(uri) as tmp:
        for p in files:
            target = tmp / p.relative_to(local_dir)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, target)
        (tmp / COMPLETE_MARKER).write_bytes(b"")


def get_dir(uri: str, local_dir: str | Path, *, require_complete: bool = False) -> Path:
    """Copy everything below ``uri`` into ``local_dir`` (created). Errors if nothing is there."""
    local_dir = Path(local_dir)
    if require_complete and not is_complete(uri):
        raise StorageError(f"{uri}: incomplete (no {COMPLETE_MARKER} marker); refusing to read it")
    files = list_files(uri)
    if not files:
        raise StorageError(f"{uri}: no such directory or it is empty")
    for rel in files:  # a key like "a/../../x" would write outside the folder we copy into
        safe_relative(rel, uri)
    local_dir.mkdir(parents=True, exist_ok=True)
    if is_s3(uri):
        bucket, prefix = split_s3(uri)
        client = s3_client()
        try:
            for rel in files:
                target = local_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                key = f"{prefix}/{rel}" if prefix else rel
                client.download_file(bucket, key, str(target))
        except Exception as exc:  # noqa: BLE001
            raise _s3_error(uri, exc) from None
    else:
        shutil.copytree(uri, local_dir, dirs_exist_ok=True)
    return local_dir


def safe_relative(rel: str, where: str) -> str:
    """``rel`` when it stays inside its folder; a key or name with ``..``, an absolute path or a
    backslash is refused with one line naming it."""
    parts = rel.replace("\\", "/").split("/")
    if rel.startswith("/") or "\\" in rel or any(p in ("..", ".") for p in parts) or not rel:
        raise StorageError(f"{where}: {rel!r} would leave its folder; refusing it")
    return rel


def safe_name(name: str, what: str = "name") -> str:
    """A run / sweep / model name used as a folder: letters, digits, '.', '_', '-' only, not '.' or '..'."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", name or "") or ".." in name:
        raise StorageError(f"{what} {name!r}: use letters, digits, '.', '_' and '-' (it names a folder)")
    return name


def remove(uri: str) -> None:
    """Delete a file or directory tree (missing is fine)."""
    if is_s3(uri):
        bucket, prefix = split_s3(uri)
        client = s3_client()
        keys = [f"{prefix}/{rel}".lstrip("/") for rel in list_files(uri)]
        if exists(uri) and not keys:
            keys = [prefix]
        for i in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]})
        return
    p = Path(uri)
    if p.is_dir():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a local output directory under a temporary name; rename into place only on success.

    A crash inside the block leaves any previous ``path`` untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def cached_copy(source: str, signature: str, fetch, cache_root: Path) -> Path:
    """A local copy of ``source`` under the cache, fetched (``fetch(folder)``) into a temporary folder and
    renamed into place with a ``_COMPLETE`` marker holding ``signature``; reused only when the marker matches."""
    dest = Path(cache_root) / hashlib.sha256(source.encode()).hexdigest()[:16]
    marker = dest / COMPLETE_MARKER
    if marker.is_file() and marker.read_text() == signature:
        return dest
    with atomic_dir(dest) as tmp:
        fetch(tmp)
        (tmp / COMPLETE_MARKER).write_text(signature)
    return dest


# ---------------------------------------------------------------- builds that readers see whole or not at all
POINTER = "CURRENT"


def resolve_build(uri: str) -> str | None:
    """The committed build under ``uri``: the attempt folder its ``CURRENT`` pointer names, or ``uri``
    itself when it holds a ``manifest.json`` (a folder written directly); None when there is none."""
    pointer = join(uri, POINTER)
    if exists(pointer):
        target = join(uri, safe_relative(read_bytes(pointer).decode().strip(), uri))
        return target if exists(join(target, "manifest.json")) else None
    return uri if exists(join(uri, "manifest.json")) else None


def build_committed(uri: str, build, *, reuse: bool = True) -> str:
    """Build into a fresh ``attempts/<id>/`` folder under ``uri`` (``build(folder)`` writes its
    ``manifest.json`` last), then switch ``CURRENT`` to it - one write, the last one. A reader never sees
    a half-written build, a rebuild never touches the build readers use, and builders of one content
    address never delete each other's files: with ``reuse``, a committed build is used as it is, and a
    builder that finds one committed when it finishes leaves the pointer alone (the first writer wins)."""
    if reuse and (done := resolve_build(uri)):
        return done
    attempt = f"attempts/{time.time_ns()}-{uuid.uuid4().hex[:8]}"
    build(join(uri, attempt))
    if reuse and (done := resolve_build(uri)):
        return done
    write_bytes(join(uri, POINTER), attempt.encode())
    return join(uri, attempt)


def pyarrow_filesystem(uri: str):
    """(pyarrow FileSystem, path) for Ray Data reads/writes of ``uri``."""
    if is_s3(uri):
        bucket, key = split_s3(uri)
        fs = pafs.S3FileSystem(
            endpoint_override=_endpoint(),
            region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            connect_timeout=3,
            request_timeout=30,
        )
        return fs, f"{bucket}/{key}".rstrip("/")
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


def iter_lines(uri: str) -> Iterator[tuple[int, str]]:
    """(line number, line without its end) of a text file, local or ``s3://``, streamed - never read whole; a file
    that cannot be read, or a line that is not UTF-8, is refused naming it."""
    if not is_s3(uri) and not Path(uri).is_file():
        raise StorageError(f"{uri}: no such file")
    fs, key = pyarrow_filesystem(uri)
    try:
        stream = fs.open_input_stream(key)
    except OSError as exc:
        raise StorageError(f"{uri}: cannot be read ({str(exc).splitlines()[0]})") from None
    with io.TextIOWrapper(stream, encoding="utf-8") as f:
        n = 0
        try:
            for n, line in enumerate(f, start=1):  # noqa: B007 - n names the line a decode error is on
                yield n, line.rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise DataError(f"{uri}:{n + 1}: not UTF-8 text ({exc.reason})") from None
