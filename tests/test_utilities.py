"""The private utility layer: atomic writes, forward signatures, value texts."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import pytest

import plait
from plait._files import write_atomic
from plait._signature import forward_shape, shape_of

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
