"""Mine hard negatives for (anchor, positive) rows: encoder actors stream the corpus (Ray Data), the driver keeps
each query's exact top-k, and sentence-transformers' filters choose the negatives (``mine_hard_negatives``, the
same rows on the same inputs). Writes one parquet file: anchor, positive, negative_1 ... negative_n.

    python jobs/mine_negatives.py --preset smoke
    python jobs/mine_negatives.py --preset smoke pairs.format=beir pairs.path=my_beir_folder pairs.where=null \
        'corpus={path: my_beir_folder, format: beir}' output=outputs/negatives/mine.parquet

Every input is checked before Ray starts (the rows, every corpus line, the model, an output that exists already);
on a cluster (``RAY_ADDRESS``) set ``actors`` and ``gpus_per_actor: 1`` for GPU encoders. The summary (rows,
queries kept, candidates each filter dropped, mean scores, passages/s) is printed as JSON and written beside the
output (``<output>.json``).
"""

from __future__ import annotations

import argparse
import json

import _bootstrap

from orchestrator import storage
from orchestrator.config import load_config, repo_path, resolve_config_path
from orchestrator.data.negatives import MineConfig, check, mine
from orchestrator.drivers.cli import HelpFormatter, print_config
from orchestrator.drivers.cluster import init_ray, shutdown_ray


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--preset", default="smoke", help="configs/mine_negatives/<preset>.yaml")
    src.add_argument("--config", help="a YAML config file (e.g. one written by --print-config)")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    ap.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    args = ap.parse_args()
    cfg = load_config(
        MineConfig, args.config or resolve_config_path(args.preset, "mine_negatives"), args.overrides
    )
    if args.print_config:
        return print_config(cfg)
    rows = check(cfg)
    init_ray(quiet=True)
    summary = mine(cfg, rows)
    shutdown_ray()
    storage.write_bytes(repo_path(cfg.output) + ".json", json.dumps(summary, indent=2).encode())
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    _bootstrap.run(main)
