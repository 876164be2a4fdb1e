"""Train one method on Ray Train, measure the untouched base model beside it, export the best
checkpoint, run its test evaluation, and track everything in MLflow.

    python jobs/train.py --method sifter_simcse --preset smoke [key=value ...]
    python jobs/train.py --method simcse --config my.yaml --tracking-uri http://mlflow:5000
"""

import _bootstrap

from orchestrator.drivers.train_job import main

if __name__ == "__main__":
    _bootstrap.run(lambda: main(__doc__))
