"""Parameter state kept apart from structure (seed 001): snapshots, split/merge, JSON, lock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.learning.state import (
    ParameterState,
    StructureLockedError,
    is_locked,
    lock,
    merge,
    snapshot,
)


class Tagger(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.instructions = plait.Parameter("Tag the text.", description="What to tag.")
        self.labels = plait.Parameter(["a", "b"], description="Allowed labels.")
        self.tag = plait.LLMInference("fast", system_prompt="You tag text.")

    def forward(self, text: str) -> Any:
        return self.tag(f"{self.instructions} {self.labels}\n{text}")


def test_snapshot_holds_values_and_flags_and_never_changes() -> None:
    tagger = Tagger()
    state = snapshot(tagger)
    assert dict(state) == {
        "instructions": "Tag the text.",
        "labels": ["a", "b"],
        "tag.system_prompt": "You tag text.",
    }
    assert state.requires_grad == {
        "instructions": True,
        "labels": True,
        "tag.system_prompt": False,
    }
    tagger.instructions.value = "changed"
    tagger.labels.value.append("c")  # even in-place changes to the module's value
    state["labels"].append("d")  # and to a value the snapshot handed out
    assert state["instructions"] == "Tag the text."
    assert state["labels"] == ["a", "b"]
    with pytest.raises(AttributeError, match="immutable"):
        state._values = {}
    with pytest.raises(KeyError, match="'nope'"):
        state["nope"]


def test_split_and_merge_are_inverse() -> None:
    state = snapshot(Tagger())
    trainable, frozen = state.split()
    assert set(trainable) == {"instructions", "labels"}
    assert set(frozen) == {"tag.system_prompt"}
    assert frozen.requires_grad == {"tag.system_prompt": False}
    assert merge(trainable, frozen) == state
    assert frozen.merge(trainable) == state
    tag_part, rest = state.split(lambda name: name.startswith("tag."))
    assert set(tag_part) == {"tag.system_prompt"} and len(rest) == 2


def test_merge_conflict_names_the_key() -> None:
    state = snapshot(Tagger())
    trainable, _ = state.split()
    with pytest.raises(ValueError, match="'instructions'"):
        merge(state, trainable)


def test_updated_is_functional_and_structure_is_fixed() -> None:
    state = snapshot(Tagger())
    new = state.updated({"instructions": "Tag nouns."})
    assert new["instructions"] == "Tag nouns." and state["instructions"] == "Tag the text."
    assert new.requires_grad == state.requires_grad
    with pytest.raises(KeyError, match="'extra'"):
        state.updated({"extra": 1})


def test_apply_to_loads_values_and_bumps_versions_only_for_changes() -> None:
    source, target = Tagger(), Tagger()
    source.instructions.value = "Tag verbs."
    state = snapshot(source)
    before = target.module_state_version
    state.apply_to(target)
    assert target.instructions.value == "Tag verbs."
    assert target.module_state_version == before + 1  # only instructions differed
    state.apply_to(target)
    assert target.module_state_version == before + 1

    stranger = ParameterState({"instructions": "x", "missing.param": "y"})
    with pytest.raises(KeyError, match=r"'missing\.param'"):
        stranger.apply_to(target)
    assert target.instructions.value == "Tag verbs."  # nothing written


def test_json_round_trip_and_files(tmp_path: Path) -> None:
    state = snapshot(Tagger())
    assert ParameterState.from_json(state.to_json()) == state
    path = state.save(tmp_path / "state.json")
    assert ParameterState.load(path) == state
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(ValueError, match="not a plait parameter state"):
        ParameterState.from_json('{"instructions": "x"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        ParameterState.from_json("{")
    with pytest.raises(TypeError, match="'odd'"):
        ParameterState({"odd": {1, 2}}).to_json()


async def test_lock_forbids_new_parameters_in_its_context() -> None:
    tagger = Tagger()
    assert not is_locked()
    with lock("training loop"):
        assert is_locked()
        with pytest.raises(StructureLockedError, match="training loop"):
            plait.Parameter("new", description="sneaked in")
        with pytest.raises(StructureLockedError):
            plait.LLMInference("fast", system_prompt="builds a Parameter")

        async def build() -> plait.Parameter:
            return plait.Parameter("in a task", requires_grad=False)

        with pytest.raises(StructureLockedError):
            await asyncio.create_task(build())
        tagger.instructions.apply_update("values may still change")  # state is not structure
        state = snapshot(tagger)
    assert not is_locked()
    assert state["instructions"] == "values may still change"
    plait.Parameter("fine again", requires_grad=False)


def test_module_state_version_bumps_and_appears_in_valueify_meta() -> None:
    tagger = Tagger()
    param = tagger.instructions
    assert plait.valueify(param).meta["module_state_version"] == 0
    param.accumulate_feedback("be stricter")
    param.apply_update("Tag strictly.")
    meta = plait.valueify(param).meta
    assert meta["module_state_version"] == 1 == tagger.module_state_version
    assert meta["requires_grad"] is True
    assert param.get_accumulated_feedback() == []
