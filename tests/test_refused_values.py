"""Bad values are refused, not sent (issue 20 point 12, the values parts).

A prompt with no text of its own (None from a null cell or a missing field, bytes,
a function) is that input's error row naming its type and the module, and no
request is made; an empty document is an error for `Refine` as for `MapReduce`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import plait
import plait.functional as F
from plait.sequences import MapReduce, Refine
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli


class Ask(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", "Answer.")

    def forward(self, question: Any) -> Any:
        return self.llm(question)


def _refused(value: Any, type_name: str, path: str) -> None:
    assert isinstance(value, plait.Value) and value.is_error, value
    message = value.meta["message"]
    assert value.meta["error_type"] == "TypeError"
    assert f"{path}'s prompt got {type_name}" in message and "nothing was sent" in message


@pytest.mark.parametrize(
    ("bad", "type_name"), [(None, "NoneType"), (b"x", "bytes"), (len, "builtin_function")]
)
def test_a_prompt_without_text_is_its_inputs_error_and_nothing_is_sent(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, bad: Any, type_name: str
) -> None:
    out = Ask().bind(resources=resources).run_sync([bad, "fine", {"a": 1}])
    _refused(out[0], type_name, "llm")
    assert out[1] == "[Answer.] fine" and out[2] == '[Answer.] {"a": 1}'  # dicts: JSON text
    assert server.stats()["requests_total"] == 2


async def test_concurrent_batches_refuse_each_bad_input_alone(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = Ask().bind(resources=resources)
    first, second = await asyncio.gather(pipeline([None, "a", None]), pipeline(["b", None, "c"]))
    _refused(first[0], "NoneType", "llm")
    _refused(first[2], "NoneType", "llm")
    _refused(second[1], "NoneType", "llm")
    assert [first[1], second[0], second[2]] == ["[Answer.] a", "[Answer.] b", "[Answer.] c"]
    assert server.stats()["requests_total"] == 3


def test_a_system_prompt_parameter_holding_none_is_refused(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    ask = Ask()
    ask.llm.system_prompt.value = None  # type: ignore[union-attr]
    (out,) = ask.bind(resources=resources).run_sync(["x"])
    assert out.is_error and "llm's system prompt got NoneType" in out.meta["message"]
    assert server.stats()["requests_total"] == 0


def test_a_functional_call_refuses_a_prompt_without_text(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    with pytest.raises(TypeError, match="the prompt got builtin_function_or_method <built-in"):
        asyncio.run(F.complete("fast", len, resources=resources))
    assert server.stats()["requests_total"] == 0


def test_a_null_input_line_is_an_error_row_from_the_cli(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    (tmp_path / "in.jsonl").write_text('"one"\nnull\n"three"\n')
    out = tmp_path / "out.jsonl"
    result = plait_cli(
        "run", "tests.cli_targets:Tagged", "--input", tmp_path / "in.jsonl",
        "--output", out, "--resources", resources, "-q",
    )  # fmt: skip
    rows = sorted((json.loads(line) for line in out.read_text().splitlines()), key=str)
    rows.sort(key=lambda row: row["index"])
    assert [row.get("output") for row in rows] == ["[T] one", None, "[T] three"]
    assert rows[1]["error"]["type"] == "TypeError" and rows[1]["error"]["module_path"] == "llm"
    assert "NoneType None where text is required" in rows[1]["error"]["message"]
    assert server.stats()["requests_total"] == 2
    assert result.returncode == 1  # some input failed


@pytest.mark.parametrize("document", ["", "  \n ", [], [""], ["", " \n"], ("\t",)])
def test_an_empty_document_is_an_error_for_refine_as_for_map_reduce(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, document: Any
) -> None:
    """Was: Refine returned "(nothing yet)" as a success where MapReduce failed."""
    for module in (Refine("fast", "Update."), MapReduce("fast", "Map.", "Comb.")):
        out = module.bind(resources=resources).run_sync([document, ["a part"]])
        assert isinstance(out[0], plait.Value) and out[0].is_error, (module, out[0])
        assert out[0].meta["error_type"] == "ValueError"
        assert f"{type(module).__name__} got an empty document" in out[0].meta["message"]
        assert isinstance(out[1], str) and "a part" in out[1]
    assert server.stats()["requests_total"] == 2


@pytest.mark.parametrize(
    ("document", "position", "type_name"),
    [([None], 0, "NoneType"), (["a part", None], 1, "NoneType"), (["a", b"raw"], 1, "bytes")],
)
def test_a_chunk_that_is_not_text_is_a_type_error_naming_its_position(
    server: FakeOpenAIServer,
    resources: plait.ResourceConfig,
    document: Any,
    position: int,
    type_name: str,
) -> None:
    """Issue 20 point 12: Refine sent "Next part:\nNone" and succeeded where MapReduce
    failed; both refuse the document before any call, and the other input runs."""
    for module in (Refine("fast", "Update."), MapReduce("fast", "Map.", "Comb.")):
        out = module.bind(resources=resources).run_sync([document, ["a part"]])
        assert isinstance(out[0], plait.Value) and out[0].is_error, (module, out[0])
        assert out[0].meta["error_type"] == "TypeError"
        message = out[0].meta["message"]
        assert f"{type(module).__name__} got chunk {position} of type {type_name}" in message
        assert isinstance(out[1], str) and "a part" in out[1]
    assert server.stats()["requests_total"] == 2
