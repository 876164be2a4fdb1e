"""SIFTER-LSTM's cell vs ``torch.nn.LSTM`` of the same size: forward + backward time per batch,
side by side (interleaved repetitions, so machine noise hits both), on this CPU.

Both run the same batch: 384-d inputs, hidden 384, batch 32, sequence lengths 16 / 32 / 64, half
of the tokens short-circuited for ours (the mask costs one ``torch.where`` per step). Our cell
precomputes every step's input projection in one matmul and does one ``addmm`` per step;
``nn.LSTM`` runs oneDNN's fused kernel. Goal from the issue: ours ≤ 2× nn.LSTM on CPU.

    python bench/lstm_cell.py [--reps 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import write_results


def timed(fn, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from trainers.sifter_lstm import SifterLSTM

    rows = []
    for seq in (16, 32, 64):
        torch.manual_seed(0)
        ref = torch.nn.LSTM(384, 384, batch_first=True)
        ours = SifterLSTM(384, 384)
        x = torch.randn(32, seq, 384, requires_grad=True)
        short = torch.rand(32, seq) < 0.5
        valid = torch.ones(32, seq, dtype=torch.bool)

        def run_ref(ref=ref, x=x):
            ref(x)[0].sum().backward()

        def run_ours(ours=ours, x=x, short=short, valid=valid):
            ours(x, short, valid)[0].sum().backward()

        for f in (run_ref, run_ours):  # warm-up
            timed(f, 3)
        t_ref = t_ours = 0.0
        for _ in range(args.rounds):
            t_ref += timed(run_ref, args.reps)
            t_ours += timed(run_ours, args.reps)
        t_ref, t_ours = t_ref / args.rounds, t_ours / args.rounds
        rows.append(
            {"seq_len": seq, "nn_lstm_ms": t_ref * 1e3, "ours_ms": t_ours * 1e3, "ratio": t_ours / t_ref}
        )
        print(rows[-1])
    lines = [
        f"# SIFTER-LSTM cell vs torch.nn.LSTM (forward + backward, batch 32, 384→384, {args.threads} threads)",
        "",
        "Interleaved rounds in one process; `python bench/lstm_cell.py`. Goal: ours ≤ 2× nn.LSTM.",
        "",
        "| sequence length | nn.LSTM ms | SIFTER-LSTM ms | ours / nn.LSTM |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['seq_len']} | {r['nn_lstm_ms']:.1f} | {r['ours_ms']:.1f} | {r['ratio']:.2f}× |" for r in rows
    ]
    write_results(
        "lstm_cell",
        {"threads": args.threads, "reps": args.reps, "rounds": args.rounds, "rows": rows},
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
