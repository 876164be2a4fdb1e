"""The corpus pipeline on Ray Data, one streaming execution: read → clean → sort by a seeded hash
→ dedup + limit → parse (actor pool) → augment → parquet shards, then ``manifest.json``.

Stages
1. **read + clean** (one task per input file, because cleaning looks at neighbouring lines; ``cleaning.py``):
   lines are decoded (invalid UTF-8 → skipped), control characters refused, whitespace
   normalised, overlong lines truncated to ``max_words``, sentences with fewer than
   ``min_words`` words dropped, and - as the SIFTER paper does for sentence-split errors - a
   sentence whose last word is capitalised is dropped together with the sentence after it.
   What a stage drops it counts in *tally* rows that travel with the data (``tally.py``).
2. **sort + dedup + limit**: rows are sorted by a seeded hash of their text (the one barrier: an
   exact global dedup and a seeded shuffle need it). Equal texts have equal keys, so a repeat
   follows its first; one actor reads the sorted stream in order, drops repeats and keeps the
   first ``limit``. The order is a deterministic function of (seed, texts), whatever the blocks.
3. **parse + augment**: ``map_batches`` over a fixed pool of parser actors (one parser loaded
   per actor, while stages 1-2 run); the SIFTER views, linearized parse and constituent bag.
4. **write**: parquet shards of at most ``shard_rows`` rows; each write task reports its tallies,
   the driver adds them up into ``manifest.json``, written last. Nothing is materialized or
   counted in the driver: its memory does not grow with the corpus.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import sys
import time
from collections import Counter

import numpy as np
import ray
import ray.data

from orchestrator import storage
from orchestrator.data import augment as A
from orchestrator.data import constituency as C
from orchestrator.data.cleaning import clean_records, decode_lines, input_files
from orchestrator.data.corpus_config import ROW_FORMAT, AugmentConfig, CorpusConfig, ParserConfig  # noqa: F401 - the pipeline's keys, here too
from orchestrator.data.parsing import import_spacy_without_torch, make_parser
from orchestrator.data.resources import DEDUP_CPUS, free_cpus, parser_cpus
from orchestrator.data.tally import ShardSink, tallies, with_tallies
from orchestrator.errors import DataError


# ---------------------------------------------------------------- stage 1: read + clean
def read_and_clean(paths: list[str], cfg: CorpusConfig):
    """Ray Data: one task per file; output rows ``{key, text, skip, n, error}``: each kept sentence
    with its shuffle key, then the file's tallies (lines kept, truncated, and dropped per reason)."""
    fs, _ = storage.pyarrow_filesystem(paths[0])
    resolved = [storage.pyarrow_filesystem(p)[1] for p in paths]
    ds = ray.data.read_binary_files(resolved, filesystem=fs, include_paths=True)

    def explode(row: dict) -> list[dict]:
        rows = clean_records(decode_lines(row["path"], row["bytes"], cfg.format, cfg.column), cfg)
        counts = Counter(r["skip"] or "kept" for r in rows)
        counts["truncated"] = sum(r["truncated"] for r in rows)
        kept = [
            {"key": shuffle_key(r["text"], cfg.seed), "text": r["text"], "skip": "", "n": 1, "error": ""}
            for r in rows
            if not r["skip"]
        ]
        return kept + tallies(counts)

    return ds.flat_map(explode)


# ---------------------------------------------------------------- stage 2: dedup + shuffle
def shuffle_key(text: str, seed: int) -> str:
    return hashlib.sha256(f"{seed}\x00{text}".encode()).hexdigest()


class DedupAndLimit:
    """One actor reads the key-sorted stream in order (one actor, sequential calls): equal texts have
    equal keys, so a repeat follows its first; the first ``limit`` unique sentences are kept. The
    order is a deterministic function of (seed, texts), whatever the block layout."""

    def __init__(self, limit: int | None):
        self.limit, self.last, self.kept = limit, None, 0

    def __call__(self, batch: dict) -> dict:
        keep = np.ones(len(batch["key"]), dtype=bool)
        dropped = Counter()
        for i in np.flatnonzero(batch["skip"] == ""):
            key = batch["key"][i]
            if key == self.last:
                keep[i], dropped["duplicate"] = False, dropped["duplicate"] + 1
            elif self.limit is not None and self.kept >= self.limit:
                keep[i], dropped["over_limit"] = False, dropped["over_limit"] + 1
            else:
                self.kept += 1
            self.last = key
        return with_tallies(batch, keep, dropped)


# ---------------------------------------------------------------- stage 3: parse + augment
class ParseAugment:
    """A parser actor: loads the parser once, parses batches, computes every view."""

    def __init__(self, cfg: dict):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        self.cfg = CorpusConfig.model_validate(cfg)
        p = self.cfg.parser
        if p.kind == "spacy":  # the actor's own process, torch not needed in it: start without loading it
            import_spacy_without_torch(p.spacy_model)
        self.parser = make_parser(
            p.kind, spacy_model=p.spacy_model, stanza_dir=p.stanza_dir, batch_size=p.batch_size
        )

    def __call__(self, batch: dict) -> dict:
        """Real rows are parsed; those that fail leave as tallies (the first of each reason as its
        example); tallies from upstream pass through. Every row carries when its batch ran (wall
        clock), so the manifest reports the parse window without actor start-up."""
        t0 = time.time()
        real = batch["skip"] == ""
        out = (
            augment_rows(list(batch["text"][real]), list(batch["key"][real]), self.parser, self.cfg)
            if real.any()
            else {c: np.array([], dtype=object) for c in COLUMNS}
        )
        good = out["skip"] == ""
        failed: Counter = Counter()
        examples: dict[str, tuple[str, str]] = {}
        for i in np.flatnonzero(~good):
            failed[out["skip"][i]] += 1
            examples.setdefault(out["skip"][i], (out["text"][i], out["error"][i]))
        extra = [{c: batch[c][i] for c in ("text", "skip", "n", "error")} for i in np.flatnonzero(~real)]
        extra += tallies(failed, examples)
        result = {
            c: np.concatenate([out[c][good], _objects([r.get(c, [] if c == "words" else "") for r in extra])])
            for c in COLUMNS
        }
        result["n"] = np.concatenate(
            [np.ones(int(good.sum()), dtype=np.int64), np.array([r["n"] for r in extra], dtype=np.int64)]
        )
        n = len(result["n"])
        result["_t0"], result["_t1"] = np.full(n, t0), np.full(n, time.time())
        return result


COLUMNS = (
    "text",
    "words",
    "backbone_view",
    "deletion_view",
    "linearized_parse",
    "constituent_bag",
    "skip",
    "error",
)


def augment_rows(texts: list[str], keys: list[str], parser, cfg: CorpusConfig) -> dict:
    out: dict[str, list] = {c: [] for c in COLUMNS}
    errors: dict[int, str] = {}
    try:
        parses = parser.parse_batch(texts)
    except Exception:  # noqa: BLE001 - fall back to one at a time so one bad text fails alone
        parses = []
        for i, t in enumerate(texts):
            try:
                parses.append(parser.parse_batch([t])[0])
            except Exception as exc:  # noqa: BLE001 - counted; past max_parse_failures the job stops, naming it
                errors[i] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                parses.append(None)
    a = cfg.augment
    for i, (text, key, parse) in enumerate(zip(texts, keys, parses)):
        row = dict.fromkeys(COLUMNS, "")
        row["text"], row["words"] = text, []
        if parse is None or not parse.tokens:
            row["skip"], row["error"] = "parse_error", errors.get(i, "the parser returned no tokens")
        else:
            rng = random.Random(f"{cfg.seed}:{key}")
            y = A.backbone_view(
                parse,
                rng,
                source=a.backbone_source,
                fallback=a.backbone_fallback,
                rule_max_words=a.rule_max_words,
            )
            if y is None:
                row["skip"] = "no_triple"
            else:
                tree = C.constituency(parse)
                row.update(
                    words=parse.words,
                    backbone_view=y,
                    deletion_view=A.deletion_view(parse, a.deletion_classes),
                    linearized_parse=C.linearize(tree, a.parse_max_depth),
                    constituent_bag=json.dumps(C.constituent_bag(tree), sort_keys=True),
                )
        for c in COLUMNS:
            out[c].append(row[c])
    return {c: _objects(v) for c, v in out.items()}


def _objects(values: list) -> np.ndarray:
    """One object per row (``np.array`` would make equal-length word lists a 2-D array)."""
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def too_many_failures(failures: int, total: int, limit: float) -> bool:
    return failures > 0 and failures > limit * total


def parse_failure_message(source: str, failures: int, total: int, limit: float, first: dict) -> str:
    return (
        f"{source}: {failures} of {total} sentences failed to parse (over max_parse_failures {limit:.0%}); "
        f"first: {first['text'][:80]!r}: {first['error']}"
    )


# ---------------------------------------------------------------- stage 4: write, and count
SHARD_COLUMNS = [c for c in COLUMNS if c not in ("skip", "error")]

# why a line was not kept, as the console says it (the key each reason is counted under in manifest.json)
WHY = {
    "empty": "blank",
    "control_characters": "holding control characters",
    "invalid_utf8": "not UTF-8",
    "too_short": "under {min_words} words (min_words)",
    "capitalised_split": "ending in a capitalised word, a likely bad sentence split (drop_capitalised_splits)",
    "after_capitalised_split": "following such a split (drop_capitalised_splits)",
    "duplicate": "repeating a kept sentence",
    "over_limit": "beyond limit {limit}",
    "parse_error": "that failed to parse",
    "no_triple": "with no parse triple",
}


def dropped_line(skipped: dict[str, int], truncated: int, cfg) -> str:
    """One console line: how many lines each filter dropped and why, and how many were cut to ``max_words``."""
    parts = [
        f"{n} {WHY.get(k, k).format(min_words=cfg.min_words, limit=cfg.limit)}"
        for k, n in sorted(skipped.items(), key=lambda kv: -kv[1])
    ]
    cut = f"; {truncated} cut to {cfg.max_words} words (max_words)" if truncated else ""
    return f"corpus: dropped {sum(skipped.values())} line(s){': ' + '; '.join(parts) if parts else ''}{cut}"


# ---------------------------------------------------------------- the whole pipeline
def run_pipeline(cfg: CorpusConfig, output: str, *, progress: bool = True) -> dict:
    """Run every stage as one streaming execution; write shards and ``manifest.json`` to ``output``;
    return the manifest.

    Nothing is materialized between stages: the only barrier is the sort, which an exact global
    dedup and a seeded shuffle need. The parser actors start (load their parser) while the input
    is read and sorted. The manifest is written last: a directory without one is an incomplete run.
    """
    files = input_files(cfg.input)
    storage.check_access(output)
    ctx = ray.data.DataContext.get_current()
    # Ray Data's own bars where someone watches a terminal; elsewhere (logs, CI) one line per stage
    ctx.enable_progress_bars = progress and sys.stdout.isatty()
    logging.getLogger("ray.data").setLevel(logging.INFO if ctx.enable_progress_bars else logging.WARNING)
    ctx.execution_options.preserve_order = True
    if storage.exists(storage.join(output, "manifest.json")):
        raise DataError(
            f"{output}: already holds a corpus; a new build goes to a new folder (jobs commit each "
            "build to a fresh attempt folder and switch a pointer to it)"
        )

    p = cfg.parser
    free = free_cpus()
    cpus = parser_cpus(p.workers, p.cpus_per_worker, free)  # see orchestrator.data.resources
    if cpus != p.cpus_per_worker:
        print(
            f"corpus: {free:g} CPUs free on the cluster: each of the {p.workers} parser actors reserves {cpus:g} CPU "
            f"(parser.cpus_per_worker {p.cpus_per_worker:g}), so that the read and sort tasks get theirs",
            flush=True,
            file=sys.stderr,
        )
    start = time.time()
    sink = ShardSink(output, cfg.shard_rows, SHARD_COLUMNS)
    (
        read_and_clean(files, cfg)
        .sort("key")
        .repartition(target_num_rows_per_block=p.batch_size)  # streamed: one parse call per block, spread
        .map_batches(
            DedupAndLimit,
            fn_constructor_args=(cfg.limit,),
            batch_format="numpy",
            batch_size=None,
            compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=DEDUP_CPUS,
        )
        .map_batches(
            ParseAugment,
            fn_constructor_args=(cfg.model_dump(),),
            batch_size=p.batch_size,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(size=p.workers),
            num_cpus=cpus,
        )
        .write_datasink(sink)
    )
    end = time.time()
    counts, examples = sink.report["counts"], sink.report["examples"]
    truncated, kept, written = counts.pop("truncated", 0), counts.pop("kept", 0), counts.pop("written", 0)
    read = kept + sum(
        v for k, v in counts.items() if k not in ("duplicate", "over_limit", "parse_error", "no_triple")
    )
    unique = kept - counts["duplicate"] - counts["over_limit"]
    skipped = {k: v for k, v in sorted(counts.items()) if v}
    if unique == 0:
        raise DataError(f"{cfg.input}: no usable sentences (read {read}, skipped {skipped})")
    assert written + counts["parse_error"] + counts["no_triple"] == unique, (written, counts, unique)
    failures = counts["parse_error"]
    if too_many_failures(failures, unique, cfg.max_parse_failures):
        text, error = examples["parse_error"]
        raise DataError(
            parse_failure_message(
                cfg.input, failures, unique, cfg.max_parse_failures, {"text": text, "error": error}
            )
        )
    t_first, t_last = sink.report["t0"], sink.report["t1"]
    timings = {
        "pipeline_s": end - start,
        "until_first_parse_s": t_first - start,
        "parse_window_s": t_last - t_first,
        "after_last_parse_s": end - t_last,
    }
    say = print if progress else (lambda *a, **k: None)
    say(
        f"corpus: read {read} lines, {unique} unique sentences kept, parsed + augmented by {p.workers} {p.kind} "
        f"actors: {written} rows written ({failures + counts['no_triple']} unparsed) in {timings['pipeline_s']:.1f} s",
        flush=True,
    )
    print(dropped_line(skipped, truncated, cfg), flush=True)  # what the filters took, always said
    manifest = {
        "read": read,
        "written": written,
        "skipped": skipped,
        "truncated": truncated,
        "parser": p.kind,
        "seed": cfg.seed,
        "input": cfg.input,
        "input_files": len(files),
        "columns": SHARD_COLUMNS,
        "parser_cpus_reserved": cpus,
        "config": cfg.model_dump(mode="json"),
        "timings_s": timings,
    }
    storage.write_bytes(storage.join(output, "manifest.json"), json.dumps(manifest, indent=2).encode())
    return manifest
