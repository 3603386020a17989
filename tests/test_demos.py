"""Demonstrations as parameters (issue 13 point 1): an `LLMInference` with learnable
few-shot examples, sent as user/assistant turns before the input, and seen by every
piece that keys on or saves parameters.

The wire tests read the request bodies the loopback fake server received.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest

import plait
from plait.blueprint import Blueprint, BlueprintError
from plait.blueprint import Castable as C
from plait.demos import DEMOS_DESCRIPTION, DemoError
from plait.functional import complete
from plait.handlers import cache, log_calls
from plait.learning import ParameterState, snapshot
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli

DEMOS = [{"input": "Order 12 arrived late", "output": "12"}, ("Where is order 7?", "7")]


class Extract(plait.Module):
    def __init__(self, demos: list[Any] | None = None) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast",
            system_prompt=plait.Parameter("Give the order number.", description="the task"),
            demos=[] if demos is None else demos,
            temperature=0,
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


def sent_messages(server: FakeOpenAIServer) -> list[list[dict[str, Any]]]:
    return [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]]


def test_demos_are_a_parameter_with_a_description_in_every_state_view() -> None:
    module = Extract(DEMOS)
    params = dict(module.named_parameters())
    assert set(params) == {"llm.system_prompt", "llm.demos"}
    demos = params["llm.demos"]
    assert demos.requires_grad and demos.description == DEMOS_DESCRIPTION
    expected = [
        {"input": "Order 12 arrived late", "output": "12"},
        {"input": "Where is order 7?", "output": "7"},
    ]
    assert module.state_dict()["llm.demos"] == expected
    state = snapshot(module)
    assert state["llm.demos"] == expected
    assert ParameterState.from_json(state.to_json())["llm.demos"] == expected
    module.llm.demos.value = []
    state.apply_to(module)
    assert module.llm.demos.value == expected
    fresh = Extract()
    fresh.load_state_dict(json.loads(json.dumps(module.state_dict())))
    assert fresh.state_dict() == module.state_dict()
    assert "demos=2" in repr(module)


def test_a_call_without_demos_has_no_demos_parameter() -> None:
    llm = plait.LLMInference("fast", "sys")
    assert llm.demos is None
    assert [name for name, _ in llm.named_parameters()] == ["system_prompt"]


@pytest.mark.parametrize(
    ("demos", "message"),
    [
        ("2+2=4", "must be a list of input/output pairs"),
        ([{"input": "a"}], r"demos=...\)\[0\] must have exactly the keys 'input' and 'output'"),
        ([("a", "b", "c")], r"\[0\] must be an \(input, output\) pair"),
        ([("a", "  ")], r"\[0\] has an empty output"),
        ([("a", object())], "has no JSON form"),
    ],
)
def test_malformed_demos_are_refused_when_built(demos: Any, message: str) -> None:
    with pytest.raises(DemoError, match=message):
        plait.LLMInference("fast", demos=demos)


def test_demos_go_as_user_assistant_turns_between_system_and_input(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    module = Extract(DEMOS).bind(resources=resources)
    module.run_sync("Order 99 is missing")
    (messages,) = sent_messages(server)
    assert messages == [
        {"role": "system", "content": "Give the order number."},
        {"role": "user", "content": "Order 12 arrived late"},
        {"role": "assistant", "content": "12"},
        {"role": "user", "content": "Where is order 7?"},
        {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Order 99 is missing"},
    ]


def test_structured_demo_outputs_are_sent_as_json_text(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    llm = plait.LLMInference("fast", demos=[("x", {"id": 3})]).bind(resources=resources)
    llm.run_sync("y")
    (messages,) = sent_messages(server)
    assert messages[1] == {"role": "assistant", "content": '{"id": 3}'}


def test_functional_complete_with_demos_sends_what_the_module_sends(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    Extract(DEMOS).bind(resources=resources).run_sync("Order 5")

    async def call() -> Any:
        return await complete(
            "fast",
            "Order 5",
            system="Give the order number.",
            demos=DEMOS,
            temperature=0,
            resources=resources,
        )

    asyncio.run(call())
    first, second = sent_messages(server)
    assert first == second


def test_functional_complete_shows_a_label_calls_demo_answers_as_its_labels(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    """A label call's demonstrations answer with the label itself on every path, a
    functional call's included (not the reply's JSON an older parameters file held)."""

    async def call() -> Any:
        return await complete(
            "fast",
            "Order 5 never came",
            demos=[("Charged twice", '{"value": "billing"}'), ("Parcel late", "Shipping")],
            response_format=Literal["billing", "shipping"],
            resources=resources,
        )

    asyncio.run(call())
    (messages,) = sent_messages(server)
    assert [m["content"] for m in messages if m["role"] == "assistant"] == ["billing", "shipping"]


def test_demos_changed_to_garbage_fail_the_call_with_a_clear_error(
    resources: plait.ResourceConfig,
) -> None:
    module = Extract(DEMOS).bind(resources=resources)
    module.llm.demos.value = "not a list"
    with pytest.raises(plait.ExecutionError, match="the demonstrations of llm must be a list"):
        module.run_sync("Order 1")


def test_the_cache_key_sees_the_demos(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    module = Extract(DEMOS).bind(resources=resources)
    with cache(tmp_path / "calls.db"):
        module.run_sync("Order 3")
        module.run_sync("Order 3")
        assert server.stats()["requests_total"] == 1
        module.llm.demos.value = [("Order 8 late", "8")]
        module.run_sync("Order 3")
    assert server.stats()["requests_total"] == 2


def test_a_checkpoint_reruns_with_other_demos_and_keeps_each_versions_outputs(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    """Other demonstrations are another version of the pipeline: its inputs run again
    with them (never answered with outputs the old demonstrations made), and going
    back to the old ones is answered from the checkpoint."""
    module = Extract(DEMOS).bind(resources=resources, checkpoint_dir=tmp_path)
    first = module.run_sync(["Order 1", "Order 2"])
    assert server.stats()["requests_total"] == 2
    module.llm.demos.value = [("Order 8 late", "8")]
    server.reset()
    module.run_sync(["Order 1", "Order 2"])
    shown = [[m["content"] for m in sent] for sent in sent_messages(server)]
    assert len(shown) == 2  # both inputs asked anew, with the new demonstration only
    assert all("Order 8 late" in texts and "Order 12 arrived late" not in texts for texts in shown)
    module.llm.demos.value = list(DEMOS)
    server.reset()
    assert module.run_sync(["Order 1", "Order 2"]) == first
    assert server.stats()["requests_total"] == 0


def test_a_call_log_sees_each_stage_input_and_output(
    resources: plait.ResourceConfig,
) -> None:
    module = Extract(DEMOS).bind(resources=resources)
    with log_calls() as log:
        module.run_sync("Order 4")
    (call,) = log.calls
    assert call.module is module.llm and call.input == "Order 4"
    assert call.text == "[Give the order number.] Order 4"


def test_blueprint_help_lists_demos_and_the_command_line_sets_them() -> None:
    text = Blueprint(Extract).help()
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert "llm.demos" in rows and "list[demo]" in rows["llm.demos"]
    built = Blueprint(Extract).apply({"llm.demos": C('[{"input": "a 1", "output": "1"}]')}).make()
    assert built.llm.demos.value == [{"input": "a 1", "output": "1"}]
    with pytest.raises(BlueprintError, match=r"llm\.demos .*demos are JSON text"):
        Blueprint(Extract).apply({"llm.demos": C("[oops")}).make()


def test_plait_run_loads_learned_demos_from_a_parameters_file(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target = tmp_path / "extract.py"
    target.write_text(
        "import plait\n"
        "class Extract(plait.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.llm = plait.LLMInference('fast', demos=[])\n"
        "    def forward(self, text):\n"
        "        return self.llm(text)\n"
    )
    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    params = tmp_path / "parameters.json"
    params.write_text(json.dumps({"llm.demos": [{"input": "q", "output": "a"}]}))
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"hello"\n')
    result = plait_cli(
        "run",
        f"{target}:Extract",
        "--input",
        inputs,
        "--output",
        tmp_path / "out.jsonl",
        "--resources",
        resources,
        "--parameters",
        params,
        "-q",
    )
    assert result.returncode == 0, result.stderr
    (messages,) = sent_messages(server)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == "q" and messages[1]["content"] == "a"
