"""Keys that stored data is found by, pinned to the values plait has always computed.

A response cache finds a reply by `request_key`, a checkpoint finds a call by the
request's fingerprint and refuses to resume under another producer (`producer_identity`,
`call_settings_of`, `code_of`).  If any of these changed by accident (a refactor
of the hashing, a JSON option), every user's cache would silently miss and every
checkpoint would be refused or re-run: these tests fail first.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from plait._digest import digest
from plait.blueprint._types import _load_file
from plait.execution.checkpoint import call_settings_of, code_of, producer_identity
from plait.execution.codec import fingerprint
from plait.handlers.llm import request_key
from plait.handlers.stack import Message
from plait.providers.base import LLMRequest
from plait.resources.manager import ResourceManager
from plait.testing.fake_openai import request_key as fake_request_key

PIPELINE_SOURCE = '''"""A pipeline whose source is pinned: code_of hashes this very text."""

import plait


class Pinned(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", "Be brief. \\u00e9", temperature=0.0, max_tokens=50)

    def forward(self, text: str) -> plait.Value:
        import plait_pinned_helper

        return self.llm(plait_pinned_helper.PREFIX + text)
'''

#: A user file the pipeline imports: `code_of` hashes its bytes too.
HELPER_SOURCE = 'PREFIX = "Q: "\n'

RESOURCES = {
    "fast": {
        "provider": "openai",
        "model": "m",
        "base_url": "http://127.0.0.1:9/v1",
        "api_key": "sk-test",
    }
}


class Answer(BaseModel):
    label: str
    score: float


def _pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    path = tmp_path / "plait_pinned_pipeline.py"
    path.write_text(PIPELINE_SOURCE, encoding="utf-8")
    (tmp_path / "plait_pinned_helper.py").write_text(HELPER_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = importlib.util.spec_from_file_location("plait_pinned_pipeline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "plait_pinned_pipeline", module)
    spec.loader.exec_module(module)
    return module.Pinned()


def _request() -> LLMRequest:
    return LLMRequest(
        "fast",
        [
            {"role": "system", "content": "Sé breve ☃"},
            {"role": "user", "content": "Order 3 \ud800 late"},
        ],
        temperature=0.2,
        max_tokens=64,
        response_format=Answer,
        extra={"seed": 3, "stop": ["\n"]},
    )


def test_the_response_cache_key_is_unchanged() -> None:
    resources = ResourceManager(RESOURCES)
    msg = Message("llm", "llm", kwargs={"request": _request()}, meta={"resources": resources})
    assert request_key(msg) == "f72e1463a59497ff387e1646162c7ea2ff121302db4c0b59e605c3b3f5595408"
    assert request_key(msg, "ns") == (
        "5df3cc77b4ed14ee1ef8f74a6e825dd4a1f45220aee2a806630f77be59e19c14"
    )


def test_checkpoint_call_and_input_keys_are_unchanged() -> None:
    assert _request().fingerprint("m") == "f83efc93452fc8f7fb3c60d19d010d22"
    assert fingerprint({"text": "Order 3", "n": [1, 2.5, None]}) == "45b9400ee5988b1176a972d1"
    assert digest({"b": ["x", 2.5], "a": 1}) == "8028ccff655e59cc43f578ca8b72d7a1"
    assert digest({1: "a", "b": (1, 2)}) == "cfc628420ebb3a967279e92dd1b7d166"


CODE = {"plait_pinned_helper": "33533ccf370fca2a", "plait_pinned_pipeline": "2786d97e58313e72"}


def test_the_checkpoint_producer_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _pinned(tmp_path, monkeypatch)
    resources = ResourceManager(RESOURCES)
    assert code_of(module) == CODE
    assert call_settings_of(module) == {"llm": "ce79e12ee55c64c2"}
    assert producer_identity(module, resources, seed=7) == {
        "endpoints": {"fast": {"provider": "openai", "model": "m", "url": "8a6921860d95dc50"}},
        "parameters": {"llm.system_prompt": "44899ad9fd76d690"},
        "calls": {"llm": "ce79e12ee55c64c2"},
        "seed": 7,
        "configured": True,
        "code": CODE,
    }


def test_a_blueprint_files_module_name_is_unchanged(tmp_path: Path) -> None:
    """`code_of` keys a pipeline loaded from a file by this module name."""
    path = tmp_path / "my pipeline.py"
    path.write_text("X = 1\n", encoding="utf-8")
    loaded = _load_file(str(path))
    try:
        expected = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
        assert loaded.__name__ == f"_plait_blueprint_my_pipeline_{expected}"
    finally:
        sys.modules.pop(loaded.__name__, None)


def test_the_fake_servers_request_key_is_unchanged() -> None:
    messages = [{"role": "user", "content": "héllo \ud800"}, {"role": "system", "content": "x"}]
    assert fake_request_key("fake-model", messages) == "2ff707a02d399bdd"
