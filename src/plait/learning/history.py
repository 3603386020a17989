"""A training run's history: each step's scores and decisions, and how the run ended.

The history is the run's record for people and tools: the trainer saves it
beside its checkpoint (``history.json``) after every step, ``plait train``
prints it and `plot_history` draws it.  It is plain data, written as JSON a
strict parser reads, so a run can be inspected while it is still going.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from plait._files import write_atomic
from plait._secrets import scrub
from plait.learning.plot import plot_history

__all__ = ["Judgement", "StepRecord", "TrainingHistory", "Trial"]


@dataclass(slots=True)
class StepRecord:
    """One optimizer step: what the batch scored, what validation said, what was kept."""

    step: int
    epoch: int
    batch: int
    #: Mean loss score of the minibatch before the update (higher is better)...
    train_score: float
    #: ...and the loss proper, ``1 - train_score``, for those who plot losses going down.
    train_loss: float
    #: Mean validation score after the update (None without a validation set); with
    #: several optimizers, after the last one's (``trials`` has each).
    val_score: float | None
    #: Whether the update was kept (validation improved) or rolled back.
    kept: bool
    #: Whether validation beat the best score so far (resets the patience count).
    improved: bool
    #: Names of the parameters the optimizer changed.
    changed: list[str] = field(default_factory=list)
    #: Rewrites the optimizer refused (`check_rewrite`): parameter name -> why.
    rejected: dict[str, str] = field(default_factory=dict)
    #: Each optimizer's update in this step, in order (`Trial.to_json`): the values
    #: it tried, the validation score they got, and whether they were kept.
    trials: list[dict[str, Any]] = field(default_factory=list)
    #: Requests sent to endpoints during the step (minibatch, rewrites, validation;
    #: cache hits and mocked calls cost none) and the tokens they used.
    calls: int = 0
    tokens: int = 0


@dataclass(slots=True)
class Judgement:
    """An optimizer's own verdict on the update it just made, for the `Trainer`'s gate.

    The gate scores every update on the validation set and keeps it only if that
    score improved.  An optimizer that has already measured more than that can say
    so after its ``step()`` by setting its ``judgement`` attribute to one of these:

    * ``val_score``: the mean score of exactly the values it installed on the whole
      validation set (a search that scored its winner there): the gate uses it and
      does not pay for the same pass again;
    * ``keep``: its decision, made on stronger evidence than the validation set
      alone (cross-validation over training and validation examples, say): the gate
      follows it, and records ``evidence`` in the history beside the decision.

    Args:
        val_score: The installed values' mean validation score, or None to let the
            gate score them.
        keep: True or False to decide, None to let the gate compare scores.
        evidence: What the decision rests on, in a few words, for the history.
    """

    val_score: float | None = None
    keep: bool | None = None
    evidence: str = ""


@dataclass(slots=True)
class Trial:
    """One optimizer's update within a step, judged on validation on its own."""

    optimizer: str
    #: The new value of every parameter the update changed.
    tried: dict[str, Any]
    #: Validation score with these values (None without a validation set).
    val_score: float | None
    #: Kept (it beat the best score so far) or rolled back.
    kept: bool
    #: Rewrites the optimizer refused: parameter name -> why.
    rejected: dict[str, str] = field(default_factory=dict)
    #: Validation scores of the candidates the optimizer chose among (bootstrap).
    candidates: list[float] = field(default_factory=list)
    #: A searching optimizer's account of its step (`DemoSearch.search_report`): every
    #: candidate's scores at each rung, the finalists, the paired comparison.
    search: dict[str, Any] = field(default_factory=dict)
    #: What the keep-or-roll-back decision rested on when the optimizer judged its own
    #: update (`Judgement.evidence`); empty when the gate compared validation scores.
    decided_by: str = ""

    def to_json(self) -> dict[str, Any]:
        """The trial as plain data, as the history stores it.

        Returns:
            Its fields, by name.
        """
        return asdict(self)


@dataclass(slots=True)
class TrainingHistory:
    """What a training run did: every step's scores and decisions, and how the run ended.

    `Trainer.fit` returns it and saves it beside its checkpoint as
    ``history.json`` after every step, so a run can be inspected while it goes;
    ``plait train`` prints it and `plot` draws it.

    Args:
        initial_val_score: The validation score before any update.
        best_val_score: The best validation score so far: that of the values the
            pipeline holds.
        steps: One `StepRecord` per optimizer step.
        initial_test_score: The held-out test score before training.
        final_test_score: The held-out test score with the final values.
        stopped: "" while running; then ``"completed"``, ``"early_stopping"`` or
            ``"max_steps"``.
        refit: What ``Trainer(refit=True)`` did once training had ended: the
            examples it ran and, per pool it grew, its size before and after.
    """

    initial_val_score: float | None = None
    best_val_score: float | None = None
    steps: list[StepRecord] = field(default_factory=list)
    #: The held-out test set's score before training and with the final values
    #: (`Trainer(test_data=...)`, ``plait train --test``).
    initial_test_score: float | None = None
    final_test_score: float | None = None
    #: "" while running; then "completed", "early_stopping" or "max_steps".
    stopped: str = ""
    #: What ``Trainer(refit=True)`` did once training had ended (empty otherwise):
    #: the labelled examples it ran (training and validation) and, per pool it grew,
    #: its size before and after.
    refit: dict[str, Any] = field(default_factory=dict)

    @property
    def final_val_score(self) -> float | None:
        """The validation score of the parameters the run ends with (kept updates only)."""
        return self.best_val_score

    def to_json(self) -> dict[str, Any]:
        """The history as plain data, as ``history.json`` holds it.

        Returns:
            JSON-ready data; `from_json` reads it back.
        """
        return {
            "initial_val_score": self.initial_val_score,
            "best_val_score": self.best_val_score,
            "initial_test_score": self.initial_test_score,
            "final_test_score": self.final_test_score,
            "stopped": self.stopped,
            "refit": self.refit,
            "steps": [asdict(record) for record in self.steps],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrainingHistory:
        """Read what `to_json` wrote (``json.load`` of a ``history.json``).

        Args:
            data: The history as plain data.

        Returns:
            The history.
        """
        return cls(
            initial_val_score=data.get("initial_val_score"),
            best_val_score=data.get("best_val_score"),
            steps=[StepRecord(**record) for record in data.get("steps", [])],
            stopped=data.get("stopped", ""),
            initial_test_score=data.get("initial_test_score"),
            final_test_score=data.get("final_test_score"),
            refit=dict(data.get("refit") or {}),
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the history as JSON, atomically: a reader never sees half a file.

        Credentials that appear in quoted model text are scrubbed.

        Args:
            path: Where to write.

        Returns:
            The path written.

        Raises:
            ValueError: A score is not finite (JSON cannot hold it).
        """
        target = Path(path)
        # Rejections and tried values quote model text: no credential is written with them.
        # allow_nan=False: a NaN would be written as a bare token no strict parser reads.
        text = json.dumps(self.to_json(), indent=2, allow_nan=False)
        write_atomic(target, scrub(text) + "\n")
        return target

    def plot(self, path: str | os.PathLike[str]) -> Path:
        """Draw the validation and minibatch scores to a PNG (needs matplotlib).

        Args:
            path: Where to write the image.

        Returns:
            The path written.
        """
        return plot_history(self, path)
