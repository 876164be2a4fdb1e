"""Compare methods or settings on one base model: K seeds × N arms, paired by seed, each arm's paired
difference against the untouched base (measured in the same run, with each pooling the arms are read with)
and against a reference arm, with a 95% confidence interval; a leaderboard in MLflow (one parent run, a
child run per trial) and in the console; the winner registered only when its interval against the base
lies above 0 (``register:`` in the compare file).

    python jobs/compare.py                                   # smoke preset: SimCSE vs SIFTER, 2 seeds
    python jobs/compare.py --preset sifter_cls --out bench/results/sifter_compare_cpu.md
    python jobs/compare.py --name NAME --resume              # continue after the driver died
    python jobs/compare.py --preset smoke train.max_steps=40 compare.seeds=[1,2,3]
    ray job submit --working-dir . -- python jobs/compare.py --preset sifter_cls
"""

import _bootstrap

from orchestrator.drivers.compare import main

if __name__ == "__main__":
    _bootstrap.run(lambda: main(__doc__))
