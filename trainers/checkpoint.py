"""Reading a training checkpoint back into one module state dict, for export and evaluation: a plain
``model.pt`` or a DeepSpeed ZeRO checkpoint (any stage, merged with DeepSpeed's ``zero_to_fp32``). Every
file read here is loaded weights-only, DeepSpeed's included (:func:`deepspeed_reads_weights_only`); a
module's extra state under ZeRO is in our own ``extra_state.pt``. Each rank's RNG state, saved with every
checkpoint, is written and restored here too.
"""

from __future__ import annotations

import pickle
import random
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from orchestrator.errors import DataError

EXTRA_STATE = "extra_state.pt"


def deepspeed_globals() -> list:
    """The DeepSpeed classes its checkpoint files pickle (ZeRO-2 and -3 optimizer states), allowed by name and
    nothing else."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler  # lazy: ZeRO only
    from deepspeed.runtime.zero.config import ZeroStageEnum  # lazy: ZeRO only
    from deepspeed.utils.tensor_fragment import fragment_address  # lazy: ZeRO only

    return [LossScaler, ZeroStageEnum, fragment_address]


@contextmanager
def deepspeed_reads_weights_only():
    """While DeepSpeed reads a checkpoint (``engine.load_checkpoint``, ``zero_to_fp32``), every ``torch.load``
    it makes is weights-only with :func:`deepspeed_globals` allowed: its own calls would unpickle
    anything, and so run whatever a writer of the run's storage planted there."""
    real = torch.load
    allowed = deepspeed_globals()

    def load(*args, **kwargs):
        kwargs["weights_only"] = True
        try:
            with torch.serialization.safe_globals(allowed):
                return real(*args, **kwargs)
        except pickle.UnpicklingError as exc:
            where = args[0] if args else kwargs.get("f", "a checkpoint file")
            raise DataError(
                f"{where}: refused - not a weights-only file ({str(exc).splitlines()[0][:160]})"
            ) from None

    torch.load = load
    try:
        yield
    finally:
        torch.load = real


def extra_states(module: torch.nn.Module) -> dict:
    """Every submodule's ``get_extra_state()`` under its state-dict key (``<name>._extra_state``)."""
    return {
        f"{name}._extra_state" if name else "_extra_state": m.get_extra_state()
        for name, m in module.named_modules()
        if type(m).get_extra_state is not torch.nn.Module.get_extra_state
    }


def load_weights_only(path: Path):
    """``torch.load`` of one of our checkpoint files, weights-only: a file holding anything but tensors and plain
    containers (a pickled callable: what a writer of the run's storage could plant) is refused in one line
    naming it, not a raw ``UnpicklingError``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DataError(
            f"{path}: refused - not a weights-only file ({str(exc).splitlines()[0][:160]})"
        ) from None


def read_extra_states(checkpoint_dir: Path) -> dict:
    """The extra states a ZeRO checkpoint keeps in :data:`EXTRA_STATE`, loaded weights-only: a file holding
    anything but tensors and plain containers (a pickled callable) is refused, naming the file."""
    path = Path(checkpoint_dir) / EXTRA_STATE
    if not path.is_file():
        return {}
    return load_weights_only(path)


def load_module_state(checkpoint_dir) -> dict:
    """The full (consolidated) module state dict from a plain or a DeepSpeed ZeRO checkpoint.

    ZeRO-3 shards (and ZeRO-1/2 partitioned optimizer states) are merged into one fp32 state
    dict with DeepSpeed's own ``zero_to_fp32`` logic, so export and evaluation need no cluster.
    """
    checkpoint_dir = Path(checkpoint_dir)
    if (checkpoint_dir / "model.pt").is_file():
        return torch.load(checkpoint_dir / "model.pt", map_location="cpu", weights_only=True)["model"]
    if (checkpoint_dir / "ds").is_dir():
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint  # lazy: ZeRO only

        # zero_to_fp32 merges parameters and buffers only; a module's extra state (e.g. ParaBART's
        # vocabularies) is in our own file beside the checkpoint, read (and refused if need be) first
        extra = read_extra_states(checkpoint_dir)
        with deepspeed_reads_weights_only():
            return {**get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag="ds"), **extra}
    raise FileNotFoundError(f"{checkpoint_dir}: neither model.pt nor a DeepSpeed 'ds' checkpoint")


def export_trained_encoder(
    build_model, cfg, checkpoint_dir, out_dir, *, max_seq_length: int | None = None, **build
):
    """A checkpoint → the sentence-transformers folder users load: the method's module built again
    (``build_model(cfg, **build)`` → module, tokenizer), the checkpoint's weights loaded, its ``.encoder`` saved
    alone (decoders, heads and MLPs are training-only) with the config's pooling, and ``export.onnx``'s ONNX
    copies. What every encoder recipe exports; ``max_seq_length`` defaults to the test's (``cfg.eval.max_length``)."""
    from orchestrator.export import export_encoder  # lazy: the driver's export, never a worker's
    from orchestrator.models import pooling_for  # lazy: as above

    module, tokenizer = build_model(cfg, **build)
    module.load_state_dict(load_module_state(checkpoint_dir))
    return export_encoder(
        module.encoder,
        tokenizer,
        out_dir,
        pooling=pooling_for(cfg),
        max_seq_length=cfg.eval.max_length if max_seq_length is None else max_seq_length,
        write_more=onnx_copies(cfg),
        base=cfg.model.name_or_path,  # its pooler weights, saved untouched: the folder has every weight it had
    )


def onnx_copies(cfg):
    """``export.onnx``'s ONNX copies, written inside the folder's atomic write (None: none asked for)."""
    from orchestrator.onnx_export import write_onnx  # lazy: the driver's export, never a worker's

    return (lambda folder: write_onnx(folder, cfg.export.onnx)) if cfg.export.onnx else None


# ---------------------------------------------------------------- every generator, per rank
def rng_state() -> dict:
    """Every generator's state as tensors and plain numbers, so ``torch.load(weights_only=True)`` reads it back."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    out = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next],
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state()
    return out


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
