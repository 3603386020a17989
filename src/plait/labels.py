"""Answers that are always a label: ``response_format=Literal["a", "b", ...]`` or an `Enum`.

A small model asked to classify drifts into sentences ("This message is about
billing.").  A call whose ``response_format`` is a fixed set of texts gets the
label itself, always, by one of three methods (``LLMInference(label_method=...)``):

- ``"grammar"``: decoding is constrained so that the only replies possible are the
  labels: a grammar on the embedded model, a JSON schema with an ``enum`` on
  endpoints with structured outputs, a tool schema on Anthropic.
- ``"logprob"``: one token is generated and each label is scored by the probability
  the model gives to starting its reply with it (the probability mass of the first
  tokens that begin that label, and only that label); the likeliest label wins.
  Needs log-probabilities (the embedded model, OpenAI-compatible endpoints).
- ``"calibrated"``: as ``"logprob"``, divided by the label prior the same prompt
  gives a content-free input ("N/A"): a model's bias toward one label, which its
  system prompt and demonstrations cause, is taken out ("Calibrate Before Use",
  Zhao et al. 2021).  The prior costs one request per call site (and
  demonstrations), remembered by the endpoint.

The scoring methods run on the provider's wire (`plait.providers.scoring`).
Whatever the method, the reply is read leniently (`match_label`): JSON or bare
text, any case, surrounding quotes and punctuation; a reply that names exactly one
label is that label; anything else is a `ValueError` naming the labels, which the
endpoint quotes back to the model once before the call fails.

Examples:
    ```python
    from typing import Literal

    import plait

    fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
    resources = plait.ResourceConfig({"fast": fast})
    route = plait.LLMInference(
        "fast",
        system_prompt="Which team should answer this message?",
        response_format=Literal["billing", "technical", "other"],
    ).bind(resources=resources)
    print(route.run_sync("I was charged twice."))  # one of the three labels
    ```
"""

from __future__ import annotations

import difflib
import enum
import functools
import json
import math
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

__all__ = [
    "CONTENT_FREE",
    "DEFAULT_LOCAL_METHOD",
    "LABEL_METHODS",
    "LABEL_METHOD_DESCRIPTION",
    "LabelMethod",
    "check_label_method",
    "choose_label",
    "label_choices",
    "label_output",
    "label_scores",
    "labels_instruction",
    "match_label",
    "normalized",
]

LabelMethod = Literal["grammar", "logprob", "calibrated"]
"""How a label call chooses its label: the values of ``LLMInference(label_method=...)``."""

LABEL_METHODS: tuple[str, ...] = typing.get_args(LabelMethod)
"""The label methods, in order: ``("grammar", "logprob", "calibrated")``."""

DEFAULT_LOCAL_METHOD: LabelMethod = "logprob"
"""How the embedded model chooses a label when the call does not say.

Scoring is as accurate as the grammar on plait's labelling benchmark and generates
one token where the grammar spells the label out, so it is faster; ``"calibrated"``
does better with a few fixed demonstrations, at a second request per prompt.  The
Benchmarks page has the figures, measured with ``python benchmarks/labels.py``.
"""

LABEL_METHOD_DESCRIPTION = (
    "How the call chooses its label: grammar (decoding constrained to the labels), logprob "
    "(each label scored by its log-probability), calibrated (scored, less the prior of a "
    "content-free input), or null for the endpoint's best."
)
"""The description of a label call's ``label_method`` `Parameter`."""


def check_label_method(value: Any) -> Any:
    """``value`` if it is a label method (or None, the endpoint's best).

    The check of the ``label_method`` parameter, so a saved method loads back only
    if it is one of `LABEL_METHODS`.

    Args:
        value: A method name, or None.

    Returns:
        ``value`` unchanged.

    Raises:
        ValueError: ``value`` is neither None nor one of `LABEL_METHODS`.

    Examples:
        >>> from plait.labels import check_label_method
        >>> check_label_method("calibrated")
        'calibrated'
    """
    if value is not None and value not in LABEL_METHODS:
        raise ValueError(
            f"label_method must be one of {', '.join(LABEL_METHODS)} (or None for the "
            f"endpoint's best), got {value!r}"
        )
    return value


CONTENT_FREE = "N/A"
"""The content-free input whose label distribution is the prior ``"calibrated"`` divides by."""

#: Floor for a label no listed token begins when no alternative is listed at all.
UNSEEN = -1e9


def label_choices(tp: Any) -> tuple[str, ...] | None:
    """The labels of a label type, in order, or None for any other ``response_format``.

    A label type is a ``Literal`` of texts or an `Enum` whose values are all texts
    (a ``str`` mixin or not); the labels must be distinct and not empty.  Asked at
    every call, so remembered per type.

    Args:
        tp: A ``response_format``.

    Returns:
        The labels, or None when ``tp`` is not a label type.

    Raises:
        TypeError: When a label is empty, or two differ only in case.

    Examples:
        >>> from typing import Literal
        >>> from plait.labels import label_choices
        >>> label_choices(Literal["yes", "no"])
        ('yes', 'no')
        >>> label_choices(dict) is None
        True
    """
    if tp is None:
        return None
    try:
        return _label_choices_cached(tp)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _label_choices(tp)


@functools.lru_cache(maxsize=256)
def _label_choices_cached(tp: Any) -> tuple[str, ...] | None:
    return _label_choices(tp)


def _label_choices(tp: Any) -> tuple[str, ...] | None:
    if typing.get_origin(tp) is Literal:
        values = typing.get_args(tp)
        if not values or not all(isinstance(v, str) for v in values):
            return None
        choices = tuple(str(v) for v in values)
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        members = list(tp)
        if not members or not all(isinstance(m.value, str) for m in members):
            return None
        choices = tuple(str(m.value) for m in members)
    else:
        return None
    if any(not c.strip() for c in choices):
        raise TypeError(f"response_format={tp!r} has an empty label: every label needs text")
    folded = [c.casefold() for c in choices]
    if len(set(folded)) != len(folded):
        raise TypeError(
            f"response_format={tp!r} has labels that differ only in case; a reply could "
            "not tell them apart: make them distinct"
        )
    return choices


def labels_instruction(choices: Sequence[str]) -> str:
    """The line a label call's system prompt ends with, and a re-ask says.

    The model is told its answers, whatever method then picks one.

    Args:
        choices: The labels.

    Returns:
        The instruction.

    Examples:
        >>> from plait.labels import labels_instruction
        >>> labels_instruction(["yes", "no"])
        'Answer with exactly one of: yes, no.'
    """
    return "Answer with exactly one of: " + ", ".join(choices) + "."


def label_output(tp: Any, label: str) -> Any:
    """What a label call returns for ``label``: its text, or the member of an `Enum`.

    Args:
        tp: The label type.
        label: One of its labels.

    Returns:
        The label's text, or the `Enum` member whose value it is.
    """
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(label)
    return label


def match_label(tp: Any, text: str) -> Any:
    """The label a reply names, read leniently.

    In order: the reply's JSON value (``{"value": ...}`` as the wire schema asks,
    or a JSON string) or its text; that text without surrounding quotes, spaces
    and punctuation, in any case; the one label named as a whole word; the one
    label the text is a near spelling of.

    Args:
        tp: The label type.
        text: The reply's text.

    Returns:
        The label, as `label_output` gives it.

    Raises:
        TypeError: When ``tp`` is not a label type.
        ValueError: When the reply names no label, or several (naming the labels).

    Examples:
        >>> from typing import Literal
        >>> from plait.labels import match_label
        >>> match_label(Literal["billing", "technical"], "Billing.")
        'billing'
        >>> match_label(Literal["billing", "technical"], 'This is about "technical".')
        'technical'
    """
    choices = label_choices(tp)
    if choices is None:
        raise TypeError(f"response_format={tp!r} is not a set of labels")
    candidate = _json_value(text)
    by_fold = {c.casefold(): c for c in choices}
    bare = _bare(candidate)
    if bare in by_fold:
        return label_output(tp, by_fold[bare])
    named = {
        c
        for c in choices
        if re.search(rf"(?<!\w){re.escape(c.casefold())}(?!\w)", candidate.casefold())
    }
    if len(named) == 1:
        return label_output(tp, named.pop())
    close = difflib.get_close_matches(bare, list(by_fold), n=2, cutoff=0.8)
    if len(close) == 1:
        return label_output(tp, by_fold[close[0]])
    shown = text if len(text) <= 80 else text[:77] + "..."
    why = "names several of them" if len(named) > 1 else "is none of them"
    raise ValueError(f"reply {shown!r} {why}; answer with exactly one of: {', '.join(choices)}")


def stated_label(answer: Any, choices: Sequence[str]) -> str | None:
    """The label of ``choices`` that ``answer`` states, as it is spelled there, or None.

    What a demonstration's answer is read as: the label in any case, with quotes,
    spaces and punctuation around it, or as the wire carries it (``{"value": "x"}``
    as JSON text or data, a JSON string), or an `Enum` member whose value is a label.
    Unlike `match_label` (for replies), a sentence that names a label, or a near
    spelling, states none: a demonstration is data a user or training wrote, and
    only what is unmistakably a label is rewritten as one.
    """
    if isinstance(answer, enum.Enum):
        answer = answer.value
    if isinstance(answer, Mapping) and len(answer) == 1:
        answer = next(iter(answer.values()))
    if not isinstance(answer, str):
        return None
    bare = _bare(_json_value(answer))
    return next((c for c in choices if c.casefold() == bare), None)


def _bare(text: str) -> str:
    """``text`` without surrounding quotes, spaces and punctuation, case folded."""
    return text.strip().strip("\"'`*.,;:!?()[]{} \n\t").casefold()


def _json_value(text: str) -> str:
    """The text inside a JSON reply (``{"value": "x"}`` or ``"x"``), else ``text``."""
    stripped = text.strip()
    if stripped[:1] not in ("{", '"'):
        return text
    try:
        data = json.loads(stripped)
    except ValueError:
        return text
    if isinstance(data, dict) and len(data) == 1:  # {"value": ...}, as the wire asks
        data = next(iter(data.values()))
    return data if isinstance(data, str) else text


def label_scores(top: Sequence[Mapping[str, Any]], choices: Sequence[str]) -> dict[str, float]:
    """Each label's log-probability of starting the reply.

    A label's mass is the sum over the listed tokens that begin it (ignoring case
    and leading space) and begin no other label: a token shared by several labels
    ("te" for "technical" and "test") says nothing about which.  A label no listed
    token begins gets a floor below every listed alternative.

    Args:
        top: The first generated token's alternatives, ``{"token": ..., "logprob":
            ...}`` dicts as `LLMResponse.logprobs` holds them.
        choices: The labels.

    Returns:
        Each label's log-probability (or the floor).
    """
    folded = [c.casefold() for c in choices]
    mass = dict.fromkeys(choices, 0.0)
    floor = 0.0
    for alt in top:
        token, logprob = alt.get("token"), alt.get("logprob")
        if not isinstance(token, str) or not isinstance(logprob, int | float):
            continue
        floor = min(floor, float(logprob))
        piece = token.lstrip().casefold()
        if not piece:
            continue
        begun = [c for c, f in zip(choices, folded, strict=True) if f.startswith(piece)]
        if len(begun) == 1:
            mass[begun[0]] += math.exp(float(logprob))
    unseen = (floor - 1.0) if top else UNSEEN
    return {c: math.log(m) if m > 0 else unseen for c, m in mass.items()}


def choose_label(scores: Mapping[str, float], prior: Mapping[str, float] | None = None) -> str:
    """The label with the highest score (less its prior's, when calibrating).

    Args:
        scores: Each label's log-score (`label_scores`).
        prior: Each label's log-score for a content-free input, to subtract; None
            to take the scores as they are.

    Returns:
        The best label; ties go to the label listed first.
    """
    best, best_score = "", -math.inf
    for label, score in scores.items():
        value = score - prior[label] if prior is not None else score
        if value > best_score:
            best, best_score = label, value
    return best


def normalized(scores: Mapping[str, float]) -> dict[str, float]:
    """Log-scores as probabilities over the labels (summing to 1).

    Args:
        scores: Each label's log-score.

    Returns:
        Each label's probability.

    Examples:
        >>> import math
        >>> from plait.labels import normalized
        >>> normalized({"yes": math.log(3), "no": math.log(1)})
        {'yes': 0.75, 'no': 0.25}
    """
    top = max(scores.values())
    weights = {label: math.exp(score - top) for label, score in scores.items()}
    total = sum(weights.values())
    return {label: weight / total for label, weight in weights.items()}
