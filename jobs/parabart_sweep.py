"""ParaBART sweep: λ_adv (0 = the "w/o adversarial loss" ablation) and word dropout with Ray Tune,
model selection on STS-B dev, every trial tested on STS (Pearson, the paper's metric), tracked in
MLflow, the best registered as ``parabart@candidate``. QQP-Easy/Hard and the syntactic probes:
``bench/parabart_smoke.py``.

    python jobs/parabart_sweep.py                    # smoke preset, embedded MLflow, local Ray
    python jobs/parabart_sweep.py --preset paper --storage s3://bucket/sieve --tracking-uri http://mlflow:5000
    python jobs/parabart_sweep.py --name NAME --resume
"""

import _bootstrap

from orchestrator.drivers.sweep_job import main

if __name__ == "__main__":
    _bootstrap.run(lambda: main(__doc__, "parabart_sweep"))
