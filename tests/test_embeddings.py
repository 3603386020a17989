"""Demonstrations ranked by an embedding alias (issue 24 point 2): `knn_demos(embed=...)`.

The fake OpenAI server answers ``/v1/embeddings`` with vectors built from words, where
the words of a topic ("parcel", "package", "delivery"...) share an axis: an input can be
near a pair it shares no word with, which BM25 cannot see.  Every embedding request goes
down plait's one call path, so the cache, checkpoints and mocks see them like chat calls.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.demos import DemoError, choose_demos, knn_demos
from plait.handlers import cache, mock
from plait.providers.base import LLMRequest
from plait.testing import FakeOpenAIServer
from plait.testing.fake_openai import fake_embedding

from .conftest import make_resources, plait_cli

POOL = [
    ("my card was charged twice", "billing"),
    ("the parcel did not come", "shipping"),
    ("the app freezes on start", "technical"),
]


class Classify(plait.Module):
    def __init__(self, demos: Any) -> None:
        super().__init__()
        self.llm = plait.LLMInference("fast", "Classify the message.", demos=demos)

    def forward(self, text: str) -> Any:
        return self.llm(text)


def chat_requests(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [r["body"] for r in server.stats(bodies=True)["requests"] if "messages" in r["body"]]


def embedding_requests(server: FakeOpenAIServer) -> list[list[str]]:
    """The texts of each embedding request, in the order they were answered."""
    return [
        r["body"]["input"] for r in server.stats(bodies=True)["requests"] if "input" in r["body"]
    ]


def shown(body: dict[str, Any]) -> list[str]:
    """The demonstrations' inputs of a chat request (between system and input)."""
    return [m["content"] for m in body["messages"][1:-1] if m["role"] == "user"]


def test_embeddings_find_the_pair_nearest_in_meaning_where_bm25_sees_no_shared_word(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    by_meaning = Classify(knn_demos(k=1, pool=POOL, embed="smart")).bind(resources=resources)
    by_words = Classify(knn_demos(k=1, pool=POOL)).bind(resources=resources)
    by_meaning.run_sync("where is my package")
    by_words.run_sync("where is my package")
    meaning, words = chat_requests(server)
    assert shown(meaning) == ["the parcel did not come"]  # package ~ parcel: one topic
    assert shown(words) == ["my card was charged twice"]  # only "my" in common
    pool_texts = [text for text, _ in POOL]
    assert sorted(map(tuple, embedding_requests(server))) == sorted(
        [tuple(pool_texts), ("where is my package",)]
    )


def test_the_pool_is_embedded_once_per_run_whatever_runs_beside_it(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    module = Classify(knn_demos(k=1, pool=POOL, embed="smart")).bind(resources=resources)
    inputs = ["package late", "refund my card", "app crash", "delivery missing"] * 3

    async def three_runs_at_once() -> list[list[Any]]:
        return list(await asyncio.gather(*(module(inputs) for _ in range(3))))

    outputs = asyncio.run(three_runs_at_once())
    assert all(len(run) == len(inputs) for run in outputs)
    asked = embedding_requests(server)
    pool_texts = [text for text, _ in POOL]
    assert asked.count(pool_texts) == 3  # one per run, shared by its 12 calls
    assert sorted(t for texts in asked if texts != pool_texts for t in texts) == sorted(inputs * 3)
    nearest = {body["messages"][-1]["content"]: shown(body) for body in chat_requests(server)}
    assert nearest == {
        "package late": ["the parcel did not come"],
        "delivery missing": ["the parcel did not come"],
        "refund my card": ["my card was charged twice"],
        "app crash": ["the app freezes on start"],
    }


def test_a_pool_no_bigger_than_k_embeds_nothing(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    module = Classify(knn_demos(k=3, pool=POOL, embed="smart")).bind(resources=resources)
    module.run_sync("package late")
    assert embedding_requests(server) == []
    (body,) = chat_requests(server)
    assert len(shown(body)) == 3


def test_the_cache_answers_embeddings_on_the_next_run(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    module = Classify(knn_demos(k=1, pool=POOL, embed="smart")).bind(resources=resources)
    with cache(tmp_path / "calls.db"):
        first = module.run_sync(["package late", "app crash"])
        sent = server.stats()["requests_total"]
        again = module.run_sync(["package late", "app crash"])
    assert sent == 5  # the pool, two inputs, two chat calls
    assert server.stats()["requests_total"] == sent and again == first


def test_a_mock_answers_embedding_calls_like_any_call(resources: plait.ResourceConfig) -> None:
    seen: list[LLMRequest] = []

    def vectors(request: LLMRequest) -> list[list[float]]:
        seen.append(request)
        return [fake_embedding(m["content"]) for m in request.messages]

    module = Classify(knn_demos(k=1, pool=POOL, embed="smart")).bind(resources=resources)
    with mock({"smart": vectors, "fast": lambda request: str(shown_in(request))}, strict=True):
        assert module.run_sync("my delivery is late") == "['the parcel did not come']"
    assert all(request.embed for request in seen) and len(seen) == 2


def shown_in(request: LLMRequest) -> list[str]:
    return [m["content"] for m in request.messages[1:-1] if m["role"] == "user"]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ([[1.0, 0.0]], "for 3 text"),  # one vector for the pool's three texts
        ("not vectors", "not one vector"),
    ],
)
def test_an_embedding_reply_of_the_wrong_shape_is_an_error_naming_the_alias(
    resources: plait.ResourceConfig, reply: Any, message: str
) -> None:
    module = Classify(knn_demos(k=1, pool=POOL, embed="smart")).bind(resources=resources)
    with mock({"smart": reply, "fast": "x"}):
        (out,) = module.run_sync(["package late"])
    assert isinstance(out, plait.Value) and out.is_error
    assert "alias 'smart'" in str(out.payload) and message in str(out.payload)


def test_an_alias_without_embeddings_is_refused_saying_what_would_work(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    config = plait.ResourceConfig(
        {
            "fast": {"provider": "openai", "model": "m", "base_url": server.base_url,
                     "api_key": "sk-test"},
            "claude": {"provider": "anthropic", "model": "claude-x", "api_key": "sk-ant-test"},
        }
    )  # fmt: skip
    module = Classify(knn_demos(k=1, pool=POOL, embed="claude")).bind(resources=config)
    (out,) = module.run_sync(["package late"])
    assert isinstance(out, plait.Value) and out.is_error
    text = str(out.payload)
    assert "alias 'claude' gives no embeddings" in text and "BM25" in text
    assert "sk-ant-test" not in text
    assert chat_requests(server) == []  # nothing was sent for an input that cannot be ranked


def test_a_malformed_embed_is_refused_and_a_ranked_pool_needs_the_runtime() -> None:
    with pytest.raises(DemoError, match="embed is the alias"):
        knn_demos(k=1, pool=POOL, embed="")
    with pytest.raises(DemoError, match="only a call run by plait's runtime"):
        choose_demos(knn_demos(k=1, pool=POOL, embed="smart"), "package late")


def test_the_embed_alias_is_part_of_the_value_state_and_training_keep(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    from plait.learning import BootstrapFewShot
    from plait.learning.losses import ExactMatch
    from plait.learning.trainer import Trainer

    module = Classify(knn_demos(k=1, embed="smart"))
    assert module.state_dict()["llm.demos"]["embed"] == "smart"
    data = [("package late", "package late"), ("app crash", "app crash")]
    Trainer(
        module, ExactMatch(), BootstrapFewShot(module.parameters()), data, data,
        batch_size=2, resources=resources, refit=True,
    ).fit_sync()  # fmt: skip
    value = module.llm.demos.value
    assert value["embed"] == "smart" and len(value["pool"]) == 2


def test_plait_run_resumes_without_embedding_the_pool_again(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    target = tmp_path / "classify.py"
    target.write_text(
        "import plait\n"
        "from plait.demos import knn_demos\n"
        f"POOL = {POOL!r}\n"
        "class Classify(plait.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.llm = plait.LLMInference(\n"
        "            'fast', 'Classify.', demos=knn_demos(k=1, pool=POOL, embed='smart'))\n"
        "    def forward(self, text):\n"
        "        return self.llm(text)\n"
    )
    (tmp_path / "resources.toml").write_text(
        "".join(
            f'[{alias}]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
            'api_key = "sk-test"\n'
            for alias in ("fast", "smart")
        )
    )
    texts = ["package late", "app crash", "refund my card", "[[status:400]] bad"]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    args = (
        "run", f"{target}:Classify", "--input", tmp_path / "in.jsonl",
        "--output", tmp_path / "out.jsonl", "--resources", tmp_path / "resources.toml",
        "--checkpoint", tmp_path / "ckpt",
    )  # fmt: skip
    first = plait_cli(*args)
    assert first.returncode != 0  # the input the server refuses failed
    assert embedding_requests(server).count([t for t, _ in POOL]) == 1
    server.reset()
    again = plait_cli(*args)  # the failed input runs again: its chat call, nothing else
    assert again.returncode != 0
    # The pool's embeddings (made for the first input that asked) and the failed input's
    # own came back from the checkpoint: only the refused chat call went out again.
    assert embedding_requests(server) == []
    assert [body["messages"][-1]["content"] for body in chat_requests(server)] == [texts[-1]]


def test_plait_train_demos_knn_embed_from_the_shell(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from .test_bootstrap import write_target

    target, resources = write_target(tmp_path, server)
    with resources.open("a") as extra:
        extra.write(
            f'[embedder]\nprovider = "openai"\nmodel = "e"\nbase_url = "{server.base_url}"\n'
            'api_key = "sk-test"\n'
        )
    data = tmp_path / "data.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"w{n} parcel", "target": f"w{n} parcel"}) + "\n"
                for n in range(6))
    )  # fmt: skip
    out = tmp_path / "out"
    base = ("train", target, "--data", data, "--val", data, "--resources", resources, "-q")
    refused = plait_cli(*base, "--embed", "embedder", "--out", out)
    assert refused.returncode == 2 and "give --demos knn" in refused.stderr
    done = plait_cli(
        *base, "--optimizer", "search", "--demos", "knn", "--k", "2", "--embed", "embedder",
        "--refit", "--out", out, "--batch-size", "6",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    value = json.loads((out / "parameters.json").read_text())["llm.demos"]
    assert value["embed"] == "embedder" and value["k"] == 2 and len(value["pool"]) == 6
    asked = [r for r in server.stats(bodies=True)["requests"] if "input" in r["body"]]
    assert asked and all(r["model"] == "e" for r in asked)


def test_an_embedding_alias_the_resources_lack_is_refused_before_any_call(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """A pool ranked by an alias nobody configured: the run is refused up front, naming
    the alias, as for an LLM call's alias (it failed every input at its first call)."""
    from plait.resources.config import ConfigurationError

    from .test_bootstrap import write_target

    only_fast = make_resources(server, ("fast",), max_concurrent=4)
    module = Classify(knn_demos(k=1, pool=POOL, embed="embedder")).bind(resources=only_fast)
    with pytest.raises(ConfigurationError, match="'embedder'"):
        module.run_sync(["package late", "app crash"])
    assert server.stats()["requests_total"] == 0

    target, resources = write_target(tmp_path, server)  # configures fast, not embedder
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"w{n}", "target": f"w{n}"}) + "\n"
                            for n in range(4)))  # fmt: skip
    train = plait_cli(
        *("train", target, "--data", data, "--val", data, "--resources", resources, "-q"),
        *("--optimizer", "bootstrap", "--demos", "knn", "--embed", "embedder"),
        *("--out", tmp_path / "out"),
    )
    assert train.returncode == 2 and "'embedder'" in train.stderr, train.stderr
    assert "Traceback" not in train.stderr
    assert server.stats()["requests_total"] == 0
