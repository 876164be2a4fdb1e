"""Augmentations: pure, seeded functions of a :class:`~orchestrator.data.parsing.Parse`.

SIFTER (Section 3) builds two views of each sentence X:

* **Y = X + backbone** - the top two layers of the dependency tree for a short sentence: the main
  clause's root and its direct dependents, in sentence order, less punctuation, articles, conjunctions
  and dependent clauses (:func:`core_backbone`: the paper's worked example, "I like this apple because it
  looks so fresh and I think it should be delicious." → "I like apple"); a subject-relation-object
  *triple* of phrases from the parse otherwise (the paper's rule; either one alone is configurable);
* **Z = X without useless words** - articles and conjunctions (coordinating and subordinating) removed,
  as the paper says ("articles do not change the semantics of sentences, while conjunctions contain
  less semantic information"); pronouns stay. The word classes are configurable.

TSDAE corrupts a sentence by deleting a fixed fraction of its words (:func:`tsdae_noise`, called
by the trainer each epoch); ESimCSE duplicates a few words (:func:`repetition`). ParaBART's constituency
trees and their linearized parse and bag of constituents: ``orchestrator/data/constituency.py``.

Every function that draws randomness takes a ``random.Random`` so results are reproducible.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

from orchestrator.data.parsing import Parse

ARTICLES = frozenset({"a", "an", "the"})
DELETION_CLASSES = ("article", "cconj", "sconj")  # the paper's; "pron" may be added
SUBJ = ("nsubj", "nsubjpass", "nsubj:pass", "csubj", "csubj:pass", "csubjpass", "expl")
OBJ = ("obj", "dobj", "iobj", "dative", "attr", "oprd")


def detok(tokens) -> str:
    """Join tokens with their original whitespace."""
    return "".join(t.text + t.ws for t in tokens).strip()


# ---------------------------------------------------------------- SIFTER's Y view
def backbone(parse: Parse, *, keep_punct: bool = False) -> list[int]:
    """Indices of the tree's first two layers: every root and its direct dependents, in order."""
    roots = {i for i, t in enumerate(parse.tokens) if t.head < 0}
    keep = [i for i, t in enumerate(parse.tokens) if i in roots or t.head in roots]
    if not keep_punct:
        keep = [i for i in keep if parse.tokens[i].upos != "PUNCT"]
    return keep


# the root's dependents that are not the main clause's backbone: a dependent clause or a coordinated one (its
# head word alone is no argument: "looks" of "because it looks so fresh"), and the words that join them
NOT_BACKBONE = (
    "advcl",
    "ccomp",
    "xcomp",
    "conj",
    "parataxis",
    "relcl",
    "acl",
    "acl:relcl",
    "cc",
    "mark",
    "discourse",
    "dep",
    "punct",
)


def core_backbone(parse: Parse) -> list[int]:
    """SIFTER's "top two layers", read so that the paper's worked example gives its backbone: the main
    clause's root (the first root: a parser may split a sentence into several) and its direct dependents,
    without punctuation, dependent or coordinated clauses (:data:`NOT_BACKBONE`) and Z's useless words."""
    roots = [i for i, t in enumerate(parse.tokens) if t.head < 0]
    if not roots:
        return []
    root = roots[0]
    return [
        i
        for i, t in enumerate(parse.tokens)
        if i == root
        or (t.head == root and t.deprel not in NOT_BACKBONE and t.upos != "PUNCT" and not is_useless(t))
    ]


def triples(parse: Parse) -> list[tuple[int, int, int]]:
    """Every (subject, verb, object) index triple: a verb with both a subject and an object child."""
    kids: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(parse.tokens):
        if t.head >= 0:
            kids[t.head].append(i)
    out = []
    for v, children in sorted(kids.items()):
        subj = [c for c in children if parse.tokens[c].deprel in SUBJ]
        obj = [c for c in children if parse.tokens[c].deprel in OBJ]
        out += [(s, v, o) for s in subj for o in obj]
    return out


# the dependents that stay with a phrase's head (an OpenIE-style argument: "the new [red] car of mine" →
# "new red car"); articles, clauses and punctuation do not
PHRASE_DEPS = (
    "compound",
    "amod",
    "nummod",
    "poss",
    "nmod:poss",
    "flat",
    "flat:name",
    "fixed",
    "case",
    "nn",
    "quantmod",
    "advmod",
    "npadvmod",
    "det:poss",
)
RELATION_DEPS = ("aux", "auxpass", "aux:pass", "neg", "prt", "compound:prt")
WH_TAGS = ("WDT", "WP", "WP$")


def phrase(parse: Parse, head: int, deps: tuple[str, ...] = PHRASE_DEPS) -> list[int]:
    """``head`` and, recursively, its dependents of the kinds in ``deps``, in sentence order."""
    kids: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(parse.tokens):
        if t.head >= 0:
            kids[t.head].append(i)
    out, todo = [], [head]
    while todo:
        i = todo.pop()
        out.append(i)
        todo += [k for k in kids[i] if parse.tokens[k].deprel in deps and parse.tokens[k].upos != "PUNCT"]
    return sorted(out)


def triple_phrases(parse: Parse) -> list[tuple[list[int], list[int], list[int]]]:
    """Subject / relation / object *phrases* (token indices): for every verb with a subject, its
    direct object - or, without one, the object of a preposition attached to it, the preposition
    joining the relation ("was born in" + "Hawaii"). Subject and object keep their modifiers
    (:data:`PHRASE_DEPS`); the relation keeps auxiliaries, negation and particles."""
    kids: dict[int, list[int]] = defaultdict(list)
    for i, t in enumerate(parse.tokens):
        if t.head >= 0:
            kids[t.head].append(i)
    out = []
    for v in sorted(kids):
        subj = [c for c in kids[v] if parse.tokens[c].deprel in SUBJ]
        if not subj:
            continue
        relation = sorted([v] + [c for c in kids[v] if parse.tokens[c].deprel in RELATION_DEPS])
        objects = [(o, relation) for o in kids[v] if parse.tokens[o].deprel in OBJ]
        if not objects:  # "sat on the mat": the preposition joins the relation
            for prep in (c for c in kids[v] if parse.tokens[c].deprel in ("prep", "obl", "agent")):
                pobj = [g for g in kids[prep] if parse.tokens[g].deprel in ("pobj", "obj")]
                if (
                    parse.tokens[prep].deprel == "obl"
                ):  # UD: the noun is the dependent, its "case" the preposition
                    case = [g for g in kids[prep] if parse.tokens[g].deprel == "case"]
                    objects += [(prep, sorted(relation + case))]
                else:
                    objects += [(g, sorted(relation + [prep])) for g in pobj]
        for s in subj:
            for o, rel in objects:
                if parse.tokens[o].tag in WH_TAGS or parse.tokens[s].tag in WH_TAGS:
                    continue  # "the plan that the board approved": a relative pronoun is no argument
                subject, obj = phrase(parse, s), [i for i in phrase(parse, o) if i not in rel]
                out.append((subject, rel, obj))
    return out


def main_triples(parse: Parse) -> list[tuple[list[int], list[int], list[int]]]:
    """The triples of the main clause (the root's), else every triple."""
    found = triple_phrases(parse)
    main = [tr for tr in found if any(parse.tokens[i].head < 0 for i in tr[1])]
    return main or found


def backbone_view(
    parse: Parse,
    rng: random.Random,
    *,
    source: str = "backbone",
    fallback: str = "backbone",
    rule_max_words: int = 20,
) -> str | None:
    """Y = X + " " + the backbone words: the tree's first two layers (``backbone``), a seeded
    choice among the subject-relation-object phrase triples (``triple``), or SIFTER's rule
    (``rule``): the tree layers for a sentence of at most ``rule_max_words`` words, a triple otherwise.

    ``fallback`` applies when a triple is wanted and none is found: ``backbone``, ``copy`` (Y = X)
    or ``none`` (return None: the caller counts and skips the sentence).
    """
    if source == "rule":
        source = "backbone" if len(parse.tokens) <= rule_max_words else "triple"
    words: list[str] | None = None
    if source == "triple":
        found = main_triples(parse)
        if found:
            words = [parse.tokens[i].text for part in rng.choice(found) for i in part]
        elif fallback == "copy":
            return parse.text
        elif fallback == "none":
            return None
    if words is None:
        words = [parse.tokens[i].text for i in core_backbone(parse)]
    if not words:
        return parse.text
    return f"{parse.text} {' '.join(words)}"


# ---------------------------------------------------------------- SIFTER's Z view
def is_useless(token, classes: Sequence[str] = DELETION_CLASSES) -> bool:
    return (
        ("article" in classes and token.upos == "DET" and token.lemma.lower() in ARTICLES)
        or ("cconj" in classes and token.upos == "CCONJ")
        or ("sconj" in classes and token.upos == "SCONJ")
        or ("pron" in classes and token.upos == "PRON")
    )


def deletion_view(parse: Parse, classes: Sequence[str] = DELETION_CLASSES) -> str:
    """Z = X without the words of ``classes`` (the paper's: articles and conjunctions); never empty (X itself
    if all would go)."""
    toks = parse.tokens
    kept = [i for i, t in enumerate(toks) if not is_useless(t, classes)]
    if not any(toks[i].upos != "PUNCT" for i in kept):
        return parse.text
    # the space before each kept token is the original space right before it
    return "".join((toks[j - 1].ws if k else "") + toks[j].text for k, j in enumerate(kept)).strip()


# ---------------------------------------------------------------- TSDAE and ESimCSE noise
def round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def tsdae_noise(words: Sequence[str], ratio: float, rng: random.Random) -> list[str]:
    """Delete exactly ``round(ratio * n)`` words (half rounds up), always keeping at least one.

    Note: sentence-transformers' example keeps a word when ``random() < del_ratio``, so its
    ``del_ratio=0.6`` *keeps* about 60%; here ``ratio`` is the fraction *deleted*, exactly.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"deletion ratio {ratio} outside [0, 1]")
    n = len(words)
    if n == 0:
        return []
    n_delete = min(round_half_up(ratio * n), n - 1)
    keep = sorted(rng.sample(range(n), n - n_delete))
    return [words[i] for i in keep]


def repetition(words: Sequence[str], rate: float, rng: random.Random) -> list[str]:
    """ESimCSE word repetition: duplicate a random ``0..max(1, int(rate*n))`` distinct words in place."""
    n = len(words)
    if n == 0:
        return []
    dup_len = rng.randint(0, max(1, int(rate * n)))
    dup = set(rng.sample(range(n), min(dup_len, n)))
    out = []
    for i, w in enumerate(words):
        out.append(w)
        if i in dup:
            out.append(w)
    return out
