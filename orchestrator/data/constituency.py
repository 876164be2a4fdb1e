r"""Constituency trees for ParaBART: the parser's tree when it has one, else :func:`dep_to_tree`, a deterministic
conversion of the dependency parse into a Penn-style phrase tree; PTB bracketings read and cleaned
(:func:`read_bracketed`, :func:`clean_ptb`); and a tree's two ParaBART inputs - its :func:`linearize`\ d parse
(the syntax encoder's input, cut at a depth or whole) and its :func:`constituent_bag` (the discriminator's
target) - plus :func:`top_constituents` (the TopConst probe's label)."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from orchestrator.data.augment import SUBJ
from orchestrator.data.parsing import Parse

# A tree is (label, children); a preterminal is (tag, [word]).
Tree = tuple


def _category(token) -> str:
    tag, upos = token.tag, token.upos
    if tag.startswith(("VB", "MD")) or upos in ("VERB", "AUX"):
        return "V"
    if tag.startswith(("NN", "PRP", "CD", "WP", "EX")) or upos in ("NOUN", "PROPN", "PRON", "NUM"):
        return "N"
    if upos == "ADP":
        return "P"
    if tag.startswith("JJ") or upos == "ADJ":
        return "A"
    if tag.startswith("RB") or upos == "ADV":
        return "R"
    return "O"


def dep_to_tree(parse: Parse) -> Tree:  # noqa: C901 - one conversion whose cases read together
    """Deterministic dependency → Penn-style phrase tree (labels S, SBAR, VP, NP, PP, ADJP, ADVP).

    Clause heads (verbs, or any head with a copula/subject) give ``S -> subject(s) VP``; a
    ``mark`` child wraps the clause in ``SBAR``; nouns head ``NP``, prepositions ``PP``,
    adjectives ``ADJP``, adverbs ``ADVP``. Single words are bare preterminals except arguments
    of verbs/prepositions (wrapped in NP / ADJP / ADVP as treebanks do).
    """
    toks = parse.tokens
    kids: dict[int, list[int]] = defaultdict(list)
    roots = []
    for i, t in enumerate(toks):
        (roots if t.head < 0 else kids[t.head]).append(i)

    def leaf(i: int) -> Tree:
        return (toks[i].tag or toks[i].upos, [toks[i].text])

    def build(h: int, parent_cat: str | None) -> Tree:
        t, deps = toks[h], kids[h]
        cat = _category(t)
        if not deps:
            node = leaf(h)
            if cat == "N" and (parent_cat in (None, "V", "P", "C") or t.deprel == "appos"):
                return ("NP", [node])
            if cat == "A" and parent_cat in ("V", "C"):
                return ("ADJP", [node])
            if cat == "R" and parent_cat in ("V", "C"):
                return ("ADVP", [node])
            return node
        is_clause = cat == "V" or any(toks[d].deprel in SUBJ + ("cop",) for d in deps)
        if not is_clause:
            label = {"N": "NP", "P": "PP", "A": "ADJP", "R": "ADVP"}.get(cat, "NP" if cat == "O" else "FRAG")
            parts = sorted(deps + [h])
            return (label, [leaf(i) if i == h else build(i, cat) for i in parts])
        return clause(h, deps, parent_cat)

    def has_subject(d: int) -> bool:
        return any(toks[k].deprel in SUBJ for k in kids[d])

    def clause(h: int, deps: list[int], parent_cat: str | None) -> Tree:
        # Coordinated clauses ("he came , and she left .") are siblings under one S, as in PTB.
        conj = [d for d in deps if toks[d].deprel == "conj" and _category(toks[d]) == "V" and has_subject(d)]
        if conj:
            first = min(conj)
            end = max(i for i, t in enumerate(toks) if t.upos != "PUNCT")
            for c in conj:  # sentence-final punctuation hangs off the last clause: lift it out
                final = [k for k in kids[c] if toks[k].upos == "PUNCT" and k > end]
                kids[c] = [k for k in kids[c] if k not in final]
                deps = deps + final
            coord = [
                d
                for d in deps
                if d in conj
                or (d > h and d < max(conj) and toks[d].deprel in ("cc", "punct"))
                or (d > first and toks[d].deprel == "punct")
            ]
            main = clause(h, [d for d in deps if d not in coord], parent_cat)
            parts = [(h, main)] + [(d, build(d, "C") if d in conj else leaf(d)) for d in coord]
            return ("S", [node for _, node in sorted(parts, key=lambda x: x[0])])
        mark = [d for d in deps if toks[d].deprel == "mark"]
        subj = [d for d in deps if toks[d].deprel in SUBJ]
        # the VP starts at the first auxiliary / negation / the head itself; what precedes it
        # (subjects, fronted adverbials, pre-verbal adverbs) sits directly under S, and so does
        # punctuation that trails the last word of the clause
        vp_start = min([h] + [d for d in deps if toks[d].deprel in ("aux", "auxpass", "aux:pass", "neg")])
        last_word = max([h] + [d for d in deps if toks[d].upos != "PUNCT"])
        s_level, vp_level = [], []
        for d in deps:
            if d in mark:
                continue
            at_s = (
                d in subj
                or (subj and d < vp_start)
                or (
                    toks[d].deprel == "punct"
                    and (d > last_word or d < min([h] + [k for k in deps if toks[k].upos != "PUNCT"]))
                )
            )
            (s_level if at_s else vp_level).append(d)
        # punctuation between the subject and the VP (an appositive's closing comma) belongs to
        # the subject NP, as in PTB
        inner = [d for d in s_level if subj and toks[d].deprel == "punct" and max(subj) < d < vp_start]
        s_level = [d for d in s_level if d not in inner]
        vp = ("VP", [leaf(i) if i == h else build(i, "V") for i in sorted(vp_level + [h])])
        s_kids = []
        for i in sorted(s_level + [h]):
            node = vp if i == h else build(i, "C")
            if i == max(subj, default=-1) and inner and not is_preterminal(node):
                node = (node[0], node[1] + [leaf(d) for d in inner])
            s_kids.append(node)
        s_node = ("S", s_kids)
        if not subj and parent_cat is not None and not mark:
            return vp  # non-finite / controlled clause: a bare VP
        if mark:
            return ("SBAR", [build(m, "C") if kids[m] else leaf(m) for m in sorted(mark)] + [s_node])
        return s_node

    trees = [build(r, None) for r in roots]
    return trees[0] if len(trees) == 1 else ("S", trees)  # several roots: one S over them


def read_bracketed(text: str) -> Tree:
    """Read a Penn bracketed tree ``(S (NP (DT the) (NN cat)) ...)``; a bare ``( (S ...))`` wrapper is kept."""
    tokens = re.findall(r"\(|\)|[^\s()]+", text)
    pos = 0

    def node() -> Tree:
        nonlocal pos
        assert tokens[pos] == "("
        pos += 1
        label = ""
        if tokens[pos] not in ("(", ")"):
            label = tokens[pos]
            pos += 1
        children: list = []
        while tokens[pos] != ")":
            if tokens[pos] == "(":
                children.append(node())
            else:
                children.append(tokens[pos])
                pos += 1
        pos += 1
        return (label, children)

    return node()


def clean_ptb(tree: Tree) -> Tree | None:
    """Strip function tags (``NP-SBJ-1`` → ``NP``), traces (``-NONE-``) and the empty root wrapper."""
    label, children = tree
    if label == "-NONE-":
        return None
    if label not in ("-LRB-", "-RRB-", "-NONE-"):
        label = re.split(r"[-=]", label)[0] or label
    kids = []
    for c in children:
        if isinstance(c, str):
            kids.append(c)
        else:
            cc = clean_ptb(c)
            if cc is not None:
                kids.append(cc)
    if not kids:
        return None
    if label in ("", "ROOT") and len(kids) == 1 and isinstance(kids[0], tuple):
        return kids[0]
    return (label, kids)


def constituency(parse: Parse) -> Tree:
    """The parser's tree when it gave one (cleaned), else the dependency conversion."""
    if parse.tree:
        cleaned = clean_ptb(read_bracketed(parse.tree))
        if cleaned is not None:
            return cleaned
    return dep_to_tree(parse)


def is_preterminal(node: Tree) -> bool:
    return all(isinstance(c, str) for c in node[1])


def linearize(tree: Tree, max_depth: int | None = None) -> str:
    """Leaves replaced by their tags; nodes at ``max_depth`` printed without children (None: the whole tree).

    ``(S (NP (DT) (NN)) (VP (VBZ) (ADJP)) (.))`` is a sentence at ``max_depth=3``.
    """

    def lin(node: Tree, depth: int) -> str:
        label, kids = node
        if is_preterminal(node) or (max_depth is not None and depth >= max_depth):
            return f"({label})"
        return f"({label} " + " ".join(lin(k, depth + 1) for k in kids if isinstance(k, tuple)) + ")"

    return lin(tree, 1)


def constituent_bag(tree: Tree) -> dict[str, int]:
    """ParaBART's bag of constituents, counted as the reference code counts it: every token of the
    linearized tree under a ``ROOT`` node (as CoreNLP's trees have it) - each node's label (phrase labels
    and POS tags), ``ROOT`` once, and each bracket, so ``(`` and ``)`` each count the nodes. Raw counts;
    the trainer smooths (+1 per tag) and normalises them into D's target."""
    counts: Counter[str] = Counter({"ROOT": 1, "(": 1, ")": 1})

    def walk(node: Tree) -> None:
        counts[node[0]] += 1
        counts["("] += 1
        counts[")"] += 1
        for k in node[1]:
            if isinstance(k, tuple):
                walk(k)

    walk(tree)
    return dict(sorted(counts.items()))


def top_constituents(tree: Tree) -> list[str]:
    """Labels of the top node's children (ParaBART's TopConst / QQP-Easy/Hard criterion)."""
    return [k[0] for k in tree[1] if isinstance(k, tuple)]
