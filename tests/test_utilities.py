"""The private utility layer: atomic writes, forward signatures, value texts."""

from __future__ import annotations

import dataclasses
import inspect
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import plait
from plait._files import write_atomic
from plait._signature import forward_shape, shape_of
from plait._text import as_text, data_text, prompt_text
from plait.learning.feedback import Feedback, feedback_text
from plait.values import Value, ValueKind

# -- write_atomic ---------------------------------------------------------------------


def test_write_atomic_writes_text_and_bytes_and_makes_the_folder(tmp_path: Path) -> None:
    target = tmp_path / "new" / "state.json"
    assert write_atomic(target, "héllo\n") == target
    assert target.read_bytes() == "héllo\n".encode()
    write_atomic(str(target), b"\x00\xff")
    assert target.read_bytes() == b"\x00\xff"
    assert os.listdir(target.parent) == ["state.json"]


def test_a_failed_write_atomic_keeps_the_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old", encoding="utf-8")

    def refuse(src: Any, dst: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, "new")
    assert target.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == ["manifest.json"]


# -- forward_shape / shape_of ----------------------------------------------------------


class Plain(plait.Module):
    def forward(self, text: str, style: str = "short") -> str:
        return text


class Fancy(plait.Module):
    def forward(self, first: str, /, *rest: str, mode: str, **extra: Any) -> str:
        return first


def test_a_forward_shape_is_read_once_per_class_and_without_self() -> None:
    shape = forward_shape(Plain)
    assert forward_shape(Plain) is shape
    assert shape_of(Plain().forward) is shape  # a bound forward reads the same cache
    assert [p.name for p in shape.parameters] == ["text", "style"]
    assert shape.names == ("text", "style") and shape.required == {"text"}
    assert shape.simple and shape.positional == 2
    assert shape.keywords == {"text", "style"}
    assert str(shape.signature) == str(inspect.signature(Plain().forward))


def test_a_forward_shape_reads_every_kind_of_parameter() -> None:
    shape = forward_shape(Fancy)
    assert shape.names == ("mode",) and shape.required == {"mode"}
    assert shape.positional == 1 and shape.var_positional and shape.var_keyword
    assert not shape.simple and shape.keywords is None
    assert str(shape.signature) == str(inspect.signature(Fancy().forward))


def test_a_replaced_forward_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    class Swapped(plait.Module):
        def forward(self, a: str) -> str:
            return a

    assert forward_shape(Swapped).names == ("a",)

    def other(self: Any, b: str, c: str) -> str:
        return b + c

    monkeypatch.setattr(Swapped, "forward", other)
    assert forward_shape(Swapped).names == ("b", "c")


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        (("x",), {}),
        (("x", "y"), {}),
        (("x", "y", "z"), {}),
        ((), {"text": "x"}),
        (("x",), {"style": "y"}),
        (("x",), {"text": "y"}),
        ((), {"style": "y"}),
        (("x",), {"other": 1}),
    ],
)
def test_fits_never_accepts_what_bind_refuses(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    shape = forward_shape(Plain)
    try:
        shape.signature.bind(*args, **kwargs)
        binds = True
    except TypeError:
        binds = False
    assert shape.fits(args, kwargs) == binds  # a plain signature is decided by counting
    assert not forward_shape(Fancy).fits(args, kwargs)  # anything else goes to bind


def test_shape_of_reads_any_callable() -> None:
    def check(output: str, target: str | None = None) -> bool:
        return output == target

    shape = shape_of(check)
    assert shape.positional == 2 and shape.names == ("output", "target")
    assert shape_of(lambda *items: None).var_positional
    with pytest.raises((TypeError, ValueError)):
        shape_of(42)  # type: ignore[arg-type]


# -- value texts ---------------------------------------------------------------------


class Reply(BaseModel):
    label: str


@dataclasses.dataclass
class Point:
    x: int


def test_as_text_is_how_a_value_reads_in_a_prompt() -> None:
    assert as_text("é") == "é"
    assert as_text({"a": ["é", 1]}) == '{"a": ["é", 1]}'
    assert as_text(Reply(label="x")) == '{"label":"x"}'
    assert as_text((1, 2)) == "(1, 2)"
    assert as_text(True) == "True"
    assert as_text([object]) == str([object])  # not JSON: its str()


def test_prompt_text_refuses_what_has_no_text() -> None:
    assert prompt_text(3, "the prompt") == "3"
    assert prompt_text(Point(1), "the prompt") == "Point(x=1)"
    for textless in (None, b"x", object()):
        with pytest.raises(TypeError, match=r"the prompt got .* where text is required"):
            prompt_text(textless, "the prompt")


def test_data_text_is_how_a_value_reads_as_data() -> None:
    assert data_text("é") == "é"
    assert data_text({"a": ["é", 1]}) == '{"a": ["é", 1]}'
    assert data_text(Reply(label="x")) == '{"label":"x"}'
    assert data_text((1, 2)) == "[1, 2]"
    assert data_text(True) == "true"
    assert data_text(None) == "null"
    assert data_text(Point(1)) == '{"x": 1}'


def test_feedback_text_reads_through_values() -> None:
    feedback = Feedback(0.5, "too long")
    assert feedback_text(feedback) == "too long"
    assert feedback_text(Value(ValueKind.STRUCTURED, feedback)) == "too long"
    nested = Value(ValueKind.STRUCTURED, Value(ValueKind.STRUCTURED, feedback))
    assert feedback_text(nested) == "too long"
    assert feedback_text("be shorter") == "be shorter"
    assert feedback_text(3) == "3"
