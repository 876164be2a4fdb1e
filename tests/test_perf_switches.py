"""The speed switches, each on CPU against the fp32 / default path: bf16 autocast (loss within 1%),
SDPA vs eager attention (loss to 1e-5), fused AdamW (parameters after a step to 1e-6; on by default, CPU
included), torch.compile
(loss to 1e-5; the ``aot_eager`` backend here - Inductor's C++ build takes minutes on 2 cores - while
the default, Inductor, is what a GPU run uses)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainers import common
from trainers.ingest import Ingest
from trainers.sifter_simcse import ContrastiveConfig, build_model, compute_loss

X = [
    "a man is playing a guitar .",
    "the cat sat on the mat .",
    "she reads a long book .",
    "dogs run in the park .",
]
ROOT = Path(__file__).resolve().parents[1]
BATCH = {
    "text": X,
    "backbone_view": [x + " man" for x in X],
    "deletion_view": [x.replace("the ", "") for x in X],
}


def cfg_for(model_dir, **perf) -> ContrastiveConfig:
    return ContrastiveConfig.model_validate(
        {
            "model": {"name_or_path": str(model_dir), "max_length": 16, "pooling": "cls"},
            "dropout": 0.0,
            "perf": perf,
        }
    )


def loss_of(model_dir, **perf) -> float:
    torch.manual_seed(0)
    cfg = cfg_for(model_dir, **perf)
    model, tok = build_model(cfg)
    with common.autocast(cfg):
        loss, _ = compute_loss(model, tok, BATCH, cfg)
    return loss.item()


def test_bf16_autocast_gives_the_fp32_loss_within_one_percent(tiny_bert_dir):
    fp32, bf16 = loss_of(tiny_bert_dir, bf16="off"), loss_of(tiny_bert_dir, bf16="on")
    assert fp32 != bf16 and bf16 == pytest.approx(fp32, rel=1e-2)  # really in bf16, and close
    assert not common.autocast(cfg_for(tiny_bert_dir))._enabled  # auto: off on CPU


def test_sdpa_and_eager_attention_give_the_same_loss(tiny_bert_dir):
    sdpa, eager = loss_of(tiny_bert_dir, attention="sdpa"), loss_of(tiny_bert_dir, attention="eager")
    assert sdpa == pytest.approx(eager, abs=1e-5)
    model, _ = build_model(cfg_for(tiny_bert_dir, attention="eager"))
    assert model.encoder.config._attn_implementation == "eager"


def one_step(model_dir, fused: bool):
    torch.manual_seed(0)
    cfg = cfg_for(model_dir)
    model, tok = build_model(cfg)
    stepper = common.Stepper(
        model, model.parameters(), lr=1e-3, schedule="constant", total_steps=5, grad_clip=None, fused=fused
    )
    loss, _ = compute_loss(stepper.model, tok, BATCH, cfg)
    stepper.step(loss)
    return stepper, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_fused_adamw_updates_like_the_plain_one(tiny_bert_dir):
    fused, after_fused = one_step(tiny_bert_dir, True)
    plain, after_plain = one_step(tiny_bert_dir, False)
    assert fused.optimizer.defaults["fused"] is True and not plain.optimizer.defaults.get("fused")
    for name, p in after_plain.items():
        torch.testing.assert_close(after_fused[name], p, atol=1e-6, rtol=1e-5, msg=name)
    # auto: fused on CPU too (the optimiser step 4x faster there: bench/results/cpu_step.md); off when asked
    model, _ = build_model(cfg_for(tiny_bert_dir))
    assert common.make_stepper(model, cfg_for(tiny_bert_dir), 64).optimizer.defaults["fused"] is True
    assert not common.make_stepper(model, cfg_for(tiny_bert_dir, fused_adamw="off"), 64).optimizer.defaults[
        "fused"
    ]


def test_torch_compile_gives_the_same_loss(tiny_bert_dir):
    torch.manual_seed(0)
    cfg = cfg_for(tiny_bert_dir, compile=True, compile_backend="aot_eager")
    model, tok = build_model(cfg)
    eager_loss, _ = compute_loss(model, tok, BATCH, cfg)
    stepper = common.Stepper(
        model,
        model.parameters(),
        lr=1e-3,
        schedule="constant",
        total_steps=5,
        grad_clip=None,
        compile_backend=cfg.perf.compile_backend,
    )
    assert (
        stepper.model is not model and stepper.module is model
    )  # compiled forward, plain module for eval/export
    compiled_loss, _ = compute_loss(stepper.model, tok, BATCH, cfg)
    assert compiled_loss.item() == pytest.approx(eager_loss.item(), abs=1e-5)
    stepper.step(compiled_loss)  # and it trains


# ---------------------------------------------------------------- the ingest
def texts_of(ingest, epoch) -> list[str]:
    return [t for batch in ingest(epoch) for t in batch["text"]]


def test_read_ahead_ingest_gives_the_batches_of_reading_when_asked_in_order(ray_cluster):
    """The worker's read-ahead thread is an optimisation only: every epoch yields the batches a
    plain ``iter_batches`` gives, in the same order; and it really reads before it is asked."""
    import time

    import ray.data

    ds = ray.data.from_items([{"text": f"s{i}"} for i in range(50)])
    plain = Ingest(8, epochs=2, depth=0, shard=ds.iterator())
    ahead = Ingest(8, epochs=2, depth=3, shard=ds.iterator())
    deadline = time.monotonic() + 60
    while ahead.ahead[1].qsize() < 3 and time.monotonic() < deadline:  # nothing asked yet
        time.sleep(0.05)
    assert ahead.ahead[1].qsize() == 3  # `depth` batches ready before the loop asks for one
    for epoch in range(2):
        want = texts_of(plain, epoch)
        assert want == [f"s{i}" for i in range(48)]  # 6 whole batches of 8; the last 2 rows dropped
        assert texts_of(ahead, epoch) == want
    assert ahead.ahead is None  # the last epoch reads nothing further


def test_a_reader_error_surfaces_on_the_training_thread(ray_cluster):
    import ray.data

    def broken(row):
        raise ValueError("bad row in shard 3")

    ingest = Ingest(
        4, epochs=1, depth=2, shard=ray.data.from_items([{"text": "x"}] * 8).map(broken).iterator()
    )
    with pytest.raises(Exception, match="bad row in shard 3"):
        texts_of(ingest, 0)


def test_a_small_corpus_is_read_once_before_the_workers_and_a_large_one_streams(
    ray_cluster, tiny_shards, tiny_bert_dir, tmp_path
):
    from ray.data.dataset import MaterializedDataset

    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import build_trainer

    def trainer(workers, **perf):
        cfg = ContrastiveConfig.model_validate(
            {
                "model": {"name_or_path": str(tiny_bert_dir), "max_length": 16, "pooling": "cls"},
                "train": {"batch_size": 8},
                "scaling": {"num_workers": workers, "cpus_per_worker": 1},
                "run": {"storage": str(tmp_path / "store")},
                "perf": perf,
            }
        )
        return build_trainer(get_method("sifter_simcse"), cfg, tiny_shards, name="ingest")

    one = trainer(1)
    assert isinstance(one.datasets["train"], MaterializedDataset)
    assert one.data_config._datasets_to_split == []  # one worker reads it whole: no split coordinator
    streamed = trainer(2, ingest_materialize_mb=0)  # 0 MiB: every corpus is "large"
    assert not isinstance(streamed.datasets["train"], MaterializedDataset)
    assert streamed.data_config._datasets_to_split == "all"


def test_a_small_corpus_read_in_process_holds_what_ray_datas_read_held(ray_cluster, tiny_shards, tmp_path):
    """The corpus is read by the process that builds the trainer (no read tasks, 3-7 s of every run).
    One shard file (every smoke preset's corpus): the same rows in the same order, and the same rows for
    each of 2 workers, as ``read_parquet(...).materialize()`` gave - the training figures cannot move.
    Several files: read in file-name order, one block each. No shard file, or a broken one: one error naming it."""
    import threading

    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    import ray.data

    from orchestrator import storage
    from orchestrator.drivers.train import read_in_process
    from orchestrator.errors import ConfigError, DataError

    fs, path = storage.pyarrow_filesystem(storage.join(storage.resolve_build(tiny_shards), "shards"))
    cols = ["text", "deletion_view"]
    ours, theirs = (
        read_in_process(fs, path, cols),
        ray.data.read_parquet(path).select_columns(cols).materialize(),
    )

    def texts(it) -> list[str]:
        return [
            t for b in it.iter_batches(batch_size=8, drop_last=True, batch_format="numpy") for t in b["text"]
        ]

    def split(ds) -> list[list[str]]:  # as Ray Train hands 2 workers their shards
        its, out = ds.streaming_split(2, equal=True), [None, None]
        readers = [threading.Thread(target=lambda i=i: out.__setitem__(i, texts(its[i]))) for i in range(2)]
        for r in readers:
            r.start()
        for r in readers:
            r.join()
        return out

    rows, halves = ours.take_all(), split(ours)
    assert ours.num_blocks() == theirs.num_blocks() == 1
    assert rows == theirs.take_all() and len(rows) > 100
    assert halves == split(theirs) and all(halves)

    folder = tmp_path / "shards"
    folder.mkdir()
    for name, rows in [
        ("000001-0000.parquet", ["c", "d"]),
        ("000000-0000.parquet", ["a", "b"]),
        ("000002-0000.parquet", ["e"]),
    ]:
        pq.write_table(pa.table({"text": rows, "other": [0] * len(rows)}), folder / name)
    (folder / "_SUCCESS").write_text("")
    several = read_in_process(pafs.LocalFileSystem(), str(folder), ["text"])
    assert several.num_blocks() == 3 and several.take_all() == [{"text": t} for t in "abcde"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"empty: no parquet shard files"):
        read_in_process(pafs.LocalFileSystem(), str(tmp_path / "empty"), None)
    (folder / "000003-0000.parquet").write_bytes(b"PAR1 cut short")
    with pytest.raises(DataError, match=r"000003-0000\.parquet: not a readable shard file"):
        read_in_process(pafs.LocalFileSystem(), str(folder), ["text"])


def test_trials_share_the_cpu_the_ingest_no_longer_needs(ray_cluster):
    """On the session's 4 logical CPUs: 1-worker trials (2 CPUs each) ran one at a time, 1 CPU kept for a
    streaming ingest's read tasks; with the corpus read before the workers start, two fit at once."""
    from orchestrator.drivers.cluster import concurrent_trials

    one = ContrastiveConfig.model_validate({"scaling": {"num_workers": 1, "cpus_per_worker": 1}})
    two = ContrastiveConfig.model_validate({"scaling": {"num_workers": 2, "cpus_per_worker": 1}})
    assert [concurrent_trials(one, None, streams=s) for s in (True, False)] == [1, 2]
    assert [concurrent_trials(two, None, streams=s) for s in (True, False)] == [1, 1]
    assert concurrent_trials(one, 3, streams=True) == 3  # asked for: as asked


# ---------------------------------------------------------------- the base model measured beside training
def test_beside_gives_the_value_or_the_error_and_restores_the_threads():
    from orchestrator.drivers.train import Beside

    before = torch.get_num_threads()
    seen = []
    job = Beside(lambda: seen.append(torch.get_num_threads()) or 42, threads=1)
    assert job.result() == 42 and seen == [1]  # at the threads it was given
    assert torch.get_num_threads() == before

    def failing():
        raise ValueError("bad eval file")

    with pytest.raises(ValueError, match="bad eval file"):
        Beside(failing, threads=1).result()


def test_idle_cores_are_the_cores_a_run_leaves_free():
    from orchestrator.drivers.train import idle_cores

    def cfg(workers, cpus, gpu=False):
        return ContrastiveConfig.model_validate(
            {
                "model": {"name_or_path": "m"},
                "scaling": {"num_workers": workers, "cpus_per_worker": cpus, "use_gpu": gpu},
            }
        )

    cores = torch.get_num_threads()
    assert idle_cores(cfg(1, 1)) == cores - 1  # ParaBART's smoke preset: one 1-CPU worker
    assert idle_cores(cfg(cores, 1)) == 0 and idle_cores(cfg(cores, 2)) == 0
    assert idle_cores(cfg(1, 1, gpu=True)) == 0  # a GPU run keeps to the old order


def test_the_base_measured_beside_training_is_the_base_measured_alone(tiny_bert_dir):
    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import Beside, measure_bases

    spec = get_method("simcse")
    cfg = spec.config_cls.model_validate(
        {
            "method": "simcse",
            "model": {"name_or_path": str(tiny_bert_dir), "pooling": "mean"},
            "eval": {"tasks": ["stsb"], "max_length": 32},
        }
    )
    alone = measure_bases(spec, cfg)
    beside = Beside(lambda: measure_bases(spec, cfg), threads=1).result()
    assert [(b.label, b.dev, b.test.metrics) for b in beside] == [
        (b.label, b.dev, b.test.metrics) for b in alone
    ]


def test_what_a_train_controller_unpickles_imports_no_torch_transformers_or_mlflow(tmp_path):
    """Ray Train's controller (a new process per run) imports the module of each callback, train function and
    config it is given, and never builds a model: from ``sweep.py``'s callback that was torch, transformers, MLflow
    and SciPy (9.7 and 11.5 s to unpickle here); from ``recipe.train_func`` and the typed config, the recipe's
    module - transformers, MLflow, SciPy (~5 CPU-s of each run's controller). The workers still get both."""
    import subprocess
    import sys

    import cloudpickle

    from orchestrator.drivers.recording import RecordingTuneReportCallback
    from orchestrator.drivers.train import train_function
    from trainers.sifter_simcse import ContrastiveConfig, SIFTERSimCSERecipe

    cfg = ContrastiveConfig.model_validate(
        {"model": {"name_or_path": "unused"}, "run": {"storage": str(tmp_path)}}
    )
    func, config = train_function(SIFTERSimCSERecipe, cfg, rows_per_worker=8, shards="unused")
    code = (
        "import pickle, sys; pickle.loads(sys.stdin.buffer.read()); "
        "print(sorted({'torch', 'transformers', 'mlflow', 'scipy', 'orchestrator.drivers.train', 'trainers'} "
        "& set(sys.modules)))"
    )
    for thing in (RecordingTuneReportCallback, (func, config)):
        res = subprocess.run(
            [sys.executable, "-c", code],
            input=cloudpickle.dumps(thing),
            capture_output=True,
            timeout=120,
            cwd=ROOT,
        )
        assert res.returncode == 0, res.stderr[-2000:]
        assert res.stdout.decode().strip() == "[]", thing
    # what a worker opens: the recipe and the config as they were made
    recipe, typed = cloudpickle.loads(config["recipe_and_config"])
    assert recipe is SIFTERSimCSERecipe and typed == cfg and config["rows_per_worker"] == 8
