"""ParaBART: alternating optimisers on disjoint parameters, λ_adv = 0 keeps the adversary's gradient
out of the encoder, word dropout on source tokens only, the losses against torch's cross-entropy, generation
from a saved model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from orchestrator.data.paraphrase import parse_tokens
from trainers.parabart import (
    Batch,
    ParaBARTConfig,
    Vocab,
    adv_loss,
    average_bag_loss,
    bag_targets,
    build_model,
    discriminator,
    discriminator_optimizer,
    main_loss,
    parameter_groups,
)
from trainers.parabart_batch import word_dropout
from trainers.parabart_recipe import generate

ROWS = {
    "src": ["the cat sat on the mat .", "a man is playing a guitar ."],
    "tgt": ["on the mat sat the cat .", "a guitar is being played by a man ."],
    "tgt_parse": [
        "(S (PP (IN) (NP)) (VP (VBD)) (NP (DT) (NN)) (.))",
        "(S (NP (DT) (NN)) (VP (VBZ) (VP)) (.))",
    ],
    # the bags as the pipeline writes them (orchestrator.data.constituency.constituent_bag): counts, ROOT and brackets
    "src_bag": [
        json.dumps({"(": 6, ")": 6, "ROOT": 1, "S": 1, "NP": 2, "VP": 1, "DT": 1}),
        json.dumps({"(": 5, ")": 5, "ROOT": 1, "S": 1, "NP": 2, "VP": 1}),
    ],
}


def tiny(model_dir, **kw) -> ParaBARTConfig:
    return ParaBARTConfig.model_validate(
        {
            "model": {"name_or_path": str(model_dir), "max_length": 24},
            "syntax_heads": 2,
            "syntax_layers": 1,
            **kw,
        }
    )


def setup(model_dir, **kw):
    """(cfg, ParaBART, D, batcher) on a tiny model folder, seeded."""
    cfg = tiny(model_dir, **kw)
    syntax = Vocab.build(parse_tokens(p) for p in ROWS["tgt_parse"])
    tags = Vocab.build(json.loads(b).keys() for b in ROWS["src_bag"])
    torch.manual_seed(0)
    model, tok = build_model(cfg, syntax, tags)
    return cfg, model, discriminator(model), Batch(tok, syntax, tags, cfg)


def test_parse_vocab():
    assert parse_tokens("(S (NP (DT)) (.))") == ["(", "S", "(", "NP", "(", "DT", ")", ")", "(", ".", ")", ")"]
    v = Vocab.build([["(", "S", ")"], ["(", "NP", ")"]])
    assert v.items[:2] == ["<pad>", "<unk>"] and v.ids(["S", "XYZ"]) == [v.index["S"], 1]


def test_word_dropout_touches_only_source_tokens(tiny_bert_dir):
    cfg, model, dis, batcher = setup(tiny_bert_dir, word_dropout=0.5)
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
    rate = word_dropout(ids, torch.ones_like(ids), 0.2, 103, set(), torch.Generator().manual_seed(1)) == 103
    assert 0.15 < rate.float().mean() < 0.25


def lr_of(groups: list[dict], model) -> dict[str, float]:
    return {
        n: next(g["lr"] for g in groups if any(p is q for q in g["params"]))
        for n, p in model.named_parameters()
    }


def test_parameter_groups_get_the_papers_learning_rates(tiny_bert_dir):
    """E_sem (and D) at 2e-5, E_syn, the decoder and its output projection at 1e-4; weight decay off
    for biases and norms."""
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    assert cfg.train.lr == 2e-5 and cfg.lr_syntax_decoder == 1e-4 and cfg.train.weight_decay == 0.01
    lrs = lr_of(parameter_groups(model, cfg), model)
    assert all(lr == 2e-5 for n, lr in lrs.items() if n.startswith("sem."))
    assert all(lr == 1e-4 for n, lr in lrs.items() if not n.startswith("sem."))
    assert any(n.startswith("syn") for n in lrs) and any("crossattention" in n for n in lrs)
    assert lrs["decoder.cls.predictions.decoder.weight"] == 1e-4  # the output projection: its own, fast
    decay = {
        n: g["weight_decay"]
        for g in parameter_groups(model, cfg)
        for n, p in model.named_parameters()
        if any(p is q for q in g["params"])
    }
    assert decay["sem.encoder.layer.0.attention.self.query.weight"] == 0.01
    assert decay["sem.encoder.layer.0.attention.self.query.bias"] == 0.0
    assert decay["sem.embeddings.LayerNorm.weight"] == 0.0
    opt = discriminator_optimizer(dis, cfg)
    assert opt.param_groups[0]["lr"] == 2e-5  # D at E_sem's rate, as the reference code


def test_the_output_layer_is_not_the_encoders_embedding_matrix(tiny_bert_dir):
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    emb = model.sem.get_input_embeddings().weight
    assert model.decoder.get_input_embeddings().weight is emb  # the decoder reads E_sem's embeddings
    out = model.decoder.get_output_embeddings().weight
    assert (
        out is not emb and out.data_ptr() != emb.data_ptr() and torch.equal(out, emb)
    )  # own copy, same start
    loss, _ = main_loss(model, dis, batcher(ROWS, train=False), cfg, adversary_on=False)
    loss.backward()
    assert out.grad is not None and out.grad.abs().sum() > 0
    _, tied, _, _ = setup(tiny_bert_dir, tie_output=True)
    assert tied.decoder.get_output_embeddings().weight is tied.sem.get_input_embeddings().weight


def test_without_syntax_guidance_the_decoder_sees_only_the_sentence_vector(tiny_bert_dir):
    """The "w/o SG" ablation: no E_syn parameters at all (DDP would refuse unused ones), and the
    decoder's logits do not depend on the target parse."""
    cfg, model, dis, batcher = setup(tiny_bert_dir, syntax_guidance=False)
    assert not any(n.startswith("syn") for n, _ in model.named_parameters())
    model.eval()
    b = batcher(ROWS, train=False)
    other = batcher({**ROWS, "tgt_parse": ["(S (NP (NN)) (.))"] * 2}, train=False)
    logits, _ = model(
        b["src_ids"], b["src_mask"], b["parse_ids"], b["parse_mask"], b["tgt_ids"], b["tgt_mask"]
    )
    logits2, _ = model(
        other["src_ids"],
        other["src_mask"],
        other["parse_ids"],
        other["parse_mask"],
        b["tgt_ids"],
        b["tgt_mask"],
    )
    assert torch.allclose(logits, logits2)
    cfg, guided, dis, batcher = setup(tiny_bert_dir)
    guided.eval()
    with_v, _ = guided(
        b["src_ids"], b["src_mask"], b["parse_ids"], b["parse_mask"], b["tgt_ids"], b["tgt_mask"]
    )
    with_other, _ = guided(
        other["src_ids"],
        other["src_mask"],
        other["parse_ids"],
        other["parse_mask"],
        b["tgt_ids"],
        b["tgt_mask"],
    )
    assert not torch.allclose(with_v, with_other)  # with guidance the parse matters (the test can fail)


def test_the_syntax_input_keeps_the_whole_tree_of_a_long_sentence(tiny_bert_dir):
    """A 30-word sentence's parse, as the pipeline linearizes it by default, reaches E_syn whole."""
    from orchestrator.data import constituency as C
    from orchestrator.data.corpus import AugmentConfig
    from orchestrator.data.parsing import SpacyParser

    text = (
        "The committee , which had met every Tuesday since the war ended , finally approved the long and "
        "expensive plan that the mayor of the old northern city proposed last spring ."
    )
    assert len(text.split()) >= 30
    parse = SpacyParser().parse_batch([text])[0]
    tree = C.constituency(parse)
    linear = C.linearize(tree, AugmentConfig().parse_max_depth)
    assert AugmentConfig().parse_max_depth is None and linear == C.linearize(tree, 100)  # nothing cut
    assert len(re.findall(r"\((\S+)\)", linear)) == len(parse.tokens) > 30  # every word's tag is there
    assert linear != C.linearize(tree, 4)  # the old depth-4 cut would have lost part of it
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    syntax = Vocab.build([parse_tokens(linear)])
    b = Batch(batcher.tok, syntax, batcher.tags, cfg)({**ROWS, "tgt_parse": [linear, linear]}, train=False)
    assert len(parse_tokens(linear)) <= cfg.parse_max_length == 160
    assert b["parse_ids"].shape[1] == len(parse_tokens(linear))  # E_syn reads every token of it


def test_optimisers_update_disjoint_parameter_sets_in_alternation(tiny_bert_dir):
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    groups = parameter_groups(model, cfg)
    main = [p for g in groups for p in g["params"]]
    assert {id(p) for p in main}.isdisjoint({id(p) for p in dis.parameters()})
    assert len({id(p) for p in main}) == len(main) == len(list(model.parameters()))  # every parameter, once
    opt_main = torch.optim.AdamW(groups, lr=cfg.train.lr)
    opt_dis = torch.optim.AdamW(dis.parameters(), lr=1e-2)
    b = batcher(ROWS, train=False)

    def snapshot():
        return {
            n: p.detach().clone()
            for m, pre in ((model, ""), (dis, "dis."))
            for n, p in ((pre + n, p) for n, p in m.named_parameters())
        }

    before = snapshot()
    # (1) the discriminator step changes D and nothing else
    loss, logs = main_loss(model, dis, b, cfg, adversary_on=True, opt_dis=opt_dis)
    after_d = snapshot()
    changed = {n for n in before if not torch.equal(before[n], after_d[n])}
    assert changed == {"dis.linear.weight", "dis.linear.bias"}
    # (2) the main step changes the encoders/decoder and not D
    opt_main.zero_grad()
    loss.backward()
    opt_main.step()
    after_m = snapshot()
    changed = {n for n in before if not torch.equal(after_d[n], after_m[n])}
    assert not any(n.startswith("dis.") for n in changed) and any(n.startswith("sem.") for n in changed)
    assert any(n.startswith("syn") for n in changed)


def test_lambda_zero_keeps_the_adversary_out_of_the_encoder(tiny_bert_dir):
    """With λ_adv = 0 the encoder's gradient is exactly L_para's; with λ_adv > 0 it is not."""

    def encoder_grads(lam):
        cfg, model, dis, batcher = setup(tiny_bert_dir, lambda_adv=lam)
        model.eval()
        loss, _ = main_loss(
            model,
            dis,
            batcher(ROWS, train=False),
            cfg,
            adversary_on=True,
            opt_dis=torch.optim.SGD(dis.parameters(), lr=0.1),
        )
        loss.backward()
        return {n: p.grad.clone() for n, p in model.sem.named_parameters() if p.grad is not None}

    def para_only():
        cfg, model, dis, batcher = setup(tiny_bert_dir)
        model.eval()
        loss, _ = main_loss(model, dis, batcher(ROWS, train=False), cfg, adversary_on=False)
        loss.backward()
        return {n: p.grad.clone() for n, p in model.sem.named_parameters() if p.grad is not None}

    zero, plain, adv = encoder_grads(0.0), para_only(), encoder_grads(1.0)
    assert zero.keys() == plain.keys() and all(torch.equal(zero[k], plain[k]) for k in zero)
    assert any(not torch.allclose(adv[k], plain[k]) for k in adv)
    # and the discriminator's own step never writes an encoder gradient
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    u = model.embed(*[batcher(ROWS, train=False)[k] for k in ("src_ids", "src_mask")])
    adv_loss(dis(u.detach()), batcher(ROWS, train=False)["bags"], dis.form).backward()
    assert all(p.grad is None for p in model.sem.parameters())


def full_projection_loss(model, b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(ū, L_para) derived apart from ``para_loss``: every target position's next-token logits (the decoder's full
    projection, nothing gathered), shifted by hand, padding set to ``ignore_index``, torch's ``cross_entropy``."""
    import torch.nn.functional as F

    tgt, mask = b["tgt_ids"], b["tgt_mask"]
    with torch.no_grad():
        u = model.embed(b["src_ids"], b["src_mask"])
        full = model.decode(
            u, model.syntax(b["parse_ids"], b["parse_mask"]), b["parse_mask"], tgt[:, :-1], mask[:, :-1]
        )
    labels = tgt[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
    return u, F.cross_entropy(full.reshape(-1, full.size(-1)), labels.reshape(-1), ignore_index=-100)


def test_the_losses_are_teacher_forced_cross_entropy_and_minus_lambda_times_d_s_loss(tiny_bert_dir):
    """L_para, derived apart from ``para_loss``: every target position's next-token logits (the decoder's full
    projection, nothing gathered), shifted by hand, padding set to ``ignore_index`` and torch's
    ``cross_entropy`` averaging over the real tokens. With the adversary on, the encoders' loss is
    L_para − λ_adv·L_adv (the paper's reverse objective), L_adv D's loss on the same ū (its formula: the
    hand-computed example below). Eval mode: no dropout, no word dropout."""

    cfg, model, dis, batcher = setup(tiny_bert_dir, lambda_adv=0.3)
    model.eval()
    b = batcher(ROWS, train=False)
    loss, logs = main_loss(model, dis, b, cfg, adversary_on=False)
    mask = b["tgt_mask"]
    u, expected = full_projection_loss(model, b)
    assert mask[:, 1:].sum() < mask[:, 1:].numel()  # the rows differ in length: padding is really ignored
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5) == logs["loss_para"]
    loss, logs = main_loss(model, dis, b, cfg, adversary_on=True)
    assert logs["loss_adv"] == pytest.approx(adv_loss(dis(u), b["bags"], dis.form).item(), rel=1e-5)
    assert loss.item() == pytest.approx(expected.item() - 0.3 * logs["loss_adv"], rel=1e-5)


# a pair's row (data.row: pair): the reverse direction's target parse and source bag beside the forward's
PAIR_ROWS = {
    **ROWS,
    "src_parse": ["(S (NP (DT) (NN)) (VP (VBD) (PP)) (.))", "(S (NP (DT) (NN)) (VP (VBZ) (VP)) (.))"],
    "tgt_bag": [
        json.dumps({"(": 7, ")": 7, "ROOT": 1, "S": 1, "PP": 1, "NP": 2, "VP": 1}),
        json.dumps({"(": 6, ")": 6, "ROOT": 1, "S": 1, "NP": 2, "VP": 2}),
    ],
}
BACK_ROWS = {
    "src": PAIR_ROWS["tgt"],
    "tgt": PAIR_ROWS["src"],
    "tgt_parse": PAIR_ROWS["src_parse"],
    "src_bag": PAIR_ROWS["tgt_bag"],
}


def test_a_pair_row_trains_both_directions_in_one_step_summed_as_the_reference_code(tiny_bert_dir):
    """``data.row: pair``: a batch of 2 pairs is 4 examples, every source → target, then every target → source;
    the step's loss is the reference code's two passes summed, (L_para(x→y) − λ·L_adv(x)) + (L_para(y→x) −
    λ·L_adv(y)), each pass's loss computed here apart, on its own batch of directions; D's update is its two
    backward passes' summed gradient (plain SGD at lr 1: the step is minus the gradient)."""
    import copy

    from orchestrator.data.paraphrase import directions
    from trainers.parabart import adversary_step, para_loss

    cfg, model, dis, batcher = setup(tiny_bert_dir, lambda_adv=0.3)
    model.eval()
    b = batcher(PAIR_ROWS, train=False)
    assert b["both_directions"] and len(b["src_ids"]) == 4
    assert directions(PAIR_ROWS) == {k: list(ROWS[k]) + list(BACK_ROWS[k]) for k in ROWS}
    loss, logs = main_loss(model, dis, b, cfg, adversary_on=True)
    passes = [
        main_loss(model, dis, batcher(rows, train=False), cfg, adversary_on=True)
        for rows in (ROWS, BACK_ROWS)
    ]
    assert loss.item() == pytest.approx(sum(p[0].item() for p in passes), rel=1e-5)
    assert logs["loss_para"] == pytest.approx(sum(p[1]["loss_para"] for p in passes), rel=1e-5)
    assert logs["loss_adv"] == pytest.approx(sum(p[1]["loss_adv"] for p in passes), rel=1e-5)
    assert (
        abs(passes[0][1]["loss_para"] - passes[1][1]["loss_para"]) > 1e-3
    )  # the halves differ: a mean would not do

    # L_para by hand: a pair whose x→y target has 1 token, y→x 3 (the sum of the halves' means, not twice the mean
    # over the 4 tokens: 5.0 + 1.0, where twice the mean would be 2 × (5 + 3 × 1) / 4 = 4.0)
    tgt_ids = torch.tensor([[9, 0, 0, 0], [9, 1, 1, 1]])
    tgt_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    nll = torch.tensor([5.0, 1.0, 1.0, 1.0])  # each token's −log p of its target (targets 0, 1, 1, 1)
    logits = torch.zeros(4, 2)
    logits[torch.arange(4), 1 - torch.tensor([0, 1, 1, 1])] = torch.log(torch.exp(nll) - 1)
    assert para_loss(logits, tgt_ids, tgt_mask, both_directions=True).item() == pytest.approx(6.0, rel=1e-6)
    assert para_loss(logits, tgt_ids, tgt_mask).item() == pytest.approx(2.0, rel=1e-6)

    with torch.no_grad():
        u = model.embed(b["src_ids"], b["src_mask"])
    ours, ref = copy.deepcopy(dis), copy.deepcopy(dis)
    adversary_step(ours, torch.optim.SGD(ours.parameters(), lr=1.0), u, b["bags"], directions=2)
    for half in (slice(0, 2), slice(2, 4)):  # the reference: one backward pass per direction, then one step
        adv_loss(ref(u[half]), b["bags"][half], ref.form).backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= p.grad
    for a, r in zip(ours.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a, r, atol=1e-6)


def test_a_pair_row_is_read_once_per_pair_and_needs_both_directions():
    """``read_pairs`` gives a pair once with ``row: pair`` (its directions made per batch), twice as directions;
    ``row: pair`` without both directions is refused by the config."""
    from pydantic import ValidationError

    from orchestrator.data.paraphrase import ParaphraseData, read_pairs

    src = [{"path": str(Path(__file__).resolve().parents[1] / "data" / "paraphrase" / "mrpc-train.tsv")}]
    pairs, rows = read_pairs(ParaphraseData(pairs=src, row="pair")), read_pairs(ParaphraseData(pairs=src))
    assert len(rows) == 2 * len(pairs) and {frozenset(p) for p in pairs} == {frozenset(p) for p in rows}
    assert len({frozenset(p) for p in pairs}) == len(pairs) > 100
    with pytest.raises(ValidationError, match="data.row 'pair' .* needs data.both_directions"):
        ParaphraseData(pairs=src, row="pair", both_directions=False)


def test_generation_projects_only_the_next_token_and_gets_the_full_projections_last_row(tiny_bert_dir):
    """``generate`` asks the decoder for the last position's logits only (``keep=1``): the same numbers as the
    last row of every position projected onto the vocabulary, at a 1/T of the projection's cost per token."""
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    model.eval()
    b = batcher(ROWS, train=False)
    with torch.no_grad():
        u, v = model.embed(b["src_ids"], b["src_mask"]), model.syntax(b["parse_ids"], b["parse_mask"])
        ids = b["tgt_ids"][:, :5]
        full = model.decode(u, v, b["parse_mask"], ids, torch.ones_like(ids))
        last = model.decode(u, v, b["parse_mask"], ids, torch.ones_like(ids), keep=1)
    assert full.shape[:2] == ids.shape and last.shape == (len(ids), 1, full.size(-1))
    torch.testing.assert_close(last[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_generation_from_a_saved_model(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from trainers.parabart_recipe import export_model, load_parabart

    cfg, model, dis, batcher = setup(tiny_bert_dir)
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
    assert torch.allclose(
        torch.tensor(st.encode(ROWS["src"])), ours.detach(), atol=1e-5
    )  # ū = ST mean pooling


@pytest.fixture(scope="module")
def parabart_store(tmp_path_factory):
    """One storage for the Ray runs below: the parsed shards are content-addressed, parsed once."""
    return tmp_path_factory.mktemp("parabart-store")


ENGINES = ("ddp", "zero2")


@pytest.fixture(scope="module")
def parabart_trained(ray_cluster, tiny_bert_dir, parabart_store):
    """Pairs → the spaCy pipeline's parses → shards + vocabularies; ParaBART on 2 workers under DDP and under
    DeepSpeed ZeRO-2, both trained at once (2 + 2 workers on the cluster's 4 CPUs; suite time - each run's
    numbers depend on its own seed and threads only), ZeRO-2's rows pairs trained both ways in a step (``data.row:
    pair``, the reference code's), DDP's directions: {engine: (config, outcome)}."""
    from concurrent.futures import ThreadPoolExecutor

    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import build_trainer, fit

    lines = parabart_store / "pairs.tsv"
    src = Path(__file__).resolve().parents[1] / "data" / "paraphrase" / "mrpc-train.tsv"
    lines.write_text("\n".join(src.read_text().splitlines()[:81]) + "\n")
    method = get_method("parabart")
    cfgs = {
        engine: tiny(
            tiny_bert_dir,
            adversary_start_step=2,
            **{
                "train": {
                    "batch_size": 8,
                    "max_steps": 4,
                    "epochs": 2,  # a pair's rows are half the directions': 2 steps an epoch on each worker
                    "eval_steps": 2,
                    "grad_clip": 1.0,
                    "lr_schedule": "constant",
                },
                "scaling": {"num_workers": 2, "cpus_per_worker": 1},
                "deepspeed": {"stage": 2 if engine == "zero2" else 0},
                "data": {
                    "pairs": [{"path": str(lines)}],
                    "parser_workers": 1,
                    "valid_pairs": 8,
                    "row": "pair" if engine == "zero2" else "direction",
                },
                "eval": {"batch_size": 256, "max_length": 32},
                "run": {"storage": str(parabart_store / "runs")},
            },
        )
        for engine in ENGINES
    }
    shards = {e: method.prepare_data(cfgs[e]) for e in ENGINES}
    manifest, pairs = (json.loads((Path(shards[e]) / "manifest.json").read_text()) for e in ENGINES)
    assert manifest["valid_rows"] == 16  # 8 pairs held out, both directions
    assert manifest["rows"] > 64 and manifest["syntax_vocab"] > 10 and manifest["tags"] > 5
    # a row per pair: half the rows, the same held-out pairs and the same vocabularies (both parses, both bags)
    assert (pairs["rows"] * 2, pairs["valid_rows"] * 2) == (manifest["rows"], manifest["valid_rows"])
    assert (pairs["syntax_vocab"], pairs["tags"]) == (manifest["syntax_vocab"], manifest["tags"])
    assert (Path(shards["zero2"]) / "vocab.json").read_text() == (
        Path(shards["ddp"]) / "vocab.json"
    ).read_text()
    trainers = {e: build_trainer(method, cfgs[e], shards[e], name=f"parabart-{e}") for e in ENGINES}
    with ThreadPoolExecutor(len(ENGINES)) as pool:
        outcomes = dict(
            zip(ENGINES, pool.map(lambda e: fit(trainers[e], method, cfgs[e]), ENGINES), strict=True)
        )
    return {e: (cfgs[e], outcomes[e]) for e in ENGINES}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", ENGINES)
def test_parabart_under_ray_train(engine, parabart_trained, tmp_path):
    """2 workers (the main model under DDP or DeepSpeed ZeRO-2, D's gradients averaged by hand), adversary
    switched on mid-run, D saved in the checkpoint, export, STS test, generation."""
    from orchestrator.drivers.registry import get_method
    from orchestrator.drivers.train import export_and_test
    from trainers.parabart_recipe import load_parabart

    method = get_method("parabart")
    cfg, outcome = parabart_trained[engine]
    steps = [int(r["step"]) for r in outcome.history]
    assert steps == [2, 4] and "loss_adv" in outcome.history[-1] and "loss_adv" not in outcome.history[0]
    with outcome.best_checkpoint.as_directory() as d:
        blob = (
            torch.load(Path(d) / "model.pt", weights_only=False)
            if engine == "ddp"
            else torch.load(next((Path(d) / "ds").glob("*model_states.pt")), weights_only=False)
        )
        if engine == "zero2":  # the vocabularies (module extra state) in our own weights-only file
            extra = torch.load(Path(d) / "extra_state.pt", weights_only=True)
            assert set(extra["_extra_state"]) == {"syntax", "tags"}
    assert set(blob["extra_modules"]["discriminator"]) == {
        "linear.weight",
        "linear.bias",
    }  # D travels with it
    assert blob["extra_optimizers"]["discriminator"]["state"]  # and so does its optimiser
    out, report = export_and_test(method, cfg, outcome, tmp_path / "model", tasks=["stsb"])
    assert report.headline == "sts_avg_pearson_all"
    model, batcher = load_parabart(out)
    assert len(generate(model, batcher, ["the cat sat ."], ["(S (NP) (VP) (.))"], max_new_tokens=4)) == 1


def test_the_discriminator_is_saved_and_restored_with_the_checkpoint(tiny_bert_dir, tmp_path):
    from trainers import common

    cfg, model, dis, batcher = setup(tiny_bert_dir)
    opt_dis = torch.optim.AdamW(dis.parameters(), lr=1e-2)
    stepper = common.Stepper(
        model,
        parameter_groups(model, cfg),
        lr=1e-4,
        schedule="constant",
        total_steps=10,
        grad_clip=1.0,
        extra_modules={"discriminator": dis},
        extra_optimizers={"discriminator": opt_dis},
    )
    loss, _ = main_loss(
        stepper.model, dis, batcher(ROWS, train=True), cfg, adversary_on=True, opt_dis=opt_dis
    )
    stepper.step(loss)
    stepper.save(tmp_path / "ckpt", {"step": 1})
    cfg, model2, dis2, _ = setup(tiny_bert_dir)
    torch.nn.init.zeros_(dis2.linear.weight)
    opt2 = torch.optim.AdamW(dis2.parameters(), lr=1e-2)
    stepper2 = common.Stepper(
        model2,
        parameter_groups(model2, cfg),
        lr=1e-4,
        schedule="constant",
        total_steps=10,
        grad_clip=1.0,
        extra_modules={"discriminator": dis2},
        extra_optimizers={"discriminator": opt2},
    )
    assert stepper2.load(tmp_path / "ckpt") == {"step": 1}
    assert torch.equal(dis2.linear.weight, dis.linear.weight) and torch.equal(
        dis2.linear.bias, dis.linear.bias
    )
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt_dis.state_dict()["state"][0]["exp_avg"])
    assert all(torch.equal(a, b) for a, b in zip(model2.parameters(), model.parameters(), strict=True))


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


def test_our_bshift_probe_swaps_adjacent_words_in_half_the_sentences(tmp_path):
    import csv

    from orchestrator.evaluation.syntax import BSHIFT, PTB_PROBES, build_bshift

    out = tmp_path / "b.tsv"
    assert build_bshift(PTB_PROBES, out) == build_bshift(PTB_PROBES, out)  # seeded
    assert out.read_bytes() == BSHIFT.read_bytes()  # the shipped file is this builder's output
    rows = list(csv.DictReader(open(out, encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE))
    original = {
        r["sentence"]
        for r in csv.DictReader(open(PTB_PROBES, encoding="utf-8"), delimiter="\t", quoting=csv.QUOTE_NONE)
    }
    inverted = [r["sentence"] for r in rows if r["bshift"] == "I"]
    assert 0.45 < len(inverted) / len(rows) < 0.55
    assert sum(s not in original for s in inverted) > 0.95 * len(inverted)  # a swap changed the sentence
    assert all(r["sentence"] in original for r in rows if r["bshift"] == "O")


def test_an_unsupported_model_is_refused_with_one_clear_line(tmp_path, tiny_bart_dir):
    from orchestrator.errors import ConfigError

    t5 = tmp_path / "t5"
    t5.mkdir()
    (t5 / "config.json").write_text('{"model_type": "t5", "architectures": ["T5Model"], "d_model": 16}')
    (t5 / "model.safetensors").write_bytes(b"")  # refused for its architecture before any weight is read
    with pytest.raises(ConfigError, match="ParaBART needs a BART or BERT model folder .*model_type 't5'"):
        build_model(tiny(t5), Vocab([]), Vocab([]))
    with pytest.raises(
        ConfigError, match="architecture 'bert2bert' needs a BERT-family model folder .*'bart'"
    ):
        build_model(tiny(tiny_bart_dir, architecture="bert2bert"), Vocab([]), Vocab([]))
    with pytest.raises(ConfigError, match="decoder_layers 3: .* has only 2 decoder layers"):
        build_model(tiny(tiny_bart_dir, decoder_layers=3), Vocab([]), Vocab([]))


# ---------------------------------------------------------------- BART backbones
@pytest.fixture(scope="module")
def tiny_bart_dir(tmp_path_factory):
    """A tiny random BART (2 encoder + 2 decoder layers) saved as a model folder - the shape of a
    ``facebook/bart-base`` copy (no BART weights exist here; MiniLM's tokenizer stands in for BART's)."""
    from transformers import BartConfig, BartForConditionalGeneration

    from orchestrator.models import load_tokenizer

    out = tmp_path_factory.mktemp("tiny") / "tiny-bart"
    tok = load_tokenizer("default")
    torch.manual_seed(0)
    conf = BartConfig(
        vocab_size=tok.vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        decoder_start_token_id=tok.cls_token_id,
        scale_embedding=True,
    )
    BartForConditionalGeneration(conf).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_a_bart_folder_gives_its_encoder_and_first_decoder_layers(tiny_bart_dir):
    from transformers import BartModel

    cfg, model, dis, batcher = setup(tiny_bart_dir, decoder_layers=1)
    bart = BartModel.from_pretrained(tiny_bart_dir)
    assert type(model.sem).__name__ == "BartEncoder" and type(model.decoder).__name__ == "BartForCausalLM"
    for n, p in bart.encoder.state_dict().items():
        assert torch.equal(model.sem.state_dict()[n], p), n  # E_sem = BART's encoder
    dec = model.decoder.model.decoder
    assert len(dec.layers) == 1
    for n, p in bart.decoder.layers[0].state_dict().items():
        assert torch.equal(dec.layers[0].state_dict()[n], p), (
            n
        )  # the first decoder layer, cross-attention included
    emb = model.sem.embed_tokens.weight
    assert dec.embed_tokens.weight is emb  # one vocabulary read by E_sem and the decoder
    assert model.decoder.get_output_embeddings().weight is not emb  # the output projection is its own
    lrs = lr_of(parameter_groups(model, cfg), model)
    assert all(lr == cfg.train.lr for n, lr in lrs.items() if n.startswith("sem."))  # BART's encoder = E_sem
    assert all(lr == cfg.lr_syntax_decoder for n, lr in lrs.items() if not n.startswith("sem."))
    loss, logs = main_loss(
        model,
        dis,
        batcher(ROWS, train=True),
        cfg,
        adversary_on=True,
        opt_dis=torch.optim.AdamW(dis.parameters()),
    )
    loss.backward()
    assert torch.isfinite(loss) and model.sem.layers[0].fc1.weight.grad is not None


def test_bart_from_config_takes_the_bert_vocabulary_and_embeddings(tiny_bert_dir):
    from transformers import AutoModel

    cfg, model, dis, batcher = setup(tiny_bert_dir, architecture="bart")
    bert = AutoModel.from_pretrained(tiny_bert_dir)
    assert (
        type(model.sem).__name__ == "BartEncoder" and len(model.sem.layers) == bert.config.num_hidden_layers
    )
    assert torch.equal(model.sem.embed_tokens.weight, bert.embeddings.word_embeddings.weight)
    assert torch.equal(model.sem.embed_positions.weight[2:], bert.embeddings.position_embeddings.weight)
    assert model.decoder.get_input_embeddings().weight is model.sem.embed_tokens.weight
    assert model.pretrained == {
        "sem.embed_tokens.weight",
        "sem.embed_positions.weight",
        "decoder.model.decoder.embed_positions.weight",
    }  # the rest is new


@pytest.mark.parametrize("arch", ["bart-folder", "bart-from-bert"])
def test_a_bart_model_exports_an_encoder_sentence_transformers_runs_as_an_encoder(
    arch, tiny_bart_dir, tiny_bert_dir, tmp_path
):
    """ST has no BART encoder-only loader (it would run BART's decoder): the export must still give ū."""
    from sentence_transformers import SentenceTransformer

    from orchestrator.evaluation.encode import HFEncoder
    from orchestrator.models import load_encoder
    from trainers.parabart_recipe import export_model, load_parabart

    if arch == "bart-folder":
        cfg, model, dis, batcher = setup(tiny_bart_dir)
    else:
        cfg, model, dis, batcher = setup(tiny_bert_dir, architecture="bart")
    with torch.no_grad():  # move away from the saved weights, so the export must carry the trained ones
        for p in model.sem.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"model": model.state_dict()}, ckpt / "model.pt")
    out = export_model(cfg, ckpt, tmp_path / "model")
    model.eval()
    ours = model.embed(*[batcher(ROWS, train=False)[k] for k in ("src_ids", "src_mask")]).detach()
    st = SentenceTransformer(str(out), device="cpu")
    assert torch.allclose(torch.tensor(st.encode(ROWS["src"])), ours, atol=1e-5)
    enc, tok = load_encoder(str(out))  # what evaluate_encoder and jobs/evaluate.py load
    got = HFEncoder(enc, tok, pooling="mean", max_length=24).encode(ROWS["src"])
    assert torch.allclose(torch.tensor(got), ours, atol=1e-5)
    loaded, b2 = load_parabart(out)
    assert generate(loaded, b2, ROWS["src"], ROWS["tgt_parse"], max_new_tokens=5) == generate(
        model, batcher, ROWS["src"], ROWS["tgt_parse"], max_new_tokens=5
    )


def test_a_hold_out_that_would_swallow_the_training_pairs_is_refused(tmp_path):
    """80 MRPC pairs with the default 500 held out used to leave 0 training rows, found only as an
    empty shard; now one line names the setting and the file before anything is parsed."""
    from orchestrator.data.paraphrase import ParaphraseData, prepare_paraphrase_data
    from orchestrator.errors import ConfigError

    src = Path(__file__).resolve().parents[1] / "data" / "paraphrase" / "mrpc-train.tsv"
    lines = tmp_path / "pairs.tsv"
    lines.write_text("\n".join(src.read_text().splitlines()[:81]) + "\n")
    with pytest.raises(ConfigError, match=r"data.valid_pairs=500 .*/pairs\.tsv; lower it \(at most \d+\)"):
        prepare_paraphrase_data(ParaphraseData(pairs=[{"path": str(lines)}]), str(tmp_path / "store"))
    assert not (tmp_path / "store").exists()


# ---------------------------------------------------------------- the reference code's adversary
def test_the_bag_counts_brackets_and_root_and_the_target_starts_at_one():
    """The pipeline's bag is the reference code's count of the linearized tree's tokens under ROOT; D's
    target adds one to every tag and normalises (``synt_bow``)."""
    from orchestrator.data import constituency as C

    tree = (
        "S",
        [("NP", [("PRP", ["I"])]), ("VP", [("VBP", ["like"]), ("NP", [("NN", ["apples"])])]), (".", ["."])],
    )
    bag = C.constituent_bag(tree)
    # (ROOT (S (NP (PRP)) (VP (VBP) (NP (NN))) (.))): 9 nodes with ROOT, each with an opening and a closing bracket
    assert bag == {"(": 9, ")": 9, "ROOT": 1, "S": 1, "NP": 2, "PRP": 1, "VP": 1, "VBP": 1, "NN": 1, ".": 1}
    tags = Vocab(sorted(bag) + ["DT"])  # DT: a tag of the vocabulary this sentence does not have
    target = bag_targets([json.dumps(bag)], tags)[0]
    total = sum(bag.values()) + len(tags) - 2
    assert target[tags.index["("] - 2] == pytest.approx(10 / total)
    assert target[tags.index["DT"] - 2] == pytest.approx(1 / total)  # ones-smoothed
    assert target.sum() == pytest.approx(1.0)
    shares = bag_targets([json.dumps(bag)], tags, "softmax")[
        0
    ]  # the old form: label shares, no brackets / ROOT
    assert shares[tags.index["("] - 2] == 0 and shares[tags.index["NP"] - 2] == pytest.approx(2 / 8)


def test_the_discriminator_ignores_the_scale_of_the_embedding(tiny_bert_dir):
    """LayerNorm before the linear layer: the encoder cannot fool D by scaling ū."""
    cfg, model, dis, batcher = setup(tiny_bert_dir)
    u = torch.randn(3, model.hidden_size)
    assert torch.allclose(dis(10 * u), dis(u), atol=1e-5)
    assert not torch.allclose(dis(u + torch.randn_like(u)), dis(u), atol=1e-3)
    assert not any(True for _ in dis.norm.parameters())  # no affine parameters, as the reference
    old = discriminator(model, "softmax")
    assert not torch.allclose(old(10 * u), old(u), atol=1e-3)


def test_the_adversarial_loss_is_the_reference_formula_on_a_hand_computed_example():
    """Two sentences, three tags: mean over tags and sentences of −[t·log σ(z) + (1−t)·log(1−σ(z))]
    (``nn.BCEWithLogitsLoss()``), the targets ones-smoothed normalised counts."""
    import math

    tags = Vocab(["(", "NP", "S"])
    bags = bag_targets([json.dumps({"(": 2, "S": 1}), json.dumps({"NP": 3})], tags)
    # sentence 1: counts + 1 = [3, 1, 2] / 6; sentence 2: [1, 4, 1] / 6
    assert bags.tolist() == [pytest.approx([3 / 6, 1 / 6, 2 / 6]), pytest.approx([1 / 6, 4 / 6, 1 / 6])]
    z = [[0.5, -1.0, 2.0], [0.0, 1.5, -0.5]]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    by_hand = (
        sum(
            -(t * math.log(sig(x)) + (1 - t) * math.log(1 - sig(x)))
            for zs, ts in zip(z, bags.tolist(), strict=True)
            for x, t in zip(zs, ts, strict=True)
        )
        / 6
    )
    assert float(adv_loss(torch.tensor(z), bags)) == pytest.approx(by_hand, rel=1e-6)
    # the average-bag guess: the best constant; a D at its loss knows nothing of the sentence
    mean = bags.mean(0)
    const = (
        sum(
            -(t * math.log(p) + (1 - t) * math.log(1 - p))
            for ts in bags.tolist()
            for p, t in zip(mean.tolist(), ts, strict=True)
        )
        / 6
    )
    assert average_bag_loss(bags) == pytest.approx(const, rel=1e-6)
    assert float(adv_loss(torch.logit(mean).expand(2, 3), bags)) == pytest.approx(const, rel=1e-5)


def test_before_the_adversary_starts_d_is_fitted_and_no_adversarial_gradient_reaches_the_encoder(
    tiny_bert_dir,
):
    def sem_grads(**kw):
        cfg, model, dis, batcher = setup(tiny_bert_dir, lambda_adv=1.0)
        model.eval()
        before = dis.linear.weight.detach().clone()
        loss, logs = main_loss(
            model,
            dis,
            batcher(ROWS, train=False),
            cfg,
            opt_dis=torch.optim.SGD(dis.parameters(), lr=0.5),
            **kw,
        )
        loss.backward()
        return (
            {n: p.grad.clone() for n, p in model.sem.named_parameters() if p.grad is not None},
            not torch.equal(before, dis.linear.weight),
            logs,
        )

    warm, d_moved, logs = sem_grads(adversary_on=False, fit_discriminator=True)
    plain, d_idle, _ = sem_grads(adversary_on=False)
    on, _, _ = sem_grads(adversary_on=True)
    assert d_moved and "loss_dis" in logs and "loss_adv" not in logs  # D fitted during the warm-up
    assert not d_idle  # idle (the reference code): D untouched before the start
    assert warm.keys() == plain.keys() and all(torch.equal(warm[k], plain[k]) for k in warm)
    assert any(not torch.allclose(on[k], plain[k]) for k in on)  # once on, L_adv reaches E_sem


def test_the_checkpoint_is_chosen_on_the_paraphrase_loss_alone(tiny_bert_dir):
    from trainers.parabart_recipe import ParaBARTRecipe, validation_loss

    cfg, model, dis, batcher = setup(tiny_bert_dir)
    assert (
        cfg.selection == "valid_para_loss" and ParaBARTRecipe.selection_metric(cfg) == "neg_valid_loss_para"
    )
    assert ParaBARTRecipe.selection_metric(tiny(tiny_bert_dir, selection="last")) is None
    got = {
        lam: validation_loss(
            model, dis, batcher, ROWS, tiny(tiny_bert_dir, lambda_adv=lam), adversary_on=True
        )
        for lam in (0.0, 5.0)
    }
    assert got[0.0]["neg_valid_loss_para"] == got[5.0]["neg_valid_loss_para"] == -got[0.0]["valid_loss_para"]
    assert (
        got[5.0]["valid_loss"] < got[0.0]["valid_loss"]
    )  # the reference's printed L_para − λ·L_adv: not chosen on
    v = got[0.0]
    assert v["valid_loss_adv_average_bag"] > 0 and v["u_norm_mean"] > 0 and -1 <= v["u_cosine_mean"] <= 1
    assert v["u_cosine_mean"] != 1.0


def test_the_validation_figures_are_the_same_whatever_the_batches(tiny_bert_dir):
    """``validation_loss`` batches the held-out rows by parse length: its L_para is the mean over every held-out
    target token (torch's cross-entropy over the full projection of all four rows at once, derived apart), D's
    loss the mean over rows, whatever ``batch_size``; the rows differ in target length, so a mean of batch means
    would not be."""

    from orchestrator.data.paraphrase import directions
    from trainers.parabart_recipe import validation_loss

    cfg, model, dis, batcher = setup(tiny_bert_dir)
    rows = directions(PAIR_ROWS)
    got = [
        validation_loss(model, dis, batcher, rows, cfg, adversary_on=True, batch_size=k) for k in (1, 3, 4)
    ]
    model.eval()
    b = batcher(rows, train=False)
    u, para = full_projection_loss(model, b)
    with torch.no_grad():
        adv = adv_loss(dis(u), b["bags"], dis.form).item()
    assert len(set(b["tgt_mask"][:, 1:].sum(1).tolist())) > 1  # the targets differ in length
    para = para.item()
    for v in got:
        assert v["valid_loss_para"] == pytest.approx(para, rel=1e-5)
        assert v["valid_loss_adv"] == pytest.approx(adv, rel=1e-5)


def test_a_frozen_encoder_stays_bit_identical_for_n_steps_then_moves(tiny_bert_dir):
    from trainers import common
    from trainers.parabart import hold_encoder

    cfg, model, dis, batcher = setup(tiny_bert_dir, freeze_encoder_steps=2)
    stepper = common.Stepper(
        model, parameter_groups(model, cfg), lr=1e-3, schedule="constant", total_steps=10, grad_clip=1.0
    )
    sem0 = {n: p.detach().clone() for n, p in model.sem.named_parameters()}
    new0 = {n: p.detach().clone() for n, p in model.syn.named_parameters()}
    b = batcher(ROWS, train=True)
    for step in range(3):
        hold_encoder(stepper.optimizer, frozen=step < cfg.freeze_encoder_steps)
        loss, _ = main_loss(model, dis, b, cfg, adversary_on=False)
        stepper.step(loss)
        same = all(torch.equal(sem0[n], p) for n, p in model.sem.named_parameters())
        assert same == (step < 2), step
        assert any(
            not torch.equal(new0[n], p) for n, p in model.syn.named_parameters()
        )  # the new parts learn
    with pytest.raises(ValueError, match="freeze_encoder_steps"):
        tiny(tiny_bert_dir, freeze_encoder_steps=2, deepspeed={"stage": 2})


def test_a_prior_bias_starts_d_at_the_average_bags_loss(tiny_bert_dir):
    """``discriminator_bias: prior``: D's bias is the log-odds of the batch's average bag, and with its weights at
    zero D's loss is exactly the best constant guess's; PyTorch's default bias (the reference code) starts far
    above it (σ ≈ 0.5 against shares near 1/n_tags)."""
    from trainers.parabart import set_prior_bias

    cfg, model, dis, batcher = setup(tiny_bert_dir)
    bags = batcher(ROWS, train=False)["bags"]
    u = torch.randn(2, model.hidden_size)
    with torch.no_grad():
        default = float(adv_loss(dis(u), bags))
        set_prior_bias(dis, bags)
        torch.nn.init.zeros_(dis.linear.weight)
        assert float(adv_loss(dis(u), bags)) == pytest.approx(average_bag_loss(bags), rel=1e-5)
    assert default > 1.5 * average_bag_loss(bags)  # 7 tags here; with the smoke data's ~70 the gap is larger


def test_the_confusion_objective_is_bounded_and_lowest_when_d_predicts_the_average_bag(tiny_bert_dir):
    """``adversary_objective``: ``reverse`` (the paper) adds −λ·L_adv, which grows without bound as D's logits
    are pushed the wrong way; ``confusion`` adds λ·BCE(D(ū), average bag), never below its value at the average
    bag, and pulls ū's gradient the other way from ``reverse`` where D already predicts each bag well."""
    from trainers.parabart import encoder_adv_term

    tags = Vocab(["(", "NP", "S"])
    bags = bag_targets([json.dumps({"(": 2, "S": 1}), json.dumps({"NP": 3})], tags)
    at_average = torch.logit(bags.mean(0)).expand(2, 3)
    wrong = torch.full((2, 3), 20.0)  # every tag predicted near 1: D as wrong as it can be
    assert float(encoder_adv_term(wrong, bags)) < -10  # reverse: the encoder's term falls without bound
    floor = float(encoder_adv_term(at_average, bags, objective="confusion"))
    for z in (wrong, torch.logit(bags), torch.randn(2, 3)):
        assert float(encoder_adv_term(z, bags, objective="confusion")) >= floor - 1e-6
    assert float(encoder_adv_term(wrong, bags, objective="confusion")) > floor + 5
    exact = torch.logit(bags).clone().requires_grad_(True)  # D reads each sentence's bag exactly
    encoder_adv_term(exact, bags, objective="confusion").backward()
    toward_average = exact.grad.clone()
    exact.grad = None
    encoder_adv_term(exact, bags).backward()
    assert torch.allclose(exact.grad, torch.zeros_like(exact.grad), atol=1e-7)  # reverse: zero gradient there
    assert (toward_average.sign() == (torch.sigmoid(exact) - bags.mean(0)).detach().sign()).all()


def test_the_reverse_objective_is_the_papers_loss_and_confusion_a_named_option(tiny_bert_dir):
    cfg, model, dis, batcher = setup(tiny_bert_dir, lambda_adv=0.5)
    b = batcher(ROWS, train=False)
    model.eval()
    torch.manual_seed(1)
    loss, logs = main_loss(model, dis, b, cfg, adversary_on=True)
    assert float(loss) == pytest.approx(logs["loss_para"] - 0.5 * logs["loss_adv"], rel=1e-6)
    conf = tiny(tiny_bert_dir, lambda_adv=0.5, adversary_objective="confusion")
    loss_c, logs_c = main_loss(model, dis, b, conf, adversary_on=True)
    assert logs_c["loss_adv"] == pytest.approx(logs["loss_adv"]) and float(loss_c) > logs_c["loss_para"]
    with pytest.raises(ValueError, match="adversary_objective"):
        tiny(tiny_bert_dir, adversary_objective="gradient_reversal")


def test_the_reference_syntax_encoder_is_a_post_norm_gelu_bart_layer_on_normalised_embeddings(tiny_bert_dir):
    """``syntax_encoder: reference`` builds E_syn as uclanlp/ParaBART does: LayerNorm on the tag + position
    embeddings, then BART encoder layers - post-norm, GELU, no dropout on attention or activations. V is computed
    here by hand from the layer's own weights (eval mode) and must equal E_syn's output at every real position;
    a pre-norm layer, ReLU or a missing embedding LayerNorm gives other values."""
    import torch.nn.functional as F

    cfg, model, _, batcher = setup(tiny_bert_dir, syntax_encoder="reference")
    model.eval()
    b = batcher(ROWS, train=False)
    ids, mask = b["parse_ids"], b["parse_mask"]
    got = model.syntax(ids, mask)

    layer = model.syn[0]
    assert type(layer).__name__ == "BartEncoderLayer" and len(model.syn) == cfg.syntax_layers
    assert layer.activation_dropout == 0.0 and layer.self_attn.dropout == 0.0 and layer.dropout == 0.1
    assert model.syn_embed.weight[0].abs().sum() == 0  # the padding row, zero as the reference sets it

    def ln(x, norm):
        return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)

    x = ln(model.syn_embed(ids) + model.syn_pos(torch.arange(ids.size(1))), model.syn_norm)
    a, heads = layer.self_attn, cfg.syntax_heads
    B, T, d = x.shape

    def split(t):
        return t.view(B, T, heads, d // heads).transpose(1, 2)

    q, k, v = split(a.q_proj(x)), split(a.k_proj(x)), split(a.v_proj(x))
    scores = q @ k.transpose(-1, -2) / (d // heads) ** 0.5
    scores = scores.masked_fill((mask == 0)[:, None, None, :], float("-inf"))
    attn = a.out_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d))
    h = ln(x + attn, layer.self_attn_layer_norm)  # post-norm: the norm after the residual sum
    want = ln(h + layer.fc2(F.gelu(layer.fc1(h))), layer.final_layer_norm)
    real = mask.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)
    assert not torch.allclose(
        got[real], ln(h + layer.fc2(F.relu(layer.fc1(h))), layer.final_layer_norm)[real]
    )


def test_the_reference_output_layer_is_a_fresh_linear_with_bias_on_the_decoder_states(tiny_bert_dir):
    """``output_layer: reference``: the logits are ``W h + b`` with h the decoder's last states as they leave
    its layers (no MLM transform between), W fresh (not the pretrained embeddings), b zero at the start; both at
    the decoder's learning rate, the bias without weight decay. Tying it to the embeddings is refused."""
    import torch.nn.functional as F
    from pydantic import ValidationError

    cfg, model, _, batcher = setup(tiny_bert_dir, output_layer="reference")
    head = model.decoder.cls
    assert isinstance(head, torch.nn.Linear) and head.bias is not None
    assert head.weight.shape == model.sem.get_input_embeddings().weight.shape
    assert (
        not torch.equal(head.weight, model.sem.get_input_embeddings().weight) and head.bias.abs().sum() == 0
    )
    assert not any(n.startswith("decoder.cls.") for n in model.pretrained)
    seen = {}
    model.decoder.bert.register_forward_hook(lambda m, i, o: seen.update(h=o.last_hidden_state))
    model.eval()
    b = batcher(ROWS, train=False)
    u = model.embed(b["src_ids"], b["src_mask"])
    logits = model.decode(
        u, model.syntax(b["parse_ids"], b["parse_mask"]), b["parse_mask"], b["tgt_ids"], b["tgt_mask"]
    )
    assert torch.allclose(logits, F.linear(seen["h"], head.weight, head.bias), atol=1e-5)
    groups = parameter_groups(model, cfg)
    lrs = lr_of(groups, model)
    assert lrs["decoder.cls.weight"] == lrs["decoder.cls.bias"] == cfg.lr_syntax_decoder
    assert next(g["weight_decay"] for g in groups if any(p is head.bias for p in g["params"])) == 0
    with pytest.raises(ValidationError, match="cannot be tie_output"):
        tiny(tiny_bert_dir, output_layer="reference", tie_output=True)


@pytest.mark.parametrize("shuffled", [False, True])
def test_the_discriminator_prefit_learns_a_learnable_bag_and_not_a_shuffled_one(shuffled):
    """D pre-fitted on cached ū: on planted bags that ū determines (each row's shares a softmax of a fixed
    projection of ū) its held-out loss ends well below the average bag's; on the same bags shuffled across rows
    (nothing to learn) it does not get below it."""
    from trainers.parabart import Discriminator
    from trainers.parabart_prefit import prefit_discriminator

    g = torch.Generator().manual_seed(0)
    u = torch.randn(1200, 16, generator=g)
    bags = torch.softmax(u @ torch.randn(16, 10, generator=g) / 2, dim=-1)
    if shuffled:
        bags = bags[torch.randperm(len(bags), generator=g)]
    torch.manual_seed(0)
    dis = Discriminator(16, 10)
    out = prefit_discriminator(dis, u, bags, lr=1e-2, epochs=200, batch_size=64, seed=0)
    gap = out["prefit_average_bag"] - out["prefit_valid_loss_adv"]
    if shuffled:
        assert gap < 0.002 * out["prefit_average_bag"]
    else:
        assert gap > 0.05 * out["prefit_average_bag"] and out["prefit_epochs"] < 200  # converged, stopped
    val = torch.randperm(1200, generator=torch.Generator().manual_seed(0))[:120]
    with torch.no_grad():  # the returned figure is D's own held-out loss in the state it was left in
        assert adv_loss(dis(u[val]), bags[val]).item() == pytest.approx(
            out["prefit_valid_loss_adv"], rel=1e-6
        )


def test_the_recipes_prefit_encodes_each_training_source_once_untouched_and_fits_d(
    tiny_bert_dir, tmp_path, capsys
):
    """``discriminator_prefit``'s glue on one worker: the training shard's sources read, each distinct one
    encoded once by E_sem as it is (eval mode: what :meth:`ParaBART.embed` gives on clean ids), D fitted on them
    and its figures returned and said in one line; a ZeRO-3 config is refused (E_sem must be whole)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pydantic import ValidationError

    from trainers.parabart_prefit import cached_embeddings, prefit

    cfg, model, dis, batcher = setup(tiny_bert_dir, discriminator_prefit=True, prefit_epochs=5)
    rows = {"src": ROWS["src"] * 3, "src_bag": ROWS["src_bag"] * 3}  # each source three times
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.table(rows), tmp_path / "shards" / "part-00000.parquet")
    model.train()
    u, bags = cached_embeddings(model, batcher, rows, "cpu")
    assert len(u) == 2 and model.training  # two distinct sources; the mode given back
    clean = batcher({**ROWS}, train=False)
    with torch.no_grad():
        model.eval()
        assert torch.allclose(u, model.embed(clean["src_ids"], clean["src_mask"]), atol=1e-6)
    assert torch.equal(bags, clean["bags"])
    before = dis.linear.weight.detach().clone()
    out = prefit(model, dis, batcher, str(tmp_path), cfg, "cpu")
    assert set(out) == {"prefit_valid_loss_adv", "prefit_average_bag", "prefit_epochs"}
    assert (
        not torch.equal(before, dis.linear.weight)
        and "discriminator pre-fit on 2 cached" in capsys.readouterr().out
    )
    with pytest.raises(ValidationError, match="not under ZeRO-3"):
        tiny(tiny_bert_dir, discriminator_prefit=True, deepspeed={"stage": 3})
