"""Demonstrations chosen per input (issue 24 point 2): a pool from which each call is
shown the ``k`` pairs most like its input (every label covered, when asked, for a
call that answers with labels); still a `Parameter`, so state, checkpoints,
parameter files and cache keys see the pool.  The wire tests read what the loopback
fake server received."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest

import plait
from plait.demos import DemoError, choose_demos, knn_demos
from plait.handlers import cache
from plait.retrieval import BM25
from plait.testing import FakeOpenAIServer

from .conftest import plait_cli

POOL = [
    ("My card was charged twice for one order.", "billing"),
    ("I need a refund for a double charge on my card.", "billing"),
    ("The parcel has not arrived yet.", "shipping"),
    ("Where is my parcel? Tracking shows nothing.", "shipping"),
    ("The app crashes when I open settings.", "technical"),
    ("Please change the email on my account.", "account"),
]
Topic = Literal["billing", "shipping", "technical", "account"]


class Classify(plait.Module):
    def __init__(self, demos: Any, labels: Any = None) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "fast", "Classify the message.", demos=demos, response_format=labels
        )

    def forward(self, text: str) -> Any:
        return self.llm(text)


def shown_inputs(messages: list[dict[str, Any]]) -> list[str]:
    """The demonstrations' inputs in a request's messages (between system and input)."""
    return [m["content"] for m in messages[1:-1] if m["role"] == "user"]


# -- choosing --------------------------------------------------------------------------------
def test_bm25_ranks_documents_sharing_rare_words_first() -> None:
    index = BM25(["the parcel is late", "the card was charged", "the the the"])
    scores = index.scores("my parcel")
    assert scores[0] > 0 and scores[1] == 0 and scores[2] == 0
    assert index.scores("charged card")[1] > index.scores("charged card")[0]


def test_the_k_most_similar_pairs_are_chosen_the_most_similar_last() -> None:
    value = knn_demos(k=2, pool=POOL)
    chosen = choose_demos(value, "my card got a double charge")
    assert [pair["input"] for pair in chosen] == [POOL[0][0], POOL[1][0]]
    chosen = choose_demos(value, "parcel tracking")
    assert {pair["output"] for pair in chosen} == {"shipping"}
    assert chosen[-1]["input"] == POOL[3][0]  # shares "tracking" and "parcel"


def test_every_label_is_covered_when_asked_and_k_allows() -> None:
    value = knn_demos(k=4, pool=POOL, cover_labels=True)
    labels = ("billing", "shipping", "technical", "account")
    chosen = choose_demos(value, "double charge on my card", labels)
    assert sorted(pair["output"] for pair in chosen) == sorted(labels)
    # With fewer places than labels, the most similar labels get them.
    chosen = choose_demos(
        knn_demos(k=2, pool=POOL, cover_labels=True), "double charge on my card", labels
    )
    assert [pair["output"] for pair in chosen] == ["billing", "billing"] or len(
        {pair["output"] for pair in chosen}
    ) == 2


def test_a_pair_whose_answer_is_the_replys_json_covers_its_label_and_shows_it_bare() -> None:
    """A pool set from an older parameters file may hold a bootstrapped answer as the
    reply's JSON: it is still that label's pair, and it is shown as the label."""
    raw = [(text, json.dumps({"value": label})) for text, label in POOL]
    value = {"pool": raw, "k": 4, "cover_labels": True}
    labels = ("billing", "shipping", "technical", "account")
    chosen = choose_demos(value, "double charge on my card", labels)
    assert sorted(pair["output"] for pair in chosen) == sorted(labels)


def test_without_label_coverage_the_nearest_are_shown() -> None:
    value = knn_demos(k=4, pool=POOL)
    labels = ("billing", "shipping", "technical", "account")
    chosen = choose_demos(value, "double charge on my card", labels)
    assert chosen[-1]["input"] == POOL[1][0]
    # The four nearest: no room made for the labels they do not show.
    assert {pair["output"] for pair in chosen} != set(labels)
    assert [p["input"] for p in chosen] == [
        p["input"] for p in choose_demos(value, "double charge on my card")
    ]
    with pytest.raises(DemoError, match="cover_labels must be true or false"):
        plait.LLMInference("fast", demos={"pool": [], "k": 2, "cover_labels": "yes"})


def test_a_pool_no_bigger_than_k_is_shown_whole() -> None:
    value = knn_demos(k=8, pool=POOL[:3])
    assert [p["input"] for p in choose_demos(value, "anything")] == [p[0] for p in POOL[:3]]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"pool": [], "k": 0}, "positive integer"),
        ({"pool": [], "k": 2, "select": "x"}, "got the keys"),
        ({"pool": [("a", "")], "k": 2}, "empty output"),
        ({"pool": "abc", "k": 2}, "list of input/output pairs"),
    ],
)
def test_a_malformed_pool_is_refused_naming_the_problem(value: Any, message: str) -> None:
    with pytest.raises(DemoError, match=message):
        plait.LLMInference("fast", demos=value)


# -- on the wire -----------------------------------------------------------------------------
def test_each_input_is_shown_its_own_neighbours(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    module = Classify(knn_demos(k=2, pool=POOL)).bind(resources=resources)
    module.run_sync(["refund my double charge", "app crashes on settings"])
    sent = [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]]
    by_input = {messages[-1]["content"]: shown_inputs(messages) for messages in sent}
    assert by_input["refund my double charge"][-1] == POOL[1][0]
    assert by_input["app crashes on settings"][-1] == POOL[4][0]


def test_a_label_call_sees_every_label(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    module = Classify(knn_demos(k=4, pool=POOL, cover_labels=True), Topic).bind(resources=resources)
    module.run_sync("refund my double charge")
    (record,) = server.stats(bodies=True)["requests"]
    outputs = [m["content"] for m in record["body"]["messages"][1:-1] if m["role"] == "assistant"]
    assert sorted(outputs) == ["account", "billing", "shipping", "technical"]


def test_concurrent_calls_choose_independently(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    module = Classify(knn_demos(k=1, pool=POOL)).bind(resources=resources)
    inputs = ["double charge card", "parcel tracking", "app crashes", "email account"] * 3

    async def all_at_once() -> list[Any]:
        return list(await asyncio.gather(*(module(text) for text in inputs)))

    asyncio.run(all_at_once())
    sent = [r["body"]["messages"] for r in server.stats(bodies=True)["requests"]]
    nearest = {messages[-1]["content"]: shown_inputs(messages) for messages in sent}
    assert nearest["parcel tracking"] == [POOL[3][0]]
    assert nearest["app crashes"] == [POOL[4][0]]
    assert nearest["email account"] == [POOL[5][0]]


# -- a parameter like any other ----------------------------------------------------------------
def test_the_pool_is_the_parameters_value_in_state_and_the_cache_key(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    module = Classify(knn_demos(k=2, pool=POOL)).bind(resources=resources)
    state = module.state_dict()
    assert state["llm.demos"]["k"] == 2 and len(state["llm.demos"]["pool"]) == len(POOL)
    json.dumps(state)  # plain data, as parameter files and checkpoints need
    with cache(tmp_path / "calls.db"):
        module.run_sync("parcel tracking")
        module.run_sync("parcel tracking")
        assert server.stats()["requests_total"] == 1
        module.llm.demos.value = knn_demos(k=1, pool=POOL)
        module.run_sync("parcel tracking")
    assert server.stats()["requests_total"] == 2
    fresh = Classify(knn_demos(k=4))
    fresh.load_state_dict(state)
    assert fresh.llm.demos.value == state["llm.demos"]


def test_plait_run_loads_a_learned_pool_from_a_parameters_file(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target = tmp_path / "classify.py"
    target.write_text(
        "import plait\n"
        "from plait.demos import knn_demos\n"
        "class Classify(plait.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.llm = plait.LLMInference('fast', 'Classify.', demos=knn_demos(k=1))\n"
        "    def forward(self, text):\n"
        "        return self.llm(text)\n"
    )
    (tmp_path / "parameters.json").write_text(
        json.dumps({"llm.demos": {"pool": [list(pair) for pair in POOL], "k": 1}})
    )
    (tmp_path / "resources.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "app crashes"}) + "\n")
    done = plait_cli(
        "run",
        f"{target}:Classify",
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        tmp_path / "out.jsonl",
        "--resources",
        tmp_path / "resources.toml",
        "--parameters",
        tmp_path / "parameters.json",
    )
    assert done.returncode == 0, done.stderr
    (record,) = server.stats(bodies=True)["requests"]
    assert shown_inputs(record["body"]["messages"]) == [POOL[4][0]]
