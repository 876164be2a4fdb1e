"""Counts that travel with the rows, and the writer that adds them up.

What a stage of the corpus pipeline drops it reports as *tally* rows in the stream itself (``skip``:
the reason, ``n``: how many, ``text``/``error``: the first example), so no stage is materialized to
be counted: the writer, last, adds them up, and the manifest's counts are what it reports. A real
row has ``skip == ""``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from ray.data.block import BlockAccessor
from ray.data.datasource import Datasink

from orchestrator import storage

TALLY_KEY = "~"  # sorts after every (hex) shuffle key: tallies ride at the end of the sorted stream


def tallies(counts: dict[str, int], examples: dict[str, tuple[str, str]] | None = None) -> list[dict]:
    examples = examples or {}
    return [
        {
            "key": TALLY_KEY,
            "text": examples.get(k, ("", ""))[0],
            "skip": k,
            "n": int(n),
            "error": examples.get(k, ("", ""))[1],
        }
        for k, n in counts.items()
        if n
    ]


def with_tallies(batch: dict, keep: np.ndarray, counts: dict[str, int]) -> dict:
    """``batch`` cut to ``keep``, with tally rows for ``counts`` appended (only the tally columns set)."""
    extra = tallies(counts)
    out = {}
    for c, v in batch.items():
        add = [r.get(c, "") for r in extra]
        out[c] = (
            np.concatenate([v[keep], np.array(add, dtype=v.dtype if c == "n" else object)])
            if add
            else v[keep]
        )
    return out


class ShardSink(Datasink):
    """Writes the real rows as parquet shards of at most ``shard_rows`` rows, named so that their
    sorted order is the stream's; each write task returns what its rows tally up to, and the driver
    adds those reports (a few numbers per task, whatever the corpus size) in ``on_write_complete``."""

    def __init__(self, output: str, shard_rows: int, columns: list[str]):
        self.fs, path = storage.pyarrow_filesystem(output)
        self.dir, self.shard_rows, self.columns, self.report = f"{path}/shards", shard_rows, columns, None

    @property
    def min_rows_per_write(self) -> int:  # a write task buffers about one shard: memory grows with the shard
        return self.shard_rows

    def on_write_start(self, schema=None) -> None:
        self.fs.create_dir(self.dir, recursive=True)

    def write(self, blocks, ctx) -> dict:
        counts: Counter = Counter()
        examples: dict[str, tuple[str, str]] = {}
        good, t0, t1 = [], float("inf"), 0.0
        for block in blocks:
            table = BlockAccessor.for_block(block).to_arrow()
            if not table.num_rows:
                continue
            real = pc.equal(table["skip"], "")
            if (rows := table.filter(real).select(self.columns)).num_rows:
                good.append(rows)
            for r in table.filter(pc.invert(real)).select(["skip", "n", "text", "error"]).to_pylist():
                counts[r["skip"]] += r["n"]
                examples.setdefault(r["skip"], (r["text"], r["error"]))
            t0, t1 = min(t0, pc.min(table["_t0"]).as_py()), max(t1, pc.max(table["_t1"]).as_py())
        rows = pa.concat_tables(good) if good else None
        counts["written"] = rows.num_rows if rows is not None else 0
        for j, start in enumerate(range(0, counts["written"], self.shard_rows)):
            pq.write_table(
                rows.slice(start, self.shard_rows),
                f"{self.dir}/{ctx.task_idx:06d}-{j:04d}.parquet",
                filesystem=self.fs,
            )
        return {"counts": dict(counts), "examples": examples, "t0": t0, "t1": t1}

    def on_write_complete(self, write_result) -> None:
        counts: Counter = Counter()
        examples: dict[str, tuple[str, str]] = {}
        for r in write_result.write_returns:
            counts.update(r["counts"])
            for k, v in r["examples"].items():
                examples.setdefault(k, v)
        t0 = min((r["t0"] for r in write_result.write_returns), default=0.0)
        t1 = max((r["t1"] for r in write_result.write_returns), default=0.0)
        self.report = {"counts": counts, "examples": examples, "t0": t0, "t1": t1}
