"""Training rows of (anchor, positive[, negatives...]): what the supervised contrastive recipe trains on and what
``jobs/mine_negatives.py`` reads and writes.

Three sources, each checked before anything runs (a bad row names its file and line, or its row):

- ``format: tsv`` - a tab-separated file with a header; the named columns (``where`` keeps rows by value);
- ``format: beir`` - a BEIR folder's qrels (``qrels/<split>.tsv``): each query with each of its relevant passages;
- ``format: parquet`` - a parquet file, e.g. the one the mining job writes (``anchor``, ``positive``,
  ``negative_1`` ... ``negative_n``).
"""

from __future__ import annotations

from typing import Literal

import pyarrow.parquet as pq
from pydantic import Field, model_validator

from orchestrator import storage
from orchestrator.config import StrictModel, repo_path
from orchestrator.data.labelled import read_table
from orchestrator.errors import DataError
from orchestrator.evaluation.beir import read_beir


class TrainingRows(StrictModel):
    """Rows of a tab-separated file with a header or of a parquet file (an anchor, its positive and any given
    negatives), or a BEIR folder's training qrels (``format: beir``: each query with each relevant passage)."""

    path: str
    format: Literal["tsv", "beir", "parquet"] = "tsv"
    anchor_column: str = "sentence1"
    positive_column: str = "sentence2"
    negative_columns: list[str] = []
    where: dict[str, list[str]] | None = Field(
        None, description="keep rows whose column holds one of the values"
    )
    split: str = Field("train", description="format beir: the qrels file read (qrels/<split>.tsv)")
    limit: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _beir_has_no_columns(self):
        if self.format == "beir" and (self.negative_columns or self.where):
            raise ValueError(
                "format beir: the rows are (query, relevant passage); negative_columns and where are for a "
                "TSV or parquet file"
            )
        return self

    def rows(self) -> list[list[str]]:
        """[anchor, positive, *negatives] per row; a missing column, an empty field or a bad BEIR line names its
        file and line."""
        if self.format == "beir":
            data = read_beir(self.path, self.split)
            passages = data.texts_at(set().union(*data.relevant))  # the relevant ones only, one streamed pass
            rows = [
                [q, passages[i]]
                for q, rel in zip(data.queries, data.relevant, strict=True)
                for i in sorted(rel)
            ]
            return rows[: self.limit] if self.limit else rows
        columns = (self.anchor_column, self.positive_column, *self.negative_columns)
        if self.format == "parquet":
            return read_parquet_rows(self.path, columns, limit=self.limit, where=self.where)
        return [values for _, values in read_table(self.path, columns, limit=self.limit, where=self.where)]


def read_parquet_rows(
    path: str,
    columns: tuple[str, ...],
    *,
    limit: int | None = None,
    where: dict[str, list[str]] | None = None,
) -> list[list[str]]:
    """The named string columns of a parquet file (local or ``s3://``), a list a row; a missing column or an empty
    field is refused naming the file and the row (counted from 1)."""
    path = repo_path(path)
    fs, key = storage.pyarrow_filesystem(path)
    try:
        table = pq.read_table(key, filesystem=fs)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
    missing = [c for c in dict.fromkeys((*columns, *(where or {}))) if c not in table.column_names]
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)} (has: {', '.join(table.column_names)})"
        )
    data = table.to_pydict()
    rows = []
    for i in range(table.num_rows):
        if where and any(str(data[c][i]) not in allowed for c, allowed in where.items()):
            continue
        values = [data[c][i] for c in columns]
        for c, v in zip(columns, values, strict=True):
            if not isinstance(v, str) or not v.strip():
                raise DataError(f"{path}: row {i + 1}: empty or non-text {c}")
        rows.append([v.strip() for v in values])
        if limit and len(rows) >= limit:
            break
    if not rows:
        raise DataError(f"{path}: no rows" + (f" matching {where}" if where else ""))
    return rows
