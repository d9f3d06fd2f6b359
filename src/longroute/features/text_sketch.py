"""TF-IDF of word 1-2-grams, fitted by scikit-learn, applied to one text in plain Python.

scikit-learn's ``TfidfVectorizer.transform`` costs ~0.5-2 ms for a single short
document (input validation, a sparse matrix built per call). Chimera's router
featurises one prompt per routing decision, so :class:`TfidfSketch` keeps only
what the fitted vectorizer knows -- its vocabulary and idf weights -- and
reproduces its transform for one text: lowercase, ``\\b\\w\\w+\\b`` tokens,
unigrams and bigrams, counts, ``1 + log(count)`` (sublinear tf), times idf,
L2-normalised. The result is a sparse vector as two arrays (column indices,
values) that callers multiply with their own weight rows, e.g. ``values @
weights[indices]`` for a linear head or an SVD projection.

Cost: O(number of words), every per-word step in C: a regex scan, one
``Counter`` of words and word pairs (no string is built per bigram), one
``dict.get`` per distinct gram through ``map``, then numpy. Equal to
scikit-learn's transform up to float rounding (tests check it).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
"""scikit-learn's default token pattern: words of two or more word characters."""

# Equal to TOKEN_PATTERN's matches (a maximal run of >= 2 word characters always
# starts at a word boundary when scanned left to right) and ~40% faster.
_TOKEN_RE = re.compile(r"\w\w+")

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def new_vectorizer(*, max_features: int, min_df: int) -> Any:
    """The scikit-learn vectorizer :func:`TfidfSketch.from_vectorizer` mirrors."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(
        lowercase=True,
        token_pattern=TOKEN_PATTERN,
        ngram_range=(1, 2),
        sublinear_tf=True,
        min_df=min_df,
        max_features=max_features,
        norm="l2",
        dtype=np.float64,
    )


def fit_vectorizer(texts: Sequence[str], *, max_features: int, min_df: int) -> tuple[Any, Any]:
    """Fit the vectorizer on ``texts``; returns (vectorizer, sparse tf-idf matrix).

    Raises ``ValueError`` naming the setting when no gram survives ``min_df``.
    """
    vectorizer = new_vectorizer(max_features=max_features, min_df=min_df)
    try:
        matrix = vectorizer.fit_transform(texts)
    except ValueError as exc:
        raise ValueError(
            f"no word appears in at least min_df={min_df} of the {len(texts)} prompts "
            f"({exc}): give more rows, or prompts with text"
        ) from None
    return vectorizer, matrix


@dataclass(frozen=True, slots=True, eq=False)
class TfidfSketch:
    """A fitted TF-IDF vocabulary: column index per gram (a word, or a pair of words for a
    bigram) and idf weight per column. Memory: one dict entry per gram, one float per column.
    """

    vocabulary: Mapping[str | tuple[str, str], int]
    idf: FloatArray

    @classmethod
    def from_vectorizer(cls, vectorizer: Any) -> TfidfSketch:
        """The sketch of a fitted :func:`new_vectorizer`."""
        vocabulary: dict[str | tuple[str, str], int] = {}
        for gram, column in vectorizer.vocabulary_.items():
            words = gram.split(" ")
            key = gram if len(words) == 1 else (words[0], words[1])
            vocabulary[key] = int(column)
        return cls(vocabulary=vocabulary, idf=np.asarray(vectorizer.idf_, dtype=np.float64))

    @property
    def num_columns(self) -> int:
        """Vocabulary size."""
        return int(self.idf.shape[0])

    def transform(self, text: str) -> tuple[IntArray, FloatArray]:
        """The L2-normalised tf-idf vector of ``text`` as (columns, values); empty if no gram."""
        words = _TOKEN_RE.findall(text.lower())
        counts: Counter[str | tuple[str, str]] = Counter(words)
        counts.update(itertools.pairwise(words))
        # every per-gram step below runs in C (Counter, map over dict.get, fromiter)
        size = len(counts)
        columns = np.fromiter(
            map(self.vocabulary.get, counts, itertools.repeat(-1)), dtype=np.int64, count=size
        )
        known = columns >= 0
        index = columns[known]
        if not len(index):
            return index, np.zeros(0, dtype=np.float64)
        values = np.fromiter(counts.values(), dtype=np.float64, count=size)[known]
        np.log(values, out=values)
        values += 1.0
        values *= self.idf[index]
        values /= math.sqrt(float(values @ values))
        return index, values

    def transform_many(self, texts: Sequence[str]) -> Any:
        """A CSR matrix (one row per text) of :meth:`transform`, for batch prediction."""
        from scipy.sparse import csr_matrix

        pointers = [0]
        all_columns: list[IntArray] = []
        all_values: list[FloatArray] = []
        for text in texts:
            columns, values = self.transform(text)
            all_columns.append(columns)
            all_values.append(values)
            pointers.append(pointers[-1] + len(columns))
        data = np.concatenate(all_values) if all_values else np.zeros(0)
        indices = np.concatenate(all_columns) if all_columns else np.zeros(0, dtype=np.int64)
        shape = (len(texts), self.num_columns)
        return csr_matrix((data, indices, np.asarray(pointers)), shape=shape)
