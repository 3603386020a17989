"""The learning benchmark's data and pipelines (``benchmarks/data/learning``,
``benchmarks/learning.py``): the data is made the same way every time, its splits are
disjoint and of the sizes the benchmark reports, and every task's pipeline runs an
example against a real (fake) endpoint in each way a configuration can build it."""

from __future__ import annotations

import importlib.util
import json
import re
import types
from pathlib import Path

import pytest

import plait
from plait.testing import FakeOpenAIServer
from tests.conftest import make_resources

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "data" / "learning"
NEW_TASKS = ("sentiment", "field", "arithmetic", "review")
SPLITS = ("train", "val", "test")


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def learning() -> types.ModuleType:
    return importlib.import_module("benchmarks.learning")


def _rows(task: str, split: str) -> list[dict[str, str]]:
    lines = (DATA / task / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_making_the_data_again_writes_the_same_bytes_for_every_task(tmp_path: Path) -> None:
    make_data = _load("make_data", DATA / "make_data.py")
    make_data.make_all(tmp_path)
    made = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl"))
    bundled = sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*.jsonl"))
    assert made == bundled
    assert len(made) == 3 * 7
    for name in made:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


@pytest.mark.parametrize("task", NEW_TASKS)
def test_a_new_task_has_small_validation_and_disjoint_splits(task: str) -> None:
    rows = {split: _rows(task, split) for split in SPLITS}
    assert [len(rows[s]) for s in SPLITS] == [30, 10, 60]
    inputs = {split: {row["input"] for row in rows[split]} for split in SPLITS}
    assert [len(inputs[s]) for s in SPLITS] == [30, 10, 60]  # no repeat inside a split
    assert not inputs["train"] & inputs["val"]
    assert not inputs["train"] & inputs["test"]
    assert not inputs["val"] & inputs["test"]


def test_each_new_task_has_the_answers_its_description_promises() -> None:
    every = {task: [row for split in SPLITS for row in _rows(task, split)] for task in NEW_TASKS}
    verdicts = {row["target"] for row in every["sentiment"]}
    assert verdicts == {"positive", "negative"}
    for row in every["field"]:
        words = len(row["input"].split())
        assert 80 <= words <= 150, row
        dates = re.findall(r"(?:January|February|March|April|May|June|July|August|September"
                           r"|October|November|December) \d+", row["input"])  # fmt: skip
        assert row["target"] in dates and len(dates) >= 5, row
    for row in every["arithmetic"]:
        assert row["target"].isdigit(), row
    for row in every["review"]:
        verdict, product = row["target"].split(" ", 1)
        assert verdict in {"positive", "negative"}
        assert product in row["input"], row
    # Neither verdict is most of a split: a constant answer is not a good score.
    for task in ("sentiment", "review"):
        for split in SPLITS:
            share = sum(r["target"].startswith("positive") for r in _rows(task, split))
            assert 0.2 <= share / len(_rows(task, split)) <= 0.8, (task, split)


@pytest.mark.parametrize("task", NEW_TASKS)
@pytest.mark.parametrize("config", ["baseline", "recommended", "labels+calibrated+bootstrap"])
def test_every_new_pipeline_runs_an_example_on_an_endpoint(
    learning: types.ModuleType, server: FakeOpenAIServer, task: str, config: str
) -> None:
    config = learning.resolve(task, config)
    model, stages = learning.build(task, set(config.split("+")))
    text, target = learning.load_examples(DATA / task / "test.jsonl")[0]
    resources = make_resources(server, ("student",), max_concurrent=4)
    output = model.run_sync(text, resources=resources)
    calls = [m for _, m in model.named_modules() if isinstance(m, plait.LLMInference)]
    labelled = [c for c in calls if c.response_format is not None]
    assert bool(labelled) == (task in learning.LABEL_TASKS and "labels" in config)
    methods = {c.label_method for c in labelled}
    method = "calibrated" if "calibrated" in config else None
    assert methods == ({method} if labelled else set())
    knn = "knn" in config
    assert all(isinstance(c.demos.value, dict) == knn for c in calls)  # a pool, or a list
    assert len(server.stats()["requests"]) >= len(calls)
    if stages:  # a two-stage task: its stages' targets come from the example's target
        assert set(stages) == {name for name, _ in model.named_children()}
        assert " ".join(stages[name](target) for name in reversed(list(stages))) == target
    if task in ("sentiment", "review") and labelled:
        assert str(output).split(" ", 1)[0] in {"positive", "negative"}
    else:  # the fake endpoint echoes the instruction and the input
        assert str(output).startswith("[") and text.split()[0] in str(output)
    optimizers = learning.make_optimizers(config.split("+"), model, stages, 0)
    assert [type(o).__name__ for o in optimizers] == [
        type(learning.OPTIMIZERS[p](model, stages, 0)).__name__
        for p in config.split("+")
        if p in learning.OPTIMIZERS
    ]


def test_merging_the_published_run_files_still_reports_them(
    learning: types.ModuleType, tmp_path: Path
) -> None:
    """Run files written before the new tasks keep merging into the section, with the
    per-task line of plain bootstrap and the best configuration."""
    runs = ROOT / "benchmarks" / "results" / "learning-runs"
    published = ("extract-knn", "extract-refit", "classify-no-refit", "classify-refit")
    rows = learning.merged([runs / f"{name}.json" for name in (*published, "triage-refit")])
    assert {row["task"] for row in rows} == {"extract", "classify", "triage"}
    groups = learning.summary(rows)
    lines = learning.landmarks(groups)
    body = "\n".join(lines)
    # Files from before plain bootstrap was measured: it is said to be missing.
    extract = (
        "| extract | bootstrap | not measured | knn+search+refit | 97% (97%–97%, 3 seeds) "
        "| auto | not measured |"
    )
    assert extract in body
    # A task's baseline, once measured, is reported with its mean and range.
    fake = [
        dict(rows[0], task="sentiment", config="labels+bootstrap", seed=s, test_end=e)
        for s, e in ((0, 0.5), (1, 0.75), (2, 1.0))
    ]
    body = "\n".join(learning.landmarks(learning.summary(rows + fake)))
    assert "| sentiment | labels+bootstrap | 75% (50%–100%, 3 seeds) |" in body
    # auto is judged against both: plain bootstrap, and the best single configuration.
    assert learning.auto_missed(learning.summary(rows + fake)) == []
    auto = [dict(row, config="labels+auto", test_end=0.70) for row in fake]
    groups = learning.summary(rows + fake + auto)
    assert "| labels+auto | 70% (70%–70%, 3 seeds) |" in "\n".join(learning.landmarks(groups))
    assert learning.auto_missed(groups) == [
        "sentiment: auto's mean 70% < plain bootstrap's 75%",
        "sentiment: auto's mean 70% is more than 2% below labels+bootstrap's 75%",
    ]
    close = [dict(row, config="labels+auto", test_end=0.74) for row in fake]
    assert learning.auto_missed(learning.summary(rows + fake + close)) == [
        "sentiment: auto's mean 74% < plain bootstrap's 75%"
    ]
    # Plain bootstrap is the better of free text and labels: a user can run either.
    free = [dict(row, config="bootstrap", test_end=0.8) for row in fake]
    groups = learning.summary(rows + fake + free + close)
    assert "| sentiment | bootstrap | 80% (80%–80%, 3 seeds) |" in "\n".join(
        learning.landmarks(groups)
    )
    assert "sentiment: auto's mean 74% < plain bootstrap's 80%" in learning.auto_missed(groups)


def test_an_unknown_feature_or_task_is_refused_with_the_known_ones(
    learning: types.ModuleType,
) -> None:
    with pytest.raises(SystemExit, match=r"known: .*calibrated.*bootstrap"):
        learning.train_one("sentiment", "labels+bootsrap", 0, 1, 8, _Counts())
    with pytest.raises(SystemExit, match="known: extract"):
        learning.build("sentimnet", {"labels"})


class _Counts:
    """A cache's counters, for a run refused before its first call."""

    hits = 0
    misses = 0
