"""Augmentations on hand-built parses (checked by hand) and on real spaCy / stanza parses."""

import random
from pathlib import Path

import pytest

from orchestrator.data import augment as A
from orchestrator.data import constituency as C
from orchestrator.data.parsing import Parse, Token

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def P(spec: str, text: str | None = None) -> Parse:
    """Build a parse from 'word/UPOS/TAG/head/deprel' items (head is 1-based, 0 = root)."""
    toks = []
    for item in spec.split():
        w, upos, tag, head, rel = item.split("/")
        toks.append(Token(w, w.lower(), upos, tag, int(head) - 1, rel))
    for t, nxt in zip(toks, toks[1:] + [None]):
        t.ws = "" if nxt is not None and nxt.upos == "PUNCT" else " "
    return Parse(text or A.detok(toks), toks)


CAT = P(
    "The/DET/DT/2/det cat/NOUN/NN/3/nsubj sat/VERB/VBD/0/root on/ADP/IN/3/prep "
    "the/DET/DT/6/det mat/NOUN/NN/4/pobj ./PUNCT/./3/punct"
)
CHASE = P(
    "The/DET/DT/2/det dog/NOUN/NN/3/nsubj chased/VERB/VBD/0/root a/DET/DT/5/det cat/NOUN/NN/3/dobj "
    "and/CCONJ/CC/3/cc she/PRON/PRP/8/nsubj saw/VERB/VBD/3/conj it/PRON/PRP/8/dobj ./PUNCT/./3/punct"
)


def test_backbone_is_root_and_direct_dependents_in_order():
    assert CAT.text == "The cat sat on the mat."
    assert [CAT.tokens[i].text for i in A.backbone(CAT)] == ["cat", "sat", "on"]
    assert A.backbone_view(CAT, random.Random(0), source="backbone") == "The cat sat on the mat. cat sat on"
    assert [CAT.tokens[i].text for i in A.backbone(CAT, keep_punct=True)] == ["cat", "sat", "on", "."]


def test_triples_and_seeded_choice():
    found = [tuple(CHASE.tokens[i].text for i in t) for t in A.triples(CHASE)]
    assert found == [("dog", "chased", "cat"), ("she", "saw", "it")]
    phrases = [
        tuple(" ".join(CHASE.tokens[i].text for i in part) for part in t) for t in A.triple_phrases(CHASE)
    ]
    assert phrases == [("dog", "chased", "cat"), ("she", "saw", "it")]
    # Y takes a triple of the main clause (the root's), seeded
    views = {A.backbone_view(CHASE, random.Random(s), source="triple") for s in range(20)}
    assert views == {CHASE.text + " dog chased cat"}


SOLD = P(
    "The/DET/DT/3/det old/ADJ/JJ/3/amod man/NOUN/NN/5/nsubj quickly/ADV/RB/5/advmod sold/VERB/VBD/0/root "
    "his/PRON/PRP$/9/poss small/ADJ/JJ/9/amod red/ADJ/JJ/9/amod car/NOUN/NN/5/dobj ./PUNCT/./5/punct"
)
BORN = P(
    "Obama/PROPN/NNP/3/nsubjpass was/AUX/VBD/3/auxpass born/VERB/VBN/0/root in/ADP/IN/3/prep "
    "Hawaii/PROPN/NNP/4/pobj ./PUNCT/./3/punct"
)


def test_triples_are_phrases_not_single_words():
    """Subject and object keep their modifiers (not articles); the relation keeps auxiliaries and, without
    a direct object, the preposition of its prepositional object."""

    def words(parse):
        return [
            tuple(" ".join(parse.tokens[i].text for i in part) for part in t) for t in A.triple_phrases(parse)
        ]

    assert words(SOLD) == [("old man", "sold", "his small red car")]
    assert words(BORN) == [("Obama", "was born in", "Hawaii")]
    assert (
        A.backbone_view(SOLD, random.Random(0), source="triple")
        == SOLD.text + " old man sold his small red car"
    )


def test_the_rule_switches_on_length():
    """SIFTER's rule: the tree's top two layers for a short sentence, a triple for a longer one."""
    assert len(SOLD.tokens) == 10
    tree = A.backbone_view(SOLD, random.Random(0), source="rule", rule_max_words=10)
    triple = A.backbone_view(SOLD, random.Random(0), source="rule", rule_max_words=9)
    assert tree == SOLD.text + " man quickly sold car" and tree == A.backbone_view(SOLD, random.Random(0))
    assert triple == SOLD.text + " old man sold his small red car"


def test_triple_fallbacks():
    slept = P("The/DET/DT/2/det cat/NOUN/NN/3/nsubj slept/VERB/VBD/0/root ./PUNCT/./3/punct")
    rng = random.Random(0)
    assert A.triple_phrases(slept) == []
    assert A.backbone_view(slept, rng, source="triple", fallback="backbone") == "The cat slept. cat slept"
    assert A.backbone_view(slept, rng, source="triple", fallback="copy") == slept.text
    assert A.backbone_view(slept, rng, source="triple", fallback="none") is None


def test_deletion_removes_articles_and_conjunctions_and_keeps_pronouns():
    assert A.deletion_view(CHASE) == "dog chased cat she saw it."
    assert A.deletion_view(CAT) == "cat sat on mat."
    assert A.deletion_view(CAT, classes=["pron"]) == CAT.text  # configurable: nothing to remove
    assert A.deletion_view(CHASE, classes=["article", "cconj", "sconj", "pron"]) == "dog chased cat saw."
    # 'this' is a DET but not an article: kept
    this = P("this/DET/DT/2/det cat/NOUN/NN/0/root")
    assert A.deletion_view(this) == "this cat"


def test_deletion_never_empty():
    only = P("He/PRON/PRP/0/root and/CCONJ/CC/1/cc she/PRON/PRP/1/conj ./PUNCT/./1/punct")
    assert A.deletion_view(only, classes=["cconj", "pron"]) == only.text
    assert A.deletion_view(only) == "He she."  # the paper's classes: the pronouns stay


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.5, 0.6, 0.7, 1.0])
def test_tsdae_noise_deletes_exactly_the_stated_fraction(ratio):
    rng = random.Random(7)
    for n in range(1, 41):
        words = [f"w{i}" for i in range(n)]
        out = A.tsdae_noise(words, ratio, rng)
        expected_deleted = min(int(ratio * n + 0.5), n - 1)
        assert len(out) == n - expected_deleted, (n, ratio)
        it = iter(words)
        assert all(w in it for w in out)  # a subsequence: order kept, nothing invented
    # the paper's 0.6 on a 10-word sentence deletes 6 and keeps 4 (sentence-transformers'
    # example would keep about 6: it keeps a word when random() < del_ratio)
    assert len(A.tsdae_noise([str(i) for i in range(10)], 0.6, random.Random(0))) == 4


def test_tsdae_noise_is_resampled_per_call_and_seeded():
    words = [f"w{i}" for i in range(20)]
    a = A.tsdae_noise(words, 0.6, random.Random(1))
    assert a == A.tsdae_noise(words, 0.6, random.Random(1))
    rng = random.Random(1)
    assert len({tuple(A.tsdae_noise(words, 0.6, rng)) for _ in range(10)}) > 1  # new noise each epoch
    with pytest.raises(ValueError):
        A.tsdae_noise(words, 1.5, rng)


def test_repetition_duplicates_in_place():
    words = "a b c d e f g h i j".split()
    rng = random.Random(0)
    for _ in range(50):
        out = A.repetition(words, 0.32, rng)
        assert len(words) <= len(out) <= len(words) + 3
        dedup = [w for i, w in enumerate(out) if i == 0 or out[i - 1] != w]
        assert dedup == words


def test_dep_to_tree_and_linearize():
    tree = C.dep_to_tree(CAT)
    assert tree == (
        "S",
        [
            ("NP", [("DT", ["The"]), ("NN", ["cat"])]),
            ("VP", [("VBD", ["sat"]), ("PP", [("IN", ["on"]), ("NP", [("DT", ["the"]), ("NN", ["mat"])])])]),
            (".", ["."]),
        ],
    )
    assert C.linearize(tree, 3) == "(S (NP (DT) (NN)) (VP (VBD) (PP)) (.))"
    assert C.linearize(tree, 10) == "(S (NP (DT) (NN)) (VP (VBD) (PP (IN) (NP (DT) (NN)))) (.))"
    assert C.top_constituents(tree) == ["NP", "VP", "."]
    bag = C.constituent_bag(tree)
    # counts, as ParaBART's reference code counts the linearized tree under ROOT: 12 nodes + ROOT, 13 brackets a side
    assert bag["NP"] == 2 and bag["DT"] == 2 and bag["ROOT"] == 1 and bag["("] == bag[")"] == 13
    assert sum(bag.values()) == 3 * 13


def test_subordinate_clause_becomes_sbar():
    s = P(
        "I/PRON/PRP/2/nsubj left/VERB/VBD/0/root because/SCONJ/IN/5/mark it/PRON/PRP/5/nsubj "
        "rained/VERB/VBD/2/advcl ./PUNCT/./2/punct"
    )
    assert C.linearize(C.dep_to_tree(s), 5) == "(S (NP (PRP)) (VP (VBD) (SBAR (IN) (S (NP) (VP)))) (.))"
    assert C.linearize(C.dep_to_tree(s), 4) == "(S (NP (PRP)) (VP (VBD) (SBAR (IN) (S))) (.))"


def test_ptb_reader_strips_function_tags_and_traces():
    raw = "( (S (NP-SBJ-1 (NNP Mr.) (NNP Vinken)) (VP (VBZ is) (NP-PRD (-NONE- *T*-1) (NN chairman))) (. .)))"
    tree = C.clean_ptb(C.read_bracketed(raw))
    assert C.top_constituents(tree) == ["NP", "VP", "."]
    assert C.linearize(tree, 3) == "(S (NP (NNP) (NNP)) (VP (VBZ) (NP)) (.))"


def test_parser_tree_wins_over_conversion():
    p = Parse(CAT.text, CAT.tokens, tree="(ROOT (S (NP (DT The) (NN cat)) (VP (VBD sat)) (. .)))")
    assert C.linearize(C.constituency(p), 3) == "(S (NP (DT) (NN)) (VP (VBD)) (.))"


def test_real_spacy_parse():
    from orchestrator.data.parsing import SpacyParser

    parse = SpacyParser().parse_batch(["The cat sat on the mat."])[0]
    assert [t.deprel for t in parse.tokens] == ["det", "nsubj", "root", "prep", "det", "pobj", "punct"]
    assert A.backbone_view(parse, random.Random(0)) == "The cat sat on the mat. cat sat on"
    assert C.linearize(C.constituency(parse), 3) == "(S (NP (DT) (NN)) (VP (VBD) (PP)) (.))"


# ---------------------------------------------------------------- stanza adapter on UD gold
UD_DEV = Path(__file__).resolve().parents[1] / "data" / "ud" / "en_ewt-ud-dev-first50.conllu"  # shipped


def test_stanza_adapter_on_ud_gold_documents():
    from stanza.utils.conll import CoNLL

    from orchestrator.data.parsing import from_stanza_document

    text = UD_DEV.read_text(encoding="utf-8")
    blocks = [b for b in text.split("\n\n") if b.strip()][:50]
    for block in blocks:
        doc = CoNLL.conll2doc(input_str=block + "\n\n")
        parse = from_stanza_document(doc)
        rows = [ln.split("\t") for ln in block.splitlines() if ln and not ln.startswith("#")]
        words = [r for r in rows if r[0].isdigit()]  # syntactic words (skip 1-2 ranges and 1.1 empties)
        assert [t.text for t in parse.tokens] == [r[1] for r in words]
        assert [t.upos for t in parse.tokens] == [r[3] for r in words]
        assert [t.head for t in parse.tokens] == [int(r[6]) - 1 for r in words]
        assert [t.deprel for t in parse.tokens] == [r[7].lower() for r in words]
        roots = [i for i, t in enumerate(parse.tokens) if t.head < 0]
        assert A.backbone(parse, keep_punct=True) == sorted(
            i for i, r in enumerate(words) if int(r[6]) == 0 or int(r[6]) - 1 in roots
        )
        assert A.deletion_view(parse)  # never empty


def test_stanza_pipeline_needs_a_model_dir(tmp_path):
    from orchestrator.data.parsing import StanzaParser, make_parser
    from orchestrator.errors import ConfigError

    with pytest.raises(ConfigError, match="parser.stanza_dir: required"):
        make_parser("stanza")
    with pytest.raises(ConfigError, match="no such directory"):
        StanzaParser(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no resources.json there"):
        StanzaParser(str(tmp_path))


def test_coordinated_clauses_and_appositive_comma_follow_ptb():
    coord = P(
        "He/PRON/PRP/2/nsubj came/VERB/VBD/0/root ,/PUNCT/,/2/punct and/CCONJ/CC/2/cc "
        "she/PRON/PRP/6/nsubj left/VERB/VBD/2/conj ./PUNCT/./6/punct"
    )
    assert C.top_constituents(C.dep_to_tree(coord)) == ["S", ",", "CC", "S", "."]
    appos = P(
        "Vinken/PROPN/NNP/5/nsubj ,/PUNCT/,/1/punct chairman/NOUN/NN/1/appos ,/PUNCT/,/5/punct "
        "joined/VERB/VBD/0/root ./PUNCT/./5/punct"
    )
    assert C.linearize(C.dep_to_tree(appos), 3) == "(S (NP (NNP) (,) (NP) (,)) (VP (VBD)) (.))"


# The paper's worked example (SIFTER, Section 3), parsed by the shipped spaCy pipeline; and ESimCSE's sentence.
EXAMPLE = "I like this apple because it looks so fresh and I think it should be delicious."


@pytest.fixture(scope="module")
def spacy_parser():
    from orchestrator.data.parsing import SpacyParser

    return SpacyParser()


def test_the_papers_worked_example_gives_its_backbone_and_its_z(spacy_parser):
    parse = spacy_parser.parse_batch([EXAMPLE])[0]
    assert A.backbone_view(parse, random.Random(0), source="rule") == EXAMPLE + " I like apple"
    assert A.backbone_view(parse, random.Random(0), source="triple") == EXAMPLE + " I like apple"
    assert A.deletion_view(parse) == "I like this apple it looks so fresh I think it should be delicious."


def test_a_sentences_pronouns_survive_z(spacy_parser):
    text = "She sold her old car and bought a bicycle because she wanted to save money."
    parse = spacy_parser.parse_batch([text])[0]
    z = A.deletion_view(parse)
    assert z == "She sold her old car bought bicycle she wanted to save money."
    assert [w for w in z.split() if w.lower() in ("she", "her")] == ["She", "her", "she"]
    assert A.backbone_view(parse, random.Random(0), source="rule") == text + " She sold car"
