"""Servable exports: an exported sentence-transformers folder also as ONNX, for a search service that runs ONNX
Runtime rather than PyTorch.

``export.onnx: [fp32, int8]`` on an encoder method's config writes, inside the model folder (the same atomic write
as the folder itself), ``onnx/``:

- ``model.onnx`` - fp32: the whole sentence encoder (transformer, pooling, normalisation as the folder has them)
  traced once by ``torch.onnx.export``, then ONNX Runtime's graph optimisations (operator fusion, constant folding:
  ``ORT_ENABLE_EXTENDED``) applied and saved, so a service does not redo them at every start;
- ``model_qint8.onnx`` - int8: the traced graph's matrix products with int8 weights, one scale per output channel,
  activations quantised on the fly (ONNX Runtime's dynamic quantisation, ``quantize_dynamic``); the embedding
  lookups stay fp32. Measured on MiniLM and the 2,551 STS-B test sentences (cosine with the PyTorch model): mean
  0.992, lowest 0.961 (short generic sentences: "yes you got it ."); per-tensor scales fall to mean 0.967, lowest
  0.94; keeping the feed-forward products in fp32 lifts the lowest to 0.992 but leaves the file nearly fp32's size.

Inputs ``input_ids`` and ``attention_mask`` (the folder's tokenizer), output ``sentence_embedding``.
:class:`OnnxEncoder` loads either; ``tests/test_onnx_export.py`` holds them to the PyTorch model on the STS-B test
sentences (cosine ≥ 0.999 fp32 on every sentence; int8 ≥ 0.98 on average). sentence-transformers' own exporters
(``export_optimized_onnx_model``, ``export_dynamic_quantized_onnx_model``) go through ``optimum``, whose releases
require transformers < 5 - they cannot install beside this stack (``docs/FIDELITY.md``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch import nn

ONNX_DIR = "onnx"
FILES = {"fp32": "model.onnx", "int8": "model_qint8.onnx"}
OPSET = 17


class _Embed(nn.Module):
    """The sentence-transformers model as a function of two tensors (what ONNX traces)."""

    def __init__(self, st):
        super().__init__()
        self.st = st

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.st({"input_ids": input_ids, "attention_mask": attention_mask})["sentence_embedding"]


def write_onnx(folder: str | Path, variants: list[str]) -> dict[str, Path]:
    """``variants`` (``fp32``, ``int8``) of the sentence-transformers folder, written to ``folder/onnx/``."""
    import onnxruntime as ort  # lazy: only an export that asks for ONNX pays for it
    from onnxruntime.quantization import QuantType, quantize_dynamic  # lazy: as above
    from sentence_transformers import SentenceTransformer  # lazy: as above

    folder = Path(folder)
    out = folder / ONNX_DIR
    out.mkdir(exist_ok=True)
    st = SentenceTransformer(str(folder), device="cpu", trust_remote_code=False, local_files_only=True).eval()
    example = st.tokenizer(
        ["a short sentence", "a somewhat longer sentence to trace the shapes with"],
        padding=True,
        return_tensors="pt",
    )
    traced = out / "model_traced.onnx"
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad():
        torch.onnx.export(
            _Embed(st),
            (example["input_ids"], example["attention_mask"]),
            str(traced),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes={"input_ids": axes, "attention_mask": axes, "sentence_embedding": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
        )
    written = {}
    if "fp32" in variants:  # ONNX Runtime optimises the graph once, here, and saves the result
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(out / FILES["fp32"])
        ort.InferenceSession(str(traced), options, providers=["CPUExecutionProvider"])
        written["fp32"] = out / FILES["fp32"]
    if "int8" in variants:
        quantize_dynamic(
            str(traced),
            str(out / FILES["int8"]),
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul"],
        )
        written["int8"] = out / FILES["int8"]
    traced.unlink()
    return written


class OnnxEncoder:
    """An ONNX export read back: ``encode(texts)`` → embeddings, as the PyTorch folder's ``encode`` gives them."""

    def __init__(self, folder: str | Path, variant: str = "fp32", batch_size: int = 64, threads: int = 0):
        import onnxruntime as ort  # lazy: as above

        from orchestrator.models import load_tokenizer  # lazy: transformers

        folder = Path(folder)
        self.tokenizer = load_tokenizer(str(folder))
        config = folder / "sentence_bert_config.json"
        self.max_length = (
            json.loads(config.read_text()).get("max_seq_length", 128) if config.exists() else 128
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(folder / ONNX_DIR / FILES[variant]), options, providers=["CPUExecutionProvider"]
        )
        self.batch_size = batch_size

    def encode(self, texts: list[str]) -> np.ndarray:
        chunks = []
        for start in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="np",
            )
            feed = {
                "input_ids": enc["input_ids"].astype(np.int64),
                "attention_mask": enc["attention_mask"].astype(np.int64),
            }
            chunks.append(self.session.run(["sentence_embedding"], feed)[0])
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), dtype=np.float32)
