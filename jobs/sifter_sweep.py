"""The main job: sweep SIFTER-SimCSE's λXY, λXZ, λYZ (0 included: single-pair variants and plain
SimCSE are points of the same sweep), dropout, learning rate and temperature with Ray Tune,
track it in MLflow, register the best model as ``sifter-simcse@candidate``.

    python jobs/sifter_sweep.py                      # smoke preset, embedded MLflow, local Ray
    python jobs/sifter_sweep.py --preset paper --storage s3://bucket/sieve --tracking-uri http://mlflow:5000
    python jobs/sifter_sweep.py --name NAME --resume # continue after the driver died
    ray job submit --working-dir . -- python jobs/sifter_sweep.py --preset smoke
"""

import _bootstrap

from orchestrator.drivers.sweep_job import main

if __name__ == "__main__":
    _bootstrap.run(lambda: main(__doc__, "sifter_sweep"))
