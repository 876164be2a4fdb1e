"""Part of the reliability suite: the bad-input catalogue as one table, secrets never written,
and concurrent registration against a real MLflow server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from forked import run_forked

ROOT = Path(__file__).resolve().parents[1]
JOBS = ROOT / "jobs"


def write(tmp, name, data: bytes | str):
    p = tmp / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(p)


CANARY = "canary-pw-2c81"  # a password in a tracking URI


def model_folder(tmp: Path, tiny: Path, name: str) -> Path:
    """A copy of the tiny model folder, to spoil."""
    folder = tmp / f"model-{name}"
    shutil.copytree(tiny, folder, dirs_exist_ok=True)
    return folder


def with_auto_map(folder: Path) -> Path:
    """A folder whose config asks transformers to import its own module - which, run, leaves a marker file."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(cfg))
    marker = folder / "CODE-RAN"
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertConfig as EvilConfig, BertModel as EvilModel\n"
    )
    return marker


def catalogue(tmp: Path, tiny: Path) -> list[tuple[str, list[str], str]]:
    """(case, command, expected one-line stderr fragment)."""
    cfg = write(tmp, "bad_key.yaml", "method: simcse\ntrain:\n  lrr: 1\n")
    gpt = tmp / "gpt"
    gpt.mkdir(exist_ok=True)
    (gpt / "config.json").write_text(
        '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 1}'
    )
    (gpt / "model.safetensors").write_bytes(b"")  # refused for its architecture before any weight is read
    code, corrupt, bare, pickled = (
        model_folder(tmp, tiny, n) for n in ("code", "corrupt", "bare", "pickled")
    )
    with_auto_map(code)
    (corrupt / "config.json").write_text('{"model_type": "bert",\n  "hidden_size": 32\n')
    (bare / "model.safetensors").unlink()
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    ev, tr, sw, au = (
        str(JOBS / n) for n in ("evaluate.py", "train.py", "sifter_sweep.py", "augment_corpus.py")
    )
    tsv_missing = write(tmp, "nocol.tsv", "sentence1\tsentence2\na\tb\n")
    levels = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))
    bomb = write(tmp, "bomb.yaml", "method: simcse\nl0: &l0 [x, x, x, x, x, x, x, x, x]\n" + levels)
    blank = write(tmp, "blank.txt", "\n\n   \n\n")
    tsv_nan = write(tmp, "nan.tsv", "sentence1\tsentence2\tscore\na\tb\thigh\n")
    tsv_empty = write(tmp, "empty.tsv", "")
    tsv_utf8 = write(tmp, "utf8.tsv", b"sentence1\tsentence2\tscore\n\xff\tb\t1\n")
    tsv_one = write(tmp, "one.tsv", "sentence1\tsentence2\tscore\na\tb\t1\n")
    tsv_flat = write(
        tmp, "flat.tsv", "\ufeffsentence1\tsentence2\tscore\na\tb\t3\nc\td\t3\n"
    )  # BOM + constant
    cmp = str(JOBS / "compare.py")
    arms = (
        "arms:\n  a: {method: simcse, config: configs/simcse/smoke.yaml}\n"
        "  b: {method: sifter_simcse, config: configs/sifter_simcse/smoke.yaml, overrides: {train.max_steps: 80}}\n"
    )
    unequal = write(tmp, "unequal.yaml", "seeds: [1, 2]\n" + arms)
    typo = write(tmp, "typo.yaml", "seeds: [1, 2]\nrefrence: a\n" + arms)
    (tmp / "st" / "train" / "taken").mkdir(parents=True, exist_ok=True)  # an earlier run's checkpoints
    (tmp / "st" / "sweeps" / "a-sweep").mkdir(
        parents=True, exist_ok=True
    )  # a sweep's: no comparison plan kept
    beir = tmp / "beir"  # your own retrieval data whose qrels name a document the corpus lacks
    (beir / "qrels").mkdir(parents=True, exist_ok=True)
    write(beir, "corpus.jsonl", '{"_id": "d1", "text": "a cat"}\n')
    write(beir, "queries.jsonl", '{"_id": "q1", "text": "cats"}\n')
    write(beir / "qrels", "test.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td9\t1\n")
    return [
        (
            "eval: a BEIR qrels id not in the corpus",
            [ev, "--beir", str(beir), "--tasks", ""],
            "qrels/test.tsv:3: corpus-id 'd9' is not in corpus.jsonl",
        ),
        (
            "retrieval: a qrels id not in the corpus",
            [
                tr,
                "--method",
                "supervised_contrastive",
                "eval.domain=[beir_mine]",
                f"eval.domain_paths={{beir_mine: {beir}}}",
            ],
            "qrels/test.tsv:3: corpus-id 'd9' is not in corpus.jsonl",
        ),
        (
            "train: a name already used",
            [tr, "--method", "simcse", "--name", "taken", "--storage", str(tmp / "st")],
            "--name 'taken': a run of that name exists at",
        ),
        (
            "data: missing corpus, before Ray",
            [tr, "--method", "simcse", f"data.corpus={tmp / 'nope.txt'}"],
            "data.corpus: " + str(tmp / "nope.txt") + ": no such file or folder",
        ),
        (
            "data: missing labelled set",
            [tr, "--method", "sifter_lstm", "data.dev=data/sst2/nope.tsv"],
            "data.dev: data/sst2/nope.tsv: no such file or folder",
        ),
        (
            "config: unknown key",
            [tr, "--method", "simcse", "--config", cfg],
            "bad_key.yaml: train.lrr: unknown key",
        ),
        (
            "config: wrong type",
            [tr, "--method", "simcse", "train.lr=fast"],
            "train.lr: Input should be a valid number",
        ),
        (
            "config: infinite learning rate",  # every NaN or inf in a config; the runtime guard: test_loop.py
            [tr, "--method", "simcse", "train.lr=.inf"],
            "train.lr: Input should be a finite number",
        ),
        (
            "config: a YAML alias bomb, refused before it expands",
            [tr, "--method", "simcse", "--config", bomb],
            "bomb.yaml:10: more than 64 YAML aliases (*name)",
        ),
        (
            "config: a 1,000-deep override",
            [tr, "--method", "simcse", "train.lr=" + "[" * 1000 + "]" * 1000],
            "override train.lr:1: YAML nested deeper than 32 levels",
        ),
        (
            "config: TSDAE deleting every word",
            [tr, "--method", "tsdae", "deletion_ratio=1.0"],
            "deletion_ratio: Input should be less than 1",
        ),
        (
            "config: a negative seed",
            [tr, "--method", "simcse", "train.seed=-1"],
            "train.seed: Input should be greater than or equal to 0",
        ),
        (
            "eval: a batch of no sentences",
            [ev, "--batch-size", "0", "--tasks", "stsb"],
            "--batch-size 0: expected 1",
        ),
        (
            "eval: a length no model reads",
            [ev, "--max-length", "100000"],
            "--max-length 100000: expected 1 to 8192",
        ),
        ("eval: a negative seed", [ev, "--seed", "-1"], "--seed -1: expected 0 to"),
        (
            "data: a corpus of blank lines, before Ray",
            [tr, "--method", "simcse", f"data.corpus={blank}"],
            "blank.txt: no line of 3 or more words (data.min_words): nothing to train on",
        ),
        (
            "scaling: a GPU this machine does not have, before Ray",  # not a silent wait for a placement
            [tr, "--method", "simcse", "scaling.use_gpu=true"],
            "scaling.use_gpu=true: each worker needs 1 GPU, and no node of the Ray cluster has more than 0",
        ),
        (
            "scaling: more CPUs per worker than the machine has",
            [sw, "--preset", "smoke", "scaling.cpus_per_worker=64"],
            "scaling.cpus_per_worker=64: each worker needs 64 CPU, and no node of the Ray cluster has more than",
        ),
        (
            "config: negative lambda",
            [tr, "--method", "sifter_simcse", "lambda_xy=-1"],
            "lambda_xy: Input should be greater than or equal to 0",
        ),
        (
            "config: no lambda",
            [tr, "--method", "sifter_simcse", "lambda_xy=0", "lambda_xz=0", "lambda_yz=0"],
            "at least one of lambda_xx",
        ),
        (
            "config: dropout outside [0,1)",
            [tr, "--method", "simcse", "dropout=1.5"],
            "dropout: Input should be less than 1",
        ),
        (
            "config: missing file",
            [tr, "--method", "simcse", "--config", str(tmp / "nope.yaml")],
            "nope.yaml: config file not found",
        ),
        ("config: unknown method", [tr, "--method", "bart"], "unknown method 'bart'"),
        (
            "config: unknown preset",
            [tr, "--method", "simcse", "--preset", "huge"],
            "huge.yaml: config file not found",
        ),
        ("config: malformed override", [tr, "--method", "simcse", "train.lr"], "expected key=value"),
        (
            "config: a list key given one word",
            [tr, "--method", "simcse", "eval.tasks=stsb"],
            "eval.tasks: Input should be a valid list (got 'stsb'); a list is written in brackets: 'eval.tasks=[a, b]'",
        ),
        (
            "config: grad_cache's mini-batch not dividing the batch",
            [tr, "--method", "simcse", "train.grad_cache.mini_batch=24"],
            "train: grad_cache.mini_batch (24) must divide the per-worker train.batch_size (32)",
        ),
        (
            "config: grad_cache on a method that cannot cache",
            [tr, "--method", "tsdae", "train.grad_cache.mini_batch=2"],
            "train.grad_cache: tsdae cannot cache gradients",
        ),
        ("sweep: unknown space key", [sw, "sweep.space={nope: {grid: [1]}}"], "sweep.space.nope=1"),
        ("sweep: resume without name", [sw, "--resume"], "--resume needs --name"),
        (
            "sweep: a float range on an integer key",
            [sw, "sweep.space={train.eval_steps: {uniform: [10, 20]}}"],
            "sweep.space.train.eval_steps=13.7",
        ),
        (
            "sweep: a confirm stage of one seed (no interval)",
            [sw, "confirm.seeds=1"],
            "confirm.seeds: 1 seed gives no interval",
        ),
        ("sweep: a confirm stage of no setting", [sw, "confirm.top_k=0"], "confirm.top_k: Input should be"),
        (
            "sweep: the explore stage's dev task among the test tasks",
            [sw, "eval.tasks=[stsb, stsb_dev]"],
            "the test task 'stsb_dev' is the explore stage's dev task",
        ),
        (
            "sweep: a confirm seed the explore stage trained with",
            [sw, "confirm.seeds=[42, 7]"],
            "confirm.seeds [42] trained in the explore stage too",
        ),
        (
            "sweep: a confirm stage for a method without an untouched base",
            [str(JOBS / "sentiment_sweep.py"), "--preset", "smoke", "confirm.seeds=2"],
            "set confirm.seeds: 0",
        ),
        (
            "sweep: resume of a name never run",
            [sw, "--name", "never", "--resume", "--storage", str(tmp / "st")],
            "no sweep 'never' at",
        ),
        (
            "compare: resume of a name never run",
            [cmp, "--name", "never", "--resume", "--storage", str(tmp / "st")],
            "no comparison 'never' at",
        ),
        (
            "compare: status of a name never run",
            [cmp, "--name", "never", "--status", "--storage", str(tmp / "st")],
            "no comparison 'never' at",
        ),
        (
            "compare: status of a sweep's name (no plan kept: not read with the preset's)",
            [cmp, "--name", "a-sweep", "--status", "--storage", str(tmp / "st")],
            "comparison 'a-sweep' kept no plan (",
        ),
        (
            "compare: arms on unequal steps",
            [cmp, "--config", unequal],
            "arm 'b' differs from arm 'a' in the step budget",
        ),
        ("compare: unknown key", [cmp, "--config", typo], "typo.yaml: refrence: unknown key"),
        (
            "compare: resume without name",
            [cmp, "--resume"],
            "--resume needs --name (the comparison to continue)",
        ),
        (
            "corpus: missing input",
            [au, "--input", str(tmp / "none.txt"), "--output", str(tmp / "o")],
            "none.txt: no such input file or directory",
        ),
        (
            "corpus: bad parser",
            [au, "--output", str(tmp / "o"), "parser.kind=udpipe"],
            "parser.kind: String should match pattern",
        ),
        (
            "eval: missing column",
            [ev, "--sts-file", tsv_missing, "--tasks", ""],
            "nocol.tsv:1: missing column(s) score",
        ),
        (
            "eval: non-numeric score",
            [ev, "--sts-file", tsv_nan, "--tasks", ""],
            "nan.tsv:2: score 'high' is not a number",
        ),
        ("eval: empty file", [ev, "--sts-file", tsv_empty, "--tasks", ""], "empty.tsv: empty file"),
        ("eval: invalid UTF-8", [ev, "--sts-file", tsv_utf8, "--tasks", ""], "utf8.tsv:2: not valid UTF-8"),
        ("eval: unknown task", [ev, "--tasks", "sts99"], "--tasks: unknown task(s) sts99"),
        (
            "eval: --json is a folder",
            [ev, "--tasks", "stsb", "--json", str(tmp)],
            "is a folder; give a file path",
        ),
        (
            "eval: --json under a file",
            [ev, "--tasks", "stsb", "--json", str(tmp / "one.tsv" / "x.json")],
            "one.tsv is a file, not a folder",
        ),
        ("eval: empty --model", [ev, "--model", " "], "--model is empty"),
        (
            "eval: one pair",
            [ev, "--sts-file", tsv_one, "--tasks", ""],
            "one.tsv: 1 pair: a correlation needs at least 2",
        ),
        (
            "eval: constant scores (and a BOM)",
            [ev, "--sts-file", tsv_flat, "--tasks", ""],
            "flat.tsv: every score is 3: a correlation with constant scores is undefined",
        ),
        (
            "model: hub id offline",
            [ev, "--model", "bert-base-uncased"],
            "model 'bert-base-uncased': not a local folder",
        ),
        ("model: missing folder", [ev, "--model", str(tmp / "no" / "model")], "no such folder"),
        ("model: wrong architecture", [ev, "--model", str(gpt)], "is not a text encoder"),
        ("model: not a model folder", [ev, "--model", str(tmp)], "has no config.json"),
        ("model: its own code (auto_map)", [ev, "--model", str(code)], "never runs code from a model folder"),
        (
            "model: corrupt config.json",
            [tr, "--method", "simcse", f"model.name_or_path={corrupt}", "--storage", str(tmp / "st")],
            "config.json line 3 is not valid JSON",
        ),
        ("model: no weights", [ev, "--model", str(bare)], "has no safetensors weights"),
        (
            "model: pickle weights only",
            [tr, "--method", "simcse", f"model.name_or_path={pickled}", "--storage", str(tmp / "st")],
            "only pytorch_model.bin: a pickle, never loaded",
        ),
        (
            "tracking: a password over plain http to another machine",
            [tr, "--method", "simcse", "--tracking-uri", f"http://sieve:{CANARY}@mlflow.example.com"],
            "tracking URI http://sieve:***@mlflow.example.com: a password over plain http",
        ),
        (
            "tracking: unreachable, a password in the URI",
            [tr, "--method", "simcse", "--tracking-uri", f"http://sieve:{CANARY}@127.0.0.1:9"],
            "MLflow tracking server http://127.0.0.1:9 unreachable",
        ),
        (
            "tracking: unreachable",
            [tr, "--method", "simcse", "--tracking-uri", "http://127.0.0.1:9"],
            "MLflow tracking server http://127.0.0.1:9 unreachable",
        ),
        (
            "storage: missing bucket",
            [tr, "--method", "simcse", "--storage", "s3://no-such-bucket-sieve-test/x"],
            "s3://no-such-bucket-sieve-test/x:",
        ),
    ]


@pytest.mark.slow
def test_bad_input_catalogue(tmp_path, tiny_bert_dir, s3_endpoint, job_server):
    from conftest import free_port

    cases = catalogue(tmp_path, tiny_bert_dir)
    assert len(cases) >= 20
    # a web server that is not MLflow's (it answers 404 with a page of HTML): one line, not the page
    (tmp_path / "www").mkdir()
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(tmp_path / "www")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cases.append(
        (
            "tracking: a web server that is not MLflow",
            [str(JOBS / "train.py"), "--method", "simcse", "--tracking-uri", f"http://127.0.0.1:{port}"],
            "error code 404 != 200.) - is it an MLflow tracking server?",
        )
    )
    # the session's job server (it imported the jobs' libraries once) forks a real process per case (tests/forked.py)
    sessions = set(Path("/tmp/ray").glob("session_2*"))  # a Ray started by a case would add one
    try:
        time.sleep(1)  # the server listening
        got = run_forked([(n, cmd, tmp_path) for n, cmd, _ in cases], tmp_path, jobs=job_server)
    finally:
        web.kill()
    assert sorted(got) == sorted(n for n, _, _ in cases)
    failures = []
    for name, _, fragment in cases:
        rc, stderr = got[name]["rc"], got[name]["stderr"]
        err = stderr.strip().splitlines()
        last = err[-1] if err else ""
        if rc != 2 or "Traceback" in stderr or not last.startswith("error: ") or fragment not in last:
            failures.append(f"{name}: rc={rc} last={last!r}")
        elif (
            len([ln for ln in err if ln.strip() and " INFO mlflow." not in ln]) != 1
        ):  # one message (MLflow's
            # own INFO lines when it creates an embedded store aside)
            failures.append(f"{name}: {len(err)} lines: {stderr[-600:]!r}")
    assert failures == []
    assert not [
        n for n, r in got.items() if CANARY in r["stderr"] + r["stdout"]
    ]  # a URI's password: never shown
    assert not (tmp_path / "o").exists() and not (tmp_path / "outputs").exists()  # no partial output
    assert set(Path("/tmp/ray").glob("session_2*")) == sessions  # no case started Ray
    store = tmp_path / "mlruns" / "mlflow.db"
    if (
        store.exists()
    ):  # a case that reached the tracking preflight made the embedded store, and nothing in it
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{store}")
        experiments = client.search_experiments()
        assert not client.search_runs([e.experiment_id for e in experiments]) if experiments else True
        assert client.search_registered_models() == []


def test_a_model_folder_that_asks_to_run_its_code_is_refused_even_with_yes_on_stdin(tmp_path, tiny_bert_dir):
    """transformers asks "Do you wish to run the custom code? [y/N]" for a folder with an ``auto_map``; a script
    that answers ``y`` would run the folder's module. The job never gets there: one line, exit 2, nothing ran."""
    folder = model_folder(tmp_path, tiny_bert_dir, "code")
    marker = with_auto_map(folder)
    res = subprocess.run(
        [sys.executable, str(JOBS / "evaluate.py"), "--model", str(folder), "--tasks", "stsb"],
        input="y\ny\n",
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    err = [line for line in res.stderr.strip().splitlines() if line.strip()]
    assert res.returncode == 2 and len(err) == 1 and "never runs code from a model folder" in err[0], (
        res.stderr
    )
    assert not marker.exists()
    # and where a load is reached some other way, transformers is told not to trust the folder either
    from orchestrator.models import load_config

    with pytest.raises(Exception, match="auto_map|never runs code"):
        load_config(str(folder))
    assert not marker.exists()


@pytest.mark.slow
def test_concurrent_registration_gets_distinct_versions(
    mlflow_server, postgres_uri, tiny_bert_dir, monkeypatch
):
    """Three jobs register under one name at once: distinct versions, one alias. Against PostgreSQL and a
    2-worker server (the cluster's setup) where the machine has PostgreSQL."""
    import mlflow

    from orchestrator import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    tracking.setup(None, "concurrency")
    with mlflow.start_run():
        info = tracking.log_sentence_encoder(tiny_bert_dir, name="model")
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from orchestrator import tracking; "
        f"tracking.setup(None, 'concurrency'); print(tracking.register({info.model_uri!r}, 'shared-name', alias='candidate'))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    versions = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        versions.append(int(out.strip().splitlines()[-1]))
    assert sorted(versions) == [1, 2, 3]  # on PostgreSQL the alias writes used to collide (UniqueViolation)
    assert tracking.alias_version("shared-name", "candidate") in (1, 2, 3)
    if postgres_uri:  # the versions really live in PostgreSQL
        import psycopg2

        with (
            psycopg2.connect(postgres_uri.replace("postgresql+psycopg2", "postgresql")) as conn,
            conn.cursor() as cur,
        ):
            cur.execute("SELECT version FROM model_versions WHERE name = 'shared-name' ORDER BY version")
            assert [v for (v,) in cur.fetchall()] == [1, 2, 3]


def test_tracking_outage_after_training_keeps_the_run_and_sync_logs_it(
    mlflow_server, tiny_bert_dir, tmp_path, capsys, job_server
):
    """The server is gone when a finished run is logged → one warning naming the URI, the whole
    run kept in a pending file (atomically), nothing raised; `jobs/sync_tracking.py` logs it later,
    every evaluation step included, and removes the file."""
    import time

    import mlflow
    from conftest import free_port

    from orchestrator import outbox
    from orchestrator.tracking import logged_models

    history = [
        {"step": 2, "stsb_dev_spearman": 0.5, "loss": 3.0},
        {"step": 4, "stsb_dev_spearman": 0.6, "loss": 2.5},
    ]
    record = outbox.run_record(
        experiment="outage",
        run_name="tiny-run",
        method="sifter_simcse",
        params={"train": {"lr": 1e-4}},
        history=history,
        metrics={"test_sts_avg": 0.7},
        texts={"test.md": "| a |"},
        model_dir=str(tiny_bert_dir),
    )
    pending = tmp_path / "pending"
    dead = f"http://127.0.0.1:{free_port()}"
    t0 = time.time()
    assert outbox.log_or_defer(record, dead, pending) is None
    assert time.time() - t0 < 10
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and dead in err and "jobs/sync_tracking.py" in err
    files = [p.name for p in pending.iterdir()]
    assert (
        len(files) == 1 and files[0].startswith("tiny-run-") and files[0].endswith(".json")
    )  # no .tmp left behind

    res = job_server.run(  # the job's own process, forked by the session's job server
        [
            sys.executable,
            str(JOBS / "sync_tracking.py"),
            "--tracking-uri",
            mlflow_server,
            "--pending",
            str(pending),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "1 pending run(s) logged" in res.stdout and not list(pending.iterdir())
    mlflow.set_tracking_uri(mlflow_server)
    run = mlflow.search_runs(experiment_names=["outage"], output_format="list")[0]
    assert run.data.params["train.lr"] == "0.0001" and run.data.metrics["test_sts_avg"] == 0.7
    steps = mlflow.MlflowClient().get_metric_history(run.info.run_id, "stsb_dev_spearman")
    assert [(m.step, m.value) for m in steps] == [(2, 0.5), (4, 0.6)]
    # replaying the same record again (a crash after logging, before the file was removed) adds nothing
    again = outbox.replay(record, mlflow_server)
    assert (
        again == run.info.run_id
        and len(mlflow.search_runs(experiment_names=["outage"], output_format="list")) == 1
    )
    steps = mlflow.MlflowClient().get_metric_history(run.info.run_id, "stsb_dev_spearman")
    assert [(m.step, m.value) for m in steps] == [(2, 0.5), (4, 0.6)]
    assert len(logged_models(run.info.run_id, "model")) == 1  # the model once, not once per replay


def test_a_record_that_fails_its_own_checks_is_an_error_not_an_outage(embedded_tracking, tmp_path):
    """A model folder that is not one fails the job with that message; it is not parked in tracking-pending/
    as a tracking outage for sync_tracking.py to retry for ever (how the train job's SIFTER-LSTM defect hid)."""
    from orchestrator import outbox
    from orchestrator.errors import ModelSourceError

    folder = tmp_path / "not-a-model"
    folder.mkdir()
    (folder / "weights.pt").write_bytes(b"x")
    record = outbox.run_record(
        experiment="checks",
        run_name="bad-folder",
        method="sifter_simcse",
        params={},
        history=[],
        metrics={"test_sts_avg": 0.7},
        model_dir=str(folder),
    )
    pending = tmp_path / "pending"
    with pytest.raises(ModelSourceError, match="not-a-model"):
        outbox.log_or_defer(record, f"sqlite:///{tmp_path / 'mlflow.db'}", str(pending))
    assert not pending.exists()


def test_a_record_the_server_refuses_is_kept_aside_and_never_holds_back_the_others(
    tiny_bert_dir, tmp_path, job_server
):
    """A record MLflow refuses (its run deleted in the UI while the job trained) is not an outage: the job
    fails with one line naming the run and where the record is kept (``rejected/``, not retried); a sync
    meeting such a record moves it there and still logs the records after it. Before, it was parked as an
    outage and stopped every later sync at itself."""
    import mlflow

    from orchestrator import outbox
    from orchestrator.errors import TrackingRejected

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("refused")
    gone = client.create_run(exp, run_name="deleted-in-the-ui").info.run_id
    client.delete_run(gone)

    def record(name, run_id=None):
        return outbox.run_record(
            experiment="refused",
            run_name=name,
            method="sifter_simcse",
            params={"a": 1},
            history=[{"step": 2, "stsb_dev_spearman": 0.5}],
            metrics={"test_sts_avg": 0.7},
            model_dir=str(tiny_bert_dir),
            run_id=run_id,
        )

    pending = tmp_path / "pending"
    with pytest.raises(TrackingRejected, match=r"run 'a-bad' was refused .*deleted.*kept in .*rejected"):
        outbox.log_or_defer(record("a-bad", gone), uri, str(pending))
    assert [p.name for p in pending.iterdir()] == ["rejected"]  # nothing parked for the sync to retry
    assert len(list((pending / "rejected").iterdir())) == 1

    # a sync that meets one: the refused record (sorted first) goes aside, the good one is still logged
    next((pending / "rejected").iterdir()).rename(pending / "a-bad.json")
    (pending / "b-good.json").write_text(json.dumps(record("b-good")))
    res = job_server.run(
        [sys.executable, str(JOBS / "sync_tracking.py"), "--tracking-uri", uri, "--pending", str(pending)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "1 pending run(s) logged" in res.stdout and "b-good.json as run" in res.stdout
    assert "run 'a-bad' was refused" in res.stderr and "not retried" in res.stderr
    assert sorted(p.name for p in pending.iterdir()) == ["rejected"]
    assert [p.name for p in (pending / "rejected").iterdir()] == ["a-bad.json"]
    runs = client.search_runs([exp])
    assert [r.info.run_name for r in runs] == ["b-good"] and runs[0].data.metrics["test_sts_avg"] == 0.7


def test_a_malformed_pending_record_is_set_aside_and_the_good_ones_beside_it_are_logged(
    tiny_bert_dir, tmp_path
):
    """One record that is not JSON, one that is JSON but not a record: each moved to ``rejected/`` with a
    line naming its file, before any MLflow call (no half-logged run); the good record after them is logged.
    Before, the first bad file stopped the sync with a TrackingError and nothing after it was logged."""
    import mlflow

    from orchestrator import outbox

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pending = tmp_path / "pending"
    pending.mkdir()
    (pending / "a-cut.json").write_text('{"record_id": "x", "params": {')  # cut short by a full disk
    (pending / "b-shape.json").write_text(json.dumps({"record_id": "y", "params": [1, 2]}))
    good = outbox.run_record(
        experiment="sync",
        run_name="c-good",
        method="sifter_simcse",
        params={"a": 1},
        history=[{"step": 2, "stsb_dev_spearman": 0.5}],
        metrics={"test_sts_avg": 0.7},
        model_dir=str(tiny_bert_dir),
    )
    (pending / "c-good.json").write_text(json.dumps(good))
    done, refused = outbox.sync_pending(uri, str(pending))
    assert [Path(p).name for p, _ in done] == ["c-good.json"]
    assert [(Path(p).name, r.split(": ", 1)[1]) for p, r in refused] == [
        ("a-cut.json", "not a pending run record (Expecting property name enclosed in double quotes)"),
        (
            "b-shape.json",
            "not a pending run record (missing or mistyped: experiment, run_name, method, params, "
            "history, metrics, texts, tags)",
        ),
    ]
    assert all(r.startswith(str(pending)) for _, r in refused)  # each line names its file
    assert sorted(p.name for p in (pending / "rejected").iterdir()) == ["a-cut.json", "b-shape.json"]
    assert sorted(p.name for p in pending.iterdir()) == ["rejected"]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("sync").experiment_id])
    assert [r.info.run_name for r in runs] == ["c-good"]


def test_what_waits_for_the_server_and_what_is_refused():
    """The rule that decides it: an unreachable server, a 5xx, a refused credential or rate limit, the
    artifact store - waited for; an invalid value, a missing run, a client-side bug - refused."""
    from botocore.exceptions import EndpointConnectionError
    from mlflow.exceptions import MlflowException, RestException
    from mlflow.protos.databricks_pb2 import (
        INVALID_PARAMETER_VALUE,
        REQUEST_LIMIT_EXCEEDED,
        TEMPORARILY_UNAVAILABLE,
        UNAUTHENTICATED,
    )

    from orchestrator.errors import StorageError
    from orchestrator.tracking import is_outage

    assert is_outage(ConnectionRefusedError(111, "Connection refused"))
    assert is_outage(MlflowException("API request failed: Max retries exceeded"))  # after its own retries
    assert is_outage(MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE))
    assert is_outage(RestException({"error_code": "INTERNAL_ERROR", "message": "the server's own failure"}))
    assert is_outage(MlflowException("who are you", error_code=UNAUTHENTICATED))
    assert is_outage(MlflowException("slow down", error_code=REQUEST_LIMIT_EXCEEDED))
    assert is_outage(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert is_outage(StorageError("s3://bucket/x: cannot write"))
    assert is_outage(OSError(28, "No space left on device"))
    assert not is_outage(MlflowException("Invalid value", error_code=INVALID_PARAMETER_VALUE))
    assert not is_outage(
        RestException({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Run 'x' not found"})
    )
    assert not is_outage(MlflowException("Cannot start run with ID x because it is in the deleted state."))
    assert not is_outage(FileNotFoundError(2, "No such file", "/gone/model"))
    assert not is_outage(TypeError("unsupported operand"))


@pytest.mark.slow
def test_server_killed_mid_replay_then_the_replay_completes_once(tiny_bert_dir, tmp_path, monkeypatch):
    """A real MLflow server is killed while a pending record is being replayed (after the run was
    made and its params logged, at the first metrics): the replay fails with one line naming the URI;
    the server restarted on the same store, the next replay finishes that same run - every evaluation
    once, the model once, no second run."""
    import signal

    import mlflow
    from conftest import free_port, start_mlflow_server

    from orchestrator import outbox
    from orchestrator.errors import TrackingError
    from orchestrator.tracking import logged_models

    port, root = free_port(), tmp_path / "server"
    root.mkdir()
    uri = f"http://127.0.0.1:{port}"

    def serve() -> subprocess.Popen:
        return start_mlflow_server(root, port, f"sqlite:///{root / 'db'}")

    history = [{"step": 2, "stsb_dev_spearman": 0.5}, {"step": 4, "stsb_dev_spearman": 0.6}]
    record = outbox.run_record(
        experiment="midway",
        run_name="cut",
        method="sifter_simcse",
        params={"a": 1},
        history=history,
        metrics={"test_sts_avg": 0.7},
        model_dir=str(tiny_bert_dir),
    )
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = serve()
    real_log_metrics = outbox.log_metrics

    def kill_then_log(*a, **k):  # the server dies at this instant, for real
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
        return real_log_metrics(*a, **k)

    monkeypatch.setattr(outbox, "log_metrics", kill_then_log)
    with pytest.raises(TrackingError, match=f"MLflow tracking server {uri}: logging run 'cut' failed"):
        outbox.replay(record, uri)
    monkeypatch.setattr(outbox, "log_metrics", real_log_metrics)
    server = serve()
    try:
        run_id = outbox.replay(record, uri)
        client = mlflow.MlflowClient(tracking_uri=uri)
        runs = client.search_runs([client.get_experiment_by_name("midway").experiment_id])
        assert [r.info.run_id for r in runs] == [run_id]  # the run the cut replay made, finished
        assert [(m.step, m.value) for m in client.get_metric_history(run_id, "stsb_dev_spearman")] == [
            (2, 0.5),
            (4, 0.6),
        ]
        assert runs[0].data.params["a"] == "1" and runs[0].data.metrics["test_sts_avg"] == 0.7
        mlflow.set_tracking_uri(uri)
        assert len(logged_models(run_id, "model")) == 1
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)


class _Payload:
    """A pickle that would run code when loaded without weights_only (it writes a file)."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_checkpoints_load_with_weights_only(tiny_bert_dir, tmp_path):
    """A checkpoint in a prefix every job can write cannot run code when loaded: a model.pt or an
    RNG file carrying an arbitrary pickle is refused in one line naming it, and the code never runs; our
    own files load."""
    import torch

    from orchestrator.errors import DataError
    from trainers import common
    from trainers.sifter_simcse import ContrastiveConfig, build_model

    cfg = ContrastiveConfig.model_validate({"model": {"name_or_path": str(tiny_bert_dir), "pooling": "cls"}})
    model, _ = build_model(cfg)
    stepper = common.Stepper(
        model, model.parameters(), lr=1e-4, schedule="linear", total_steps=10, grad_clip=None
    )
    good = tmp_path / "good"
    stepper.save(good, {"step": 3})
    assert stepper.load(good) == {"step": 3}  # RNG states, optimiser and scheduler all load weights_only
    for victim in ("model.pt", "rng_rank0.pt"):
        bad = tmp_path / f"bad-{victim}"
        stepper.save(bad, {"step": 3})
        marker = tmp_path / f"pwned-{victim}"
        torch.save({"model": _Payload(str(marker))}, bad / victim)
        with pytest.raises(DataError, match=rf"^{bad / victim}: refused - not a weights-only file"):  # named
            stepper.load(bad)
        assert not marker.exists()


def test_storage_keys_and_names_that_would_escape_are_refused(tmp_path):
    from orchestrator import storage
    from orchestrator.errors import StorageError

    for rel in ("../x", "a/../../x", "/etc/passwd", "a\\b", "./a"):
        with pytest.raises(StorageError, match="would leave its folder"):
            storage.safe_relative(rel, "s3://b/p")
    assert storage.safe_relative("a/b.txt", "s3://b/p") == "a/b.txt"
    for name in ("..", "../up", "a/b", "", "x" * 200, ".hidden"):
        with pytest.raises(StorageError, match="--name"):
            storage.safe_name(name, "--name")
    assert storage.safe_name("smoke-2026.12_01", "--name") == "smoke-2026.12_01"


def test_a_checkpoint_whose_extra_state_file_holds_a_pickled_callable_is_refused(tmp_path):
    """A ZeRO checkpoint's module extra state is read from our own file, weights-only: one that
    holds a callable (what a writer of the run's storage could plant) is refused, naming the file, before
    DeepSpeed reads anything; tensors and plain containers (ParaBART's vocabularies) come back."""
    import torch

    from orchestrator.errors import DataError
    from trainers.checkpoint import EXTRA_STATE, extra_states, load_module_state, read_extra_states

    class WithVocab(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)
            self.vocab = ["<pad>", "NP", "VP"]

        def get_extra_state(self):
            return {"tags": self.vocab}

        def set_extra_state(self, state):
            self.vocab = state["tags"]

    outer = torch.nn.Sequential(WithVocab())
    assert extra_states(outer) == {"0._extra_state": {"tags": ["<pad>", "NP", "VP"]}}
    good = tmp_path / "good"
    good.mkdir()
    torch.save(extra_states(outer), good / EXTRA_STATE)
    assert read_extra_states(good) == {"0._extra_state": {"tags": ["<pad>", "NP", "VP"]}}

    # the plain (DDP) checkpoint and the RNG states go through the same weights-only read, naming the file
    from trainers.checkpoint import load_weights_only

    torch.save({"model": {}, "hook": os.system}, tmp_path / "model.pt")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'model.pt'}: refused - not a weights-only file"):
        load_weights_only(tmp_path / "model.pt")

    bad = tmp_path / "bad"
    (bad / "ds").mkdir(parents=True)  # a ZeRO checkpoint's layout; DeepSpeed is never reached
    torch.save({"_extra_state": os.system}, bad / EXTRA_STATE)
    with pytest.raises(DataError, match=rf"{bad / EXTRA_STATE}: refused - not a weights-only file"):
        load_module_state(bad)

    # DeepSpeed's own loads (resume, zero_to_fp32) pass weights_only=False: while it reads, each is weights-only
    from trainers.checkpoint import deepspeed_reads_weights_only

    planted = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": {}, "hook": os.system}, planted)
    with deepspeed_reads_weights_only(), pytest.raises(DataError, match=f"{planted}: refused"):
        torch.load(planted, map_location="cpu", weights_only=False)
    assert (
        torch.load(planted, weights_only=False)["hook"] is os.system
    )  # and torch.load is itself again after


@pytest.mark.slow
def test_a_job_without_ray_address_starts_its_own_ray_beside_another_cluster(ray_cluster):
    """With the session's Ray cluster running on this machine, a job not told where to go (no
    RAY_ADDRESS) starts a private one - it used to join any ``gcs_server`` it found; with RAY_ADDRESS it
    joins that cluster."""
    code = (
        "import ray; from orchestrator.drivers.cluster import init_ray; init_ray(quiet=True); "
        "print(ray.get_runtime_context().gcs_address)"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    alone = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    port = ray_cluster.rsplit(":", 1)[1]
    assert alone.stdout.strip().splitlines()[-1].rsplit(":", 1)[1] != port
    told = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "RAY_ADDRESS": ray_cluster},
        cwd=ROOT,
    )
    assert told.returncode == 0, told.stderr[-2000:]
    assert told.stdout.strip().splitlines()[-1].rsplit(":", 1)[1] == port


@pytest.mark.slow
@pytest.mark.services
def test_a_cluster_that_goes_away_mid_job_ends_it_with_one_line_naming_it(tmp_path):
    """A job joined to a cluster (RAY_ADDRESS) whose head is killed mid-job exits with code 2 and one line
    naming the cluster's address, within seconds - it hung for 60 s in ``ray.get``, then Ray exited with code 1
    and "Failed to connect to GCS"."""
    import tempfile
    import time

    from conftest import BIN, free_port, stop_ray_processes

    temp_dir, port = tempfile.mkdtemp(prefix="sieve-gone-", dir="/tmp"), free_port()  # short: socket paths
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_ADDRESS": f"127.0.0.1:{port}"}
    try:
        subprocess.run(
            [
                str(BIN / "ray"),
                "start",
                "--head",
                f"--port={port}",
                "--num-cpus=1",
                f"--temp-dir={temp_dir}",
                "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            env=env,
        )
        code = (
            "import time, ray; from orchestrator.drivers.cluster import init_ray; init_ray(quiet=True)\n"
            "@ray.remote\ndef step():\n    time.sleep(0.2)\n"
            "print('joined', flush=True)\nwhile True:\n    ray.get(step.remote())\n"
        )
        job = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert job.stdout.readline().strip() == "joined", job.stderr.read()[-2000:]
        time.sleep(2)  # mid-job: tasks running
        stop_ray_processes(temp_dir, timeout_s=0, graceful=False)  # the head goes, as a lost machine
        t_lost = time.monotonic()
        _, err = job.communicate(timeout=90)
        took = time.monotonic() - t_lost
    finally:
        stop_ray_processes(temp_dir, timeout_s=0, graceful=False)
    assert job.returncode == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the Ray cluster at ") and f":{port} went away mid-job" in last, err[-3000:]
    assert took < 30


def test_a_workers_own_error_is_found_inside_what_ray_hands_the_driver():
    """A Tune trial's error wraps Ray Train's, which holds each worker's: the job prints the worker's one line.
    The wrappers are Ray's own classes, built here as Ray builds them (no cluster needed to nest them)."""
    from ray.exceptions import RayTaskError
    from ray.train.v2.api.exceptions import WorkerGroupError

    from orchestrator.errors import TrainingDiverged, sieve_cause

    diverged = TrainingDiverged("the loss is nan at step 3")
    group = WorkerGroupError("Training failed due to worker errors", {0: RuntimeError("gloo"), 1: diverged})
    try:
        raise RuntimeError("trial failed") from RayTaskError("train_fn", "Traceback ...", group)
    except RuntimeError as exc:
        wrapped = exc
    assert sieve_cause(wrapped) is diverged
    assert sieve_cause(WorkerGroupError("x", {0: RuntimeError("gloo")})) is None  # Ray's own error stays


def test_a_job_stopped_after_its_run_was_made_ends_it_failed_with_the_reason(tmp_path):
    """A real MLflow store (SQLite): the run a job made ends FAILED, its reason's first line a tag, redacted."""
    from mlflow import MlflowClient

    from orchestrator.live_runs import close_failed, create_child_run, create_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp = client.create_experiment("e")
    run_id = create_run(exp, "r", {}, {"a": 1}, uri)
    trials = [create_child_run(exp, run_id, f"t{i}", {}, {}, uri) for i in range(2)]
    client.set_terminated(
        trials[1], "FINISHED"
    )  # a trial that ended before the job stopped stays as it ended
    assert client.get_run(run_id).info.status == "RUNNING"
    close_failed(
        run_id, uri, ValueError(f"s3://k:{CANARY}@bucket/x: no such bucket\nTraceback (second line)")
    )
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["sieve.failure"] == "s3://k:***@bucket/x: no such bucket"
    first, second = (client.get_run(t) for t in trials)
    assert first.info.status == "FAILED" and first.data.tags["sieve.failure"].startswith(
        "the job stopped: s3://k:***@"
    )
    assert second.info.status == "FINISHED" and "sieve.failure" not in second.data.tags
    stopped = create_run(exp, "s", {}, {}, uri)
    close_failed(stopped, uri, KeyboardInterrupt())
    assert client.get_run(stopped).info.status == "KILLED"
    close_failed(run_id, "http://127.0.0.1:9", RuntimeError("x"))  # a server that is away: no wait, no raise


def test_what_a_worker_asks_for_is_set_against_each_node():
    """The resource check's arithmetic on hand-made nodes: a worker must fit on one node, and the nodes together
    must hold every worker (two 3-CPU nodes hold two 2-CPU workers, not three)."""
    from orchestrator.config import ScalingBlock
    from orchestrator.drivers.cluster import _short_of

    two = [{"CPU": 3.0, "GPU": 0.0}, {"CPU": 3.0}]
    assert _short_of(ScalingBlock(num_workers=2, cpus_per_worker=2), two) is None
    assert _short_of(ScalingBlock(num_workers=3, cpus_per_worker=2), two) == (
        "scaling.num_workers=3: the Ray cluster's nodes hold 2 workers of {'CPU': 2.0}"
    )
    assert _short_of(ScalingBlock(num_workers=1, cpus_per_worker=4), two) == (
        "scaling.cpus_per_worker=4: each worker needs 4 CPU, and no node of the Ray cluster has more than 3"
    )
    assert _short_of(ScalingBlock(num_workers=1, use_gpu=True), two).startswith(
        "scaling.use_gpu=true: each worker needs 1 GPU, and no node of the Ray cluster has more than 0"
    )
    assert _short_of(ScalingBlock(num_workers=2, use_gpu=True), [{"CPU": 8.0, "GPU": 1.0}] * 2) is None
