"""Sieve's library (``orchestrator``): configs, models, data, evaluation, storage, tracking and the Ray drivers.

Importing the package sets the process's environment defaults, once, before any module of it imports a
heavy library (every ``orchestrator.*`` import runs this first; ``trainers`` imports it first too):

* ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``: models are local folders or ``s3://`` URIs, never a hub id
  that silently downloads (transformers reads these when it is imported);
* ``RAY_USAGE_STATS_ENABLED=0``: nothing leaves the cluster; ``RAY_TRAIN_V2_ENABLED=1``: Train V2 is the API
  the drivers use (read when ``ray.train`` is imported);
* ``TOKENIZERS_PARALLELISM=false``: the Rust tokenizers' thread pool does not survive Ray's forks.

Each is a default: a value already in the environment wins.
"""

import os

ENVIRONMENT_DEFAULTS = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_V2_ENABLED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
for _key, _value in ENVIRONMENT_DEFAULTS.items():
    os.environ.setdefault(_key, _value)
