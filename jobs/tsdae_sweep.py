"""TSDAE sweep: deletion ratio and learning rate (and pooling in the paper preset) with Ray Tune,
model selection on a domain dev set (PIT-2015 dev AP), the best trial tested on TwitterPara AP
and STS, tracked in MLflow and registered as ``tsdae@candidate``.

    python jobs/tsdae_sweep.py                       # smoke preset, embedded MLflow, local Ray
    python jobs/tsdae_sweep.py --preset paper --storage s3://bucket/sieve --tracking-uri http://mlflow:5000
    python jobs/tsdae_sweep.py --name NAME --resume  # continue after the driver died
"""

import _bootstrap

from orchestrator.drivers.sweep_job import main

if __name__ == "__main__":
    _bootstrap.run(lambda: main(__doc__, "tsdae_sweep"))
