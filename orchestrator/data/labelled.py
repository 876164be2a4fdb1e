"""Labelled text data sets (``text``, ``label``): read + validate a TSV, and turn it into the
parquet shards + ``manifest.json`` that Ray Train reads, content-addressed so a data set is
written once per storage root.

    rows = read_labelled("data/sst2/dev.tsv", text_column="sentence")
    shards = labelled_shards("data/sst2/train_sample.tsv", "outputs", text_column="sentence")

Every malformed input is a :class:`DataError` naming the file and line: missing column, empty
text, a label that is not an integer, invalid UTF-8, an empty file.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field

from orchestrator import storage
from orchestrator.config import StrictModel, repo_path
from orchestrator.errors import DataError


class LabelledSet(StrictModel):
    """A labelled TSV in a config: which columns hold the text and the class, and which rows to keep."""

    name: str
    path: str
    text_column: str = "sentence"
    label_column: str = "label"
    where: dict[str, list[str]] = {}
    limit: int | None = Field(None, gt=0)

    def rows(self) -> list[tuple[str, str]]:
        return read_labelled(
            self.path,
            text_column=self.text_column,
            label_column=self.label_column,
            limit=self.limit,
            integer_labels=False,
            where=self.where or None,
        )


def split_rows(rows: list[tuple[str, object]], dev_fraction: float, seed: int):
    """Deterministic train/dev split by a seeded hash of the text (a text is never in both)."""
    train, dev = [], []
    for text, label in rows:
        h = int(hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        (dev if h < dev_fraction else train).append((text, label))
    return train, dev


def _text_lines(path: str) -> list[str]:
    """The lines of a local or s3:// file, or :class:`DataError` naming a missing file or the line with invalid
    UTF-8."""
    try:
        raw = storage.read_bytes(path) if storage.is_s3(path) else Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8") from None


def _label(raw: str, integer: bool, where: str, column: str) -> int | str:
    """A row's label: an integer class, or (``integer`` off) a class name that is not empty."""
    if not integer:
        if not raw.strip():
            raise DataError(f"{where}: empty {column}")
        return raw.strip()
    try:
        return int(raw)
    except ValueError:
        raise DataError(f"{where}: {column} {raw!r} is not an integer class") from None


def read_table(
    path: str,
    columns: tuple[str, ...],
    *,
    limit: int | None = None,
    where: dict[str, list[str]] | None = None,
    expected: str = "",
) -> list[tuple[str, list[str]]]:
    """The named columns of a tab-separated file with a header (local path or s3:// URI), one entry a row:
    (``path:line``, its values stripped, none of them empty). ``where`` keeps only the rows whose column value
    is one of the listed values; ``expected`` names what an empty file should have held."""
    path = repo_path(path)
    lines = _text_lines(path)
    if not lines or not lines[0].strip():
        raise DataError(f"{path}: empty file (expected a header with {expected or ', '.join(columns)})")
    header = lines[0].split("\t")
    missing = [c for c in dict.fromkeys((*columns, *(where or {}))) if c not in header]
    if missing:
        raise DataError(f"{path}:1: missing column(s) {', '.join(missing)} (header: {', '.join(header)})")
    index = [header.index(c) for c in columns]
    rows = []
    # tab-separated, nothing quoted: a split (the csv module would refuse a field over 128 KiB with a traceback)
    for lineno, row in enumerate((line.split("\t") for line in lines[1:]), start=2):
        if not row or all(not f.strip() for f in row):
            continue
        if len(row) < len(header):
            raise DataError(f"{path}:{lineno}: expected {len(header)} tab-separated fields, got {len(row)}")
        if where and any(row[header.index(c)] not in allowed for c, allowed in where.items()):
            continue
        for c, i in zip(columns, index, strict=True):
            if not row[i].strip():
                raise DataError(f"{path}:{lineno}: empty {c}")
        rows.append((f"{path}:{lineno}", [row[i].strip() for i in index]))
        if limit and len(rows) >= limit:
            break
    if not rows:
        raise DataError(f"{path}: no data rows after the header" + (f" matching {where}" if where else ""))
    return rows


def read_labelled(
    path: str,
    *,
    text_column: str = "text",
    label_column: str = "label",
    limit: int | None = None,
    integer_labels: bool = True,
    where: dict[str, list[str]] | None = None,
) -> list[tuple[str, int | str]]:
    """(text, label) pairs of a tab-separated file with a header (local path or s3:// URI).

    ``integer_labels=False`` keeps labels as strings (class names); ``where`` keeps only the rows
    whose column value is one of the listed values (e.g. ``{"event": [...]}``)."""
    table = read_table(
        path,
        (text_column, label_column),
        limit=limit,
        where=where,
        expected=f"{text_column}, {label_column}",
    )
    return [(text, _label(label, integer_labels, at, label_column)) for at, (text, label) in table]


class ScoredPairs(StrictModel):
    """Sentence pairs with a graded similarity (STS-B: 0-5) in a config; each pair's target is
    score / ``score_max``, in [0, 1]."""

    path: str
    text_a_column: str = "sentence1"
    text_b_column: str = "sentence2"
    score_column: str = "score"
    score_max: float = Field(5.0, gt=0)
    limit: int | None = Field(None, gt=0)

    def rows(self) -> list[tuple[str, str, float]]:
        """(text a, text b, target) rows; a score that is not a number in [0, score_max] names its line."""
        out = []
        columns = (self.text_a_column, self.text_b_column, self.score_column)
        for at, (a, b, raw) in read_table(self.path, columns, limit=self.limit):
            try:
                score = float(raw)
            except ValueError:
                raise DataError(f"{at}: {self.score_column} {raw!r} is not a number") from None
            if not 0 <= score <= self.score_max:
                raise DataError(
                    f"{at}: {self.score_column} {score} is outside [0, {self.score_max}] (score_max)"
                )
            out.append((a, b, score / self.score_max))
        return out


def labelled_shards(
    path: str,
    storage_root: str,
    *,
    text_column: str = "text",
    label_column: str = "label",
    limit: int | None = None,
) -> str:
    """The labelled TSV as shards under ``<storage_root>/datasets/<hash>`` (see :func:`rows_to_shards`)."""
    rows = read_labelled(path, text_column=text_column, label_column=label_column, limit=limit)
    return rows_to_shards(rows, storage_root, source=str(path))


def rows_to_shards(rows: list[tuple[str, object]], storage_root: str, *, source: str = "") -> str:
    """(text, label) rows as shards with columns text, label (see :func:`table_to_shards`), the manifest counting
    each label's rows."""
    counts: dict[str, int] = {}
    for _, y in rows:
        counts[str(y)] = counts.get(str(y), 0) + 1
    table = {"text": [t for t, _ in rows], "label": [y for _, y in rows]}
    return table_to_shards(
        table, storage_root, source=source, summary={"labels": dict(sorted(counts.items()))}
    )


def table_to_shards(
    table: dict[str, list], storage_root: str, *, source: str = "", summary: dict | None = None
) -> str:
    """Write ``<storage_root>/datasets/<hash>/shards/*.parquet`` (one column per key of ``table``) and a
    manifest (written last: a folder without it is incomplete and is rewritten); content-addressed, so a table
    is written once per storage root. Returns the folder."""
    h = hashlib.sha256(json.dumps(table).encode()).hexdigest()[:16]
    out = storage.join(storage.absolute(storage_root), "datasets", h)
    rows = len(next(iter(table.values())))

    def write(folder: str) -> None:
        buf = io.BytesIO()
        pq.write_table(pa.table(table), buf)
        storage.write_bytes(storage.join(folder, "shards", "part-00000.parquet"), buf.getvalue())
        manifest = {"source": source, "rows": rows, **(summary or {}), "sha": h}
        storage.write_bytes(storage.join(folder, "manifest.json"), json.dumps(manifest, indent=2).encode())

    return storage.build_committed(out, write)
