"""The pieces every method's worker loop shares: rank helpers, the all-gather that keeps the
local slice's graph, learning-rate schedules, the optimiser step (DDP or DeepSpeed ZeRO), and
checkpoints that Ray Train can report and resume from.

Trainers talk to Ray only through ``ray.train.report`` / ``get_checkpoint`` /
``get_dataset_shard`` (and ``prepare_model`` here), as Ray's own examples do.
"""

from __future__ import annotations

import json
import os
import random
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from transformers import get_scheduler

from trainers.checkpoint import (  # noqa: F401 - recipes read load_module_state and export_trained_encoder here
    EXTRA_STATE,
    deepspeed_reads_weights_only,
    export_trained_encoder,
    extra_states,
    load_module_state,
    load_weights_only,
    rng_state,
    set_rng_state,
)
from trainers.grad_cache import CachedLoss
from trainers.ingest import Ingest


# ---------------------------------------------------------------- process group helpers
def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_with_grad(x: torch.Tensor) -> torch.Tensor:
    """All-gather ``x`` from every worker, differentiably (``torch.distributed.nn.functional.all_gather``).

    Every worker computes the loss over the *global* batch; the backward of the gather hands each
    worker the sum of every worker's gradient for its own slice, N times the gradient of the one
    global loss, and DDP's average of the N workers then gives exactly the global-batch gradient: N
    workers × batch b = 1 worker × batch N·b (``tests/test_sifter_simcse.py`` proves it).
    """
    if world_size() == 1:
        return x
    return torch.cat(dist_nn.all_gather(x.contiguous()), dim=0)


def average_gradients(params) -> None:
    """All-reduce and average ``.grad`` over the workers (what DDP does, by hand)."""
    n = world_size()
    if n == 1:
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad)
            p.grad /= n


WORKER_START: list[float] = []  # when this worker process's train function began (perf_counter)


def setup_worker(cfg) -> Ingest:
    """Start of every method's train function: this worker's shard starts reading ahead (while the
    model loads), torch gets as many threads as the worker has CPUs on CPU, and every RNG is seeded
    (rank-offset, so dropout masks differ between workers). Returns the shard's batches for
    the loop (``trainers/loop.py``)."""
    WORKER_START[:] = [time.perf_counter()]
    ingest = Ingest(cfg.train.batch_size, epochs=cfg.train.epochs, depth=cfg.perf.ingest_prefetch)
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, int(cfg.scaling.cpus_per_worker)))
    s = cfg.train.seed + rank()
    random.seed(s)
    np.random.seed(s)
    torch.manual_seed(s)
    return ingest


def lr_scheduler(optimizer, schedule: str, warmup_steps: int, total_steps: int):
    """transformers' schedules: ``linear`` decay to 0 (after an optional linear warm-up) or ``constant``."""
    name = {"linear": "linear", "constant": "constant_with_warmup" if warmup_steps else "constant"}[schedule]
    return get_scheduler(
        name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(1, total_steps)
    )


def device_for(cfg) -> torch.device:
    """The worker's device: its GPU when the run asks for GPUs and one is there, else the CPU."""
    return torch.device("cuda" if cfg.scaling.use_gpu and torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------- the optimiser step
class Stepper:
    """Backward + optimiser step for plain PyTorch / DDP or a DeepSpeed ZeRO engine.

    ``model`` is what the trainer calls forward on (DDP-wrapped or the DeepSpeed engine);
    ``module`` is the underlying ``nn.Module`` (for evaluation and export).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        param_groups,
        *,
        lr: float,
        schedule: str,
        total_steps: int,
        grad_clip: float | None,
        deepspeed_cfg=None,
        warmup_steps: int = 0,
        fused: bool = False,
        compile_backend: str | None = None,
        extra_optimizers: dict | None = None,
        extra_modules: dict | None = None,
    ):
        self.module = module
        self.grad_clip = grad_clip
        # saved and restored with the checkpoint: small modules trained beside the main one (ParaBART's
        # discriminator, outside DDP/ZeRO: its gradients are averaged by hand) and their optimisers
        self.extra_optimizers = extra_optimizers or {}
        self.extra_modules = extra_modules or {}
        self.deepspeed = deepspeed_cfg is not None and deepspeed_cfg.stage > 0
        self.ddp = None  # the DDP wrapper on a multi-worker plain run (its ``no_sync``)
        if self.deepspeed:
            import deepspeed  # lazy: heavy (compiles op builders' metadata), and only ZeRO runs need it

            ds_config = deepspeed_config(deepspeed_cfg, grad_clip=grad_clip)
            skip_cpu_inference_all_reduce()
            self.optimizer = torch.optim.AdamW(param_groups, lr=lr)
            self.scheduler = lr_scheduler(self.optimizer, schedule, warmup_steps, total_steps)
            self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=module, optimizer=self.optimizer, lr_scheduler=self.scheduler, config=ds_config
            )
        else:
            self.ddp = ray_prepare_model(module) if world_size() > 1 else None
            self.model = self.ddp if self.ddp is not None else module
            if (
                compile_backend
            ):  # the forward the loss calls; ``module`` stays the plain one for eval and export
                self.model = torch.compile(self.model, backend=compile_backend)
            self.optimizer = torch.optim.AdamW(param_groups, lr=lr, fused=fused or None)
            self.scheduler = lr_scheduler(self.optimizer, schedule, warmup_steps, total_steps)

    def step(self, loss: torch.Tensor | CachedLoss) -> None:
        self.backward(loss)
        self.apply()

    def backward(self, loss: torch.Tensor | CachedLoss) -> None:
        """The step's gradients, reduced across workers (read them with :meth:`gradients`). A
        :class:`CachedLoss` runs mini-batch by mini-batch (``trainers/grad_cache.py``) and is reduced
        once, at its last mini-batch."""
        if self.deepspeed:
            if not isinstance(loss, CachedLoss):
                self.model.backward(loss)
                return

            def micro(surrogate: torch.Tensor, last: bool) -> None:
                self.model.set_gradient_accumulation_boundary(last)  # reduce only after the last
                self.model.backward(surrogate, scale_wrt_gas=False)

            loss.backward(micro)
            return
        self.optimizer.zero_grad(set_to_none=True)
        if isinstance(loss, CachedLoss):
            loss.backward(
                lambda surrogate, last: surrogate.backward(),
                no_sync=self.ddp.no_sync if self.ddp is not None else nullcontext,
            )
        else:
            loss.backward()

    def gradients(self) -> dict[str, torch.Tensor]:
        """Every parameter's full gradient after :meth:`backward` (ZeRO's partitions gathered)."""
        if self.deepspeed:
            from deepspeed.utils import safe_get_full_grad  # lazy: only ZeRO runs get here

            grads = {n: safe_get_full_grad(p) for n, p in self.module.named_parameters()}
        else:
            grads = {n: p.grad for n, p in self.module.named_parameters()}
        return {n: g.detach().clone() for n, g in grads.items() if g is not None}

    def apply(self) -> None:
        """The optimiser step (and the schedule's) on the gradients :meth:`backward` left."""
        if self.deepspeed:
            self.model.step()
            return
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        self.optimizer.step()
        self.scheduler.step()

    @contextmanager
    def eval_module(self, build_plain):
        """Yield a module rank 0 can evaluate alone, without collectives. Plain/DDP and ZeRO-1/2 keep full parameters on every rank: the module itself. ZeRO-3's
        forward hooks all-gather parameters (a collective every rank would have to join), so
        all ranks gather once and rank 0 copies the full weights into a plain module built by
        ``build_plain()`` (kept for the next evaluation).
        """
        stage3 = self.deepspeed and getattr(self.model, "zero_optimization_stage", lambda: 0)() == 3
        if not stage3:
            yield self.module
            return
        import deepspeed  # lazy: only ZeRO-3 runs get here

        with deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None):
            if rank() == 0:
                if getattr(self, "_plain", None) is None:
                    self._plain = build_plain()
                with torch.no_grad():
                    full = dict(self.module.named_parameters())
                    for name, p in self._plain.named_parameters():
                        p.copy_(full[name].data)
        yield self._plain if rank() == 0 else None

    # -- checkpoints: every rank writes (ZeRO shards), plain runs only rank 0
    def save(self, directory: Path, state: dict) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        extras = {
            "extra_optimizers": {k: o.state_dict() for k, o in self.extra_optimizers.items()},
            "extra_modules": {k: m.state_dict() for k, m in self.extra_modules.items()},
        }
        if self.deepspeed:
            self.model.save_checkpoint(str(directory), tag="ds", client_state=extras)
            if rank() == 0:  # a module's extra state (ParaBART's vocabularies) in a file read weights-only
                torch.save(extra_states(self.module), directory / EXTRA_STATE)
        elif rank() == 0:
            torch.save(
                {
                    "model": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                    **extras,
                },
                directory / "model.pt",
            )
        if rank() == 0:
            (directory / "state.json").write_text(json.dumps(state))
        torch.save(rng_state(), directory / f"rng_rank{rank()}.pt")  # every rank: its own dropout stream

    def load(self, directory: Path) -> dict:
        rng_file = directory / f"rng_rank{rank()}.pt"
        # a resumed run draws the same dropout masks as an uninterrupted one (SIEVE_SKIP_RNG_RESTORE: the
        # tests' negative control, which shows the equivalence bound fails without it)
        if rng_file.is_file() and not os.environ.get("SIEVE_SKIP_RNG_RESTORE"):
            set_rng_state(load_weights_only(rng_file))
        return self._load(directory)

    def _load(self, directory: Path) -> dict:
        if self.deepspeed:
            with deepspeed_reads_weights_only():  # its own loads are not weights-only
                _, blob = self.model.load_checkpoint(str(directory), tag="ds")
            blob = blob or {}
        else:
            blob = load_weights_only(directory / "model.pt")
            self.module.load_state_dict(blob["model"])
            self.optimizer.load_state_dict(blob["optimizer"])
            self.scheduler.load_state_dict(blob["scheduler"])
        for k, state in blob.get("extra_modules", {}).items():
            self.extra_modules[k].load_state_dict(state)
        for k, state in blob.get("extra_optimizers", {}).items():
            self.extra_optimizers[k].load_state_dict(state)
        return json.loads((directory / "state.json").read_text())


def skip_cpu_inference_all_reduce() -> None:
    """On its CPU accelerator DeepSpeed JIT-compiles a shared-memory all-reduce (``deepspeed_shm_comm``) when
    its comm backend starts: ~25 s on an idle 2-core machine, longer on a busy one, in the first ZeRO run, behind
    a lock file that a compile killed half-way leaves behind, on which every later run then waits for ever
    (CI, 2026-12-07). The op serves only ``inference_all_reduce`` (tensor-parallel inference), which training
    never calls; marking it incompatible is the gate DeepSpeed's own ``build_shm_op`` reads."""
    from deepspeed.accelerator import get_accelerator  # lazy: only ZeRO runs import DeepSpeed

    if get_accelerator().device_name() == "cpu":
        import deepspeed.ops  # lazy, as above

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_config(cfg, *, grad_clip: float | None) -> dict:
    on_gpu = torch.cuda.is_available()
    bf16 = cfg.bf16 == "on" or (cfg.bf16 == "auto" and on_gpu)
    zero: dict = {"stage": cfg.stage}
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if cfg.offload_params and cfg.stage == 3:
        zero["offload_param"] = {"device": "cpu"}
    if cfg.stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    if cfg.bucket_size:
        zero.update(reduce_bucket_size=cfg.bucket_size, allgather_bucket_size=cfg.bucket_size)
        if cfg.stage == 3:
            zero["stage3_prefetch_bucket_size"] = cfg.bucket_size
    if cfg.max_live_parameters and cfg.stage == 3:
        zero.update(
            stage3_max_live_parameters=cfg.max_live_parameters,
            stage3_max_reuse_distance=cfg.max_live_parameters,
        )
    out = {
        "train_micro_batch_size_per_gpu": 1,  # informational: the trainer feeds whole batches
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    if cfg.offload_optimizer:
        # our torch AdamW steps the offloaded fp32 states on the CPU. DeepSpeed refuses a client optimiser with
        # offload unless told, to steer users to DeepSpeedCPUAdam - a C++ op JIT-compiled on first use, which
        # the training image (no compiler, DS_BUILD_OPS=0) cannot build
        out["zero_force_ds_cpu_optimizer"] = False
    if grad_clip:
        out["gradient_clipping"] = grad_clip
    return out


# ---------------------------------------------------------------- the loop every method shares
def param_groups(module: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases and norm weights (BERT's convention)."""
    return named_param_groups(list(module.named_parameters()), weight_decay)


def named_param_groups(named: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    no_decay = (
        "bias",
        "LayerNorm.weight",
        "layer_norm",
        "layernorm",
        "norm.weight",
        "norm1.weight",
        "norm2.weight",
    )
    return [
        {"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
    ]


def part_groups(
    parts: dict[str, list[tuple[str, torch.nn.Parameter]]], weight_decay: float, **lr
) -> list[dict]:
    """AdamW groups tagged by part (``{part: named parameters}``) - the decay rule of
    :func:`named_param_groups` within each part, an own learning rate where ``lr`` names one (``part=rate``)
    - so :func:`hold_part` can hold a part still."""
    return [
        {**g, **({"lr": lr[part]} if lr.get(part) is not None else {}), "part": part}
        for part, named in parts.items()
        for g in named_param_groups(named, weight_decay)
        if g["params"]
    ]


def hold_part(optimizer: torch.optim.Optimizer, part: str, frozen: bool) -> None:
    """While ``frozen``, the groups tagged ``part`` step at lr 0 - AdamW then leaves those weights bit-identical
    (its decay is scaled by lr too); the schedule restores their lr after every step, so this is called before
    each one. The part still gets gradients (DDP needs every parameter used), and Adam's moments see them."""
    if frozen:
        for g in optimizer.param_groups:
            if g.get("part") == part:
                g["lr"] = 0.0


def make_stepper(
    module: torch.nn.Module, cfg, rows_per_worker: int, groups: list[dict] | None = None, **extras
) -> Stepper:
    """The optimiser of a method config with the shared ``train`` / ``deepspeed`` blocks
    (``extras``: ``extra_modules`` / ``extra_optimizers`` saved with every checkpoint)."""
    total_steps = cfg.train.planned_steps(rows_per_worker)
    gpu = device_for(cfg).type == "cuda"
    return Stepper(
        module,
        groups or param_groups(module, cfg.train.weight_decay),
        lr=cfg.train.lr,
        schedule=cfg.train.lr_schedule,
        total_steps=total_steps,
        grad_clip=cfg.train.grad_clip,
        warmup_steps=cfg.train.warmup_steps,
        fused=cfg.perf.on("fused_adamw", gpu),
        compile_backend=cfg.perf.compile_backend if cfg.perf.compile else None,
        deepspeed_cfg=cfg.deepspeed,
        **extras,
    )


def autocast(cfg):
    """bf16 autocast of the forward on the plain / DDP path (``perf.bf16``); ZeRO casts by its own config."""
    device = device_for(cfg)
    on = cfg.perf.on("bf16", device.type == "cuda") and not (cfg.deepspeed.stage > 0)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=on)


def to_device(tensor: torch.Tensor, device: torch.device | str, cfg) -> torch.Tensor:
    """A batch tensor on ``device``: from pinned memory, without blocking, when ``perf.pin_memory`` is on."""
    device = torch.device(device)
    if device.type == "cuda" and cfg.perf.on("pin_memory", True):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def ray_prepare_model(module: torch.nn.Module) -> torch.nn.Module:
    """Ray Train's DDP wrap (its device placement and process group)."""
    import ray.train.torch  # lazy: the recipes import without Ray where none runs (bench/gpu.sh's image)

    return ray.train.torch.prepare_model(module)
