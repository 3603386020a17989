"""The private utility layer: atomic writes, forward signatures, value texts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from plait._files import write_atomic

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
