"""Cached gradients (trainers/grad_cache.py): the same gradient as the uncached step, on one worker, on
two workers with gathered negatives (DDP) and under DeepSpeed ZeRO-2 and ZeRO-3; dropout masks replayed exactly;
one gradient reduction per step; resume exact; the config refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.test_sifter_simcse import BATCH, X, cfg_for
from trainers import common
from trainers.grad_cache import CachedEmbeddings
from trainers.sifter_simcse import build_model, compute_loss, sifter_loss, tokenize_views

SIMCSE = {"lambda_xx": 1, "lambda_xy": 0, "lambda_xz": 0, "lambda_yz": 0}


def grads_of(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(got: dict, ref: dict, atol: float = 1e-5) -> None:
    assert set(got) == set(ref)
    for name, g in ref.items():
        torch.testing.assert_close(got[name], g, atol=atol, rtol=1e-4, msg=name)


def max_diff(got: dict, ref: dict) -> float:
    return max(float((got[n] - g).abs().max()) for n, g in ref.items())


def one_step_grads(model_dir, *, mini_batch: int | None, seed: int = 0, restore_rng: bool = True, **kw):
    """(loss, gradients) of one step on the 8-sentence batch, plain or cached at ``mini_batch``."""
    torch.set_num_threads(1)
    train = {"batch_size": 8, **({"grad_cache": {"mini_batch": mini_batch}} if mini_batch else {})}
    cfg = cfg_for(model_dir, train=train, **kw)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    model.train()
    torch.manual_seed(seed)
    if not restore_rng:  # the negative control: the replay draws fresh dropout masks
        original = CachedEmbeddings.__init__
        CachedEmbeddings.__init__ = lambda self, *a, **k: original(self, *a, **{**k, "restore_rng": False})
    try:
        loss, logs = compute_loss(model, tok, BATCH, cfg)
        if mini_batch:
            loss.backward(lambda surrogate, last: surrogate.backward())
        else:
            loss.backward()
    finally:
        if not restore_rng:
            CachedEmbeddings.__init__ = original
    return logs["loss"], grads_of(model)


@pytest.mark.parametrize("lambdas", [{}, SIMCSE], ids=["sifter", "simcse"])
def test_cached_gradients_equal_the_uncached_step_without_dropout(tiny_bert_dir, lambdas):
    ref_loss, ref = one_step_grads(tiny_bert_dir, mini_batch=None, dropout=0.0, **lambdas)
    for mb in (1, 2, 4):
        loss, got = one_step_grads(tiny_bert_dir, mini_batch=mb, dropout=0.0, **lambdas)
        assert loss == pytest.approx(ref_loss, abs=1e-5)
        assert_same_grads(got, ref)


def test_with_dropout_the_replay_draws_the_first_pass_masks(tiny_bert_dir):
    """SimCSE's positives are dropout: the cached step equals the step whose forward draws its masks in the
    same mini-batches (one forward per mini-batch, with a graph); without the RNG restore it does not."""
    cfg = cfg_for(tiny_bert_dir, dropout=0.3, train={"batch_size": 8}, **SIMCSE)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    model.train()
    torch.manual_seed(7)
    enc, views, _ = tokenize_views(tok, BATCH, cfg)
    ids, mask = enc["input_ids"], enc["attention_mask"]
    out = torch.cat([model(ids[i : i + 4], mask[i : i + 4]) for i in range(0, ids.size(0), 4)])
    per_view = out.view(len(views), -1, out.size(-1))
    loss, _ = sifter_loss({v: per_view[i] for i, v in enumerate(views)}, cfg)
    loss.backward()
    ref = grads_of(model)

    _, cached = one_step_grads(tiny_bert_dir, mini_batch=4, seed=7, dropout=0.3, **SIMCSE)
    assert_same_grads(cached, ref)
    _, unrestored = one_step_grads(
        tiny_bert_dir, mini_batch=4, seed=7, restore_rng=False, dropout=0.3, **SIMCSE
    )
    assert max_diff(unrestored, ref) > 1e-3


def test_the_generators_stand_where_the_graph_free_pass_left_them(tiny_bert_dir):
    """After a cached step the RNG is where it would be without the replay: the next step's masks, and a
    checkpoint's saved RNG state, are those of the graph-free pass."""
    cfg = cfg_for(tiny_bert_dir, dropout=0.1, train={"batch_size": 8, "grad_cache": {"mini_batch": 2}})
    torch.manual_seed(0)
    model, tok = build_model(cfg)
    model.train()
    torch.manual_seed(3)
    loss, _ = compute_loss(model, tok, BATCH, cfg)
    after_first_pass = torch.get_rng_state()
    loss.backward(lambda surrogate, last: surrogate.backward())
    assert torch.equal(torch.get_rng_state(), after_first_pass)


def test_the_replay_runs_under_the_first_pass_autocast(tiny_bert_dir):
    cfg = cfg_for(tiny_bert_dir, pooling="mean", dropout=0.0)
    torch.manual_seed(0)
    model, _ = build_model(cfg)
    seen = []

    def encode(ids, mask):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return model(ids, mask)

    ids = torch.randint(5, 100, (8, 6))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cache = CachedEmbeddings(encode, ids, torch.ones_like(ids), 4)
    cache.embeddings.float().sum().backward()
    cache.replay(lambda surrogate, last: surrogate.backward())  # outside autocast, as the Stepper calls it
    assert seen == [(True, torch.bfloat16)] * 4


def test_stepper_cached_steps_resume_exactly(tiny_bert_dir, tmp_path, monkeypatch):
    """Four cached steps uninterrupted = two, a checkpoint, a fresh worker, two more (dropout on: the
    checkpointed RNG state carries the masks); without the RNG restore the resumed run differs."""
    cfg = cfg_for(
        tiny_bert_dir, dropout=0.2, train={"batch_size": 8, "lr": 1e-3, "grad_cache": {"mini_batch": 4}}
    )
    torch.set_num_threads(1)

    def fresh():
        torch.manual_seed(0)
        model, tok = build_model(cfg)
        model.train()
        return model, tok, common.make_stepper(model, cfg, rows_per_worker=64)

    def steps(model, tok, stepper, n):
        for _ in range(n):
            loss, _ = compute_loss(stepper.model, tok, BATCH, cfg)
            stepper.step(loss)

    model, tok, stepper = fresh()
    torch.manual_seed(11)
    steps(model, tok, stepper, 4)
    ref = {n: p.detach().clone() for n, p in model.named_parameters()}

    def resumed(skip_rng: bool):
        model, tok, stepper = fresh()
        torch.manual_seed(11)
        steps(model, tok, stepper, 2)
        stepper.save(tmp_path / str(skip_rng), {"step": 2})
        model, tok, stepper = fresh()
        torch.manual_seed(99)  # a restarted worker's generators are elsewhere until the checkpoint is read
        if skip_rng:
            monkeypatch.setenv("SIEVE_SKIP_RNG_RESTORE", "1")
        stepper.load(tmp_path / str(skip_rng))
        monkeypatch.delenv("SIEVE_SKIP_RNG_RESTORE", raising=False)
        steps(model, tok, stepper, 2)
        return {n: p.detach() for n, p in model.named_parameters()}

    assert max_diff(resumed(False), ref) < 1e-6
    assert max_diff(resumed(True), ref) > 1e-5


def test_config_refusals():
    from orchestrator.config import validate
    from orchestrator.errors import ConfigError
    from trainers.sifter_simcse import ContrastiveConfig
    from trainers.tsdae import TSDAEConfig

    with pytest.raises(
        ConfigError,
        match=r"^x.yaml: train: grad_cache.mini_batch \(24\) must divide the per-worker "
        r"train.batch_size \(64\)$",
    ):
        validate(ContrastiveConfig, {"train": {"batch_size": 64, "grad_cache": {"mini_batch": 24}}}, "x.yaml")
    with pytest.raises(ConfigError, match=r"^x.yaml: train.grad_cache: tsdae cannot cache gradients"):
        validate(TSDAEConfig, {"train": {"grad_cache": {"mini_batch": 8}}}, "x.yaml")
    ok = validate(
        ContrastiveConfig, {"train": {"batch_size": 64, "grad_cache": {"mini_batch": 16}}}, "x.yaml"
    )
    assert ok.train.grad_cache.mini_batch == 16


# ---------------------------------------------------------------- two workers: DDP, ZeRO-2, ZeRO-3
MODES = [
    ("ddp", False),
    ("ddp", True),
    ("zero2", True),
    ("zero3", True),
]  # (engine, cached), run in this order


def _worker(rank: int, world: int, model_dir: str, out_dir: str, init_file: str) -> None:
    """Every mode's one step in one process group (each from the same seeded model)."""
    import torch.distributed as dist
    import torch.nn.parallel

    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    # Ray Train's prepare_model wraps a CPU module in DDP; no Ray Train context exists in a spawned process
    import ray.train.torch

    ray.train.torch.prepare_model = torch.nn.parallel.DistributedDataParallel
    b = len(X) // world
    local = {k: v[rank * b : (rank + 1) * b] for k, v in BATCH.items()}
    for engine, cached in MODES:
        train = {"batch_size": b, **({"grad_cache": {"mini_batch": 1}} if cached else {})}
        cfg = cfg_for(
            model_dir,
            dropout=0.0,
            train=train,
            deepspeed={"stage": {"ddp": 0, "zero2": 2, "zero3": 3}[engine]},
        )
        torch.manual_seed(0)
        model, tok = build_model(cfg)
        model.train()
        stepper = common.make_stepper(model, cfg, rows_per_worker=64)
        reductions = []
        if stepper.ddp is not None:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def count(state, bucket, reductions=reductions):
                reductions.append(bucket.index())
                return allreduce_hook(state, bucket)

            stepper.ddp.register_comm_hook(None, count)
        loss, logs = compute_loss(stepper.model, tok, local, cfg)
        stepper.backward(loss)
        import deepspeed.comm.comm as ds_comm

        shm_op = getattr(ds_comm.cdb, "shm_comm_op", None) is not None  # the ZeRO runs' comm backend
        torch.save(
            {"loss": logs["loss"], "grads": stepper.gradients(), "reductions": reductions, "shm_op": shm_op},
            Path(out_dir) / f"{engine}-{cached}-rank{rank}.pt",
        )
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_workers_cached_equal_one_worker_uncached_with_the_global_batch(
    tiny_bert_dir, tmp_path, monkeypatch
):
    """2 workers × batch 4, cached at mini-batch 1 with gathered negatives = 1 worker × batch 8 uncached, under
    DDP, ZeRO-2 and ZeRO-3; under DDP the gradient is all-reduced once per step (as many bucket reductions as
    the uncached step's, not one set per mini-batch). DeepSpeed's comm backend starts without compiling its CPU
    inference all-reduce (``common.skip_cpu_inference_all_reduce``: CI hung behind that compile's lock)."""
    import torch.multiprocessing as mp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "torch_extensions"))  # empty: a compile shows

    ref_loss, ref = one_step_grads(tiny_bert_dir, mini_batch=None, dropout=0.0)
    mp.spawn(
        _worker, args=(2, str(tiny_bert_dir), str(tmp_path), str(tmp_path / "init")), nprocs=2, join=True
    )
    got = {(e, c, r): torch.load(tmp_path / f"{e}-{c}-rank{r}.pt") for e, c in MODES for r in range(2)}
    for (engine, cached, r), out in got.items():
        assert out["loss"] == pytest.approx(ref_loss, abs=1e-5), (engine, cached, r)
        assert_same_grads(out["grads"], ref)
    plain, cached = got["ddp", False, 0]["reductions"], got["ddp", True, 0]["reductions"]
    assert plain and cached == plain
    assert not any(out["shm_op"] for out in got.values())
    assert not (tmp_path / "torch_extensions").exists()
