"""BM25 over one question's own paragraphs: the `retrieve(query, k)` tool of multi-hop QA harnesses.

Scoring is `bm25s` (Lucene BM25, English stop words, no stemming); this module only indexes a
question's paragraphs and orders and trims the results. Arguments come from harness code, so
they are checked and a bad one raises (the sandbox hands the error back to the harness).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Paragraph:
    title: str
    text: str
    is_supporting: bool = False  # Gold supporting paragraph; for analysis only, never shown to harnesses.


def _bm25s():
    # Imported on first use: bm25s touches JAX at import time, which must not happen before a
    # multi-process run has called jax.distributed.initialize.
    import bm25s

    return bm25s


def _tokens(texts: list[str], return_ids: bool):
    return _bm25s().tokenize(texts, stopwords="en", show_progress=False, return_ids=return_ids)


class BM25Retriever:
    """Ranks a fixed list of paragraphs (title and text indexed together) for free-text queries."""

    def __init__(self, paragraphs: Sequence[Paragraph]):
        self.paragraphs = tuple(paragraphs)
        corpus = _tokens([f"{p.title}. {p.text}" for p in self.paragraphs], return_ids=True)
        # A corpus with no indexable word at all (only stop words) can match nothing.
        self._index = None
        if corpus.vocab:
            self._index = _bm25s().BM25()
            self._index.index(corpus, show_progress=False)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every paragraph for `query` (0 where no query word occurs)."""
        words = _tokens([query], return_ids=False)[0]
        if self._index is None or not words:
            return np.zeros(len(self.paragraphs))
        return np.asarray(self._index.get_scores(words), dtype=np.float64)

    def retrieve(self, query: str, k: int = 5) -> list[dict]:
        """Up to k paragraphs sharing a word with `query`, best first (ties: paragraph order).

        A k above the number of paragraphs returns them all; each result is {"title", "text"}.
        """
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        scores = self.scores(query)
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        return [
            {"title": self.paragraphs[i].title, "text": self.paragraphs[i].text} for i in order[:k] if scores[i] > 0
        ]
