"""ParaBART: alternating optimisers on disjoint parameters, λ_adv = 0 keeps the adversary's gradient
out of the encoder, word dropout on source tokens only, golden loss on a tiny config, generation
from a saved model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainers.parabart import (
    Batch,
    ParaBARTConfig,
    Vocab,
    adv_loss,
    build_model,
    generate,
    main_loss,
    parameter_groups,
    parse_tokens,
    word_dropout,
)

ROWS = {
    "src": ["the cat sat on the mat .", "a man is playing a guitar ."],
    "tgt": ["on the mat sat the cat .", "a guitar is being played by a man ."],
    "tgt_parse": ["(S (PP (IN) (NP)) (VP (VBD)) (NP (DT) (NN)) (.))", "(S (NP (DT) (NN)) (VP (VBZ) (VP)) (.))"],
    "src_bag": [json.dumps({"S": 0.2, "NP": 0.4, "VP": 0.2, "DT": 0.2}), json.dumps({"S": 0.25, "NP": 0.5, "VP": 0.25})],
}


def tiny(model_dir, **kw) -> ParaBARTConfig:
    return ParaBARTConfig.model_validate({"model": {"name_or_path": str(model_dir), "max_length": 24},
                                          "syntax_heads": 2, "syntax_layers": 1, **kw})


def setup(model_dir, **kw):
    cfg = tiny(model_dir, **kw)
    syntax = Vocab.build(parse_tokens(p) for p in ROWS["tgt_parse"])
    tags = Vocab.build(json.loads(b).keys() for b in ROWS["src_bag"])
    torch.manual_seed(0)
    model, tok = build_model(cfg, syntax, tags)
    return cfg, model, Batch(tok, syntax, tags, cfg)


def test_parse_vocab():
    assert parse_tokens("(S (NP (DT)) (.))") == ["(", "S", "(", "NP", "(", "DT", ")", ")", "(", ".", ")", ")"]
    v = Vocab.build([["(", "S", ")"], ["(", "NP", ")"]])
    assert v.items[:2] == ["<pad>", "<unk>"] and v.ids(["S", "XYZ"]) == [v.index["S"], 1]


def test_word_dropout_touches_only_source_tokens(tiny_bert_dir):
    cfg, model, batcher = setup(tiny_bert_dir, word_dropout=0.5)
    g = torch.Generator().manual_seed(0)
    train = batcher(ROWS, train=True, generator=g)
    clean = batcher(ROWS, train=False)
    mask_id = batcher.tok.mask_token_id
    dropped = train["src_ids"] != clean["src_ids"]
    assert dropped.any() and (train["src_ids"][dropped] == mask_id).all()
    special = torch.isin(clean["src_ids"], torch.tensor(sorted(batcher.keep)))
    assert not (dropped & special).any()  # [CLS], [SEP], padding never dropped
    for k in ("tgt_ids", "parse_ids", "bags"):
        assert torch.equal(train[k], clean[k])  # target, parse and bag untouched
    ids = torch.arange(1000, 1400).reshape(4, 100)
    rate = (word_dropout(ids, torch.ones_like(ids), 0.2, 103, set(), torch.Generator().manual_seed(1)) == 103)
    assert 0.15 < rate.float().mean() < 0.25


def test_optimisers_update_disjoint_parameter_sets_in_alternation(tiny_bert_dir):
    cfg, model, batcher = setup(tiny_bert_dir)
    groups, dis = parameter_groups(model, cfg)
    main = [p for g in groups for p in g["params"]]
    assert {id(p) for p in main}.isdisjoint({id(p) for p in dis})
    assert len({id(p) for p in main}) + len(dis) == len(list(model.parameters()))  # every parameter, once
    assert groups[0]["lr"] == cfg.lr_pretrained and groups[1]["lr"] == cfg.lr_new
    new_names = {n for n, p in model.named_parameters() if any(p is q for q in groups[1]["params"])}
    assert any(n.startswith("syn") for n in new_names) and any("crossattention" in n for n in new_names)
    assert not any(n.startswith("sem.") for n in new_names)
    opt_main = torch.optim.AdamW(groups, lr=cfg.lr_pretrained)
    opt_dis = torch.optim.AdamW(dis, lr=1e-2)
    b = batcher(ROWS, train=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # (1) the discriminator step changes D and nothing else
    loss, logs = main_loss(model, b, cfg, adversary_on=True, opt_dis=opt_dis)
    after_d = {n: p.detach().clone() for n, p in model.named_parameters()}
    changed = {n for n in before if not torch.equal(before[n], after_d[n])}
    assert changed == {"discriminator.weight", "discriminator.bias"}
    # (2) the main step changes the encoders/decoder and not D
    opt_main.zero_grad()
    loss.backward()
    opt_main.step()
    after_m = {n: p.detach() for n, p in model.named_parameters()}
    changed = {n for n in before if not torch.equal(after_d[n], after_m[n])}
    assert "discriminator.weight" not in changed and any(n.startswith("sem.") for n in changed)
    assert any(n.startswith("syn") for n in changed)


def test_lambda_zero_keeps_the_adversary_out_of_the_encoder(tiny_bert_dir):
    """With λ_adv = 0 the encoder's gradient is exactly L_para's; with λ_adv > 0 it is not."""
    def encoder_grads(lam):
        cfg, model, batcher = setup(tiny_bert_dir, lambda_adv=lam)
        model.eval()
        _, dis = parameter_groups(model, cfg)
        loss, _ = main_loss(model, batcher(ROWS, train=False), cfg, adversary_on=True,
                            opt_dis=torch.optim.SGD(dis, lr=0.1))
        loss.backward()
        return {n: p.grad.clone() for n, p in model.sem.named_parameters() if p.grad is not None}

    def para_only():
        cfg, model, batcher = setup(tiny_bert_dir)
        model.eval()
        loss, _ = main_loss(model, batcher(ROWS, train=False), cfg, adversary_on=False)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.sem.named_parameters() if p.grad is not None}

    zero, plain, adv = encoder_grads(0.0), para_only(), encoder_grads(1.0)
    assert zero.keys() == plain.keys() and all(torch.equal(zero[k], plain[k]) for k in zero)
    assert any(not torch.allclose(adv[k], plain[k]) for k in adv)
    # and the discriminator's own step never writes an encoder gradient
    cfg, model, batcher = setup(tiny_bert_dir)
    u = model.embed(*[batcher(ROWS, train=False)[k] for k in ("src_ids", "src_mask")])
    adv_loss(model.discriminator(u.detach()), batcher(ROWS, train=False)["bags"]).backward()
    assert all(p.grad is None for p in model.sem.parameters())


# Three steps on the tiny config (eval mode: no dropout, no word dropout): [L_para, L_adv] per step.
GOLDEN = [[10.338041, 1.805365], [10.33244, 1.794737], [10.326851, 1.784308]]


def test_golden_losses(tiny_bert_dir):
    cfg, model, batcher = setup(tiny_bert_dir)
    model.eval()
    groups, dis = parameter_groups(model, cfg)
    opt_main, opt_dis = torch.optim.AdamW(groups), torch.optim.AdamW(dis, lr=1e-3)
    b = batcher(ROWS, train=False)
    got = []
    for _ in range(3):
        loss, logs = main_loss(model, b, cfg, adversary_on=True, opt_dis=opt_dis)
        opt_main.zero_grad()
        loss.backward()
        opt_main.step()
        got.append([logs["loss_para"], logs["loss_adv"]])
    assert got == [pytest.approx(g, rel=1e-4) for g in GOLDEN]


def test_generation_from_a_saved_model(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from trainers.parabart import export_model, load_parabart

    cfg, model, batcher = setup(tiny_bert_dir)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": model.state_dict()}, ckpt / "model.pt")
    out = export_model(cfg, ckpt, tmp_path / "model")
    loaded, b2 = load_parabart(out)
    assert loaded.syntax_vocab.items == model.syntax_vocab.items
    model.eval()
    texts = generate(loaded, b2, ROWS["src"], ROWS["tgt_parse"], max_new_tokens=6)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    assert texts == generate(model, batcher, ROWS["src"], ROWS["tgt_parse"], max_new_tokens=6)  # same weights
    st = SentenceTransformer(str(out), device="cpu")
    ours = model.embed(*[batcher(ROWS, train=False)[k] for k in ("src_ids", "src_mask")])
    assert torch.allclose(torch.tensor(st.encode(ROWS["src"])), ours.detach(), atol=1e-5)  # ū = ST mean pooling


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parabart_under_ray_train(ray_cluster, tiny_bert_dir, tmp_path):
    """Pairs → the spaCy pipeline's parses → shards + vocabularies; 2 workers (gradients averaged
    by hand for both optimisers), adversary switched on mid-run, export, STS test, generation."""
    from orchestrator.methods import get_method
    from orchestrator.train import build_trainer, export_and_test, fit, prepare_data
    from trainers.parabart import load_parabart

    lines = tmp_path / "pairs.tsv"
    src = Path(__file__).resolve().parents[1] / "data" / "paraphrase" / "mrpc-train.tsv"
    lines.write_text("\n".join(src.read_text().splitlines()[:81]) + "\n")
    method = get_method("parabart")
    cfg = tiny(tiny_bert_dir, adversary_start_step=2, **{
        "train": {"batch_size": 8, "max_steps": 4, "eval_steps": 2, "grad_clip": 1.0, "lr_schedule": "constant"},
        "scaling": {"num_workers": 2, "cpus_per_worker": 1},
        "data": {"pairs": [{"path": str(lines)}], "parser_workers": 1},
        "eval": {"batch_size": 256, "max_length": 32}, "run": {"storage": str(tmp_path / "store")}})
    shards = prepare_data(method, cfg)
    manifest = json.loads((Path(shards) / "manifest.json").read_text())
    assert manifest["rows"] > 64 and manifest["syntax_vocab"] > 10 and manifest["tags"] > 5
    outcome = fit(build_trainer(method, cfg, shards, name="parabart"), method)
    steps = [int(r["step"]) for r in outcome.history]
    assert steps == [2, 4] and "loss_adv" in outcome.history[-1] and "loss_adv" not in outcome.history[0]
    out, report = export_and_test(method, cfg, outcome, tmp_path / "model", tasks=["stsb"])
    assert report.headline == "sts_avg_pearson_all"
    model, batcher = load_parabart(out)
    assert len(generate(model, batcher, ["the cat sat ."], ["(S (NP) (VP) (.))"], max_new_tokens=4)) == 1


def test_threshold_accuracy_and_the_shipped_easy_hard_split():
    import csv

    import numpy as np

    from orchestrator.evaluation.syntax import PTB_PROBES, QQP_EASY_HARD, best_threshold_accuracy

    sims = np.array([0.9, 0.8, 0.35, 0.3, -0.2])
    labels = np.array([1, 1, 1, 0, 0])
    assert best_threshold_accuracy(sims, labels) == (1.0, 0.31)  # the first threshold above 0.30
    assert best_threshold_accuracy(np.array([0.5, 0.5]), np.array([1, 0]))[0] == 0.5
    rows = list(csv.DictReader(open(QQP_EASY_HARD, encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))
    by = {s: [r for r in rows if r["subset"] == s] for s in ("easy", "hard", "negative")}
    assert len(by["easy"]) == len(by["hard"]) == len(by["negative"]) > 2000
    assert all(r["top1"] == r["top2"] and r["label"] == "1" for r in by["easy"])
    assert all(r["top1"] != r["top2"] and r["label"] == "1" for r in by["hard"])
    assert all(r["label"] == "0" for r in by["negative"])
    probes = list(csv.DictReader(open(PTB_PROBES, encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(probes) == 3914 and {int(r["tree_depth"]) for r in probes} <= set(range(5, 13))
    assert len({r["top_const"] for r in probes}) == 20  # 19 sequences + OTHER


def test_a_non_bert_model_is_refused_with_one_clear_line(tmp_path):
    from orchestrator.errors import ConfigError

    bart = tmp_path / "bart"
    bart.mkdir()
    (bart / "config.json").write_text('{"model_type": "bart", "architectures": ["BartModel"], "d_model": 16}')
    with pytest.raises(ConfigError, match="needs a BERT-family encoder folder .*model_type 'bart'.*not supported yet"):
        build_model(tiny(bart), Vocab([]), Vocab([]))
