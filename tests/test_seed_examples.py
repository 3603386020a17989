"""Every code example of seeds 000 (Module system) and 002 (Parameters), run as written.

The seed code below is copied from the seeds; only the endpoint configuration differs: every
alias an example uses points at a real `FakeOpenAIServer` on 127.0.0.1, whose replies are a
pure function of the request (``[<system prompt>] <last user message>``, or the user message
alone without a system prompt).  That makes every answer the seed describes computable
exactly, and the server's per-request records (with bodies) show what plait actually sent.

Where an example leaves a name undefined (``send_to_client``, ``logger``, ``loss_fn``,
``batch_inputs``) it is defined minimally in the test.  Sections follow the seeds, top to bottom.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

import plait
from plait import (
    BackwardContext,
    BackwardResult,
    ExecutionError,
    ExecutionSettings,
    LLMInference,
    Module,
    Parameter,
    ResourceConfig,
    Value,
    ValueKind,
    run,
    valueify,
)
from plait.learning import Contains, Feedback, SFAOptimizer, TrainingStep
from plait.learning.optimizers import rewrite_max_tokens
from plait.resources import manager as resource_manager
from plait.resources.config import EndpointConfig
from plait.testing import FakeOpenAIServer

# =============================================================================================
# Seed 000, copied: composing modules
# =============================================================================================


class SummarizeAndAnalyze(Module):
    """A simple sequential pipeline."""

    def __init__(self):
        super().__init__()
        self.summarizer = LLMInference(
            alias="fast_llm",
            system_prompt="You are a concise summarizer.",
        )
        self.analyzer = LLMInference(
            alias="smart_llm",
            system_prompt="You are a thorough analyst.",
        )

    def forward(self, text: str) -> str:
        summary = self.summarizer(text)
        analysis = self.analyzer(summary)
        return analysis


class MultiPerspectiveAnalysis(Module):
    """Analyze from multiple perspectives in parallel."""

    def __init__(self):
        super().__init__()
        self.technical = LLMInference(
            alias="llm",
            system_prompt="Analyze from a technical perspective.",
        )
        self.business = LLMInference(
            alias="llm",
            system_prompt="Analyze from a business perspective.",
        )
        self.user = LLMInference(
            alias="llm",
            system_prompt="Analyze from a user perspective.",
        )

    def forward(self, text: str) -> dict[str, str]:
        # These can execute in parallel (same input, no dependencies)
        return {
            "technical": self.technical(text),
            "business": self.business(text),
            "user": self.user(text),
        }


class Synthesizer(Module):
    """Combine multiple analyses into a final report."""

    def __init__(self):
        super().__init__()
        self.analyzer = MultiPerspectiveAnalysis()
        self.synthesizer = LLMInference(
            alias="smart_llm",
            system_prompt="Synthesize multiple perspectives into a cohesive report.",
        )

    def forward(self, text: str) -> str:
        perspectives = self.analyzer(text)
        # Format for synthesis
        combined = "\n\n".join(
            f"## {name.title()} Perspective\n{analysis}" for name, analysis in perspectives.items()
        )
        return self.synthesizer(combined)


class DeepPipeline(Module):
    """Deeply nested module composition."""

    def __init__(self):
        super().__init__()
        self.stage1 = SummarizeAndAnalyze()  # Contains 2 LLMInference
        self.stage2 = MultiPerspectiveAnalysis()  # Contains 3 LLMInference
        self.stage3 = Synthesizer()  # Contains nested modules

    def forward(self, text: str) -> str:
        result1 = self.stage1(text)
        result2 = self.stage2(result1)
        return self.stage3(str(result2))


class AssistantGeneration(Module):
    """
    An assistant with optimizable instructions.
    The system prompt can be improved through backward passes.
    """

    def __init__(self, assistant_instructions: str, temperature: float = 1.0):
        super().__init__()
        # This parameter can be optimized
        self.assistant_instructions = Parameter(
            assistant_instructions,
            description=(
                "Defines the assistant’s core behavior and tone. "
                "Should be stable but improvable based on feedback."
            ),
        )
        # LLM for generating responses
        self.llm = LLMInference(
            alias="assistant_llm",
            temperature=temperature,
        )
        # LLM for backward pass (prompt optimization)
        self.optimizer_llm = LLMInference(
            alias="optimizer_llm",
            temperature=0.7,
            system_prompt="You help improve prompts based on feedback.",
        )

    def forward(self, request: str) -> str:
        # Combine instructions with request
        full_prompt = f"{self.assistant_instructions}\n\nUser: {request}"
        return self.llm(full_prompt)

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        """Generate feedback for the instructions parameter."""
        result = BackwardResult()
        # Value for the input request
        result.input_feedback["request"] = feedback.payload
        # Use LLM to generate parameter feedback
        if self.assistant_instructions.requires_grad:
            improvement_prompt = f"""
Current instructions: {self.assistant_instructions.value}
Output that was produced: {ctx.output}
Value on output: {feedback.payload}
What specific changes to the instructions would improve the output?
"""
            # Note: This would be traced and executed as part of backward graph
            improvement = self.optimizer_llm(improvement_prompt)
            result.parameter_feedback["assistant_instructions"] = improvement
        return result


# For modules that don't use LLMInference, direct calls work
class TextProcessor(Module):
    def forward(self, text: str) -> str:
        return text.upper()


Input = TypeVar("Input")
Output = TypeVar("Output")


class TypedModule(Module, Generic[Input, Output]):
    """Base class for type-annotated modules."""

    def forward(self, input: Input) -> Output:
        raise NotImplementedError


class Summarizer(TypedModule[str, str]):
    """Strongly typed summarizer."""

    def __init__(self):
        super().__init__()
        self.llm = LLMInference(alias="llm")

    def forward(self, text: str) -> str:
        return self.llm(f"Summarize: {text}")


class Classifier(TypedModule[str, list[str]]):
    """Strongly typed classifier."""

    def __init__(self):
        super().__init__()
        self.llm = LLMInference(
            alias="llm",
            response_format=list[str],  # Structured output
        )

    def forward(self, text: str) -> list[str]:
        return self.llm(f"Classify into categories: {text}")


class CustomAssistant(Module):
    def __init__(self, instructions: str):
        super().__init__()
        # Document what this parameter controls
        self.instructions = Parameter(
            instructions,
            description="Defines the assistant’s response policy and tone.",
        )


# =============================================================================================
# The endpoint configuration (the one thing changed) and helpers to predict replies
# =============================================================================================

KEY = "sk-seed-examples"

SUMMARIZER = "You are a concise summarizer."
ANALYST = "You are a thorough analyst."
TECHNICAL = "Analyze from a technical perspective."
BUSINESS = "Analyze from a business perspective."
USER = "Analyze from a user perspective."
SYNTHESIS = "Synthesize multiple perspectives into a cohesive report."
IMPROVER = "You help improve prompts based on feedback."
STAGE2 = (TECHNICAL, BUSINESS, USER)

# An alias that nobody configured falls back to the embedded local model. Examples must
# reach the fake server, so in this module that fallback fails at once and says why.
NO_LOCAL_MODEL = "/nonexistent/seed-example-fell-back-to-the-embedded-local-model.gguf"


def seed_resources(server: FakeOpenAIServer) -> ResourceConfig:
    """The seed's ResourceConfig, plus the aliases its other examples use, all on the fake."""
    endpoint = {"base_url": server.base_url, "api_key": KEY}
    return ResourceConfig(
        {
            "fast_llm": {
                "provider": "openai",
                "model": "gpt-4o-mini",
                "max_concurrent": 10,
                **endpoint,
            },
            "smart_llm": {
                "provider": "openai",
                "model": "gpt-4o",
                "max_concurrent": 5,
                **endpoint,
            },
            # aliases used by the other examples, which the seed's config leaves out
            "llm": {"provider": "openai", "model": "llm-model", **endpoint},
            "assistant_llm": {"provider": "openai", "model": "assistant-model", **endpoint},
            "optimizer_llm": {"provider": "openai", "model": "optimizer-llm-model", **endpoint},
            "optimizer": {"provider": "openai", "model": "sfa-optimizer-model", **endpoint},
            "customer_support_llm": {"provider": "openai", "model": "support-model", **endpoint},
        }
    )


def echo(system: str | None, text: str) -> str:
    """The fake server's reply to ``text`` under ``system``."""
    return text if system is None else f"[{system}] {text}"


def expected_summarize_and_analyze(text: str) -> str:
    return echo(ANALYST, echo(SUMMARIZER, text))


def expected_perspectives(text: str) -> dict[str, str]:
    return {
        "technical": echo(TECHNICAL, text),
        "business": echo(BUSINESS, text),
        "user": echo(USER, text),
    }


def expected_combined(text: str) -> str:
    return "\n\n".join(
        f"## {name.title()} Perspective\n{analysis}"
        for name, analysis in expected_perspectives(text).items()
    )


def expected_synthesizer(text: str) -> str:
    return echo(SYNTHESIS, expected_combined(text))


def expected_stage2(text: str) -> dict[str, str]:
    return expected_perspectives(expected_summarize_and_analyze(text))


def expected_deep(text: str) -> str:
    return expected_synthesizer(str(expected_stage2(text)))


@dataclass
class Sent:
    """One request the fake server received."""

    system: str | None
    user: str
    model: str
    status: int
    t_start: float
    t_end: float
    body: dict[str, Any]


def sent(server: FakeOpenAIServer) -> list[Sent]:
    """Every request since the last reset, in arrival order."""
    out = []
    for record in server.stats(bodies=True)["requests"]:
        body = record["body"]
        users = [m["content"] for m in body["messages"] if m["role"] == "user"]
        out.append(
            Sent(
                system=record["system"],
                user=users[-1] if users else "",
                model=record["model"],
                status=record["status"],
                t_start=record["t_start"],
                t_end=record["t_end"],
                body=body,
            )
        )
    return sorted(out, key=lambda s: s.t_start)


def replies(server: FakeOpenAIServer) -> list[str]:
    return [echo(s.system, s.user) for s in sent(server) if s.status == 200]


@pytest.fixture(scope="module")
def seed_server() -> Any:
    with FakeOpenAIServer(api_key=KEY) as server:
        yield server


@pytest.fixture()
def fake(seed_server: FakeOpenAIServer) -> FakeOpenAIServer:
    """The module's fake server with its statistics cleared and no latency or faults."""
    seed_server.configure(
        latency_ms=0, jitter_ms=0, rate_429=0, rate_500=0, rate_drop=0, rate_timeout=0, seed=0
    )
    seed_server.reset()
    return seed_server


@pytest.fixture()
def resources(fake: FakeOpenAIServer) -> ResourceConfig:
    return seed_resources(fake)


@pytest.fixture(autouse=True)
def _no_embedded_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        resource_manager,
        "LOCAL_DEFAULT",
        EndpointConfig(provider="local", model_path=NO_LOCAL_MODEL),
    )


# =============================================================================================
# Seed 000: Module base class, introspection, state, modes
# =============================================================================================


def test_s000_setattr_registers_children_and_parameters_by_name() -> None:
    pipeline = DeepPipeline()
    assert [name for name, _ in pipeline.named_children()] == ["stage1", "stage2", "stage3"]
    assert list(pipeline.children()) == [pipeline.stage1, pipeline.stage2, pipeline.stage3]
    assistant = AssistantGeneration("Be helpful.")
    assert assistant.assistant_instructions._name == "assistant_instructions"
    assert dict(assistant.named_children()) == {
        "llm": assistant.llm,
        "optimizer_llm": assistant.optimizer_llm,
    }


DEEP_MODULES = [
    "",
    "stage1",
    "stage1.summarizer",
    "stage1.analyzer",
    "stage2",
    "stage2.technical",
    "stage2.business",
    "stage2.user",
    "stage3",
    "stage3.analyzer",
    "stage3.analyzer.technical",
    "stage3.analyzer.business",
    "stage3.analyzer.user",
    "stage3.synthesizer",
]

DEEP_PARAMETERS = {
    "stage1.summarizer.system_prompt": SUMMARIZER,
    "stage1.analyzer.system_prompt": ANALYST,
    "stage2.technical.system_prompt": TECHNICAL,
    "stage2.business.system_prompt": BUSINESS,
    "stage2.user.system_prompt": USER,
    "stage3.analyzer.technical.system_prompt": TECHNICAL,
    "stage3.analyzer.business.system_prompt": BUSINESS,
    "stage3.analyzer.user.system_prompt": USER,
    "stage3.synthesizer.system_prompt": SYNTHESIS,
}


def test_s000_named_modules_and_named_parameters_are_hierarchical() -> None:
    pipeline = DeepPipeline()
    assert [name for name, _ in pipeline.named_modules()] == DEEP_MODULES
    assert len(list(pipeline.modules())) == len(DEEP_MODULES)
    assert next(iter(pipeline.modules())) is pipeline
    named = list(pipeline.named_parameters())
    assert [(name, p.value) for name, p in named] == list(DEEP_PARAMETERS.items())
    assert list(pipeline.parameters()) == [p for _, p in named]
    # with a prefix, as the seed's signatures allow
    assert [name for name, _ in pipeline.named_modules("root")][:3] == [
        "root",
        "root.stage1",
        "root.stage1.summarizer",
    ]
    assert next(iter(pipeline.named_parameters("root")))[0] == (
        "root.stage1.summarizer.system_prompt"
    )


def test_s000_state_dict_and_load_state_dict(fake: FakeOpenAIServer, resources: Any) -> None:
    pipeline = DeepPipeline()
    assert pipeline.state_dict() == DEEP_PARAMETERS
    pipeline.load_state_dict({"stage1.summarizer.system_prompt": "Summarize in five words."})
    assert pipeline.stage1.summarizer.system_prompt.value == "Summarize in five words."
    assert pipeline.state_dict()["stage2.user.system_prompt"] == USER  # missing keys ignored
    with pytest.raises(KeyError):
        pipeline.load_state_dict({"stage9.nope": "x"})
    # the loaded prompt is what the next run sends
    pipeline.bind(resources=resources).stage1.run_sync("doc")
    assert [s.system for s in sent(fake)] == ["Summarize in five words.", ANALYST]

    assistant = AssistantGeneration("Be terse.")
    assert assistant.state_dict() == {
        "assistant_instructions": "Be terse.",
        "optimizer_llm.system_prompt": IMPROVER,
    }
    restored = AssistantGeneration("x")
    restored.load_state_dict(assistant.state_dict())
    assert restored.assistant_instructions.value == "Be terse."


def test_s000_train_eval_propagate_and_return_self() -> None:
    pipeline = DeepPipeline()
    assert pipeline.train() is pipeline
    assert all(module.training for module in pipeline.modules())
    assert pipeline.eval() is pipeline
    assert not any(module.training for module in pipeline.modules())
    pipeline.train(True)
    pipeline.train(False)  # eval() is train(False)
    assert not pipeline.stage3.analyzer.user.training


def test_s000_requires_grad_freezes_every_parameter() -> None:
    assistant = AssistantGeneration("Be terse.")
    assert assistant.requires_grad_(False) is assistant
    assert [p.requires_grad for p in assistant.parameters()] == [False, False]
    assistant.assistant_instructions.accumulate_feedback("ignored: frozen")
    assert assistant.assistant_instructions.get_accumulated_feedback() == []
    assistant.requires_grad_()
    assert all(p.requires_grad for p in assistant.parameters())
    assistant.assistant_instructions.accumulate_feedback("kept")
    assert assistant.assistant_instructions.get_accumulated_feedback() == ["kept"]


def test_s000_default_module_backward_sends_feedback_to_every_input() -> None:
    feedback = Value(ValueKind.TEXT, "too loud")
    result = TextProcessor().backward(feedback, BackwardContext(inputs={"text": "hello"}))
    assert result.input_feedback == {"text": feedback}
    assert result.parameter_feedback == {}


# =============================================================================================
# Seed 000: Parameter class
# =============================================================================================


def test_s000_parameter_methods() -> None:
    param = Parameter("Be concise.", description="Tone of the summary.")
    assert str(param) == "Be concise."
    assert param.requires_grad is True
    param.accumulate_feedback("too long")
    param.accumulate_feedback("too formal")
    got = param.get_accumulated_feedback()
    assert got == ["too long", "too formal"]
    got.append("not in the buffer")  # a copy, as list(self._feedback_buffer)
    assert param.get_accumulated_feedback() == ["too long", "too formal"]
    param.apply_update("Be brief.")
    assert param.value == "Be brief." and str(param) == "Be brief."
    assert param.get_accumulated_feedback() == []
    param.accumulate_feedback("again")
    param.zero_feedback()
    assert param.get_accumulated_feedback() == []
    frozen = Parameter("fixed", description="not learnable", requires_grad=False)
    frozen.accumulate_feedback("ignored")
    assert frozen.get_accumulated_feedback() == []


# =============================================================================================
# Seed 000: LLMInference
# =============================================================================================


def test_s000_llm_inference_wraps_its_system_prompt() -> None:
    llm = LLMInference(alias="fast_llm", system_prompt="You are a concise summarizer.")
    assert isinstance(llm.system_prompt, Parameter)
    assert llm.system_prompt.value == SUMMARIZER and llm.system_prompt.requires_grad is False
    assert LLMInference(alias="fast_llm").system_prompt is None
    learnable = Parameter("Be kind.", description="the assistant's tone")
    assert LLMInference(alias="llm", system_prompt=learnable).system_prompt is learnable
    llm = LLMInference(alias="llm", temperature=0.2, max_tokens=64, response_format=list[str])
    assert (llm.alias, llm.temperature, llm.max_tokens) == ("llm", 0.2, 64)
    assert llm.response_format == list[str]
    with pytest.raises(RuntimeError):
        llm.forward("called directly")


def test_s000_llm_inference_backward() -> None:
    learnable = Parameter("Be kind.", description="the assistant's tone")
    llm = LLMInference(alias="llm", system_prompt=learnable)
    result = llm.backward(
        Value(ValueKind.TEXT, "too curt"), BackwardContext(inputs={"prompt": "p"})
    )
    assert result.input_feedback == {"prompt": "too curt"}
    assert result.parameter_feedback == {
        "system_prompt": (
            "Given output feedback: too curt\nSuggest improvements to the system prompt."
        )
    }
    fixed = LLMInference(alias="llm", system_prompt="Fixed.")
    result = fixed.backward(Value(ValueKind.TEXT, "x"), BackwardContext(inputs={"prompt": "p"}))
    assert result.parameter_feedback == {}


# =============================================================================================
# Seed 000: composing modules, run on the fake server
# =============================================================================================


async def test_s000_sequential_summarize_and_analyze(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=resources)
    result = await pipeline("The quarterly report shows growth.")
    assert result == expected_summarize_and_analyze("The quarterly report shows growth.")
    first, second = sent(fake)
    assert (first.system, first.model, first.user) == (
        SUMMARIZER,
        "gpt-4o-mini",
        "The quarterly report shows growth.",
    )
    assert (second.system, second.model) == (ANALYST, "gpt-4o")
    assert second.user == echo(SUMMARIZER, "The quarterly report shows growth.")
    assert second.t_start >= first.t_end - 0.01


async def test_s000_parallel_multi_perspective_analysis(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    pipeline = MultiPerspectiveAnalysis().bind(resources=resources)
    # the three calls park at the server's gate: all three reach it before any reply
    running = asyncio.ensure_future(pipeline("A new billing page. [[gate:three]]"))
    try:
        await asyncio.to_thread(fake.wait_parked, "three", 3)
    finally:
        await asyncio.to_thread(fake.open_gate, "three")
    result = await running
    assert result == expected_perspectives("A new billing page.")
    assert sorted(s.system or "" for s in sent(fake)) == sorted(STAGE2)
    assert all(s.model == "llm-model" for s in sent(fake))
    assert fake.stats()["max_in_flight"] == 3  # "These can execute in parallel"


async def test_s000_fan_in_synthesizer(fake: FakeOpenAIServer, resources: Any) -> None:
    pipeline = Synthesizer().bind(resources=resources)
    result = await pipeline("Feature X")
    assert result == expected_synthesizer("Feature X")
    requests = sent(fake)
    [final] = [s for s in requests if s.system == SYNTHESIS]
    assert final.user == expected_combined("Feature X")
    assert final.model == "gpt-4o"
    analyses = [s for s in requests if s.system in STAGE2]
    assert len(analyses) == 3
    assert final.t_start >= max(s.t_end for s in analyses) - 0.01


async def test_s000_deep_pipeline_returns_the_answer_of_all_three_stages(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    pipeline = DeepPipeline().bind(resources=resources)
    result = await pipeline("Analyze this document...")
    assert result == expected_deep("Analyze this document...")
    assert len(sent(fake)) == 9  # one flattened graph: every LLMInference once


async def test_s000_deep_pipeline_stage3_receives_str_of_stage2_real_outputs(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    fake.configure(latency_ms=50)
    pipeline = DeepPipeline().bind(resources=resources)
    await pipeline("Analyze this document...")
    requests = sent(fake)
    stage1_output = expected_summarize_and_analyze("Analyze this document...")
    stage2 = [s for s in requests if s.system in STAGE2 and s.user == stage1_output]
    stage3 = [s for s in requests if s.system in STAGE2 and s.user != stage1_output]
    assert len(stage2) == 3, [s.user for s in requests]
    # str(result2): Python's repr of a dict holding stage2's three real replies
    want = str(expected_stage2("Analyze this document..."))
    assert [s.user for s in stage3] == [want] * 3
    assert min(s.t_start for s in stage3) >= max(s.t_end for s in stage2) - 0.01


async def test_s000_assistant_generation_forward(fake: FakeOpenAIServer, resources: Any) -> None:
    assistant = AssistantGeneration("Answer in one sentence.").bind(resources=resources)
    result = await assistant("How do I reset my password?")
    assert result == "Answer in one sentence.\n\nUser: How do I reset my password?"
    [request] = sent(fake)
    assert request.model == "assistant-model" and request.system is None
    assert request.body["temperature"] == 1.0


async def test_s000_assistant_generation_backward_runs_its_optimizer_llm(
    fake: FakeOpenAIServer, resources: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its own backward runs, and the optimizer_llm reply is the parameter's feedback."""
    calls: list[tuple[Any, Any]] = []
    original = AssistantGeneration.backward

    def spy(self: AssistantGeneration, feedback: Value, ctx: BackwardContext) -> Any:
        calls.append((feedback.payload, ctx.output))
        return original(self, feedback, ctx)

    monkeypatch.setattr(AssistantGeneration, "backward", spy)
    assistant = AssistantGeneration("Answer in one sentence.").bind(resources=resources)
    loss_fn = Contains()
    step = TrainingStep(assistant, loss_fn).bind(resources=resources)
    step.train()
    loss = await step("How do I reset my password?", target="settings page")
    output = "Answer in one sentence.\n\nUser: How do I reset my password?"
    feedback_text = loss_fn.forward(output, "settings page").text
    await loss.backward()

    assert len(calls) == 1, "AssistantGeneration.backward() was not called by loss.backward()"
    assert calls[0] == (feedback_text, output)
    improver = [s for s in sent(fake) if s.system == IMPROVER]
    assert len(improver) == 1, "optimizer_llm inside backward() never reached the server"
    [request] = improver
    assert request.model == "optimizer-llm-model" and request.body["temperature"] == 0.7
    assert "Current instructions: Answer in one sentence.\n" in request.user
    assert f"Output that was produced: {output}\n" in request.user
    assert f"Value on output: {feedback_text}\n" in request.user
    assert assistant.assistant_instructions.get_accumulated_feedback() == [
        echo(IMPROVER, request.user)
    ]


# =============================================================================================
# Seed 000: execution patterns
# =============================================================================================

DOCS = ["Document 1 text...", "Document 2 text...", "Document 3 text..."]


async def test_s000_bound_async_single_and_concurrent_batch(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    # Bind resources to the module
    pipeline = DeepPipeline().bind(resources=resources)
    # Async execution
    result = await pipeline("Analyze this document...")
    assert result == expected_deep("Analyze this document...")
    fake.reset()
    # Batch execution - runs CONCURRENTLY, returns list: each document's first call
    # parks at the server's gate, and all three get there before any is answered
    batch = asyncio.ensure_future(
        pipeline(
            [
                "Document 1 text... [[gate:docs]]",
                "Document 2 text... [[gate:docs]]",
                "Document 3 text... [[gate:docs]]",
            ]
        )
    )
    try:
        await asyncio.to_thread(fake.wait_parked, "docs", 3)
    finally:
        await asyncio.to_thread(fake.open_gate, "docs")
    results = await batch
    assert results == [expected_deep(doc) for doc in DOCS]
    assert fake.stats()["max_in_flight"] >= 3


def test_s000_bound_sync_single_and_batch(fake: FakeOpenAIServer, resources: Any) -> None:
    pipeline = DeepPipeline().bind(resources=resources)
    # Sync execution for scripts (no await needed)
    result = pipeline.run_sync("Analyze this document...")
    results = pipeline.run_sync(["Doc 1...", "Doc 2...", "Doc 3..."])
    assert result == expected_deep("Analyze this document...")
    assert results == [expected_deep(doc) for doc in ["Doc 1...", "Doc 2...", "Doc 3..."]]
    assert len(sent(fake)) == 4 * 9


logger = logging.getLogger("seed_examples.streaming")


async def test_s000_streaming_yields_batch_results(
    fake: FakeOpenAIServer, resources: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pipeline = DeepPipeline().bind(resources=resources)
    config = resources
    # the second input fails at its first call: the fake answers it with HTTP 400
    large_batch = ["Document 1 text...", "Document 2 text... [[status:400]]", "Document 3 text..."]
    delivered: dict[int, Any] = {}
    seen: list[Any] = []

    async def send_to_client(output: Any) -> None:
        delivered[result.index] = output

    with caplog.at_level(logging.ERROR, logger=logger.name):
        async with ExecutionSettings(resources=config, streaming=True):
            async for result in pipeline(large_batch):
                seen.append(result)
                if result.ok:
                    await send_to_client(result.output)
                else:
                    logger.error(f"Input {result.index} failed: {result.error}")

    assert all(isinstance(r, plait.BatchResult) for r in seen)
    assert sorted(r.index for r in seen) == [0, 1, 2]
    assert delivered == {0: expected_deep(DOCS[0]), 2: expected_deep(DOCS[2])}
    [failed] = [r for r in seen if not r.ok]
    assert failed.index == 1 and failed.output is None and failed.input == large_batch[1]
    assert isinstance(failed.error, ExecutionError)
    assert failed.error.value.kind is ValueKind.ERROR
    assert "400" in str(failed.error)
    assert [rec.getMessage() for rec in caplog.records] == [f"Input 1 failed: {failed.error}"]


async def test_s000_streaming_order_completion_first_or_preserved(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    pipeline = DeepPipeline().bind(resources=resources)
    batch = ["slow [[gate:slow]]", "fast one", "fast two"]
    order = []
    async with ExecutionSettings(resources=resources, streaming=True):
        async for r in pipeline(batch):
            order.append(r.index)
            if len(order) == 2:  # both fast ones are out while the slow one's call waits
                await asyncio.to_thread(fake.open_gate, "slow")
    assert order[-1] == 0  # "as completed (fastest first)"
    async with ExecutionSettings(resources=resources, streaming=True, preserve_order=True):
        results = [r async for r in pipeline(batch)]
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.output for r in results] == [expected_deep(t) for t in ["slow", *batch[1:]]]


# loss_fn, batch_inputs and targets are left undefined by the seed
def loss_fn_for_seed() -> Contains:
    return Contains()


async def test_s000_training_execution_single_and_batch(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    """The seed's snippet: a bound pipeline inside an (unbound) TrainingStep."""
    pipeline = DeepPipeline().bind(resources=resources)
    loss_fn = loss_fn_for_seed()
    input, target = "Analyze this document...", "document"
    batch_inputs, targets = DOCS, ["Document 1", "Document 2", "nowhere"]

    step = TrainingStep(pipeline, loss_fn)
    # Enable recording so loss.backward() works
    step.train()
    # Single input - returns loss Value
    loss = await step(input, target)
    assert isinstance(loss, Value)
    assert loss.meta["_tape_ids"]  # Tape ids for backward()
    assert loss.payload == loss_fn.forward(expected_deep(input), target)
    assert len(sent(fake)) == 9, "the bound pipeline's calls must reach its own endpoints"

    # Batch inputs - returns list[Value]
    losses = await asyncio.gather(
        *[step(x, target=t) for x, t in zip(batch_inputs, targets, strict=True)]
    )
    assert all(isinstance(v, Value) and v.meta["_tape_ids"] for v in losses)
    assert [v.payload.score for v in losses] == [1.0, 1.0, 0.0]
    # Disable training mode for inference
    step.eval()
    assert isinstance(await step(input, target), Feedback)


async def test_s000_train_mode_returns_values_eval_returns_raw(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    """Table rows: `await module("x")` is T; after `module.train()` it is Value[T]."""
    pipeline = DeepPipeline().bind(resources=resources)
    pipeline.eval()
    plain = await pipeline("Analyze this document...")
    assert plain == expected_deep("Analyze this document...")
    assert not isinstance(plain, Value)
    pipeline.train()
    single = await pipeline("Analyze this document...")
    assert isinstance(single, Value)
    assert single.payload == expected_deep("Analyze this document...")
    assert single.meta["_tape_ids"]
    batch = await pipeline(DOCS)
    assert [type(v) for v in batch] == [Value] * 3
    assert [v.payload for v in batch] == [expected_deep(d) for d in DOCS]
    assert all(v.meta["_tape_ids"] for v in batch)


async def test_s000_training_loop_on_deep_pipeline(fake: FakeOpenAIServer, resources: Any) -> None:
    pipeline = DeepPipeline().bind(resources=resources)
    loss_fn = loss_fn_for_seed()
    batch_inputs, targets = DOCS, ["Document 1", "Document 2", "nowhere"]
    before = pipeline.state_dict()

    optimizer = SFAOptimizer(pipeline.parameters()).bind(resources)
    step = TrainingStep(pipeline, loss_fn)

    async with ExecutionSettings(resources=resources):
        step.train()
        optimizer.zero_feedback()
        losses = await asyncio.gather(
            *[step(x, target=t) for x, t in zip(batch_inputs, targets, strict=True)]
        )
        await asyncio.gather(*[loss.backward() for loss in losses])
        await optimizer.step()
        step.eval()

    assert [v.payload.score for v in losses] == [1.0, 1.0, 0.0]
    assert len(sent(fake)) == 27  # 9 calls per input; frozen prompts need no rewrite
    # every system prompt is requires_grad=False: lifted, but never learns
    assert all(p.get_accumulated_feedback() == [] for p in pipeline.parameters())
    assert pipeline.state_dict() == before
    assert not step.training and not pipeline.training


async def test_s000_training_loop_refuses_an_echoed_rewrite(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    """The same loop over the seed's parameterized module (AssistantGeneration)."""
    pipeline = AssistantGeneration("Answer in one sentence.").bind(resources=resources)
    loss_fn = loss_fn_for_seed()
    batch_inputs = ["How do I reset my password?", "Where is my invoice?"]
    targets = ["settings page", "billing tab"]
    version = pipeline.module_state_version

    # Plain-text rewrites (structured=False), which the fake server answers with an echo.
    optimizer = SFAOptimizer(pipeline.parameters(), structured=False).bind(resources)
    step = TrainingStep(pipeline, loss_fn)

    async with ExecutionSettings(resources=resources):
        step.train()
        optimizer.zero_feedback()
        losses = await asyncio.gather(
            *[step(x, target=t) for x, t in zip(batch_inputs, targets, strict=True)]
        )
        await asyncio.gather(*[loss.backward() for loss in losses])
        improvements = [echo(s.system, s.user) for s in sent(fake) if s.system == IMPROVER]
        assert len(improvements) == 2, "AssistantGeneration.backward's optimizer_llm calls"
        heard = pipeline.assistant_instructions.get_accumulated_feedback()
        assert sorted(heard) == sorted(improvements)
        await optimizer.step()
        step.eval()

    [rewrite] = [s for s in sent(fake) if s.model == "sfa-optimizer-model"]
    for improvement in improvements:
        assert " ".join(improvement.split()) in rewrite.user  # the rewrite saw the feedback
    # The fake server echoes the rewrite prompt back: an echo, not a value, so it is
    # refused and the parameter keeps its value and its feedback for the next step.
    (rejection,) = optimizer.rejected
    # (cut short: the rewriter's max_tokens is sized to the one-sentence parameter)
    assert echo(rewrite.system, rewrite.user).startswith(rejection.value)
    assert rewrite.body["max_tokens"] == rewrite_max_tokens("Answer in one sentence.")
    assert "echoes the rewrite prompt" in rejection.reason
    assert pipeline.assistant_instructions.value == "Answer in one sentence."
    assert sorted(pipeline.assistant_instructions.get_accumulated_feedback()) == sorted(heard)
    assert pipeline.module_state_version == version


async def test_s000_run_with_max_concurrent_and_checkpoint_dir(
    fake: FakeOpenAIServer, resources: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    # Create module (not bound)
    pipeline = DeepPipeline()
    # Use run() with per-call options
    result = await run(
        pipeline,
        "Analyze this document...",
        resources=resources,
        max_concurrent=50,
        checkpoint_dir=Path("./checkpoints"),
    )
    assert result == expected_deep("Analyze this document...")
    assert len(sent(fake)) == 9
    assert (tmp_path / "checkpoints").is_dir() and any((tmp_path / "checkpoints").iterdir())


async def test_s000_run_max_concurrent_caps_calls_in_flight(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    result = await run(MultiPerspectiveAnalysis(), "x", resources=resources, max_concurrent=1)
    assert result == expected_perspectives("x")
    assert fake.stats()["max_in_flight"] == 1
    fake.reset()
    bound = MultiPerspectiveAnalysis().bind(resources=resources, max_concurrent=2)
    running = asyncio.ensure_future(bound("y [[gate:two]]"))
    try:
        await asyncio.to_thread(fake.wait_parked, "two", 2)  # two of the three, no more
        assert fake.stats()["in_flight"] == 2
    finally:
        await asyncio.to_thread(fake.open_gate, "two")
    assert await running == expected_perspectives("y")
    assert fake.stats()["max_in_flight"] == 2


async def test_s000_bind_propagates_to_children(fake: FakeOpenAIServer, resources: Any) -> None:
    root = DeepPipeline()
    assert root.bind(resources=resources) is root
    # "Binding is propagated to all child modules automatically"
    assert root.stage1.run_sync("child text") == expected_summarize_and_analyze("child text")
    assert await root.stage3.synthesizer("grandchild") == echo(SYNTHESIS, "grandchild")
    assert [s.system for s in sent(fake)] == [SUMMARIZER, ANALYST, SYNTHESIS]


def _unreachable_resources() -> ResourceConfig:
    """Every alias on a closed port, without retries: a call that uses these fails fast."""
    dead = {"provider": "openai", "base_url": "http://127.0.0.1:9/v1", "api_key": "x"}
    return ResourceConfig(
        {
            alias: {**dead, "model": "dead", "max_retries": 0, "timeout": 5}
            for alias in ("fast_llm", "smart_llm", "llm")
        }
    )


async def test_s000_settings_priority_call_over_bound_over_context(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    """_execute_bound: call-time kwargs > bind() > ExecutionSettings."""
    async with ExecutionSettings(resources=_unreachable_resources()):
        bound = SummarizeAndAnalyze().bind(resources=resources)
        assert await bound("a") == expected_summarize_and_analyze("a")
        unbound = SummarizeAndAnalyze()
        assert await run(unbound, "b", resources=resources) == expected_summarize_and_analyze("b")
    dead_bound = SummarizeAndAnalyze().bind(resources=_unreachable_resources())
    assert await run(dead_bound, "c", resources=resources) == expected_summarize_and_analyze("c")
    assert len(sent(fake)) == 6


def test_s000_direct_execution_of_a_plain_module(fake: FakeOpenAIServer) -> None:
    processor = TextProcessor()
    result = processor("hello")  # Returns "HELLO" directly
    assert result == "HELLO"
    assert fake.stats()["requests_total"] == 0


async def test_s000_typed_summarizer_and_classifier(fake: FakeOpenAIServer, resources: Any) -> None:
    summarizer = Summarizer().bind(resources=resources)
    assert await summarizer("a long text") == "Summarize: a long text"
    classifier = Classifier().bind(resources=resources)
    categories = await classifier("a long text")
    # the fake answers a JSON schema with its minimal instance: one string, "x"
    assert categories == ["x"]
    structured = sent(fake)[-1]
    assert structured.user == "Classify into categories: a long text"
    assert structured.body.get("response_format", {}).get("type") == "json_schema"


async def test_s000_best_practice_examples(fake: FakeOpenAIServer, resources: Any) -> None:
    # Good: Single responsibility (the seed leaves out __init__; the alias is its other tip)
    class Summarizer(Module):
        def forward(self, text: str) -> str:
            return self.llm(f"Summarize: {text}")

    focused = Summarizer()
    # Good: Clear purpose
    focused.llm = LLMInference(alias="customer_support_llm")
    assert await focused.bind(resources=resources)("the ticket") == "Summarize: the ticket"
    assert sent(fake)[-1].model == "support-model"

    # Document parameters
    assistant = CustomAssistant("Reply within one paragraph.")
    [(name, param)] = list(assistant.named_parameters())
    assert name == "instructions" and param.value == "Reply within one paragraph."
    assert param.description == "Defines the assistant’s response policy and tone."
    assert param.requires_grad is True


# =============================================================================================
# Seed 002: Parameters
# =============================================================================================


def test_s002_core_data_model() -> None:
    param = Parameter({"style": "terse", "max_words": 50}, description="Output settings.")
    assert param.value == {"style": "terse", "max_words": 50}  # value: Any
    assert param.description == "Output settings."
    assert param.requires_grad is True
    assert param._name is None and param._feedback_buffer == []
    with pytest.raises((ValueError, TypeError)):
        Parameter("no description but learnable")  # description required when requires_grad
    assert Parameter("fixed", requires_grad=False).description is None


def test_s002_valueify_gives_param_ref_and_meta() -> None:
    pipeline = DeepPipeline()
    param = dict(pipeline.named_parameters())["stage3.analyzer.user.system_prompt"]
    value = valueify(param)
    assert value.kind is ValueKind.TEXT
    assert value.payload == USER
    assert value.ref == "param:stage3.analyzer.user.system_prompt"
    assert value.meta == {
        "param_name": "stage3.analyzer.user.system_prompt",
        "param_id": value.meta["param_id"],
        "module_state_version": 0,
        "requires_grad": False,
    }
    assert isinstance(value.meta["param_id"], str) and value.meta["param_id"]
    assert valueify(param).meta["param_id"] == value.meta["param_id"]  # stable
    other = dict(pipeline.named_parameters())["stage2.user.system_prompt"]
    assert valueify(other).meta["param_id"] != value.meta["param_id"]
    assert valueify(other).ref == "param:stage2.user.system_prompt"

    assistant = AssistantGeneration("Be terse.")
    lifted = valueify(assistant.assistant_instructions)
    assert lifted.ref == "param:assistant_instructions"
    assert lifted.meta["requires_grad"] is True

    class Settings(Module):
        def __init__(self) -> None:
            super().__init__()
            self.options = Parameter({"k": [1, 2]}, description="structured settings")

    structured = valueify(Settings().options)
    assert structured.kind is ValueKind.STRUCTURED and structured.payload == {"k": [1, 2]}
    assert structured.ref == "param:options"


def test_s002_module_state_version_increments_on_update() -> None:
    assistant = AssistantGeneration("Be terse.")
    param = assistant.assistant_instructions
    first = valueify(param)
    assert assistant.module_state_version == first.meta["module_state_version"] == 0
    param.accumulate_feedback("too terse")
    param.apply_update("Be warm.")
    second = valueify(param)
    assert assistant.module_state_version == second.meta["module_state_version"] == 1
    assert second.payload == "Be warm." and second.ref == first.ref
    assert second.meta["param_id"] == first.meta["param_id"]
    assistant.load_state_dict({"assistant_instructions": "Be kind."})
    assert assistant.module_state_version == 2


async def test_s002_parameter_is_immutable_during_a_forward_pass(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    """An update made while an input is running does not reach that input's later calls."""

    class TwoReads(Module):
        def __init__(self) -> None:
            super().__init__()
            self.style = Parameter("Style A.", description="style of both calls")
            self.first = LLMInference(alias="llm")
            self.second = LLMInference(alias="llm")

        def forward(self, text: str) -> str:
            return self.second(f"{self.style} then {self.first(f'{self.style} {text}')}")

    fake.configure(latency_ms=300)
    module = TwoReads().bind(resources=resources)
    task = asyncio.ensure_future(module("go"))
    for _ in range(500):
        if fake.stats()["in_flight"]:
            break
        await asyncio.sleep(0.01)
    module.style.apply_update("Style B.")  # mid-pass: the first call is in flight
    result = await task
    assert result == "Style A. then Style A. go"
    assert [s.user for s in sent(fake)] == ["Style A. go", "Style A. then Style A. go"]
    assert await module("next") == "Style B. then Style B. next"


async def test_s002_errors_are_values_of_kind_error(fake: FakeOpenAIServer, resources: Any) -> None:
    pipeline = DeepPipeline().bind(resources=resources)
    ok, failed = await pipeline(["fine", "broken [[status:400]]"])
    assert ok == expected_deep("fine")
    assert isinstance(failed, Value) and failed.kind is ValueKind.ERROR
    assert failed.meta["module_path"] == "stage1.summarizer"
    assert "400" in failed.meta["message"]
    with pytest.raises(ExecutionError) as raised:
        await pipeline("broken [[status:400]]")
    assert raised.value.value.kind is ValueKind.ERROR


async def test_s002_frozen_parameters_are_lifted_but_learn_nothing(
    fake: FakeOpenAIServer, resources: Any
) -> None:
    """requires_grad=False: lifted into a Value, but never accumulates feedback."""
    assistant = AssistantGeneration("Answer in one sentence.").bind(resources=resources)
    assistant.requires_grad_(False)
    step = TrainingStep(assistant, Contains()).bind(resources=resources)
    step.train()
    loss = await step("hi", target="absent")
    await loss.backward()
    assert valueify(assistant.assistant_instructions).meta["requires_grad"] is False
    assert assistant.assistant_instructions.get_accumulated_feedback() == []
    assert [s.system for s in sent(fake)] == [None]  # no optimizer_llm call for a frozen one
