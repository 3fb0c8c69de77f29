"""SQuAD-style answer normalisation, exact match and token F1, as the official multi-hop QA scripts do.

Normalisation (HotpotQA, MuSiQue and 2WikiMultihopQA agree): lowercase, drop ASCII punctuation,
drop the articles a/an/the, collapse whitespace. F1 is over whitespace tokens of the normalised
strings. HotpotQA and 2WikiMultihopQA add the yes/no rule: if either side normalises to "yes",
"no" or "noanswer" and the two differ, F1 is 0 (no partial credit for "no" vs "no way").
MuSiQue has no such rule. Aliases are handled by taking the best score over all gold strings.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Callable, Iterable

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_YES_NO = frozenset({"yes", "no", "noanswer"})


def normalize_answer(text: str) -> str:
    """Lowercase, strip punctuation, remove articles, collapse whitespace (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1_score(prediction: str, gold: str, *, yes_no_rule: bool) -> float:
    """Token F1 of the normalised strings; `yes_no_rule` as in HotpotQA (see module docstring)."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if yes_no_rule and (pred in _YES_NO or ref in _YES_NO) and pred != ref:
        return 0.0
    pred_tokens, ref_tokens = pred.split(), ref.split()
    if not pred_tokens or not ref_tokens:
        # Nothing left after normalising: right only if both are empty (MuSiQue's and SQuAD's rule;
        # HotpotQA's script scores this 0, which differs only for a gold made of articles and punctuation).
        return float(pred_tokens == ref_tokens)
    common = sum((collections.Counter(pred_tokens) & collections.Counter(ref_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(ref_tokens)
    return 2 * precision * recall / (precision + recall)


def best_over_golds(metric: Callable[[str, str], float], prediction: str, golds: Iterable[str]) -> float:
    """The best score of `prediction` against any gold answer or alias."""
    golds = list(golds)
    if not golds:
        raise ValueError("no gold answers to score against")
    return max(metric(prediction, g) for g in golds)
