"""Stage 1 of the corpus pipeline, one input file at a time (``corpus.py`` runs it as a Ray Data task per
file, because cleaning looks at neighbouring lines): the files an input names, their records decoded (invalid
UTF-8 → skipped; a TSV's or parquet file's column), control characters refused, whitespace normalised,
overlong lines cut to ``max_words``, short ones dropped, and - as the SIFTER paper does for sentence-split
errors - a sentence whose last word is capitalised dropped together with the sentence after it."""

from __future__ import annotations

import io
import re
import unicodedata
from pathlib import Path

import pyarrow.parquet as pq

from orchestrator import storage
from orchestrator.errors import DataError

_WS = re.compile(r"\s+")
_CONTROL_OK = {"\t", "\n", "\r"}


def decode_lines(path: str, data: bytes, fmt: str, column: str) -> list[tuple[str | None, str | None]]:
    """(text, skip_reason) for every record of one file."""
    if fmt == "auto":
        fmt = "parquet" if path.endswith(".parquet") else "tsv" if path.endswith(".tsv") else "text"
    if fmt == "parquet":
        try:
            table = pq.read_table(io.BytesIO(data), columns=[column])
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"{path}: cannot read column {column!r} from parquet ({exc})") from None
        return [
            (v, None) if isinstance(v, str) else (None, "empty") for v in table.column(column).to_pylist()
        ]
    raw_lines = data.split(b"\n")
    if raw_lines and raw_lines[-1] == b"":
        raw_lines.pop()
    col = None
    if fmt == "tsv":
        if not raw_lines:
            return []
        header = raw_lines.pop(0).decode("utf-8", "replace").rstrip("\r").split("\t")
        if column not in header:
            raise DataError(f"{path}:1: no column {column!r} (header: {', '.join(header)})")
        col = header.index(column)
    out: list[tuple[str | None, str | None]] = []
    for raw in raw_lines:
        try:
            line = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError:
            out.append((None, "invalid_utf8"))
            continue
        if col is not None:
            fields = line.split("\t")
            line = fields[col] if col < len(fields) else ""
        out.append((line, None))
    return out


def normalise(text: str) -> tuple[str | None, str | None]:
    """(clean text, None) or (None, skip reason) for one line."""
    if any(unicodedata.category(ch) == "Cc" and ch not in _CONTROL_OK for ch in text):
        return None, "control_characters"
    text = _WS.sub(" ", unicodedata.normalize("NFC", text)).strip()
    if not text:
        return None, "empty"
    return text, None


def clean_records(records: list[tuple[str | None, str | None]], cfg) -> list[dict]:
    """Apply the cleaning rules to one file's records (order matters for the split rule); ``cfg``: a
    :class:`orchestrator.data.corpus.CorpusConfig` (its ``min_words``, ``max_words``, ``drop_capitalised_splits``)."""
    rows: list[dict] = []
    drop_next = False
    for text, reason in records:
        truncated = False
        if reason is None:
            text, reason = normalise(text or "")
        if reason is None:
            words = text.split(" ")
            if len(words) > cfg.max_words:
                text, truncated = " ".join(words[: cfg.max_words]), True
                words = words[: cfg.max_words]
            if drop_next:
                reason = "after_capitalised_split"
                drop_next = False
            elif cfg.drop_capitalised_splits and ends_capitalised(words):
                reason, drop_next = "capitalised_split", True
            elif len(words) < cfg.min_words:
                reason = "too_short"
        rows.append({"text": text if reason is None else None, "skip": reason or "", "truncated": truncated})
    return rows


def ends_capitalised(words: list[str]) -> bool:
    """The last word starts with a capital letter (``... met Dr.``): likely a bad sentence split.

    On PTB-tokenised text a sentence ends with a separate ``.`` token, so only real splits match.
    """
    return len(words) >= 2 and words[-1][:1].isupper()


def input_files(uri: str) -> list[str]:
    """The files an input names: one file, or every file below a directory."""
    if storage.is_s3(uri):
        files = storage.list_files(uri)
        if files:
            return [storage.join(uri, f) for f in files if not f.startswith(("_", "."))]
        if storage.exists(uri):
            return [uri]
        raise DataError(f"{uri}: no such input")
    p = Path(uri)
    if p.is_file():
        return [str(p)]
    if p.is_dir():
        files = sorted(str(f) for f in p.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))
        if files:
            return files
        raise DataError(f"{uri}: input directory is empty")
    raise DataError(f"{uri}: no such input file or directory")
