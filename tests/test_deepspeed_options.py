"""DeepSpeed's options on this machine's CPU accelerator, in one process (gloo): ZeRO-2 and ZeRO-3 with the
optimiser offloaded start and take the step plain AdamW takes, and ``deepspeed.bf16: on`` trains with the fp32
loss to 1% under both. (The 2-worker equalities of ZeRO-2/3 are ``tests/test_grad_cache.py``'s; crash/resume, ``test_train_ray.py``.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.test_sifter_simcse import BATCH, cfg_for
from trainers import common
from trainers.sifter_simcse import build_model, compute_loss

SETTINGS = {
    "plain": {"stage": 0},
    "offload": {"stage": 2, "offload_optimizer": True},
    "bf16": {"stage": 2, "bf16": "on"},
    "offload3": {"stage": 3, "offload_optimizer": True},
    "bf16_3": {"stage": 3, "bf16": "on"},
}


def _worker(rank: int, model_dir: str, out_dir: str, init_file: str) -> None:
    import torch.distributed as dist

    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK="0", WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    out = {}
    for name, ds in SETTINGS.items():
        cfg = cfg_for(model_dir, dropout=0.0, train={"batch_size": 8, "lr": 1e-3}, deepspeed=ds)
        torch.manual_seed(0)
        model, tok = build_model(cfg)
        model.train()
        stepper = common.make_stepper(model, cfg, rows_per_worker=64)
        loss, logs = compute_loss(stepper.model, tok, BATCH, cfg)
        stepper.step(loss)
        if ds["stage"] == 3:  # ZeRO-3 holds each parameter partitioned: gathered whole to be read
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(model.parameters())):
                params = {n: p.detach().float().clone() for n, p in model.named_parameters()}
                dtype = str(next(model.parameters()).dtype)
        else:
            params = {n: p.detach().float().clone() for n, p in model.named_parameters()}
            dtype = str(next(model.parameters()).dtype)
        out[name] = {"loss": logs["loss"], "params": params, "dtype": dtype}
    torch.save(out, Path(out_dir) / "out.pt")
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero2_and_zero3_offload_step_as_adamw_and_bf16_trains_within_one_percent(tiny_bert_dir, tmp_path):
    import torch.multiprocessing as mp

    torch.manual_seed(0)
    start = {
        n: p.detach().clone()
        for n, p in build_model(cfg_for(tiny_bert_dir, dropout=0.0))[0].named_parameters()
    }
    mp.spawn(_worker, args=(str(tiny_bert_dir), str(tmp_path), str(tmp_path / "init")), nprocs=1, join=True)
    out = torch.load(tmp_path / "out.pt")
    plain = out["plain"]
    moved = max(float((plain["params"][n] - p).abs().max()) for n, p in start.items())
    assert (
        moved > 1e-4
    )  # the step moved the weights (lr 1e-3): the equality below is not of two unmoved models
    for offload in (out["offload"], out["offload3"]):  # ZeRO-2 and ZeRO-3, the optimiser on the CPU
        assert offload["loss"] == pytest.approx(plain["loss"], abs=1e-6)
        assert offload["params"].keys() == plain["params"].keys()
        for n, p in plain["params"].items():
            torch.testing.assert_close(offload["params"][n], p, atol=1e-6, rtol=1e-5, msg=n)
    for bf16 in (out["bf16"], out["bf16_3"]):
        assert bf16["dtype"] == "torch.bfloat16"
        assert bf16["loss"] == pytest.approx(plain["loss"], rel=0.01)
        assert max(float((bf16["params"][n] - p).abs().max()) for n, p in start.items()) > 1e-4


@pytest.mark.parametrize("stage", [2, 3])
def test_bucket_and_live_parameter_options_reach_the_fields_deepspeed_reads(stage):
    """``deepspeed.bucket_size`` / ``max_live_parameters`` as DeepSpeed's own config model parses them (it refuses
    an unknown key, so a misspelt one fails here); unset, DeepSpeed's defaults - the figures the options'
    descriptions give."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from orchestrator.config import DeepSpeedBlock

    def parsed(**kw):
        return DeepSpeedZeroConfig(
            **common.deepspeed_config(DeepSpeedBlock(stage=stage, **kw), grad_clip=None)["zero_optimization"]
        )

    got = parsed(bucket_size=1234, max_live_parameters=5678)
    assert (got.reduce_bucket_size, got.allgather_bucket_size) == (1234, 1234)
    assert (got.prefetch_bucket_size, got.max_live_parameters, got.max_reuse_distance) == (
        (1234, 5678, 5678) if stage == 3 else (5e7, 1e9, 1e9)
    )
    default = parsed()
    assert (default.reduce_bucket_size, default.prefetch_bucket_size, default.max_live_parameters) == (
        5e8,
        5e7,
        1e9,
    )
