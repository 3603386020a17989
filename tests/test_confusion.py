"""`plait.learning.confusion`: which datasets are classifications, and the counts of one."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import pytest

from plait.learning.confusion import (
    FAILED,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    NotLabels,
    confusion,
    find_labels,
)
from plait.learning.losses import ExactMatch


class Verdict(Enum):
    SPAM = "Spam"
    HAM = "ham"


def test_labels_are_the_targets_as_exact_compares_them_sorted() -> None:
    assert find_labels(["Spam", " spam ", "ham", "HAM", "eggs  and\tham"]) == [
        "eggs and ham",
        "ham",
        "spam",
    ]
    assert find_labels([1, 0, 1]) == ["0", "1"]


@pytest.mark.parametrize(
    ("targets", "why"),
    [
        (["spam", "spam"], "one label is no choice"),
        (["spam", "ham", "eggs"], "each of the 3 targets differs"),
        (["spam", None, "spam"], "example 1's target None is missing"),
        (["spam", ["a", "b"], "spam"], "is a list, not a text label"),
        (["spam", {"a": 1}, "spam"], "is a dict, not a text label"),
        (["spam", 0.5, "spam"], "is a float, not a text label"),
        (["spam", "first line\nsecond line", "spam"], "spans several lines"),
        (["spam", "   ", "spam"], "is empty"),
        (["spam", "x" * (MAX_LABEL_CHARS + 1), "spam"], f"over {MAX_LABEL_CHARS}"),
        ([f"label {i}" for i in range(MAX_LABELS + 1)] * 2, f"{MAX_LABELS + 1} distinct values"),
        ([], "no examples"),
    ],
)
def test_targets_that_are_not_a_classification_say_why(targets: list[Any], why: str) -> None:
    with pytest.raises(NotLabels, match=why):
        find_labels(targets)


def test_the_limits_themselves_are_a_classification() -> None:
    assert len(find_labels([f"label {i}" for i in range(MAX_LABELS)] * 2)) == MAX_LABELS
    assert find_labels(["x" * MAX_LABEL_CHARS, "y", "y"]) == ["x" * MAX_LABEL_CHARS, "y"]
    assert find_labels([" padded  \n", "y", "y"]) == ["padded", "y"]  # one line once trimmed
    assert find_labels(["a", "b", "A"]) == ["a", "b"]  # shared once compared as exact does


def test_force_takes_any_targets_but_a_missing_one() -> None:
    assert find_labels(["spam", "spam"], force=True) == ["spam"]
    assert find_labels(["spam", "ham"], force=True) == ["ham", "spam"]
    assert find_labels(["a\nb", 0.5], force=True) == ["0.5", "a b"]
    assert len(find_labels([f"l{i}" for i in range(MAX_LABELS + 5)], force=True)) == 25
    with pytest.raises(NotLabels, match="example 1's target None is missing"):
        find_labels(["spam", None], force=True)


def test_counts_precision_recall_and_f1() -> None:
    pairs = [
        ("spam", " SPAM"),  # right, after the exact loss's normalisation
        ("spam", Verdict.SPAM),  # an Enum counts as its value
        ("spam", "ham"),
        ("ham", Verdict.HAM),
        ("ham", "ham"),
        ("ham", "maybe"),  # none of the labels
        ("ham", FAILED),
        ("eggs", "eggs"),
    ]
    table = confusion(pairs, ["spam", "ham", "eggs"])
    assert table.labels == ["eggs", "ham", "spam"]
    rows = {row.label: row for row in table.rows}
    assert rows["spam"].predicted == {"eggs": 0, "ham": 1, "spam": 2}
    assert rows["ham"].predicted == {"eggs": 0, "ham": 2, "spam": 0}
    assert (rows["ham"].other, rows["ham"].errors, rows["ham"].support) == (1, 1, 4)
    assert (rows["spam"].other, rows["spam"].errors, rows["spam"].support) == (0, 0, 3)
    # ham: 2 right of 3 answered "ham" (precision) and of 4 that were ham (recall)
    assert (rows["ham"].precision, rows["ham"].recall) == (2 / 3, 0.5)
    assert rows["ham"].f1 == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert (rows["spam"].precision, rows["spam"].recall) == (1.0, 2 / 3)
    assert rows["eggs"].f1 == 1.0
    assert (table.examples, table.correct, table.accuracy) == (8, 5, 5 / 8)
    assert table.macro_f1 == pytest.approx(sum(row.f1 for row in table.rows) / 3)


def test_accuracy_is_what_exact_match_scores() -> None:
    """The table counts a match exactly when the exact loss scores 1."""
    pairs: list[tuple[Any, Any]] = [
        ("Spam", "  spam\n"),
        ("Spam", Verdict.SPAM),
        ("ham", "Ham."),
        ("ham", "h a m"),
        ("ham", Verdict.HAM),
        ("Spam", ["spam"]),
    ]
    table = confusion(pairs, find_labels([target for target, _ in pairs]))
    scores = [ExactMatch()(prediction, target).score for target, prediction in pairs]
    assert table.correct == sum(scores) == 3


def test_a_label_never_answered_has_precision_zero_and_code_counts_as_other() -> None:
    table = confusion([("a", "b"), ("b", print)], ["a", "b"])
    rows = {row.label: row for row in table.rows}
    assert (rows["a"].precision, rows["a"].recall, rows["a"].f1) == (0.0, 0.0, 0.0)
    assert rows["b"].other == 1 and rows["b"].precision == 0.0
    assert table.accuracy == 0.0 and table.macro_f1 == 0.0


def test_a_target_outside_the_labels_is_refused() -> None:
    with pytest.raises(ValueError, match="'c' is none of the labels"):
        confusion([("a", "a"), ("c", "a")], ["a", "b"])


def test_as_json_is_plain_json_with_every_count() -> None:
    table = confusion([("a", "a"), ("b", "a"), ("b", FAILED)], ["a", "b"])
    data = json.loads(json.dumps(table.as_json()))
    assert data["labels"] == ["a", "b"]
    assert (data["examples"], data["correct"], data["accuracy"]) == (3, 1, 1 / 3)
    assert data["rows"][1] == {
        "label": "b",
        "predicted": {"a": 1, "b": 0},
        "other": 0,
        "errors": 1,
        "support": 2,
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
    }
    assert data["macro_f1"] == pytest.approx((2 * 0.5 * 1 / 1.5) / 2)
