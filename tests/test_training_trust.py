"""`plait train` / `Trainer` fail clearly and never pay twice (issue 20: 5, 10, 12, 16).

The classifier and rewriter helpers of `tests.test_trainer` decide each step's
outcome; calls that must be counted go to the loopback fake server.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import mock
from plait.learning.losses import Loss
from plait.learning.optimizers import SFAOptimizer
from plait.learning.trainer import HISTORY_FILE, Trainer, TrainerError
from tests.test_trainer import Classifier, classify, dataset


def _strict_json(text: str) -> Any:
    """``json.loads`` that refuses the NaN/Infinity tokens Python writes by default."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


# -- point 12: a NaN score is an error, and history.json is always JSON --------------------------
class RatioLoss(Loss):
    """A hand-written loss that divides by the target's length: NaN for an empty target."""

    def forward(self, output: Any, target: Any = None) -> float:
        return float(str(output) == str(target)) if target else math.nan


def test_a_nan_score_stops_training_naming_the_loss_and_the_example(
    resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    model = Classifier()
    data = [*dataset(3), ("a good thing with no label", "")]
    trainer = Trainer(
        model,
        RatioLoss(),
        SFAOptimizer(model.parameters(), alias="smart"),
        data,
        batch_size=4,
        checkpoint_dir=tmp_path,
        resources=resources,
    )
    with (
        mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True),
        pytest.raises(TrainerError) as caught,
    ):
        trainer.fit_sync()
    message = str(caught.value)
    assert "RatioLoss" in message and "nan" in message
    assert "a good thing with no label" in message
    # Nothing was trained on it, and what is on disk is strict JSON.
    assert trainer.history.steps == []
    history = tmp_path / HISTORY_FILE
    if history.exists():
        _strict_json(history.read_text(encoding="utf-8"))


def test_history_json_is_strict_json_even_for_a_nan_score(tmp_path: Path) -> None:
    from plait.learning.trainer import StepRecord, TrainingHistory

    history = TrainingHistory(initial_val_score=0.5, best_val_score=0.5)
    history.steps.append(StepRecord(1, 0, 0, math.nan, math.nan, None, False, False))
    with pytest.raises(ValueError):
        history.save(tmp_path / "history.json")
    assert not (tmp_path / "history.json").exists()


# -- the command ---------------------------------------------------------------------------------
PIPELINE = """
import plait

class Classifier(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", system_prompt=plait.Parameter("Label it.", description="Labelling."),
            demos=[],
        )

    def forward(self, text: str):
        return self.llm(text)
"""


def write_rows(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text(
        "".join(json.dumps({"input": text, "target": label}) + "\n" for text, label in rows),
        encoding="utf-8",
    )
    return path


def command(tmp_path: Path, base_url: str, *extra: str) -> list[str]:
    """``plait train`` of a one-call classifier on the fake server, data in tmp_path."""
    target = tmp_path / "pipeline.py"
    if not target.exists():
        target.write_text(PIPELINE, encoding="utf-8")
        endpoint = {"provider": "openai", "model": "m", "base_url": base_url, "api_key": "sk-test"}
        config = {alias: endpoint for alias in ("fast", "optimizer")}
        (tmp_path / "resources.yaml").write_text(json.dumps(config), encoding="utf-8")
        write_rows(tmp_path / "train.jsonl", dataset(4))
        write_rows(tmp_path / "val.jsonl", dataset(4))
        write_rows(tmp_path / "test.jsonl", dataset(6))
        write_rows(tmp_path / "other.jsonl", dataset(5))
    return [
        "train",
        f"{target}:Classifier",
        "--data",
        str(tmp_path / "train.jsonl"),
        "--resources",
        str(tmp_path / "resources.yaml"),
        "--out",
        str(tmp_path / "out"),
        "-q",
        *extra,
    ]


# -- point 10: the data files are part of a training run's identity -----------------------------
@pytest.mark.parametrize("changed", ["--val", "--test"])
def test_resuming_with_other_data_files_is_refused_naming_what_changed(
    server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], changed: str
) -> None:
    from plait.cli import main as cli_main

    sets = {"--val": "val.jsonl", "--test": "test.jsonl"}
    first = command(tmp_path, server.base_url, "--max-steps", "1")
    for flag, name in sets.items():
        first += [flag, str(tmp_path / name)]
    with mock({"fast": classify, "rewriter": "Answer GOOD."}, strict=True):
        assert cli_main(first) == 0
        capsys.readouterr()
        again = command(tmp_path, server.base_url)
        for flag, name in sets.items():
            again += [flag, str(tmp_path / ("other.jsonl" if flag == changed else name))]
        assert cli_main(again) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"({changed})" in err and "changed" in err
    other = "--test" if changed == "--val" else "--val"
    assert f"({other})" not in err
