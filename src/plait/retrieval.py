"""Lexical similarity without a model: Okapi BM25 over a small set of texts.

Demonstrations chosen per input (`plait.demos`) need "which of these examples is
most like this input" at every call, in the process, with no endpoint and no
download.  BM25 answers that from word overlap weighted by rarity, which for short
task inputs (support messages, questions) finds the examples that share the
input's content words; it is the standard lexical baseline of retrieval and of
example selection for in-context learning.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

__all__ = ["BM25", "tokens"]

_WORD = re.compile(r"\w+", re.UNICODE)


def tokens(text: str) -> list[str]:
    """The words of ``text``, case-folded: what BM25 compares."""
    return _WORD.findall(text.casefold())


class BM25:
    """An index of ``documents``; `scores` rates each against a query.

    ``k1`` bounds how much a repeated word counts, ``b`` how much a long document
    is discounted (the usual 1.5 and 0.75).  Built once per set of documents; a
    query costs one pass over the query's words.
    """

    def __init__(self, documents: Sequence[str], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self.counts = [Counter(tokens(doc)) for doc in documents]
        self.lengths = [sum(c.values()) for c in self.counts]
        size = len(documents)
        self.average = (sum(self.lengths) / size) if size else 0.0
        frequency: Counter[str] = Counter()
        for counted in self.counts:
            frequency.update(counted.keys())
        self.idf = {
            word: math.log(1.0 + (size - df + 0.5) / (df + 0.5)) for word, df in frequency.items()
        }

    def scores(self, query: str) -> list[float]:
        """Each document's BM25 score for ``query`` (0 for one sharing no word)."""
        words = Counter(tokens(query))
        result = [0.0] * len(self.counts)
        k1, b, average = self.k1, self.b, self.average or 1.0
        for index, (counted, length) in enumerate(zip(self.counts, self.lengths, strict=True)):
            norm = k1 * (1.0 - b + b * length / average)
            total = 0.0
            for word, times in words.items():
                tf = counted.get(word)
                if tf:
                    total += times * self.idf[word] * tf * (k1 + 1.0) / (tf + norm)
            result[index] = total
        return result
