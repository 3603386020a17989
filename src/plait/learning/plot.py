"""A training history drawn as a PNG (`plot_history`, ``plait train --plot``).

The only module of plait that uses matplotlib, and it imports it inside
`plot_history` alone: training, and ``import plait``, must not need it.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from plait._files import write_atomic
from plait.learning.failures import TrainerError


class History(Protocol):
    """What the plot reads of a `plait.learning.history.TrainingHistory` (which draws
    itself with this module, so the plot names only what it reads)."""

    @property
    def steps(self) -> Sequence[Any]: ...

    @property
    def initial_val_score(self) -> float | None: ...

    @property
    def stopped(self) -> str: ...


__all__ = ["plot_history"]


def plot_history(history: History, path: str | os.PathLike[str]) -> Path:
    """The validation and train (minibatch) scores per step, as a PNG.

    Two panels, so the curves never hide each other even when they coincide:
    validation on top (each update tried: a filled marker when kept, a red cross
    when rolled back; the line follows the best score so far, i.e. the values the
    pipeline has), the minibatch score below.  A curve that does not move is
    labelled "flat at X" and every point is annotated with its value (up to 30
    steps), so a run that learned nothing reads as such instead of as an empty
    frame.  matplotlib is imported here and only here: training itself must not
    need it, and ``import plait`` must stay fast.
    """
    try:
        import matplotlib
    except ImportError:
        raise TrainerError(
            "plotting the training history needs matplotlib: pip install 'plait[plot]'"
        ) from None
    matplotlib.use("Agg")  # files only: no display, works on servers and in CI
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    target = Path(path)
    steps = [record.step for record in history.steps]
    annotate = len(steps) <= 30
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), dpi=100, sharex=True)
    try:
        if history.initial_val_score is not None:
            tried = [
                (r.step, t["val_score"], t["kept"])
                for r in history.steps
                for t in (r.trials or [{"val_score": r.val_score, "kept": r.kept}])
                if t["val_score"] is not None and t.get("tried", True)
            ]
            best = [history.initial_val_score]
            for step in steps:  # the score of the values each step ended with
                scores = [y for x, y, k in tried if x == step and k]
                best.append(scores[-1] if scores else best[-1])
            xs = [0, *steps]
            top.step(
                xs,
                best,
                where="post",
                color="tab:blue",
                label=_flat_label("best validation score (the values kept)", best),
            )
            kept = [(x, y) for x, y, k in tried if k]
            rolled = [(x, y) for x, y, k in tried if not k]
            if kept:
                top.plot(
                    *zip(*kept, strict=True),
                    "o",
                    color="tab:blue",
                    markersize=8,
                    label="update kept",
                )
            if rolled:
                top.plot(
                    *zip(*rolled, strict=True),
                    "x",
                    color="red",
                    markersize=10,
                    markeredgewidth=2,
                    label="update rolled back",
                )
            top.plot([0], [history.initial_val_score], "s", color="black", label="start")
            if annotate:
                _label_points(top, [(0, history.initial_val_score), *[(a, b) for a, b, _ in tried]])
        else:
            top.text(
                0.5,
                0.5,
                "no validation set: every update was kept unjudged",
                ha="center",
                va="center",
                transform=top.transAxes,
            )
        ran = [(x, r.train_score) for x, r in zip(steps, history.steps, strict=True)]
        train_steps = [x for x, score in ran if score is not None]
        train = [score for _, score in ran if score is not None]
        bottom.plot(
            train_steps,
            train,
            "o-",
            color="tab:orange",
            label=_flat_label("minibatch score (before the step's updates)", train),
        )
        if annotate:
            _label_points(bottom, list(zip(train_steps, train, strict=True)))
        for ax, title in ((top, "validation"), (bottom, "training minibatches")):
            ax.set_ylim(-0.08, 1.12)
            ax.set_ylabel("score (higher is better)")
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.3)
            ax.legend(loc="best", fontsize=8)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        bottom.set_xlabel("step")
        fig.suptitle(f"training history ({history.stopped or 'in progress'})")
        fig.tight_layout()
        image = io.BytesIO()
        fig.savefig(image, format="png")
        write_atomic(target, image.getvalue())
    finally:
        plt.close(fig)
    return target


def _label_points(ax: Any, points: list[tuple[float, float]]) -> None:
    """Write each point's score just above it."""
    for x, y in points:
        ax.annotate(
            f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=7
        )


def _flat_label(label: str, values: list[float]) -> str:
    """``label``, saying so when every value is the same (a flat line is easy to miss)."""
    if values and max(values) - min(values) < 1e-12:
        return f"{label}: flat at {values[0]:.3f}"
    return label
