"""The authoring API of seeds 000 and 002: registration, naming, state, modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import plait
from plait import valueify
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Assistant, DeepPipeline, Echo


def test_public_names_are_exported() -> None:
    for name in [
        "Module",
        "Parameter",
        "LLMInference",
        "Value",
        "ValueKind",
        "ResourceConfig",
        "ExecutionSettings",
        "run",
        "BatchResult",
        "Sequential",
        "ModuleList",
        "ModuleDict",
        "ParameterList",
        "ParameterDict",
        "valueify",
    ]:
        assert hasattr(plait, name), name
    assert {k.name for k in plait.ValueKind} >= {"TEXT", "STRUCTURED", "RESPONSE", "ERROR"}


def test_children_and_parameters_register_with_dotted_names() -> None:
    pipeline = DeepPipeline()
    assert [name for name, _ in pipeline.named_children()] == ["stage1", "stage2", "stage3"]
    names = [name for name, _ in pipeline.named_modules()]
    assert names[0] == ""
    assert "stage3.analyzer.technical" in names
    assert len(list(pipeline.modules())) == len(names) == 14
    params = dict(pipeline.named_parameters())
    assert params["stage1.summarizer.system_prompt"].value == "sum"
    assert "stage3.synthesizer.system_prompt" in params
    assert next(iter(pipeline.children())) is pipeline.stage1


def test_shared_module_and_parameter_keep_one_identity_and_name() -> None:
    shared_style = plait.Parameter("Be terse.", description="Shared tone.")
    shared_llm = plait.LLMInference("fast", system_prompt=shared_style)

    class Branch(plait.Module):
        def __init__(self, llm: plait.LLMInference) -> None:
            super().__init__()
            self.llm = llm
            self.style = shared_style

        def forward(self, x: str) -> Any:
            return self.llm(x)

    class Root(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = Branch(shared_llm)
            self.b = Branch(shared_llm)

        def forward(self, x: str) -> Any:
            return self.b(self.a(x))

    root = Root()
    params = list(root.named_parameters())
    assert [p for _, p in params].count(shared_style) == 1
    assert [name for name, _ in params] == ["a.style"]
    assert list(root.state_dict()) == ["a.style"]
    modules = [name for name, _ in root.named_modules()]
    assert modules.count("a.llm") == 1 and "b.llm" not in modules
    root.load_state_dict({"a.style": "Be warm."})
    assert shared_llm.system_prompt is shared_style and shared_style.value == "Be warm."


def test_state_dict_round_trip_and_unknown_key() -> None:
    pipeline = Assistant("Be kind.")
    state = pipeline.state_dict()
    assert state == {"instructions": "Be kind."}
    other = Assistant("x")
    other.load_state_dict(state)
    assert other.instructions.value == "Be kind."
    other.load_state_dict({})  # missing keys are kept
    with pytest.raises(KeyError, match="nope"):
        other.load_state_dict({"nope": "v"})


def test_train_eval_and_requires_grad() -> None:
    pipeline = DeepPipeline()
    assert pipeline.training is False  # a fresh module returns raw outputs
    pipeline.train()
    assert all(m.training for m in pipeline.modules())
    pipeline.eval()
    assert not any(m.training for m in pipeline.modules())
    assistant = Assistant()
    assert assistant.requires_grad_(False) is assistant
    assert not any(p.requires_grad for p in assistant.parameters())
    assistant.instructions.accumulate_feedback("ignored while frozen")
    assert assistant.instructions.get_accumulated_feedback() == []


def test_parameter_needs_a_description_to_be_learnable() -> None:
    with pytest.raises(ValueError, match="description"):
        plait.Parameter("Be concise.")
    assert plait.Parameter("fixed", requires_grad=False).description is None


def test_parameter_feedback_update_and_state_version() -> None:
    assistant = Assistant()
    param = assistant.instructions
    assert assistant.module_state_version == 0
    param.accumulate_feedback("too long")
    param.accumulate_feedback("too formal")
    assert param.get_accumulated_feedback() == ["too long", "too formal"]
    param.zero_feedback()
    assert param.get_accumulated_feedback() == []
    param.accumulate_feedback("again")
    param.apply_update("Be brief.")
    assert param.value == "Be brief." and param.get_accumulated_feedback() == []
    assert assistant.module_state_version == 1
    assistant.load_state_dict({"instructions": "Be warm."})
    assert assistant.module_state_version == 2


def test_valueify_gives_a_stable_param_ref_and_seed_meta() -> None:
    pipeline = DeepPipeline()
    param = dict(pipeline.named_parameters())["stage2.user.system_prompt"]
    from plait.tracing.tracer import module_paths

    module_paths(pipeline)  # a run names parameters from its root
    value = valueify(param)
    assert value.kind is plait.ValueKind.TEXT
    assert value.ref == "param:stage2.user.system_prompt"
    assert value.meta == {
        "param_name": "stage2.user.system_prompt",
        "param_id": param.param_id,
        "module_state_version": 0,
        "requires_grad": False,
    }
    structured = valueify(plait.Parameter({"k": 1}, requires_grad=False))
    assert structured.kind is plait.ValueKind.STRUCTURED


def test_direct_call_of_a_plain_module_returns_the_raw_output() -> None:
    class Upper(plait.Module):
        def forward(self, text: str) -> str:
            return text.upper()

    assert Upper()("hello") == "HELLO"


def test_llm_inference_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="alias"):
        plait.LLMInference("")
    with pytest.raises(ValueError, match="max_tokens"):
        plait.LLMInference("fast", max_tokens=0)
    with pytest.raises(TypeError, match="system_prompt"):
        plait.LLMInference("fast", system_prompt=3)  # type: ignore[arg-type]
    llm = plait.LLMInference(
        "fast", system_prompt="S", temperature=0.2, max_tokens=5, response_format=list[str]
    )
    assert llm.system_prompt is not None and llm.system_prompt.requires_grad is False
    assert "alias='fast'" in repr(llm)


def test_forgetting_super_init_is_a_clear_error() -> None:
    class Broken(plait.Module):
        def __init__(self) -> None:
            self.llm = Echo("x")

    with pytest.raises(AttributeError, match=r"super\(\).__init__\(\)"):
        Broken()


def test_containers_register_and_behave_like_their_python_types() -> None:
    seq = plait.Sequential(Echo("a"), Echo("b"))
    assert [n for n, _ in seq.named_children()] == ["0", "1"] and len(seq) == 2
    mlist = plait.ModuleList([Echo("a")])
    mlist.append(Echo("b"))
    mlist.insert(0, Echo("z"))
    assert [m.system_prompt.value for m in mlist] == ["z", "a", "b"]  # type: ignore[union-attr]
    del mlist[0]
    assert len(mlist) == 2 and [n for n, _ in mlist.named_children()] == ["0", "1"]
    mdict = plait.ModuleDict({"x": Echo("x")})
    mdict["y"] = Echo("y")
    assert list(mdict) == ["x", "y"] and "y" in mdict
    plist = plait.ParameterList([plait.Parameter("e1", description="example")])
    plist.append(plait.Parameter("e2", description="example"))
    pdict = plait.ParameterDict({"tone": plait.Parameter("calm", description="tone")})

    class Holder(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.examples = plist
            self.knobs = pdict

    assert dict(Holder().named_parameters()).keys() == {"examples.0", "examples.1", "knobs.tone"}
    with pytest.raises(TypeError, match="Parameter"):
        plist.append("not a parameter")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Module"):
        plait.ModuleList(["x"])  # type: ignore[list-item]


def test_bind_rejects_unknown_options() -> None:
    with pytest.raises(TypeError, match="max_concurent"):
        Assistant().bind(resources=None, max_concurent=3)


class Sampled(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = plait.LLMInference("fast", temperature=0.8)

    def forward(self, text: str) -> Any:
        return self.gen(text)


def test_bind_adds_to_the_binding_and_none_removes_a_name(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """``bind(seed=7)`` after ``bind(resources=r, checkpoint_dir=d)`` keeps ``r`` and ``d``."""
    inputs = [f"colour {i} [[sample:1000000]]" for i in range(3)]
    # Resources the bound ones would fall back to if they were dropped: every call fails.
    wrong = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": server.base_url,
                "api_key": "sk-wrong",
            }
        }
    )
    pipeline = Sampled().bind(resources=make_resources(server), checkpoint_dir=tmp_path / "ckpt")
    assert pipeline.bind(seed=7) is pipeline

    with plait.ExecutionSettings(resources=wrong):
        first = pipeline.run_sync(inputs)
        assert all(isinstance(out, str) and "~draw" in out for out in first), first
        sent = [record["body"].get("seed") for record in server.stats(bodies=True)["requests"]]
        assert len(sent) == 3 and all(isinstance(seed, int) for seed in sent)
        assert any((tmp_path / "ckpt").iterdir())  # the bound checkpoint was written

        server.reset()
        assert pipeline.run_sync(inputs) == first  # resumed from the bound checkpoint
        assert server.stats()["requests_total"] == 0

        # None removes a name from the binding: no checkpoint, no seed, resources kept.
        pipeline.bind(checkpoint_dir=None, seed=None)
        server.reset()
        unseeded = pipeline.run_sync(inputs)
        assert all(isinstance(out, str) for out in unseeded), unseeded
        sent = [record["body"].get("seed") for record in server.stats(bodies=True)["requests"]]
        assert sent == [None, None, None]

        # ... and resources=None falls back to the settings' (wrong) resources.
        pipeline.bind(resources=None)
        failed = pipeline.run_sync(inputs)
        assert not any(isinstance(out, str) for out in failed)


def _sent_seeds(server: FakeOpenAIServer) -> list[Any]:
    return [record["body"].get("seed") for record in server.stats(bodies=True)["requests"]]


def test_a_childs_own_bind_keeps_what_its_owner_bound_name_by_name(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    """Issue 20 point 13: ``root.gen.bind(max_concurrent=2)`` after
    ``root.bind(resources=r, seed=7, checkpoint_dir=d)`` still runs ``root.gen`` on
    ``r`` with seed 7 into ``d``; the names the child binds itself win."""
    prompt = "colour [[sample:1000000]]"
    wrong = plait.ResourceConfig(  # what a dropped binding would fall back to: calls fail
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": server.base_url,
                "api_key": "sk-wrong",
            }
        }
    )
    with plait.ExecutionSettings(resources=wrong):
        alone = Sampled().bind(resources=make_resources(server), seed=7)
        reference = alone.gen.run_sync(prompt)
        seed_7 = _sent_seeds(server)
        assert isinstance(reference, str) and "~draw" in reference, reference
        assert len(seed_7) == 1 and isinstance(seed_7[0], int)

        root = Sampled().bind(
            resources=make_resources(server), seed=7, checkpoint_dir=tmp_path / "owner"
        )
        assert root.gen.bind(max_concurrent=2) is root.gen
        server.reset()
        assert root.gen.run_sync(prompt) == reference  # the owner's resources and seed
        assert _sent_seeds(server) == seed_7
        assert any((tmp_path / "owner").iterdir())  # ... and its checkpoint
        server.reset()
        assert root.gen.run_sync(prompt) == reference  # resumed from it: nothing paid
        assert server.stats()["requests_total"] == 0

        # The child's own names win; the rest still comes from the owner.
        root.gen.bind(seed=9, checkpoint_dir=tmp_path / "child")
        server.reset()
        reseeded = root.gen.run_sync(prompt)
        assert isinstance(reseeded, str) and "~draw" in reseeded, reseeded
        seed_9 = _sent_seeds(server)
        assert len(seed_9) == 1 and isinstance(seed_9[0], int) and seed_9 != seed_7
        assert any((tmp_path / "child").iterdir())

        # A None in the child's bind removes its names: the owner's apply again (its
        # checkpoint, made with its seed, answers without a call).
        root.gen.bind(seed=None, checkpoint_dir=None)
        server.reset()
        assert root.gen.run_sync(prompt) == reference
        assert server.stats()["requests_total"] == 0


def test_concurrent_runs_of_children_share_their_owners_binding(
    server: FakeOpenAIServer,
) -> None:
    """Bindings are read per run: children with binds of their own, run at once, each
    keep the owner's resources and seed."""
    import asyncio

    class Two(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = plait.LLMInference("fast", temperature=0.8)
            self.second = plait.LLMInference("fast", temperature=0.8)

        def forward(self, text: str) -> Any:
            return self.second(self.first(text))

    root = Two().bind(resources=make_resources(server), seed=7)
    root.first.bind(max_concurrent=3)
    root.second.bind(max_concurrent=1)
    prompts = [f"p{i} [[sample:1000000]]" for i in range(4)]

    async def both() -> list[Any]:
        runs = [root.first(p) for p in prompts] + [root.second(p) for p in prompts]
        return list(await asyncio.gather(*runs))

    outputs = asyncio.run(both())
    assert all(isinstance(out, str) and "~draw" in out for out in outputs), outputs
    seeds = _sent_seeds(server)
    assert len(seeds) == 8 and all(isinstance(seed, int) for seed in seeds)
