"""Per-label counts for a classification: what each example was, what the pipeline said.

A mean score says how often a classifier is right, not where it goes wrong: which
label it confuses with which, which label it never says, how often it answers
with none of the labels at all.  `find_labels` decides whether a dataset is a
classification (its targets a few short labels), and `confusion` counts
(target, prediction) pairs into a `Confusion`: the matrix, each label's support,
precision, recall and F1, the macro-F1 and the accuracy.

A prediction is compared as `ExactMatch` compares it (`exact_text`: an Enum as its
value, case, surrounding and repeated whitespace ignored), so the table counts
exactly what ``--loss exact`` scores.  Labels are shown in that compared form.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from plait.learning.losses import exact_text

__all__ = [
    "FAILED",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "Confusion",
    "LabelRow",
    "NotLabels",
    "confusion",
    "find_labels",
]

#: At most this many distinct targets make a classification: more is a task with
#: free answers (names, numbers), whose table would be mostly empty cells.
MAX_LABELS = 20
#: A label is short: a longer target is a sentence to produce, not a class to pick.
MAX_LABEL_CHARS = 40


class _Failed:
    """The prediction of an example whose pipeline (or loss) raised: no output at all."""

    def __repr__(self) -> str:
        return "FAILED"


#: Stands for the prediction of a failed example in a (target, prediction) pair.
FAILED: Final = _Failed()


class NotLabels(ValueError):
    """The targets are not a classification's labels; the message says which and why."""


@dataclass(frozen=True)
class LabelRow:
    """One true label's row: where its examples went, and how well the label did."""

    label: str
    #: Examples of this label the pipeline answered with each label (every label a key).
    predicted: dict[str, int]
    #: Examples answered with text that is none of the labels.
    other: int
    #: Examples whose run failed.
    errors: int
    support: int
    #: Of the examples answered with this label, the share that had it (0 if none were).
    precision: float
    #: Of the examples that had this label, the share answered with it.
    recall: float
    f1: float


@dataclass(frozen=True)
class Confusion:
    """The confusion matrix of a classification, one `LabelRow` per label, sorted."""

    rows: tuple[LabelRow, ...]
    examples: int
    #: Examples answered with their own label.
    correct: int
    #: Examples answered with their own label, over all examples (failed ones included).
    accuracy: float
    #: The unweighted mean of the labels' F1: a rare label counts as much as a common one.
    macro_f1: float

    @property
    def labels(self) -> list[str]:
        return [row.label for row in self.rows]

    def as_json(self) -> dict[str, Any]:
        """The same numbers as plain JSON data (``plait eval --report``)."""
        return {"labels": self.labels, **asdict(self)}


def find_labels(targets: Sequence[Any], *, force: bool = False) -> list[str]:
    """The sorted labels of a classification whose examples have ``targets``.

    A classification: every target a text (or an integer) on one line, of 1 to
    `MAX_LABEL_CHARS` characters as compared, with 2 to `MAX_LABELS` distinct values,
    fewer than the examples: targets all distinct are answers (one per question),
    not classes.  With ``force`` only a target on every example is required.  Raises `NotLabels`
    naming the first example that does not fit, or the count that does not.
    """
    keys: set[str] = set()
    for index, target in enumerate(targets):
        why = _why_not_a_label(target, force)
        if why is not None:
            raise NotLabels(f"example {index}'s target {_shown(target)} {why}")
        keys.add(exact_text(target))
    if not keys:
        raise NotLabels("there are no examples")
    if not force and len(keys) < 2:
        raise NotLabels(f"every target is {_shown(next(iter(keys)))}: one label is no choice")
    if not force and len(keys) > MAX_LABELS:
        raise NotLabels(f"the targets take {len(keys)} distinct values, over {MAX_LABELS}")
    if not force and len(keys) == len(targets):
        raise NotLabels(f"each of the {len(keys)} targets differs: no label is shared")
    return sorted(keys)


def _why_not_a_label(target: Any, force: bool) -> str | None:
    """Why ``target`` cannot be a label (None when it can)."""
    if target is None:
        return "is missing"
    try:
        text = exact_text(target, normalize=False)
    except TypeError as exc:
        return f"cannot be compared: {exc}"
    if force:
        return None
    if not isinstance(target, str | int):
        return f"is a {type(target).__name__}, not a text label"
    if len(text.strip().splitlines()) > 1:
        return "spans several lines"
    key = exact_text(target)
    if not key:
        return "is empty"
    if len(key) > MAX_LABEL_CHARS:
        return f"is {len(key)} characters long, over {MAX_LABEL_CHARS}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def confusion(pairs: Iterable[tuple[Any, Any]], labels: Sequence[str]) -> Confusion:
    """Count (target, prediction) pairs into a `Confusion` over ``labels``.

    A prediction is `FAILED` for a failed example, else the pipeline's output; one
    that is none of the labels (or that cannot be compared as text) counts as other.
    Every target must be one of ``labels`` (as `find_labels` found them).
    """
    labels = sorted(labels)
    counts = {label: dict.fromkeys(labels, 0) for label in labels}
    other = dict.fromkeys(labels, 0)
    errors = dict.fromkeys(labels, 0)
    examples = 0
    for target, prediction in pairs:
        truth = exact_text(target)
        if truth not in counts:
            raise ValueError(f"target {truth!r} is none of the labels {list(labels)!r}")
        examples += 1
        predicted = _predicted(prediction)
        if predicted is FAILED:
            errors[truth] += 1
        elif predicted in counts:
            counts[truth][predicted] += 1
        else:
            other[truth] += 1
    rows = tuple(_row(label, counts, other[label], errors[label]) for label in labels)
    correct = sum(counts[label][label] for label in labels)
    return Confusion(
        rows=rows,
        examples=examples,
        correct=correct,
        accuracy=correct / examples if examples else 0.0,
        macro_f1=sum(row.f1 for row in rows) / len(rows) if rows else 0.0,
    )


def _predicted(prediction: Any) -> Any:
    """The label text of ``prediction`` as compared, `FAILED` kept, None when it has none."""
    if prediction is FAILED:
        return FAILED
    try:
        return exact_text(prediction)
    except TypeError:  # code, which ExactMatch refuses to score: not any label
        return None


def _row(label: str, counts: dict[str, dict[str, int]], other: int, errors: int) -> LabelRow:
    right = counts[label][label]
    support = sum(counts[label].values()) + other + errors
    said = sum(row[label] for row in counts.values())
    precision = right / said if said else 0.0
    recall = right / support if support else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return LabelRow(
        label=label,
        predicted=dict(counts[label]),
        other=other,
        errors=errors,
        support=support,
        precision=precision,
        recall=recall,
        f1=f1,
    )
