"""ParaBART as a :class:`Recipe`: what every worker runs (the vocabularies and held-out pairs loaded, the model
and D built, one step's loss with the adversary's schedule, the dev score with the validation diagnostics) and
what the driver runs (the paraphrase pairs prepared, the export, the test), and paraphrases generated with the
exported model. The method itself - its model, its losses and its settings - is ``trainers/parabart.py``; its
inputs, ``trainers/parabart_batch.py``."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.data.paraphrase import (
    Vocab,
    load_valid_rows,
    load_vocabs,
    parse_tokens,
    prepare_paraphrase_data,
)
from orchestrator.evaluation import sts
from orchestrator.evaluation.domain import evaluate_encoder
from orchestrator.evaluation.encode import HFEncoder
from orchestrator.export import export_encoder, standalone_encoder
from orchestrator.spec import BaseResult, measure_base
from trainers import common
from trainers.checkpoint import load_weights_only, onnx_copies
from trainers.parabart import (
    Discriminator,
    ParaBART,
    ParaBARTConfig,
    adv_loss,
    average_bag_loss,
    build_model,
    discriminator,
    discriminator_optimizer,
    hold_encoder,
    main_loss,
    para_loss,
    parameter_groups,
    set_prior_bias,
)
from trainers.parabart_batch import Batch
from trainers.parabart_prefit import prefit
from trainers.recipe import Recipe


# ---------------------------------------------------------------- export and evaluate
def export_model(cfg: ParaBARTConfig, checkpoint_dir, out_dir):
    """E_sem as a sentence encoder (mean pooling; loads with ``SentenceTransformer``) +
    ``parabart.pt`` (the whole model and its two vocabularies) + ``generator/`` (the backbone's
    config and tokenizer) + ``parabart_config.json``, for generation (this file's :func:`load_parabart`)."""
    state = common.load_module_state(checkpoint_dir)
    model, tokenizer = build_model(
        cfg, Vocab(state["_extra_state"]["syntax"]), Vocab(state["_extra_state"]["tags"])
    )
    model.load_state_dict(state)

    onnx = onnx_copies(cfg)

    def generator_files(folder: Path) -> None:
        model.sem.config.save_pretrained(folder / "generator")
        tokenizer.save_pretrained(folder / "generator")
        torch.save(model.state_dict(), folder / "parabart.pt")
        if onnx:
            onnx(folder)

    return export_encoder(
        standalone_encoder(model.sem),
        tokenizer,
        out_dir,
        pooling="mean",
        max_seq_length=cfg.eval.max_length,
        extra_files={"parabart_config.json": cfg.model_dump_json(indent=2)},
        write_more=generator_files,
    )


def evaluate(cfg: ParaBARTConfig, model_dir, tasks: list[str] | None = None):
    """STS Pearson (the paper's metric; the headline) and Spearman, mean pooling over E_sem, with the
    paper's SentEval aggregation beside SimCSE's "all": each task's Pearson averaged over its subsets
    (SentEval's "mean"), then over the tasks."""
    report = evaluate_encoder(cfg, Path(model_dir), tasks)
    sts_tasks = report.detail["sts"]["tasks"]
    report.metrics["sts_senteval_avg_pearson"] = sum(t["pearson"]["mean"] for t in sts_tasks.values()) / len(
        sts_tasks
    )
    report.table += (
        f"\n\nSentEval aggregation (Pearson averaged over each task's subsets, then tasks): "
        f"{report.metrics['sts_senteval_avg_pearson'] * 100:.2f}"
    )
    report.headline = "sts_avg_pearson_all"
    return report


# ---------------------------------------------------------------- the dev score and the validation diagnostics
def dev_score(encoder, tokenizer, cfg: ParaBARTConfig) -> float:
    enc = HFEncoder(
        encoder, tokenizer, pooling="mean", batch_size=cfg.eval.batch_size, max_length=cfg.eval.max_length
    )
    return sts.evaluate_data(enc, sts.load_task("stsb_dev"))["spearman"]["all"]


def by_parse_length(rows: dict) -> list[int]:
    """The rows' indices, shortest target parse first: batches in this order carry little of E_syn's padding."""
    return sorted(
        range(len(rows["tgt_parse"])), key=[len(parse_tokens(str(p))) for p in rows["tgt_parse"]].__getitem__
    )


@torch.inference_mode()
def validation_loss(
    model: ParaBART,
    dis: Discriminator,
    batcher: Batch,
    rows: dict,
    cfg: ParaBARTConfig,
    *,
    adversary_on: bool,
    device="cpu",
    batch_size: int = 64,
) -> dict[str, float]:
    """On the held-out pairs: the paraphrase loss L_para, the mean over every held-out target token
    (``valid_loss_para``; ``neg_valid_loss_para`` is what the checkpoint choice maximises), D's loss beside the average bag's (``valid_loss_adv``,
    ``valid_loss_adv_average_bag``), the reference code's printed L_para − λ·L_adv (``valid_loss``, λ counted
    once the adversary is on; information, never the selection), ū's mean norm and mean pairwise cosine
    (``u_norm_mean``, ``u_cosine_mean``: an encoder that beats D by collapsing or scaling ū shows here). Every
    figure is the same whatever the batches, so the rows are batched by their parse's length: a batch's parses are
    padded to its longest, and in the held-out order a third of E_syn's positions were padding
    (``bench/results/parabart_step.md``)."""
    if not rows or not len(rows.get("src", [])):
        return {}
    was = model.training
    model.eval()
    n = len(rows["src"])
    order = by_parse_length(rows)
    nll, tokens, adv, us, bags = 0.0, 0, 0.0, [], []
    for k in range(0, n, batch_size):
        pick = order[k : k + batch_size]
        b = batcher({c: [v[i] for i in pick] for c, v in rows.items()}, train=False, device=device)
        logits, u = model(
            b["src_ids"], b["src_mask"], b["parse_ids"], b["parse_mask"], b["tgt_ids"], b["tgt_mask"]
        )
        real = int(b["tgt_mask"][:, 1:].sum())
        nll, tokens = nll + real * float(para_loss(logits, b["tgt_ids"], b["tgt_mask"])), tokens + real
        adv += (
            len(pick) / n * float(adv_loss(dis(u), b["bags"], dis.form))
        )  # a mean over rows, as D's loss is
        us.append(u.float().cpu())
        bags.append(b["bags"].cpu())
    model.train(was)
    para = nll / tokens
    u = torch.cat(us)
    unit = F.normalize(u, dim=-1)
    cos = unit @ unit.T
    m = len(u)
    cosine = float((cos.sum() - cos.diagonal().sum()) / max(m * (m - 1), 1))
    loss = para - (cfg.lambda_adv * adv if adversary_on else 0.0)
    return {
        "valid_loss_para": para,
        "neg_valid_loss_para": -para,
        "valid_loss": loss,
        "valid_loss_adv": adv,
        "valid_loss_adv_average_bag": average_bag_loss(torch.cat(bags), dis.form),
        "u_norm_mean": float(u.norm(dim=-1).mean()),
        "u_cosine_mean": cosine,
    }


# ---------------------------------------------------------------- the recipe
class ParaBARTRecipe(Recipe):
    name = "parabart"
    title = "ParaBART (and its λ_adv = 0 ablation)"
    runs_with = "`jobs/parabart_sweep.py`; QQP-Easy/Hard and probes: `bench/parabart_smoke.py`"
    config_cls = ParaBARTConfig
    metric, metric_label = "stsb_dev_spearman", "STS-B dev Spearman"
    reads = "STS-B dev Spearman of E_sem (or the paraphrase loss, `selection`) → the STS tasks (Pearson)"
    # every column: a pair's row (data.row: pair) carries the reverse direction's parse and bag
    columns = None

    @classmethod
    def dev_tasks(cls, cfg):
        return ["stsb_dev"]

    def setup(self):
        self.syntax, self.tags = load_vocabs(self.job["shards"])
        self.valid = load_valid_rows(self.job["shards"]) if common.rank() == 0 else {}
        self.adversary_on = False

    def build(self) -> nn.Module:
        model, self.tokenizer = build_model(self.cfg, self.syntax, self.tags)
        self.batcher = Batch(self.tokenizer, self.syntax, self.tags, self.cfg)
        return model

    def optimizer_extras(self, module):
        # D trains outside DDP / ZeRO with its own optimiser; its gradients are averaged by hand
        self.dis = discriminator(module, self.cfg.discriminator).to(self.device)
        self.opt_dis = discriminator_optimizer(self.dis, self.cfg)
        return {
            "groups": parameter_groups(module, self.cfg),
            "extra_modules": {"discriminator": self.dis},
            "extra_optimizers": {"discriminator": self.opt_dis},
        }

    def loss(self, model, batch, state):
        cfg, b = self.cfg, self.batcher(batch, train=True, device=self.device)
        self.adversary_on = state["step"] >= cfg.adversary_start_step
        if state["step"] == 0 and cfg.discriminator_bias == "prior":  # a fresh run (a resumed one loads D)
            set_prior_bias(self.dis, b["bags"])
        if state["step"] == 0 and cfg.discriminator_prefit:  # D fitted on the untouched E_sem's cached ū
            self.prefit = prefit(
                self.stepper.module, self.dis, self.batcher, self.job["shards"], cfg, self.device
            )
        hold_encoder(self.stepper.optimizer, frozen=state["step"] < cfg.freeze_encoder_steps)
        return main_loss(
            model,
            self.dis,
            b,
            cfg,
            adversary_on=self.adversary_on,
            opt_dis=self.opt_dis,
            fit_discriminator=self.adversary_on or cfg.discriminator_warmup == "fit",
        )

    def dev(self, module):
        return {
            **getattr(self, "prefit", {}),  # the pre-fit's figures, beside D's loss at every evaluation
            "stsb_dev_spearman": dev_score(module.sem, self.tokenizer, self.cfg),
            **validation_loss(
                module,
                self.dis,
                self.batcher,
                self.valid,
                self.cfg,
                adversary_on=self.adversary_on,
                device=self.device,
            ),
        }

    @staticmethod
    def prepare_data(cfg: ParaBARTConfig, progress: bool = True) -> str:
        return prepare_paraphrase_data(cfg.data, cfg.run.storage, progress=progress)

    export = staticmethod(export_model)
    evaluate = staticmethod(evaluate)

    @staticmethod
    def evaluate_base(cfg: ParaBARTConfig) -> BaseResult:  # E_sem before training, as the trained one is read
        return measure_base(cfg, dev_score, evaluate)

    @classmethod
    def selection_metric(cls, cfg):
        return {"valid_para_loss": "neg_valid_loss_para", "last": None}.get(cfg.selection, cls.metric)


# ---------------------------------------------------------------- generation with the exported model
# Paraphrase generation with a trained ParaBART: the saved model loaded back (:func:`load_parabart`) and
# greedy decoding shaped by a target parse (:func:`generate`). Training is ``trainers/parabart.py``'s.
@torch.inference_mode()
def generate(
    model: ParaBART, batcher: Batch, sources: list[str], parses: list[str], max_new_tokens: int = 40
) -> list[str]:
    """Greedy decoding of paraphrases of ``sources`` shaped like the linearized ``parses``."""
    model.eval()
    tok = batcher.tok
    rows = {"src": sources, "tgt": [""] * len(sources), "tgt_parse": parses, "src_bag": ["{}"] * len(sources)}
    b = batcher(rows, train=False)
    u = model.embed(b["src_ids"], b["src_mask"])
    v = model.syntax(b["parse_ids"], b["parse_mask"])
    out = torch.full((len(sources), 1), tok.cls_token_id, dtype=torch.long)
    done = torch.zeros(len(sources), dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model.decode(u, v, b["parse_mask"], out, torch.ones_like(out), keep=1)  # the next token only
        nxt = logits[:, -1].argmax(-1)
        nxt = torch.where(done, torch.full_like(nxt, tok.pad_token_id), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == tok.sep_token_id
        if done.all():
            break
    return tok.batch_decode(out, skip_special_tokens=True)


def load_parabart(model_dir) -> tuple[ParaBART, Batch]:
    """The saved model for generation: ``generate(model, batcher, [src], [parse])``."""
    d = Path(model_dir)
    cfg = ParaBARTConfig.model_validate_json((d / "parabart_config.json").read_text())
    state = load_weights_only(d / "parabart.pt")
    syntax, tags = Vocab(state["_extra_state"]["syntax"]), Vocab(state["_extra_state"]["tags"])
    model, tokenizer = build_model(cfg, syntax, tags, skeleton=d / "generator")
    model.load_state_dict(state)
    model.eval()
    return model, Batch(tokenizer, syntax, tags, cfg)
