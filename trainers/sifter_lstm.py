"""SIFTER-LSTM: an LSTM whose input gate is short-circuited to 1 for task-useful words.

Method (SIFTER, the sentiment variant)
--------------------------------------
A standard LSTM cell computes, for the word vector x_t and the previous state (h_{t−1}, c_{t−1}),

    i_t = σ(W_i x_t + U_i h_{t−1} + b_i)        f_t = σ(W_f x_t + U_f h_{t−1} + b_f)
    g_t = tanh(W_g x_t + U_g h_{t−1} + b_g)     o_t = σ(W_o x_t + U_o h_{t−1} + b_o)
    c_t = f_t ⊙ c_{t−1} + i_t ⊙ g_t              h_t = o_t ⊙ tanh(c_t)

SIFTER-LSTM replaces the input gate by an all-ones vector at the steps whose word belongs to a
set 𝕏 of task-useful words (for sentiment: an opinion lexicon):

    i_t = 1                                      if x_t ∈ 𝕏
    i_t = σ(W_i x_t + U_i h_{t−1} + b_i)         otherwise

so a sentiment word is always written into the memory in full; everything else is a standard
LSTM. The classifier is linear + softmax on h_T (the state after the last real token), trained
with cross-entropy + λ·‖θ‖² (λ = 1e-7). Word vectors start from a transformer's WordPiece
embedding matrix (paper: BERT, 768-d; here the packaged MiniLM, 384-d) and are trained; hidden
size 384; dropout 0.2 on the embeddings and on h_T. The **baseline** is the same model with
the short-circuit off (``short_circuit: false``), trained with identical settings.

The word set 𝕏 (``word_set``): the Hu & Liu opinion lexicon (``data/lexicon``), or the words of
the training data whose smoothed log-odds between the classes is largest (``source:
train_data``), or - a control - random words of the training text matched to the lexicon's in size and
frequency (``random_matched``: is it the lexicon or the gate?). Membership is decided per *word* of the
sentence (lower-cased, whitespace split); a word that WordPiece splits into pieces marks all of its pieces.

Speed: the recurrence is sequential, so the input projections of every step are one fused
matmul before the loop (W x_t for all t), each step is one ``addmm`` plus elementwise gates,
and the short-circuit and padding masks are computed once per batch. ``bench/lstm_cell.py``
measures the step time against ``torch.nn.LSTM`` (cuDNN/oneDNN fused) of the same size.

Args (config keys, see :class:`SifterLSTMConfig`)
    short_circuit: SIFTER's input-gate short-circuit (true) or the plain LSTM baseline (false)
    word_set.source: ``lexicon`` | ``train_data`` | ``random_matched`` | ``none``
    hidden_size (384), dropout (0.2), l2 (1e-7), embeddings_from (``default``: MiniLM)

Paper settings (``configs/sifter_lstm/paper.yaml``): Adam lr 1e-5, batch 32, full SST-2.

Example
    python jobs/train.py --method sifter_lstm --preset smoke
    python jobs/sentiment_sweep.py --preset smoke
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn
from transformers import AutoTokenizer

from orchestrator.config import MethodConfig, StrictModel, TrackingConfig, TrainLoopConfig
from orchestrator.data.labelled import labelled_shards, read_labelled
from orchestrator.data.word_sets import frequency_matched, lexicon_words, train_data_words, words
from orchestrator.evaluation.suite import TestReport
from orchestrator.models import load_encoder, load_tokenizer
from orchestrator.storage import atomic_dir
from trainers import common
from trainers.recipe import GLOBAL_BATCH, STEP_BUDGET, Recipe


# ---------------------------------------------------------------- config
class WordSetBlock(StrictModel):
    source: Literal["lexicon", "train_data", "random_matched", "none"] = "lexicon"
    lexicon: list[str] = [
        "data/lexicon/opinion_lexicon_positive.txt",
        "data/lexicon/opinion_lexicon_negative.txt",
    ]
    top_k: int = Field(2000, gt=0, description="train_data: this many words by |log-odds|")
    min_count: int = Field(5, ge=1, description="train_data: ignore rarer words")


class LabelledDataBlock(StrictModel):
    train: str = "data/sst2/train_sample.tsv"
    dev: str = "data/sst2/dev.tsv"
    test: str = "data/sst2/test.tsv"
    text_column: str = "sentence"
    label_column: str = "label"
    limit: int | None = Field(None, gt=0, description="use at most this many training rows")


class SifterLSTMConfig(MethodConfig):
    method: Literal["sifter_lstm"] = "sifter_lstm"
    short_circuit: bool = True
    embeddings_from: str = Field(
        "default", description="model folder whose WordPiece embeddings + vocab we use"
    )
    hidden_size: int = Field(384, gt=0)
    dropout: float = Field(0.2, ge=0, lt=1)
    l2: float = Field(1e-7, ge=0)
    num_classes: int = Field(2, ge=2)
    max_length: int = Field(64, gt=0, description="WordPiece tokens per sentence")
    word_set: WordSetBlock = WordSetBlock()
    train: TrainLoopConfig = TrainLoopConfig(lr=1e-5, batch_size=32, eval_steps=50, lr_schedule="constant")
    data: LabelledDataBlock = LabelledDataBlock()
    tracking: TrackingConfig = TrackingConfig(registry_model_name="sifter-lstm")

    def model_sources(self) -> list[str]:
        return [self.embeddings_from]

    def data_sources(self) -> list[tuple[str, str]]:
        lexicon = (
            [(f"word_set.lexicon[{i}]", p) for i, p in enumerate(self.word_set.lexicon)]
            if self.word_set.source in ("lexicon", "random_matched")
            else []
        )
        return [(f"data.{k}", getattr(self.data, k)) for k in ("train", "dev", "test")] + lexicon


# ---------------------------------------------------------------- the cell
class SifterLSTM(nn.Module):
    """One-layer LSTM with the input-gate short-circuit. Parameters are laid out exactly as
    ``torch.nn.LSTM``'s layer 0 (gates i, f, g, o), so weights copy across."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden_size, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden_size, hidden_size))
        self.bias_ih = nn.Parameter(torch.empty(4 * hidden_size))
        self.bias_hh = nn.Parameter(torch.empty(4 * hidden_size))
        bound = 1 / math.sqrt(hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def step(self, xw_t, h, c, short_t):
        """One time step from the precomputed input projection ``xw_t``; returns (h, c, i_t)."""
        n = self.hidden_size
        gates = torch.addmm(xw_t, h, self.weight_hh.t())
        s = torch.sigmoid(gates)  # one kernel for i, f, o (g's sigmoid is unused)
        i = torch.where(short_t, 1.0, s[:, :n])  # the short-circuit: i_t = 1 for words in 𝕏
        c = s[:, n : 2 * n] * c + i * torch.tanh(gates[:, 2 * n : 3 * n])
        h = s[:, 3 * n :] * torch.tanh(c)
        return h, c, i

    def forward(self, x: torch.Tensor, short: torch.Tensor | None = None, valid: torch.Tensor | None = None):
        """``x`` (B, T, E); ``short`` (B, T) bool: word ∈ 𝕏; ``valid`` (B, T) bool: not padding.
        Returns (outputs (B, T, H), h_T, c_T), h_T/c_T taken at each sequence's last valid step."""
        b, t, _ = x.shape
        xw = F.linear(x, self.weight_ih, self.bias_ih + self.bias_hh)  # every step's W x_t + b at once
        h = x.new_zeros(b, self.hidden_size)
        c = x.new_zeros(b, self.hidden_size)
        short = (torch.zeros(b, t, dtype=torch.bool, device=x.device) if short is None else short).unsqueeze(
            -1
        )
        keep = None if valid is None or bool(valid.all()) else valid.unsqueeze(-1)  # no padding: no masking
        outputs = []
        for step in range(t):
            h_new, c_new, _ = self.step(xw[:, step], h, c, short[:, step])
            if keep is None:
                h, c = h_new, c_new
            else:  # padding steps carry the state through unchanged
                h, c = torch.where(keep[:, step], h_new, h), torch.where(keep[:, step], c_new, c)
            outputs.append(h)
        return torch.stack(outputs, dim=1), h, c


class SentimentLSTM(nn.Module):
    """WordPiece embeddings → dropout → SifterLSTM → dropout(h_T) → linear."""

    def __init__(self, embeddings: torch.Tensor, hidden_size: int, num_classes: int, dropout: float):
        super().__init__()
        self.embed = nn.Embedding.from_pretrained(embeddings.clone(), freeze=False, padding_idx=0)
        self.lstm = SifterLSTM(embeddings.size(1), hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.classify = nn.Linear(hidden_size, num_classes)

    def forward(self, ids: torch.Tensor, short: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        _, h_last, _ = self.lstm(self.dropout(self.embed(ids)), short, valid)
        return self.classify(self.dropout(h_last))


# ---------------------------------------------------------------- the word set 𝕏 and batches
def build_word_set(cfg: SifterLSTMConfig) -> set[str]:
    if cfg.word_set.source == "none":
        return set()
    if cfg.word_set.source == "lexicon":
        return lexicon_words(cfg.word_set.lexicon)
    rows = read_labelled(
        cfg.data.train,
        text_column=cfg.data.text_column,
        label_column=cfg.data.label_column,
        limit=cfg.data.limit,
    )
    if cfg.word_set.source == "random_matched":  # the control: is it the lexicon or the gate?
        return frequency_matched(
            lexicon_words(cfg.word_set.lexicon), [t for t, _ in rows], seed=cfg.train.seed
        )
    return train_data_words(rows, cfg.word_set.top_k, cfg.word_set.min_count)


class Batcher:
    """Sentences → (ids, short, valid) tensors; WordPiece pieces of a word in 𝕏 are all marked."""

    def __init__(self, tokenizer, word_set: set[str], max_length: int):
        self.tokenizer = tokenizer
        self.word_set = word_set
        self.max_length = max_length
        self._cache: dict[str, list[int]] = {}

    def _pieces(self, word: str) -> list[int]:
        if word not in self._cache:
            self._cache[word] = self.tokenizer.convert_tokens_to_ids(self.tokenizer.tokenize(word))
        return self._cache[word]

    def __call__(self, texts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        seqs = []
        for text in texts:
            ids, marks = [], []
            for w in words(str(text)):
                pieces = self._pieces(w)
                ids += pieces
                marks += [w.lower() in self.word_set] * len(pieces)
            seqs.append((ids[: self.max_length] or [100], marks[: self.max_length] or [False]))  # 100 = [UNK]
        t = max(len(s[0]) for s in seqs)
        ids = torch.zeros(len(seqs), t, dtype=torch.long)
        short = torch.zeros(len(seqs), t, dtype=torch.bool)
        valid = torch.zeros(len(seqs), t, dtype=torch.bool)
        for k, (i, m) in enumerate(seqs):
            ids[k, : len(i)] = torch.tensor(i)
            short[k, : len(m)] = torch.tensor(m)
            valid[k, : len(i)] = True
        return ids, short, valid


def build_model(cfg: SifterLSTMConfig, word_set: set[str] | None = None):
    """(SentimentLSTM, Batcher, word set). Embeddings copied from ``embeddings_from``'s encoder."""
    encoder, tokenizer = load_encoder(cfg.embeddings_from, add_pooling_layer=False)
    emb = encoder.get_input_embeddings().weight.detach()
    model = SentimentLSTM(emb, cfg.hidden_size, cfg.num_classes, cfg.dropout)
    word_set = build_word_set(cfg) if word_set is None else word_set
    active = word_set if cfg.short_circuit else set()
    return model, Batcher(tokenizer, active, cfg.max_length), word_set


# ---------------------------------------------------------------- loss
def compute_loss(
    model: nn.Module,
    batcher: Batcher,
    texts,
    labels,
    cfg: SifterLSTMConfig,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy + λ·‖θ‖² (every parameter, as the paper's L2 term)."""
    ids, short, valid = (t.to(device) for t in batcher(texts))
    logits = model(ids, short, valid)
    y = torch.as_tensor(labels, dtype=torch.long, device=device)
    ce = F.cross_entropy(logits, y)
    l2 = sum(p.pow(2).sum() for p in model.parameters()) if cfg.l2 > 0 else torch.zeros((), device=device)
    loss = ce + cfg.l2 * l2
    return loss, {
        "loss": float(loss.detach()),
        "ce": float(ce.detach()),
        "train_accuracy": float((logits.argmax(-1) == y).float().mean()),
    }


# ---------------------------------------------------------------- evaluation
@torch.inference_mode()
def accuracy(model: nn.Module, batcher: Batcher, rows: list[tuple[str, int]], batch_size: int = 256) -> float:
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    correct = 0
    for k in range(0, len(rows), batch_size):
        chunk = rows[k : k + batch_size]
        ids, short, valid = (t.to(device) for t in batcher([t for t, _ in chunk]))
        pred = model(ids, short, valid).argmax(-1).cpu()
        correct += int((pred == torch.tensor([y for _, y in chunk])).sum())
    model.train(was)
    return correct / len(rows)


def _rows(cfg: SifterLSTMConfig, split: str) -> list[tuple[str, int]]:
    return read_labelled(
        getattr(cfg.data, split), text_column=cfg.data.text_column, label_column=cfg.data.label_column
    )


def prepare_data(cfg: SifterLSTMConfig, progress: bool = True) -> str:
    return labelled_shards(
        cfg.data.train,
        cfg.run.storage,
        text_column=cfg.data.text_column,
        label_column=cfg.data.label_column,
        limit=cfg.data.limit,
    )


# ---------------------------------------------------------------- export, load, test
def export_model(cfg: SifterLSTMConfig, checkpoint_dir, out_dir):
    """A folder with the weights, the config, the word set and the tokenizer: ``load_exported`` reads it."""
    model, _, word_set = build_model(cfg)
    model.load_state_dict(common.load_module_state(checkpoint_dir))
    with atomic_dir(out_dir) as tmp:
        torch.save(model.state_dict(), tmp / "model.pt")
        (tmp / "sieve_config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2))
        (tmp / "word_set.txt").write_text("\n".join(sorted(word_set)) + "\n")
        load_tokenizer(cfg.embeddings_from).save_pretrained(tmp)
    return Path(out_dir)


def load_exported(model_dir) -> tuple[SentimentLSTM, Batcher, SifterLSTMConfig]:
    d = Path(model_dir)
    cfg = SifterLSTMConfig.model_validate_json((d / "sieve_config.json").read_text())
    word_set = {w for w in (d / "word_set.txt").read_text(encoding="utf-8").splitlines() if w}
    state = common.load_weights_only(d / "model.pt")
    model = SentimentLSTM(state["embed.weight"], cfg.hidden_size, cfg.num_classes, cfg.dropout)
    model.load_state_dict(state)
    model.eval()
    return (
        model,
        Batcher(
            AutoTokenizer.from_pretrained(d, local_files_only=True, trust_remote_code=False),
            word_set if cfg.short_circuit else set(),
            cfg.max_length,
        ),
        cfg,
    )


def evaluate(cfg: SifterLSTMConfig, model_dir, tasks: list[str] | None = None):
    """Dev and test accuracy of the exported model (``tasks`` is unused: STS does not apply)."""
    model, batcher, _ = load_exported(model_dir)
    metrics = {
        "test_accuracy": accuracy(model, batcher, _rows(cfg, "test")),
        "dev_accuracy": accuracy(model, batcher, _rows(cfg, "dev")),
    }
    table = "| split | accuracy ×100 |\n|---|---:|\n" + "\n".join(
        f"| {k.split('_')[0]} | {v * 100:.2f} |" for k, v in metrics.items()
    )
    return TestReport("SST-2 accuracy", metrics, "test_accuracy", table, {"accuracy": metrics})


class SentimentPyfunc:
    """MLflow pyfunc: a list (or one-column frame) of texts → P(positive) per text."""

    def __getstate__(self):  # MLflow pickles the instance: weights travel as the artifact folder
        return {}

    def load_context(self, context):
        self.model, self.batcher, _ = load_exported(context.artifacts["model_dir"])

    def predict(self, context, model_input, params=None):
        texts = list(model_input.iloc[:, 0]) if hasattr(model_input, "iloc") else list(model_input)
        with torch.inference_mode():
            return torch.softmax(self.model(*self.batcher(texts)), -1)[:, -1].tolist()


def log_model(model_dir, name: str = "model"):
    """An MLflow pyfunc that carries its code (``trainers/`` + ``orchestrator/``): it loads where Sieve
    is not installed."""
    import mlflow.pyfunc  # lazy: the driver logs; workers and the GPU bench's image import the recipe without MLflow

    class _Model(SentimentPyfunc, mlflow.pyfunc.PythonModel):
        pass

    root = Path(__file__).resolve().parents[1]
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=_Model(),
        artifacts={"model_dir": str(model_dir)},
        input_example=["a charming and often affecting journey ."],
        code_paths=[str(root / "trainers"), str(root / "orchestrator")],
        pip_requirements=["torch==2.13.0", "transformers==5.23.0", "pydantic>=2.7,<3"],
    )


# ---------------------------------------------------------------- the recipe
class SifterLSTMRecipe(Recipe):
    name = "sifter_lstm"
    title = "SIFTER-LSTM (and the LSTM baseline)"
    runs_with = "`jobs/sentiment_sweep.py`"
    config_cls = SifterLSTMConfig
    metric, metric_label = "dev_accuracy", "SST-2 dev accuracy"
    reads = "SST-2 dev accuracy → test accuracy, mean ± std over seeds"
    columns = ("text", "label")
    has_base = False  # the baseline is the plain LSTM, a point of the sweep grid
    baseline_params = {"short_circuit": False}
    model_format = "sieve-lstm"  # weights + word set + tokenizer, logged as an MLflow pyfunc

    def setup(self):
        self.word_set = None  # built with the first model, reused for ZeRO-3's plain copy
        self.dev_rows = _rows(self.cfg, "dev")

    def build(self) -> nn.Module:
        model, self.batcher, self.word_set = build_model(self.cfg, self.word_set)
        return model

    def loss(self, model, batch, state):
        return compute_loss(model, self.batcher, batch["text"], batch["label"], self.cfg, self.device)

    def dev(self, module):
        return accuracy(module, self.batcher, self.dev_rows)

    prepare_data = staticmethod(prepare_data)
    export = staticmethod(export_model)
    evaluate = staticmethod(evaluate)
    log_model = staticmethod(log_model)

    @classmethod
    def base_model(cls, cfg):
        return cfg.embeddings_from

    @classmethod
    def pooling(cls, cfg):
        return None

    @classmethod
    def comparable(cls, cfg):
        return {
            "the embeddings (embeddings_from)": cfg.embeddings_from,
            STEP_BUDGET: cfg.train.max_steps,
            GLOBAL_BATCH: cfg.train.batch_size * cfg.scaling.num_workers,
            "the data (data)": cfg.data.model_dump(mode="json"),
            "the run storage (run.storage)": cfg.run.storage,
        }
