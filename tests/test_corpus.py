"""The Ray Data corpus pipeline on a real local Ray cluster."""

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from orchestrator import storage
from orchestrator.data.cleaning import clean_records
from orchestrator.data.corpus import CorpusConfig, run_pipeline
from orchestrator.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
GOOD = [
    f"sentence number {w} is about the {w} topic ."
    for w in ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth"]
]


def dirty_file(path: Path) -> Path:
    lines = [
        *(ln.encode() for ln in GOOD),
        GOOD[0].encode(),
        GOOD[3].encode(),  # 2 duplicates
        b"",
        b"   \t  ",  # 2 empty
        b"broken \xff\xfe utf8 here .",  # invalid UTF-8
        b"a bell \x07 rings here .",  # control character
        b"Hi there",  # too short
        b"He met Dr.",
        b"Smith at noon today .",  # split at an abbreviation: both dropped
        ("long " * 20000 + ".").encode(),  # 100k characters: truncated, kept
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_cleaning_rules_without_ray():
    cfg = CorpusConfig(
        max_words=5, drop_capitalised_splits=True
    )  # off by default: WikiSplit's presets set it
    rows = clean_records(
        [
            ("a  b\tc .", None),
            ("x y", None),
            ("one two three four five six", None),
            ("He met Dr.", None),
            ("Smith came .", None),
            (None, "invalid_utf8"),
        ],
        cfg,
    )
    assert [r["text"] for r in rows] == ["a b c .", None, "one two three four five", None, None, None]
    assert [r["skip"] for r in rows] == [
        "",
        "too_short",
        "",
        "capitalised_split",
        "after_capitalised_split",
        "invalid_utf8",
    ]
    assert [r["truncated"] for r in rows] == [False, False, True, False, False, False]
    default = clean_records([("He met Dr.", None), ("Smith came .", None)], CorpusConfig())
    assert [r["text"] for r in default] == [
        "He met Dr.",
        "Smith came .",
    ]  # the split filter is WikiSplit's only


def read_shards(out) -> list[dict]:
    files = sorted(Path(out, "shards").glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_manifest_counts_on_dirty_file(ray_cluster, tmp_path, capsys):
    cfg = CorpusConfig(
        input=str(dirty_file(tmp_path / "dirty.txt")),
        seed=1,
        max_words=50,
        drop_capitalised_splits=True,  # off by default: WikiSplit's presets turn it on
        parser={"workers": 2, "cpus_per_worker": 1},
    )
    manifest = run_pipeline(cfg, str(tmp_path / "out"), progress=False)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("corpus: dropped")]
    assert said == [
        "corpus: dropped 9 line(s): 2 repeating a kept sentence; 2 blank; 1 following such a split "
        "(drop_capitalised_splits); 1 ending in a capitalised word, a likely bad sentence split "
        "(drop_capitalised_splits); 1 holding control characters; 1 not UTF-8; 1 under 3 words (min_words); "
        "1 cut to 50 words (max_words)"
    ], said
    assert manifest["read"] == 20
    assert manifest["written"] == 11
    assert manifest["skipped"] == {
        "duplicate": 2,
        "empty": 2,
        "invalid_utf8": 1,
        "control_characters": 1,
        "too_short": 1,
        "capitalised_split": 1,
        "after_capitalised_split": 1,
    }
    assert manifest["truncated"] == 1 and manifest["parser"] == "spacy" and manifest["seed"] == 1
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert on_disk["written"] == 11
    rows = read_shards(tmp_path / "out")
    assert len(rows) == 11 and len({r["text"] for r in rows}) == 11
    assert set(rows[0]) >= {
        "text",
        "words",
        "backbone_view",
        "deletion_view",
        "linearized_parse",
        "constituent_bag",
    }
    long = next(r for r in rows if r["text"].startswith("long"))
    assert len(long["text"].split()) == 50
    for r in rows:
        assert r["backbone_view"].startswith(r["text"]) and r["deletion_view"]
        bag = json.loads(
            r["constituent_bag"]
        )  # counts: one per node's label, ROOT once, a bracket a side per node
        assert (
            r["linearized_parse"].startswith("(")
            and bag["ROOT"] == 1
            and bag["("] == bag[")"] == sum(v for k, v in bag.items() if k not in ("(", ")"))
        )

    # same seed → the same order; another seed → another order
    again = run_pipeline(cfg, str(tmp_path / "out2"), progress=False)
    assert [r["text"] for r in read_shards(tmp_path / "out2")] == [r["text"] for r in rows]
    assert again["skipped"] == manifest["skipped"]
    other = cfg.model_copy(update={"seed": 2})
    run_pipeline(other, str(tmp_path / "out3"), progress=False)
    assert [r["text"] for r in read_shards(tmp_path / "out3")] != [r["text"] for r in rows]


def test_parser_actors_leave_the_read_and_sort_tasks_a_cpu():
    from orchestrator.data.resources import parser_cpus

    assert (
        parser_cpus(2, 1.0, 4.0) == 1.0 and parser_cpus(2, 1.0, 3.1) == 1.0
    )  # 2 actors + dedup + 1-CPU task fit
    assert (
        parser_cpus(2, 1.0, 3.0) == 0.95 and parser_cpus(2, 1.0, 2.5) == 0.7
    )  # they share what the task leaves
    assert (
        parser_cpus(2, 1.0, 1.0) == 0.1
    )  # never under the floor (then the build waits for CPUs, as Ray makes it)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_build_on_a_cluster_whose_cpus_are_held_elsewhere_runs(ray_cluster, tmp_path, capfd):
    """An actor of another job holds CPUs: the 2 parser actors (1 CPU each, as configured) would take what is left
    but the CPU the read and sort tasks need, and wait for those tasks forever (before: hung until the limit). The
    actors reserve less instead, the build runs and its manifest says what they reserved."""
    import ray

    @ray.remote
    class Holder:
        def ready(self):
            return True

    holder = Holder.options(num_cpus=ray.cluster_resources()["CPU"] - 2.5).remote()  # at most 2.5 CPUs left
    try:
        ray.get(holder.ready.remote(), timeout=60)
        deadline = (
            time.monotonic() + 30
        )  # the cluster's view of free CPUs follows the raylet's a moment later
        while ray.available_resources().get("CPU", 0) > 2.5 and time.monotonic() < deadline:
            time.sleep(0.1)
        cfg = CorpusConfig(
            input=str(dirty_file(tmp_path / "dirty.txt")),
            seed=1,
            max_words=50,
            parser={"workers": 2, "cpus_per_worker": 1},
        )
        manifest = run_pipeline(cfg, str(tmp_path / "out"), progress=False)
    finally:
        ray.kill(holder)
    # the dirty file's 11 sentences, and the split and the line after it, kept: the split filter is off
    assert manifest["written"] == 13 and len(read_shards(tmp_path / "out")) == 13
    assert manifest["parser_cpus_reserved"] < 1.0
    assert (
        f"each of the 2 parser actors reserves {manifest['parser_cpus_reserved']:g} CPU"
        in capfd.readouterr().err
    )


PARSE_IN_FRESH_PROCESS = """
import json, sys
if sys.argv[1] == "beside-torch":
    import torch  # noqa: F401 - loaded first, as in a process that trains: thinc then has torch
    from orchestrator.data.parsing import SpacyParser as make
else:
    from orchestrator.data.corpus import ParseAugment, CorpusConfig
    make = lambda: ParseAugment(CorpusConfig().model_dump()).parser
parser = make()
import thinc.compat  # noqa: E402 - after the parser: imported first, thinc would import torch
lines = open(sys.argv[2]).read().splitlines()
parses = [p.to_dict() for p in parser.parse_batch(lines)]
print(json.dumps({"torch": "torch" in sys.modules, "has_torch": thinc.compat.has_torch, "parses": parses}))
"""


def test_a_parser_actor_starts_without_torch_and_parses_as_a_parser_beside_torch(tmp_path):
    """A spaCy parser actor does not load torch (thinc imports it only for PyTorch-wrapped layers, which the
    sm pipeline never uses; that import was most of an actor's start), and its parses - every token's text,
    lemma, tags, head and relation - equal those of a parser in a process that loaded torch first."""
    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()[:60]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = {}
    for mode in ("actor", "beside-torch"):
        res = subprocess.run(
            [sys.executable, "-c", PARSE_IN_FRESH_PROCESS, mode, str(tmp_path / "in.txt")],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        out[mode] = json.loads(res.stdout.splitlines()[-1])
    assert (out["actor"]["torch"], out["actor"]["has_torch"]) == (False, False)
    assert (out["beside-torch"]["torch"], out["beside-torch"]["has_torch"]) == (True, True)
    assert len(out["actor"]["parses"]) == 60 and out["actor"]["parses"] == out["beside-torch"]["parses"]


def test_only_a_pipeline_that_cannot_use_torch_is_loaded_without_it(tmp_path):
    """spaCy is imported without torch only for a pipeline whose config names no transformer or PyTorch
    layer: a transformer pipeline (spacy-transformers) needs thinc's torch support, and a pipeline whose
    config cannot be found is not assumed to do without it."""
    from orchestrator.data.parsing import SPACY_MODEL, spacy_model_may_use_torch

    assert not spacy_model_may_use_torch(SPACY_MODEL)
    trf = tmp_path / "trf"
    (trf / "en_pipeline-1.0").mkdir(parents=True)
    (trf / "en_pipeline-1.0" / "config.cfg").write_text(
        '[components.transformer.model]\n@architectures = "spacy-transformers.TransformerModel.v3"\n'
    )
    numpy_only = tmp_path / "cnn"
    numpy_only.mkdir()
    (numpy_only / "config.cfg").write_text(
        '[components.parser.model]\n@architectures = "spacy.TransitionBasedParser.v2"\n'
    )
    assert spacy_model_may_use_torch(str(trf)) and not spacy_model_may_use_torch(str(numpy_only))
    assert spacy_model_may_use_torch("en_core_web_trf") and spacy_model_may_use_torch(
        str(tmp_path / "missing")
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_s3_input_and_output(ray_cluster, s3_bucket, tmp_path):
    storage.write_bytes(f"{s3_bucket}/corpus/part-0.txt", "\n".join(GOOD[:6]).encode())
    storage.write_bytes(f"{s3_bucket}/corpus/part-1.txt", "\n".join(GOOD[6:]).encode())
    cfg = CorpusConfig(input=f"{s3_bucket}/corpus", parser={"workers": 1, "cpus_per_worker": 1})
    manifest = run_pipeline(cfg, f"{s3_bucket}/augmented", progress=False)
    assert manifest["read"] == 10 and manifest["written"] == 10 and manifest["input_files"] == 2
    files = storage.list_files(f"{s3_bucket}/augmented")
    assert "manifest.json" in files and any(f.startswith("shards/") and f.endswith(".parquet") for f in files)


def test_missing_and_empty_inputs(tmp_path):
    from orchestrator.data.cleaning import input_files

    with pytest.raises(DataError, match="no such input file or directory"):
        input_files(str(tmp_path / "nope.txt"))
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError, match="input directory is empty"):
        input_files(str(tmp_path / "d"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_empty_corpus_is_one_clear_error(ray_cluster, tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("\n\n  \n")
    with pytest.raises(DataError, match=r"empty\.txt: no usable sentences \(read 3"):
        run_pipeline(CorpusConfig(input=str(p)), str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_cli_missing_input_is_one_line(tmp_path, job_server):
    res = job_server.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "augment_corpus.py"),
            "--input",
            str(tmp_path / "missing.txt"),
            "--output",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: {tmp_path / 'missing.txt'}: no such input file or directory"


def test_cli_bad_override_is_one_line(tmp_path, job_server):
    res = job_server.run(
        [
            sys.executable,
            str(ROOT / "jobs" / "augment_corpus.py"),
            "--output",
            str(tmp_path),
            "parser.kind=udpipe",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("error: <defaults> (+ overrides): parser.kind: String should match pattern")


def test_parse_failures_are_counted_and_past_the_limit_stop_the_build():
    """A sentence the parser cannot take is a counted failure with its error; past
    max_parse_failures the build stops with one line naming the input and the first failure. (The
    failing parser wraps the real spaCy parser and raises on one marked sentence: a parser crash cannot
    be provoked on demand otherwise.)"""
    from orchestrator.data.corpus import augment_rows, parse_failure_message, too_many_failures
    from orchestrator.data.parsing import SpacyParser

    class Flaky(SpacyParser):
        def parse_batch(self, texts):
            if any("BOOM" in t for t in texts):
                raise RuntimeError("cannot parse this")
            return super().parse_batch(texts)

    texts = ["the cat sat on the mat .", "BOOM goes the parser here .", "dogs run in the park ."]
    out = augment_rows(texts, ["a", "b", "c"], Flaky(), CorpusConfig())
    assert list(out["skip"]) == ["", "parse_error", ""]
    assert out["error"][1] == "RuntimeError: cannot parse this" and out["backbone_view"][0].startswith(
        texts[0]
    )
    assert (
        not too_many_failures(5, 100, 0.05)
        and too_many_failures(6, 100, 0.05)
        and not too_many_failures(0, 0, 0.05)
    )
    msg = parse_failure_message("in.txt", 6, 100, 0.05, {"text": texts[1], "error": out["error"][1]})
    assert msg == (
        "in.txt: 6 of 100 sentences failed to parse (over max_parse_failures 5%); "
        "first: 'BOOM goes the parser here .': RuntimeError: cannot parse this"
    )


@pytest.mark.parametrize("where", ["local", "s3"])
def test_builds_are_committed_by_a_pointer_switched_last(where, tmp_path, request):
    """A build goes to a fresh attempt folder and CURRENT switches to it last: a crash mid-build
    leaves readers on the previous build; two builders of one address never delete each other's files
    and the first one committed wins; a folder written directly (a manifest at its root) still reads."""
    root = str(tmp_path / "c") if where == "local" else f"{request.getfixturevalue('s3_bucket')}/c"

    def build(tag, crash=False):
        def write(folder):
            storage.write_bytes(storage.join(folder, "shards", "part-0.parquet"), tag.encode())
            if crash:
                raise RuntimeError("killed mid-build")
            storage.write_bytes(storage.join(folder, "manifest.json"), json.dumps({"tag": tag}).encode())

        return write

    assert storage.resolve_build(root) is None
    first = storage.build_committed(root, build("one"))
    assert storage.resolve_build(root) == first
    with pytest.raises(RuntimeError):
        storage.build_committed(root, build("two", crash=True), reuse=False)
    assert storage.resolve_build(root) == first  # readers still see the whole first build
    assert storage.build_committed(root, build("three")) == first  # reuse: the committed build stands
    later = storage.build_committed(root, build("four"), reuse=False)  # an explicit rebuild
    assert storage.resolve_build(root) == later != first
    assert storage.read_bytes(storage.join(first, "shards", "part-0.parquet")) == b"one"  # untouched

    def racing(folder):  # another builder commits while this one writes: the first committed wins
        storage.build_committed(root + "-race", build("winner"))
        build("loser")(folder)

    winner = storage.build_committed(root + "-race", racing)
    assert json.loads(storage.read_bytes(storage.join(winner, "manifest.json")))["tag"] == "winner"
    direct = str(tmp_path / "direct") if where == "local" else f"{root}-direct"
    storage.write_bytes(storage.join(direct, "manifest.json"), b"{}")
    assert storage.resolve_build(direct) == direct


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_streamed_pipeline_equals_a_plain_loop_row_for_row_and_counts_from_its_writers(
    ray_cluster, tmp_path, monkeypatch
):
    """One streaming execution - the driver materializes, counts and collects nothing (those calls
    fail here) - writes what a plain single-process loop over the same rules computes, row for row and in
    order, and its manifest counts are the loop's: input over 3 files (so the sorted stream reaches the
    dedup actor in several blocks), duplicates across files, a limit, shards smaller than a write."""
    import ray.data

    from orchestrator.data.corpus import augment_rows, shuffle_key
    from orchestrator.data.parsing import SpacyParser

    lines = (ROOT / "data" / "corpus" / "wikisplit_sample.txt").read_text().splitlines()[:240]
    parts = [lines[:100] + lines[:7], lines[100:180] + ["", "Hi there"], lines[180:] + lines[50:60]]
    (tmp_path / "in").mkdir()
    for i, part in enumerate(parts):
        (tmp_path / "in" / f"part-{i}.txt").write_text("\n".join(part) + "\n")
    cfg = CorpusConfig(
        input=str(tmp_path / "in"),
        limit=200,
        shard_rows=60,
        seed=3,
        parser={"workers": 2, "cpus_per_worker": 0.5, "batch_size": 32},
    )

    def refused(name, real):
        def call(*a, **k):  # from our code; Ray's write_datasink materializes its own per-task write reports
            if "/orchestrator/" in sys._getframe(1).f_code.co_filename:
                raise AssertionError(f"the driver called Dataset.{name}")
            return real(*a, **k)

        return call

    for name in ("materialize", "count", "take", "take_all", "groupby", "sum", "min", "max", "iter_rows"):
        monkeypatch.setattr(ray.data.Dataset, name, refused(name, getattr(ray.data.Dataset, name)))
    manifest = run_pipeline(cfg, str(tmp_path / "out"), progress=False)
    monkeypatch.undo()

    rows = [r for part in parts for r in clean_records([(t, None) for t in part], cfg)]
    unique = sorted({r["text"] for r in rows if not r["skip"]}, key=lambda t: shuffle_key(t, cfg.seed))
    kept = unique[: cfg.limit]
    ref = augment_rows(kept, [shuffle_key(t, cfg.seed) for t in kept], SpacyParser(), cfg)
    good = [i for i, s in enumerate(ref["skip"]) if not s]
    got = read_shards(tmp_path / "out")
    assert [r["text"] for r in got] == [ref["text"][i] for i in good]
    for c in ("words", "backbone_view", "deletion_view", "linearized_parse", "constituent_bag"):
        assert [r[c] for r in got] == [list(ref[c][i]) if c == "words" else ref[c][i] for i in good], c
    n_kept = sum(1 for r in rows if not r["skip"])
    assert manifest["read"] == len(rows) == 259
    assert manifest["written"] == len(good)
    skipped = Counter(r["skip"] for r in rows if r["skip"]) + Counter(s for s in ref["skip"] if s)
    skipped.update(duplicate=n_kept - len(unique), over_limit=len(unique) - cfg.limit)
    assert manifest["skipped"] == dict(skipped) and skipped["duplicate"] >= 10 and skipped["empty"] == 1
    files = sorted(p.name for p in (tmp_path / "out" / "shards").iterdir())
    assert len(files) >= 4 and all(
        pq.read_metadata(tmp_path / "out" / "shards" / f).num_rows <= 60 for f in files
    )
