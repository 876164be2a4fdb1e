"""Build the augmented corpus: clean, dedup, shuffle, parse (actor pool) and write parquet shards.

    python jobs/augment_corpus.py --input data/corpus/wikisplit_sample.txt --output outputs/corpus \
        [--parser spacy|stanza] [--workers N] [--config configs/corpus/default.yaml] [key=value ...]

Writes a build - ``shards/*.parquet`` (columns text, words, backbone_view, deletion_view,
linearized_parse, constituent_bag) and ``manifest.json`` with read/written/skipped counts - to a fresh
``OUTPUT/attempts/<id>/`` and then points ``OUTPUT/CURRENT`` at it; ``data.shards=OUTPUT`` reads it.
"""

from __future__ import annotations

import argparse
import json

import _bootstrap

from orchestrator.config import load_config
from orchestrator.data.cleaning import input_files
from orchestrator.data.corpus import CorpusConfig, run_pipeline
from orchestrator.drivers.cli import HelpFormatter
from orchestrator.drivers.cluster import init_ray
from orchestrator.storage import build_committed, join, read_bytes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--input", help="text / tsv / parquet file or directory, local or s3://")
    ap.add_argument("--output", required=True, help="output directory, local or s3://")
    ap.add_argument("--config", help="YAML with CorpusConfig keys (defaults otherwise)")
    ap.add_argument(
        "--parser", choices=["spacy", "stanza"], help="parser backend (default: the config's, spacy)"
    )
    ap.add_argument("--workers", type=int, help="parser actors")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("overrides", nargs="*", help="key=value config overrides, e.g. parser.batch_size=128")
    args = ap.parse_args()

    overrides = list(args.overrides)
    if args.input:
        overrides.append(f"input={args.input}")
    if args.parser:
        overrides.append(f"parser.kind={args.parser}")
    if args.workers:
        overrides.append(f"parser.workers={args.workers}")
    cfg = load_config(CorpusConfig, args.config, overrides)
    input_files(cfg.input)  # a missing input fails here, before Ray starts
    init_ray()
    # each build goes to a fresh attempt folder; the output's CURRENT pointer switches to it last, so a
    # crash mid-build never leaves new shards beside an old manifest, and readers never see half a build
    folder = build_committed(
        args.output, lambda out: run_pipeline(cfg, out, progress=not args.no_progress), reuse=False
    )
    manifest = json.loads(read_bytes(join(folder, "manifest.json")))
    summary = {k: manifest[k] for k in ("read", "written", "skipped", "truncated", "parser", "seed")}
    summary["build"] = folder
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    _bootstrap.run(main)
