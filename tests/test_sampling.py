"""Reproducible sampling (issue 14 points 4-5): run seeds, per-call seeds, ``n`` samples, `Rng`.

The calls go to the loopback fake server.  A prompt carrying ``[[sample:N]]`` is
answered as a sampler would: its echo gets `` ~draw K`` appended, K drawn from the
request's ``seed`` (the same seed, the same K) or, with none, from the server's own
random stream.  So a reply shows which seed its request carried, and the request
bodies the server kept show every seed that was sent.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import plait
from plait import functional as F
from plait.execution import CheckpointError
from plait.handlers import Handler, Message
from plait.handlers.caching import cache
from plait.handlers.recording import NotRecordedError, record, replay
from plait.learning.state import lock, snapshot
from plait.providers.base import ProviderError
from plait.sampling import SEED_LIMIT, SeedError
from plait.testing import FakeOpenAIServer

from .conftest import make_resources

SAMPLED = "Name a colour [[sample:1000000]]"


def bodies(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [record["body"] for record in server.stats(bodies=True)["requests"]]


def seeds(server: FakeOpenAIServer) -> list[Any]:
    return [body.get("seed") for body in bodies(server)]


def requests(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_total"])


class Twice(plait.Module):
    """The same call twice on the same prompt: two draws, not one answer twice."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = plait.LLMInference("fast", temperature=0.8)

    def forward(self, text: str) -> Any:
        return [self.gen(text), self.gen(text)]


class Drawn(plait.Module):
    """A sampled call whose run seed comes from the pipeline's own `Rng`."""

    def __init__(self, seed: int = 5) -> None:
        super().__init__()
        self.rng = plait.Rng(seed=seed)
        self.gen = plait.LLMInference("fast", temperature=0.8)

    def forward(self, text: str) -> Any:
        return self.gen(text)


class TwoStage(plait.Module):
    """Two sampled calls in a chain, drawing from an `Rng`."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = plait.Rng(seed=11)
        self.first = plait.LLMInference("fast", temperature=0.8)
        self.second = plait.LLMInference("fast", temperature=0.8)

    def forward(self, text: str) -> Any:
        return self.second(f"{self.first(text)} [[sample:1000000]]")


# -- the run seed --------------------------------------------------------------------------------
def test_the_same_seed_repeats_a_sampled_run_and_another_seed_changes_it(
    server: FakeOpenAIServer,
) -> None:
    pipeline = Twice().bind(resources=make_resources(server))
    inputs = [SAMPLED, "Name a fruit [[sample:1000000]]"]
    first = pipeline.run_sync(inputs, seed=7)
    again = pipeline.run_sync(inputs, seed=7)
    other = pipeline.run_sync(inputs, seed=8)
    assert first == again
    flat = [reply for row in first for reply in row]
    assert all(" ~draw " in reply for reply in flat)
    assert len(set(flat)) == 4  # every call drew on its own
    assert not {reply for row in other for reply in row} & set(flat)

    # bind(seed=) and ExecutionSettings(seed=) set the same run seed as the call does.
    assert Twice().bind(resources=make_resources(server), seed=7).run_sync(inputs) == first
    with plait.ExecutionSettings(seed=7):
        assert pipeline.run_sync(inputs) == first
    with plait.ExecutionSettings(seed=8):
        assert pipeline.run_sync(inputs, seed=7) == first  # the call's own seed ranks first


def test_every_call_sends_its_own_seed_and_an_unseeded_run_sends_none(
    server: FakeOpenAIServer,
) -> None:
    pipeline = Twice().bind(resources=make_resources(server))
    pipeline.run_sync([SAMPLED, SAMPLED, SAMPLED])  # no seed anywhere
    assert seeds(server) == [None] * 6

    server.reset()
    # The same prompt three times in a batch, twice per input: six calls, six seeds.
    outputs = pipeline.run_sync([SAMPLED, SAMPLED, SAMPLED], seed=3)
    sent = seeds(server)
    assert len(sent) == 6 and len(set(sent)) == 6
    assert all(isinstance(seed, int) and 0 <= seed < SEED_LIMIT for seed in sent)
    assert len({reply for row in outputs for reply in row}) == 6


def test_bad_seeds_and_sample_counts_are_clear_errors(server: FakeOpenAIServer) -> None:
    with pytest.raises(SeedError, match="non-negative integer"):
        plait.ExecutionSettings(seed=-1)
    with pytest.raises(SeedError, match="seed"):
        Twice().bind(resources=make_resources(server), seed="7").run_sync(SAMPLED)
    with pytest.raises(SeedError):
        Twice().bind(resources=make_resources(server)).run_sync(SAMPLED, seed=True)
    with pytest.raises(SeedError, match=r"Rng\(seed=...\)"):
        plait.Rng(seed=-3)
    with pytest.raises(ValueError, match="number of samples"):
        plait.LLMInference("fast", n=0)


def test_functional_calls_refuse_n() -> None:
    with pytest.raises(TypeError, match=r"LLMInference\(n=...\)"):
        asyncio.run(F.complete("fast", "hi", n=3))


# -- n samples -----------------------------------------------------------------------------------
class Vote(plait.Module):
    """Self-consistency: five samples, iterated in forward, passed on to one judge."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = plait.LLMInference("fast", temperature=0.9, n=5)
        self.judge = plait.LLMInference("smart", temperature=0)

    def forward(self, question: str) -> Any:
        samples = self.gen(question)
        listed = "\n".join(f"- {sample}" for sample in samples)
        return {"samples": samples, "verdict": self.judge(f"Pick one:\n{listed}")}


def test_n_samples_are_n_distinct_calls_iterable_in_forward(server: FakeOpenAIServer) -> None:
    module = plait.LLMInference("fast", temperature=0.9, n=5)
    samples = module.bind(resources=make_resources(server)).run_sync(SAMPLED)
    assert isinstance(samples, list) and len(samples) == 5
    assert len(set(samples)) == 5
    sent = seeds(server)
    assert len(sent) == 5 and len(set(sent)) == 5  # five requests, five seeds (run seed 0)

    server.reset()
    out = Vote().bind(resources=make_resources(server, ("fast", "smart"))).run_sync(SAMPLED, seed=1)
    assert len(out["samples"]) == 5 and len(set(out["samples"])) == 5
    # The judge saw every sample, in order.
    assert out["verdict"] == "Pick one:\n" + "\n".join(f"- {s}" for s in out["samples"])
    assert requests(server) == 6


def test_n_samples_are_n_cache_entries_and_a_warm_rerun_costs_nothing(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    module = plait.LLMInference("fast", temperature=0.9, n=5).bind(resources=make_resources(server))
    path = tmp_path / "calls.db"
    with cache(path) as cold:
        first = module.run_sync(SAMPLED, seed=4)
    assert (cold.hits, cold.misses, cold.stores) == (0, 5, 5)
    server.reset()
    with cache(path) as warm:
        assert module.run_sync(SAMPLED, seed=4) == first
        assert requests(server) == 0 and warm.hits == 5
        other = module.run_sync(SAMPLED, seed=5)  # another seed: five new entries
    assert requests(server) == 5 and not set(other) & set(first)
    assert warm.stats()["entries"] == 10


def test_a_profile_shows_every_sample_and_the_judge_waiting_on_them(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from plait.handlers import profile

    pipeline = Vote().bind(resources=make_resources(server, ("fast", "smart")))
    with profile(tmp_path / "trace.json") as profiler:
        pipeline.run_sync(SAMPLED, seed=1)
    path = [link.node.name for link in profiler.summary().critical_path]
    assert path == ["gen", "judge"]
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    calls = [e for e in events if e.get("ph") == "X" and e.get("name") == "gen"]
    assert len(calls) == 5


def test_the_sample_count_is_a_knob_only_where_the_call_already_samples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    made = plait.make_from_argv(Vote, ["gen.n=7"])
    assert made.gen.n == 7 and made.judge.n == 1
    with pytest.raises(SystemExit) as info:
        plait.make_from_argv(Vote, ["gen.n=1"])  # one value where forward reads a list
    assert info.value.code == 2
    assert "whole number >= 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        plait.make_from_argv(Vote, ["judge.n=3"])  # a single call stays single
    assert "judge.n" in capsys.readouterr().err


class FailSecondCall(Handler):
    """Fails the second LLM call it sees, as an endpoint refusing it would."""

    def __init__(self) -> None:
        self.seen = 0

    def process(self, msg: Message) -> None:
        if msg.type == "llm":
            self.seen += 1
            if self.seen == 2:
                raise ProviderError("HTTP 400: refused by the test")


def test_a_failed_sample_fails_the_call_and_says_which(server: FakeOpenAIServer) -> None:
    module = plait.LLMInference("fast", temperature=0.9, n=3, max_tokens=50)
    pipeline = module.bind(resources=make_resources(server, max_concurrent=1))
    with FailSecondCall(), pytest.raises(plait.ExecutionError) as info:
        pipeline.run_sync(SAMPLED)
    message = str(info.value)
    assert "refused by the test" in message
    assert "of 3" in message  # the sample that failed is named, not dropped


# -- record/replay and checkpoints see the seed ----------------------------------------------
def test_replay_answers_the_recorded_seed_and_not_another(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    path = tmp_path / "run.jsonl"
    pipeline = Twice().bind(resources=make_resources(server))
    with record(path):
        recorded = pipeline.run_sync(SAMPLED, seed=9)
    server.reset()
    with replay(path):
        assert pipeline.run_sync(SAMPLED, seed=9) == recorded
        assert requests(server) == 0
        with pytest.raises(plait.ExecutionError) as info:
            pipeline.run_sync(SAMPLED, seed=10)
    assert isinstance(info.value.__cause__, NotRecordedError)


class CancelAfter(Handler):
    """Cancels the run's task after ``count`` completed LLM calls, as Ctrl-C in an
    asyncio program (or a timeout around the run) would."""

    def __init__(self, count: int, task: asyncio.Task[Any]) -> None:
        self.count = count
        self.task = task
        self.done = 0

    def postprocess(self, msg: Message) -> None:
        if msg.type == "llm" and msg.error is None:
            self.done += 1
            if self.done == self.count:
                self.task.cancel()


def test_an_interrupted_run_resumes_with_the_same_seeds_and_pays_nothing_twice(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    inputs = [f"item {i} [[sample:1000000]]" for i in range(6)]
    reference = TwoStage().bind(resources=make_resources(server)).run_sync(inputs)

    server.reset()
    pipeline = TwoStage().bind(resources=make_resources(server, max_concurrent=2))

    async def interrupted() -> None:
        task = asyncio.current_task()
        assert task is not None
        with CancelAfter(5, task):
            await pipeline(inputs, checkpoint_dir=tmp_path / "ckpt")

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(interrupted())
    paid = requests(server)
    assert 5 <= paid < 12
    # The interrupted run gave its draw back: the Rng is where it was.
    assert pipeline.rng.counter.value == 0

    server.reset()
    resumed = pipeline.run_sync(inputs, checkpoint_dir=tmp_path / "ckpt")
    assert resumed == reference  # the same seeds, so the same samples
    # The five calls completed before the interruption came from the checkpoint (a call
    # still in flight then may have completed and been recorded as well).
    assert requests(server) <= 12 - 5
    assert pipeline.rng.counter.value == 1

    # The finished checkpoint belongs to run seed draw 0; the Rng has moved on.
    with pytest.raises(CheckpointError, match="run seed changed"):
        pipeline.run_sync(inputs, checkpoint_dir=tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="run seed changed"):
        pipeline.run_sync(inputs, checkpoint_dir=tmp_path / "ckpt", seed=123)
    pipeline.rng.reseed(counter=0)
    server.reset()
    assert pipeline.run_sync(inputs, checkpoint_dir=tmp_path / "ckpt") == reference
    assert requests(server) == 0


# -- Rng: the counter in the parameter state -----------------------------------------------------
def test_an_rng_draws_a_new_seed_each_run_and_its_state_repeats_them(
    server: FakeOpenAIServer,
) -> None:
    pipeline = Drawn().bind(resources=make_resources(server))
    state = snapshot(pipeline)
    runs = [pipeline.run_sync(SAMPLED) for _ in range(3)]
    assert len(set(runs)) == 3  # each run drew afresh
    assert pipeline.rng.counter.value == 3
    assert pipeline.state_dict()["rng.counter"] == 3

    state.apply_to(pipeline)  # the state from before the runs: the same draws again
    assert [pipeline.run_sync(SAMPLED) for _ in range(3)] == runs

    # Seed and counter are frozen state: split() files them with the frozen half,
    # merge() puts them back, and an optimizer never sees them.
    trainable, frozen = snapshot(pipeline).split()
    assert set(frozen) >= {"rng.seed", "rng.counter"}
    assert "rng.counter" not in trainable
    assert dict(trainable.merge(frozen)) == dict(snapshot(pipeline))
    assert all(not param.requires_grad for param in pipeline.rng.parameters())

    # Under lock() no parameter may be created, yet the counter (a value) still moves.
    with lock():
        pipeline.run_sync(SAMPLED)
    assert pipeline.rng.counter.value == 4

    # An explicit seed is the run seed: the Rng is not consulted and does not advance.
    before = pipeline.rng.counter.value
    assert pipeline.run_sync(SAMPLED, seed=7) == pipeline.run_sync(SAMPLED, seed=7)
    assert pipeline.rng.counter.value == before

    # Another seed in the Rng: other draws.
    other = Drawn(seed=6).bind(resources=make_resources(server))
    assert other.run_sync(SAMPLED) != runs[0]


def test_two_rngs_in_one_pipeline_are_refused(server: FakeOpenAIServer) -> None:
    class Both(Drawn):
        def __init__(self) -> None:
            super().__init__()
            self.spare = plait.Rng(seed=1)

    with pytest.raises(SeedError, match="2 Rng modules"):
        Both().bind(resources=make_resources(server)).run_sync(SAMPLED)


def test_training_neither_counts_the_rng_as_an_update_nor_rolls_it_back(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from plait.learning import BootstrapFewShot
    from plait.learning.losses import ExactMatch
    from plait.learning.trainer import Trainer

    class Echoing(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rng = plait.Rng(seed=2)
            self.llm = plait.LLMInference("fast", demos=[], temperature=0.8)

        def forward(self, text: str) -> Any:
            return self.llm(text)

    model = Echoing().bind(resources=make_resources(server))
    examples = [(f"word {i}", f"word {i}") for i in range(4)]
    trainer = Trainer(
        model,
        ExactMatch(),
        BootstrapFewShot(model.parameters(), max_demos=2, candidates=1),
        examples,
        val_data=examples,
        batch_size=2,
        max_steps=2,
        checkpoint_dir=tmp_path / "train",
    )
    history = trainer.fit_sync()
    counter = model.rng.counter.value
    assert counter > len(examples)  # every training and validation run drew a seed
    for step in history.steps:
        for trial in step.trials:
            assert "rng.counter" not in trial["tried"] and "rng.seed" not in trial["tried"]
    # The trainer's checkpoint carries the counter as it is now.
    saved = json.loads((tmp_path / "train" / "trainer.json").read_text())
    assert saved["parameters"]["rng.counter"] == counter
    assert saved["parameters"]["rng.seed"] == 2


# -- functional calls and the command line -------------------------------------------------------
class Asks(plait.Module):
    """Two identical functional calls in an async forward, and one with its own seed."""

    async def forward(self, text: str) -> Any:
        first = await F.complete("fast", text, temperature=0.8)
        second = await F.complete("fast", text, temperature=0.8)
        fixed = await F.complete("fast", text, temperature=0.8, seed=42)
        return [F.text_of(first), F.text_of(second), F.text_of(fixed)]


def test_functional_calls_in_a_seeded_run_get_their_own_seeds(server: FakeOpenAIServer) -> None:
    pipeline = Asks().bind(resources=make_resources(server))
    first = pipeline.run_sync(SAMPLED, seed=1)
    assert first == pipeline.run_sync(SAMPLED, seed=1)
    assert first[0] != first[1]
    assert seeds(server)[2] == 42  # a seed the call gives itself is kept
    assert pipeline.run_sync(SAMPLED, seed=2)[:2] != first[:2]


def test_functional_calls_outside_a_run_take_the_settings_seed(server: FakeOpenAIServer) -> None:
    async def two() -> list[str]:
        first = await F.complete("fast", SAMPLED, temperature=0.8)
        second = await F.complete("fast", SAMPLED, temperature=0.8)
        return [F.text_of(first), F.text_of(second)]

    resources = make_resources(server)
    with plait.ExecutionSettings(resources=resources, seed=3):
        drawn = asyncio.run(two())
    with plait.ExecutionSettings(resources=resources, seed=3):
        assert asyncio.run(two()) == drawn  # a new block counts from the start again
    with plait.ExecutionSettings(resources=resources, seed=4):
        assert not set(asyncio.run(two())) & set(drawn)
    assert drawn[0] != drawn[1]  # the same request twice: two seeds
    with plait.ExecutionSettings(resources=resources):
        asyncio.run(two())
    assert seeds(server)[-2:] == [None, None]  # no seed in force: none sent


class AsksTwice(plait.Module):
    """An async forward calling the same module twice on the same prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = plait.LLMInference("fast", temperature=0.8)

    async def forward(self, text: str) -> Any:
        return [await self.gen(text), await self.gen(text)]


def test_a_module_called_twice_from_an_async_forward_draws_twice(
    server: FakeOpenAIServer,
) -> None:
    pipeline = AsksTwice().bind(resources=make_resources(server))
    first = pipeline.run_sync([SAMPLED, SAMPLED], seed=1)
    assert len({reply for row in first for reply in row}) == 4
    assert pipeline.run_sync([SAMPLED, SAMPLED], seed=1) == first


class TwoScans(plait.Module):
    """Two loops over calls of one call site, gathered: latencies decide how they interleave."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = plait.LLMInference("fast", temperature=0.8)

    async def forward(self, text: str) -> Any:
        async def scan(tag: str) -> list[Any]:
            return [await self.gen(f"{tag}{i} {text}") for i in range(3)]

        first, second = await asyncio.gather(scan("a"), scan("b"))
        return first + second


def test_seeds_do_not_depend_on_the_order_gathered_calls_complete_in(
    server: FakeOpenAIServer,
) -> None:
    pipeline = TwoScans().bind(resources=make_resources(server), seed=3)

    def run_holding(held: str, last: str) -> tuple[Any, dict[str, Any]]:
        """A run whose call ``held`` waits until the other scan has sent its ``last`` call."""
        server.reset()
        server.configure(gate_texts={held: "held", last: "last"})
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(pipeline.run_sync, "x [[sample:1000000]]")
            server.wait_parked("held", 1)
            server.wait_parked("last", 1)  # the other scan made its three calls meanwhile
            server.open_gate("held")
            server.open_gate("last")
            output = future.result(timeout=120)
        sent = {body["messages"][-1]["content"]: body["seed"] for body in bodies(server)}
        return output, sent

    try:
        scan_b_first, seeds_b_first = run_holding("a0 ", "b2 ")
        scan_a_first, seeds_a_first = run_holding("b0 ", "a2 ")
    finally:
        server.configure(gate_texts={})
    assert len(seeds_b_first) == 6 and len(set(seeds_b_first.values())) == 6
    assert seeds_a_first == seeds_b_first
    assert scan_a_first == scan_b_first


def test_plait_run_seed_repeats_and_a_checkpoint_refuses_another_seed(
    server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from plait.cli import main

    from .test_cli import write_resources

    res = write_resources(tmp_path / "resources.toml", server.base_url)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps(f"q{i} [[sample:1000000]]") + "\n" for i in range(3)))

    def run(seed: str, out: str, *extra: str) -> tuple[int, list[str]]:
        path = tmp_path / out
        args = ["run", "tests.cli_targets:Tagged", "--resources", str(res), "-i", str(data)]
        code = main([*args, "-o", str(path), "--seed", seed, "-q", *extra])
        rows = [json.loads(line) for line in path.read_text().splitlines()] if code == 0 else []
        return code, [row["output"] for row in sorted(rows, key=lambda row: row["index"])]

    code, seven = run("7", "a.jsonl", "--no-checkpoint")
    assert code == 0 and len(set(seven)) == 3
    assert run("7", "b.jsonl", "--no-checkpoint") == (0, seven)
    code, eight = run("8", "c.jsonl", "--no-checkpoint")
    assert code == 0 and not set(eight) & set(seven)

    checkpoint = str(tmp_path / "ckpt")
    assert run("7", "d.jsonl", "--checkpoint", checkpoint) == (0, seven)
    capsys.readouterr()
    code, _ = run("8", "e.jsonl", "--checkpoint", checkpoint)
    assert code == 2
    assert "run seed changed (7 -> 8" in capsys.readouterr().err

    assert main(["run", "tests.cli_targets:Tagged", "--seed", "minus one"]) == 2
    assert "expected a seed" in capsys.readouterr().err


class SelfConsistency(plait.Module):
    """Self-consistency: five samples of one call, then a vote over them."""

    def __init__(self) -> None:
        super().__init__()
        self.solve = plait.LLMInference("fast", "Solve step by step.", temperature=0.8, n=5)
        self.vote = plait.LLMInference("smart", "Give the answer most of these agree on.")

    def forward(self, question: str) -> Any:
        answers = self.solve(question)
        return self.vote("\n---\n".join(answers))


def test_self_consistency_draws_five_different_samples_reproducibly(
    server: FakeOpenAIServer,
) -> None:
    pipeline = SelfConsistency().bind(resources=make_resources(server, ("fast", "smart")))
    verdict = pipeline.run_sync("What is 6 x 7? [[sample:1000000]]", seed=3)
    answers = verdict.removeprefix("[Give the answer most of these agree on.] ").split("\n---\n")
    assert len(answers) == 5 and len(set(answers)) == 5
    assert all(
        answer.startswith("[Solve step by step.] What is 6 x 7? ~draw ") for answer in answers
    )
    assert pipeline.run_sync("What is 6 x 7? [[sample:1000000]]", seed=3) == verdict
