"""LSTM vs SIFTER-LSTM on SST-2: both variants over several seeds with Ray Tune, dev accuracy
every 50 steps (best checkpoint kept), every trial tested, a mean ± std table in the report,
tracked in MLflow, the best registered as ``sifter-lstm@candidate``.

    python jobs/sentiment_sweep.py                   # smoke preset, embedded MLflow, local Ray
    python jobs/sentiment_sweep.py --preset paper --storage s3://bucket/sieve --tracking-uri http://mlflow:5000
    python jobs/sentiment_sweep.py --name NAME --resume
"""

import _bootstrap

from orchestrator.drivers.sweep_job import main

if __name__ == "__main__":
    _bootstrap.run(lambda: main(__doc__, "sentiment_sweep"))
