"""SimCSE and SIFTER-SimCSE: contrastive sentence embeddings from augmented views.

Method (SIFTER, Section 3; SimCSE, Gao et al. 2021)
----------------------------------------------------
Every sentence X comes with two augmented views built by the corpus pipeline:

* Y = X + its *backbone* (root + direct dependents of the dependency tree, or an SVO triple);
* Z = X without *useless words* (articles, conjunctions, pronouns).

An encoder maps each view to a vector: the ``[CLS]`` state passed through an MLP (dense + tanh)
during training, the raw ``[CLS]`` state (``cls_before_pooler``) at evaluation - the MLP is a
training-only head, as in SimCSE and SIFTER. With in-batch negatives and temperature τ,

    InfoNCE(A, B) = -1/N Σ_i log( exp(cos(a_i, b_i)/τ) / Σ_j exp(cos(a_i, b_j)/τ) )

and the loss is

    L = λ_XX'·InfoNCE(X, X') + λ_XY·InfoNCE(X, Y) + λ_XZ·InfoNCE(X, Z) + λ_YZ·InfoNCE(Y, Z)

where X' is a second forward pass of X (a different dropout mask). Unsupervised SimCSE is
λ_XX' = 1 and the rest 0; SIFTER is λ_XY = λ_XZ = λ_YZ = 1 (and λ_XX' = 0). Dropout (SIFTER:
0.15; SimCSE: 0.1) is set on the hidden and attention layers. All views of a batch go through
the encoder in one forward pass.

Negatives across workers: with N data-parallel workers each view's embeddings are all-gathered
(the local slice keeps its graph), so every anchor is contrasted with the *global* batch's
candidates, as SimCSE's own code does. The loss is scaled by N before DDP's gradient average,
which makes N workers × batch b give exactly the loss and gradient of 1 worker × batch N·b
(``tests/test_sifter_simcse.py`` proves it). ``gather_negatives: false`` turns it off.

Args (config keys, see :class:`ContrastiveConfig`)
    lambda_xx, lambda_xy, lambda_xz, lambda_yz: loss weights (≥ 0, at least one > 0)
    temperature: τ (0.05)
    dropout: hidden + attention dropout of the encoder
    gather_negatives: all-gather embeddings across workers (default true)

References
    - Gao, Yao, Chen. SimCSE: Simple Contrastive Learning of Sentence Embeddings. EMNLP 2021.
    - SIFTER: sentence embeddings from syntactic backbones and filtered views (the method
      described in this project's mission; λ_XY·InfoNCE(X,Y) + λ_XZ·InfoNCE(X,Z) + λ_YZ·InfoNCE(Y,Z)).

Inputs
    Parquet shards from ``jobs/augment_corpus.py`` with columns ``text`` (X), ``backbone_view``
    (Y) and ``deletion_view`` (Z).

Example
    python jobs/train.py --method sifter_simcse --preset smoke
    python jobs/train.py --method simcse --preset smoke train.max_steps=50
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import nn

from orchestrator.config import (
    CorpusBlock,
    DeepSpeedBlock,
    EvalConfig,
    ModelConfig,
    RunBlock,
    ScalingBlock,
    StrictModel,
    TrackingConfig,
    TrainLoopConfig,
)
from trainers import common

VIEW_COLUMNS = {"x": "text", "y": "backbone_view", "z": "deletion_view"}


# ---------------------------------------------------------------- config
class ContrastiveConfig(StrictModel):
    method: Literal["simcse", "sifter_simcse"] = "sifter_simcse"
    model: ModelConfig = ModelConfig(max_length=32, pooling="cls_before_pooler")
    dropout: float = Field(0.15, ge=0, lt=1)
    temperature: float = Field(0.05, gt=0)
    lambda_xx: float = Field(0.0, ge=0)
    lambda_xy: float = Field(1.0, ge=0)
    lambda_xz: float = Field(1.0, ge=0)
    lambda_yz: float = Field(1.0, ge=0)
    gather_negatives: bool = True
    train: TrainLoopConfig = TrainLoopConfig(lr=1e-5, batch_size=64, eval_steps=125)
    scaling: ScalingBlock = ScalingBlock()
    deepspeed: DeepSpeedBlock = DeepSpeedBlock()
    data: CorpusBlock = CorpusBlock()
    eval: EvalConfig = EvalConfig(batch_size=128, max_length=128)
    run: RunBlock = RunBlock()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="sifter-simcse")

    @model_validator(mode="after")
    def _some_loss(self):
        if self.lambda_xx + self.lambda_xy + self.lambda_xz + self.lambda_yz <= 0:
            raise ValueError("at least one of lambda_xx, lambda_xy, lambda_xz, lambda_yz must be > 0")
        return self

    def views(self) -> list[str]:
        """Which views a batch needs: x always; x2 (dropout copy), y, z only when weighted."""
        out = ["x"]
        if self.lambda_xx > 0:
            out.append("x2")
        if self.lambda_xy > 0 or self.lambda_yz > 0:
            out.append("y")
        if self.lambda_xz > 0 or self.lambda_yz > 0:
            out.append("z")
        return out


# ---------------------------------------------------------------- model
class ContrastiveEncoder(nn.Module):
    """Encoder + SimCSE's MLP head (dense + tanh) over ``[CLS]``; the head is used in training only."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        self.mlp = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        cls = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]
        return self.mlp(cls)


def build_model(cfg: ContrastiveConfig):
    """(ContrastiveEncoder, tokenizer) with the configured dropout; no BERT pooler (DDP would
    see it as unused parameters)."""
    from orchestrator.models import load_encoder

    encoder, tokenizer = load_encoder(cfg.model.name_or_path, dropout=cfg.dropout, add_pooling_layer=False)
    return ContrastiveEncoder(encoder), tokenizer


# ---------------------------------------------------------------- loss
def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """In-batch InfoNCE: row i of ``a`` should match row i of ``b`` against every other row of ``b``."""
    logits = F.cosine_similarity(a.unsqueeze(1), b.unsqueeze(0), dim=-1) / temperature
    labels = torch.arange(a.size(0), device=a.device)
    return F.cross_entropy(logits, labels)


def sifter_loss(emb: dict[str, torch.Tensor], cfg: ContrastiveConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """λ-weighted sum of the four InfoNCE terms over (already gathered) view embeddings."""
    terms = {}
    if cfg.lambda_xx > 0:
        terms["xx"] = cfg.lambda_xx * info_nce(emb["x"], emb["x2"], cfg.temperature)
    if cfg.lambda_xy > 0:
        terms["xy"] = cfg.lambda_xy * info_nce(emb["x"], emb["y"], cfg.temperature)
    if cfg.lambda_xz > 0:
        terms["xz"] = cfg.lambda_xz * info_nce(emb["x"], emb["z"], cfg.temperature)
    if cfg.lambda_yz > 0:
        terms["yz"] = cfg.lambda_yz * info_nce(emb["y"], emb["z"], cfg.temperature)
    loss = sum(terms.values())
    return loss, {f"loss_{k}": float(v.detach()) for k, v in terms.items()}


def tokenize_views(tokenizer, batch: dict[str, list[str]], cfg: ContrastiveConfig) -> tuple[dict, list[str]]:
    """All views of a batch in one padded tensor: [x; x2; y; z] stacked along the batch axis."""
    views = cfg.views()
    texts: list[str] = []
    for v in views:
        texts += list(batch[VIEW_COLUMNS["x" if v == "x2" else v]])
    enc = tokenizer(texts, padding=True, truncation=True, max_length=cfg.model.max_length,
                    return_tensors="pt", return_token_type_ids=False)
    return enc, views


def compute_loss(model: nn.Module, tokenizer, batch: dict[str, list[str]], cfg: ContrastiveConfig,
                 device: torch.device | str = "cpu") -> tuple[torch.Tensor, dict[str, float]]:
    """Forward every view once, gather across workers, return (loss to backprop, logged terms).

    The returned loss is already multiplied by the world size when negatives are gathered, so
    that DDP's averaged gradient is the gradient of the global-batch loss; the logged
    ``loss`` is the unscaled global value.
    """
    enc, views = tokenize_views(tokenizer, batch, cfg)
    out = model(enc["input_ids"].to(device), enc["attention_mask"].to(device))
    per_view = out.view(len(views), -1, out.size(-1))
    emb = {}
    for i, v in enumerate(views):
        emb[v] = common.gather_with_grad(per_view[i]) if cfg.gather_negatives else per_view[i]
    loss, logs = sifter_loss(emb, cfg)
    logs["loss"] = float(loss.detach())
    return loss * common.ddp_loss_scale(cfg.gather_negatives), logs


# ---------------------------------------------------------------- evaluation
def dev_score(module: ContrastiveEncoder, tokenizer, cfg: ContrastiveConfig, task: str = "stsb_dev") -> float:
    from orchestrator.evaluation import sts
    from orchestrator.evaluation.encode import HFEncoder

    enc = HFEncoder(module.encoder, tokenizer, pooling="cls_before_pooler", batch_size=cfg.eval.batch_size,
                    max_length=cfg.eval.max_length)
    return sts.evaluate_data(enc, sts.load_task(task))["spearman"]["all"]


# ---------------------------------------------------------------- the per-worker loop (Ray Train)
def train_func(config: dict) -> list[dict]:
    """Runs on every Ray Train worker: build, (resume,) train, evaluate on STS-B dev, report +
    checkpoint (the shared loop in :func:`trainers.common.train_loop`)."""
    cfg = ContrastiveConfig.model_validate(config["method_config"])
    common.setup_worker(cfg.train.seed, threads=int(cfg.scaling.cpus_per_worker))
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.scaling.use_gpu else "cpu")
    module, tokenizer = build_model(cfg)
    module.to(device)
    stepper = common.make_stepper(module, cfg, int(config["rows_per_worker"]))
    return common.train_loop(
        cfg, stepper, rows_per_worker=int(config["rows_per_worker"]), metric="stsb_dev_spearman",
        loss_fn=lambda batch, state: compute_loss(stepper.model, tokenizer, batch, cfg, device),
        dev_fn=lambda m: dev_score(m, tokenizer, cfg),
        build_plain=lambda: build_model(cfg)[0].to(device))


# ---------------------------------------------------------------- export
def export_model(cfg: ContrastiveConfig, checkpoint_dir, out_dir):
    """Checkpoint (plain or DeepSpeed ZeRO, any stage) → an HF folder of the encoder alone (the MLP
    is a training-only head) that loads with ``AutoModel`` and ``SentenceTransformer`` (CLS pooling)."""
    from orchestrator.export import export_encoder

    module, tokenizer = build_model(cfg)
    module.load_state_dict(common.load_module_state(checkpoint_dir))
    return export_encoder(module.encoder, tokenizer, out_dir, pooling="cls_before_pooler",
                          max_seq_length=cfg.eval.max_length)
