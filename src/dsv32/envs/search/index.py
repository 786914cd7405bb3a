"""BM25 over a corpus (``bm25s``, Lucene variant, k1=1.5, b=0.75).

score(q, d) = Σ_{t ∈ q} idf(t) · tf(t, d)·(k1 + 1) / (tf(t, d) + k1·(1 − b + b·|d|/avgdl))

Tokens: the lower-cased words of two or more word characters and single digits, minus English
stop words; a word with underscores also yields its parts (``move_to_end`` → ``move_to_end``, ``move``, ``to``,
``end``), so both the identifier and a plain-words query find it. The document title is indexed
twice (titles are the names people search for). An index over the default corpus is saved next to
it and reloaded on later uses.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from dsv32.envs.search.corpus import Doc

_WORD = re.compile(r"\w\w+|\d")
_STOP = frozenset(bm25s.stopwords.STOPWORDS_EN)
TOKENIZER_VERSION = (
    "words2+digits+underscore-parts+title2"  # part of the cache key: change it with tokenize()
)


def tokenize(text: str) -> list[str]:
    """The index's tokens of ``text`` (see the module docstring)."""
    out = []
    for word in _WORD.findall(text.lower()):
        if word not in _STOP:
            out.append(word)
        if "_" in word:
            out += [p for p in word.split("_") if len(p) > 1 and p not in _STOP]
    return out


@dataclass(frozen=True)
class Hit:
    doc: Doc
    score: float


class Index:
    """A BM25 index over ``docs``; ``search(query, k)`` returns the best ``k`` hits with a positive
    score, best first (ties broken by corpus order)."""

    def __init__(self, docs: list[Doc], cache: Path | None = None) -> None:
        if not docs:
            raise ValueError("an index needs at least one document")
        self.docs = docs
        self.by_id = {d.id: d for d in docs}
        key = _fingerprint(docs)
        if cache is not None and (cache / key).is_dir():
            self.bm25 = bm25s.BM25.load(str(cache / key), show_progress=False)
            return
        self.bm25 = bm25s.BM25()
        self.bm25.index([tokenize(f"{d.title}\n{d.title}\n{d.text}") for d in docs], show_progress=False)
        if cache is not None:
            tmp = cache / f"{key}.tmp"
            self.bm25.save(str(tmp), show_progress=False)
            tmp.replace(cache / key)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        tokens = tokenize(query)
        if not tokens:
            return []
        k = max(1, min(k, len(self.docs)))
        ids, scores = self.bm25.retrieve([tokens], k=k, show_progress=False, n_threads=1)
        return [Hit(self.docs[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]

    def rank(self, query: str, doc_id: str, k: int = 10) -> int | None:
        """1-based rank of ``doc_id`` among the top ``k`` hits of ``query``, or None."""
        for r, hit in enumerate(self.search(query, k), 1):
            if hit.doc.id == doc_id:
                return r
        return None


def _fingerprint(docs: list[Doc]) -> str:
    h = hashlib.sha256()
    h.update(TOKENIZER_VERSION.encode())
    for d in docs:
        h.update(d.id.encode())
        h.update(np.int64(len(d.text)).tobytes())
        h.update(hashlib.sha256(d.text.encode()).digest())
    return "bm25-" + h.hexdigest()[:16]
