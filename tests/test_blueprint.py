"""Blueprints (seed 003): layered arguments for plait modules, resources and plain callables."""

from __future__ import annotations

import enum
import re
import textwrap
from pathlib import Path
from typing import Any, Literal

import pytest

import plait
from plait.blueprint import ArgInfo, Blueprint, BlueprintError, Castable, parse_cli_args
from plait.resources.config import EndpointConfig, ResourceConfig

from .pipelines import SummarizeAndAnalyze

C = Castable


class Judge(plait.Module):
    """Scores a summary."""

    def __init__(self, alias: str = "judge", temperature: float = 0.0) -> None:
        super().__init__()
        self.llm = plait.LLMInference(alias, temperature=temperature)

    def forward(self, text: str) -> Any:
        return self.llm(text)


class StrictJudge(Judge):
    def __init__(self, strict: bool = False, temperature: float = 0.0, threshold: float = 0.5):
        super().__init__(alias="strict", temperature=temperature)
        self.strict = strict
        self.threshold = threshold


def lenient_judge(threshold: float = 0.2) -> Judge:
    judge = StrictJudge(strict=False, threshold=threshold)
    return judge


class Tone(enum.Enum):
    PLAIN = "plain"
    FRIENDLY = "friendly"


class Review(plait.Module):
    """Summarize a text, then judge the summary.

    Args:
        rounds: How many judging rounds to run.
    """

    def __init__(
        self,
        summarizer: plait.LLMInference,
        judge: Judge,
        rounds: int = 1,
        tone: Tone = Tone.PLAIN,
        style: Literal["short", "long"] = "short",
        tags: list[str] | None = None,
        cutoff: float | None = None,
        verbose: bool = False,
        judge_class: type[Judge] = Judge,
    ) -> None:
        super().__init__()
        self.summarizer = summarizer
        self.judge = judge
        self.rounds = rounds
        self.tone = tone
        self.style = style
        self.tags = tags
        self.cutoff = cutoff
        self.verbose = verbose
        self.judge_class = judge_class

    def forward(self, text: str) -> Any:
        return self.judge(self.summarizer(text))


class Panel(plait.Module):
    """Two reviews side by side: every LLM call sits two or three levels down."""

    def __init__(self, first: Review, second: Review, extra: Judge | None = None) -> None:
        super().__init__()
        self.first = first
        self.second = second
        self.extra = extra

    def forward(self, text: str) -> Any:
        return {"first": self.first(text), "second": self.second(text)}


def review() -> Blueprint[Review]:
    return Blueprint(Review).apply({"summarizer.alias": C("fast")}, layer="base")


def temperatures(module: plait.Module) -> list[float | None]:
    return [m.temperature for m in module.modules() if isinstance(m, plait.LLMInference)]


# -- nested construction, wildcards, polymorphism ----------------------------------------


def test_dotted_paths_build_nested_modules() -> None:
    built = review().apply({"summarizer.temperature": C("0.2"), "judge.alias": C("j")}).make()
    assert isinstance(built, Review)
    assert isinstance(built.summarizer, plait.LLMInference)
    assert built.summarizer.alias == "fast"
    assert built.summarizer.temperature == 0.2
    # judge is required and was built from its annotation, with the dotted argument
    assert type(built.judge) is Judge and built.judge.llm.alias == "j"
    assert built.rounds == 1  # defaults are left to the constructor
    # An optional sub-module stays None until an exact key under it asks for it.
    panel = Blueprint(Panel).apply({"...alias": C("a"), "extra.temperature": C("0.5")}).make()
    assert isinstance(panel.extra, Judge) and panel.extra.llm.temperature == 0.5


def test_knobs_of_submodules_built_in_init_are_reachable() -> None:
    # SummarizeAndAnalyze builds its LLM calls inside __init__: their alias, temperature,
    # max_tokens and system prompt are reachable by path and by wildcard all the same.
    built = (
        Blueprint(SummarizeAndAnalyze)
        .apply({"...temperature": C("0"), "analyzer.max_tokens": C("7")})
        .apply({"summarizer.system_prompt": C("Be terse."), "analyzer.alias": C("big")}, "cli")
        .make()
    )
    assert (built.summarizer.temperature, built.analyzer.temperature) == (0.0, 0.0)
    assert (built.summarizer.max_tokens, built.analyzer.max_tokens) == (None, 7)
    assert built.summarizer.system_prompt is not None
    assert built.summarizer.system_prompt.value == "Be terse."
    assert built.analyzer.alias == "big"
    # a wildcard that reaches nothing is still an error rather than a silent no-op
    with pytest.raises(BlueprintError, match=r"matches no argument; did you mean '...temperature'"):
        Blueprint(SummarizeAndAnalyze).apply({"...temprature": C("0")}).make()
    # bad values are errors naming the path and the layer, all of them at once
    with pytest.raises(BlueprintError) as info:
        Blueprint(SummarizeAndAnalyze).apply(
            {"summarizer.max_tokens": C("0"), "analyzer.temperature": C("hot")}
        ).make()
    message = str(info.value)
    assert "2 problems" in message
    assert "summarizer.max_tokens (from command line): expected a positive whole number" in message
    assert "analyzer.temperature (from command line): expected a number" in message


def test_knobs_show_in_help_with_where_each_value_came_from() -> None:
    text = Blueprint(SummarizeAndAnalyze).apply({"analyzer.temperature": C("0.2")}).help()
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert "built by __init__" in rows["summarizer.temperature"]
    assert "0.2" in rows["analyzer.temperature"] and "command line" in rows["analyzer.temperature"]
    assert "'sum'" in rows["summarizer.system_prompt"]


def test_a_learnable_system_prompt_keeps_its_parameter() -> None:
    class Learner(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.prompt = plait.Parameter("old", description="the prompt")
            self.llm = plait.LLMInference("fast", system_prompt=self.prompt)

        def forward(self, x: str) -> Any:
            return self.llm(x)

    built = Blueprint(Learner).apply({"llm.system_prompt": C("new")}).make()
    assert built.llm.system_prompt is built.prompt and built.prompt.value == "new"
    assert built.prompt.requires_grad


def test_wildcard_sets_every_temperature_at_any_depth() -> None:
    panel = Blueprint(Panel).apply({"...alias": C("fast"), "...temperature": C("0")}).make()
    assert temperatures(panel) == [0.0, 0.0, 0.0, 0.0]
    assert panel.extra is None  # a wildcard never causes something to be built
    scoped = (
        Blueprint(Panel).apply({"...alias": C("fast"), "second...temperature": C("0.7")}).make()
    )
    assert temperatures(scoped.first) == [1.0, 0.0]
    assert temperatures(scoped.second) == [0.7, 0.7]


def test_precedence_latest_layer_then_most_specific_key() -> None:
    same_layer = Blueprint(Panel).apply(
        {
            "...alias": C("fast"),
            "...temperature": C("0.1"),
            "...judge...temperature": C("0.2"),
            "first.judge.temperature": C("0.3"),
        }
    )
    panel = same_layer.make()
    assert temperatures(panel.first) == [0.1, 0.3]  # exact beats wildcards in a layer
    assert temperatures(panel.second) == [0.1, 0.2]  # more named segments beat fewer
    # A later layer wins even with a wildcard over an earlier exact key.
    later = same_layer.clone().apply({"...temperature": C("0.9")}, layer="override").make()
    assert temperatures(later) == [0.9] * 4


def test_polymorphic_bare_name_and_nested_arguments() -> None:
    built = review().apply({"judge": C("StrictJudge"), "judge.strict": C("yes")}).make()
    assert type(built.judge) is StrictJudge
    assert built.judge.strict is True


def test_polymorphic_qualified_name_function_and_class_object() -> None:
    qualified = review().apply({"judge": C(f"{__name__}:StrictJudge"), "judge.threshold": C("0.9")})
    judge = qualified.make().judge
    assert isinstance(judge, StrictJudge) and judge.threshold == 0.9
    # A bare function name is found in the module that defines the owner (Review).
    fn = review().apply({"judge": C("lenient_judge"), "judge.threshold": C("0.1")}).make()
    assert isinstance(fn.judge, StrictJudge) and fn.judge.threshold == 0.1
    # Real objects work like their names: a class gets the nested arguments.
    obj = review().apply({"judge": StrictJudge, "judge.strict": True}, layer="code").make()
    assert isinstance(obj.judge, StrictJudge) and obj.judge.strict is True
    instance = StrictJudge(threshold=0.3)
    assert review().apply({"judge": instance}).make().judge is instance


def test_polymorphic_errors_name_the_choice() -> None:
    with pytest.raises(BlueprintError) as info:
        review().apply({"judge": C("StrictJuge")}).make()
    assert "judge (from command line)" in str(info.value)
    assert "did you mean 'StrictJudge'" in str(info.value)
    with pytest.raises(BlueprintError, match="Tone does not make a Judge"):
        review().apply({"judge": Tone}).make()
    # Arguments for a class that the polymorphic choice does not take.
    with pytest.raises(BlueprintError) as info:
        review().apply({"judge.alias": C("j")}, layer="preset").apply(
            {"judge": C("StrictJudge")}
        ).make()
    message = str(info.value)
    assert "judge.alias (from preset): unknown argument" in message
    assert "'judge' is StrictJudge (from command line), which has no parameter 'alias'" in message


# -- casting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "text", "attribute", "expected"),
    [
        ("summarizer.temperature", "0.25", "summarizer.temperature", 0.25),
        ("summarizer.temperature", "None", "summarizer.temperature", None),
        ("summarizer.max_tokens", "10_000", "summarizer.max_tokens", 10_000),
        ("summarizer.max_tokens", "null", "summarizer.max_tokens", None),
        ("rounds", "3", "rounds", 3),
        ("verbose", "true", "verbose", True),
        ("verbose", "YES", "verbose", True),
        ("verbose", "1", "verbose", True),
        ("verbose", "no", "verbose", False),
        ("verbose", "0", "verbose", False),
        ("verbose", "false", "verbose", False),
        ("cutoff", "0.5", "cutoff", 0.5),
        ("cutoff", "none", "cutoff", None),
        ("tags", "a, b,c", "tags", ["a", "b", "c"]),
        ("tags", '["x", "y z"]', "tags", ["x", "y z"]),
        ("tags", "", "tags", []),
        ("style", "long", "style", "long"),
        ("tone", "FRIENDLY", "tone", Tone.FRIENDLY),
        ("tone", "friendly", "tone", Tone.FRIENDLY),
        ("judge_class", f"{__name__}:StrictJudge", "judge_class", StrictJudge),
        ("judge_class", "StrictJudge", "judge_class", StrictJudge),
        ("summarizer.system_prompt", "Be terse.", "summarizer.system_prompt.value", "Be terse."),
    ],
)
def test_castable_strings_follow_the_annotation(
    key: str, text: str, attribute: str, expected: Any
) -> None:
    built: Any = review().apply({key: C(text)}).make()
    for part in attribute.split("."):
        built = getattr(built, part)
    assert built == expected
    assert type(built) is type(expected)


@pytest.mark.parametrize(
    ("key", "text", "fragment"),
    [
        ("rounds", "many", "expected an integer, got 'many'"),
        ("summarizer.temperature", "warm", "expected a number, got 'warm'"),
        ("verbose", "maybe", "expected a boolean"),
        ("style", "medium", "'medium' is not one of 'short', 'long'"),
        ("tone", "angry", "'angry' is not a member of Tone (PLAIN, FRIENDLY)"),
        ("tags", "[1, 2", "is not a valid list"),
        ("judge_class", "Tone", "'Tone' names Tone, which is not a Judge"),
        ("judge_class", "Nobody", "found no 'Nobody' among subclasses of Judge"),
    ],
)
def test_bad_casts_name_path_and_layer(key: str, text: str, fragment: str) -> None:
    blueprint = review().apply({key: C(text)}, layer="my layer")
    with pytest.raises(BlueprintError) as info:
        blueprint.make()
    assert isinstance(info.value, ValueError)
    assert f"{key} (from my layer)" in str(info.value)
    assert fragment in str(info.value)


def test_plain_strings_are_values_not_castables() -> None:
    with pytest.raises(BlueprintError, match=r"expected int, got str '3' \(wrap text"):
        review().apply({"rounds": "3"}).make()


def test_unannotated_parameters_take_strings_or_the_defaults_type() -> None:
    def target(name, count=2, label=None):  # type: ignore[no-untyped-def]
        return (name, count, label)

    built = Blueprint(target).apply({"name": C("7"), "count": C("5"), "label": C("x")}).make()
    assert built == ("7", 5, "x")


def test_var_keyword_accepts_names_at_its_own_level() -> None:
    def target(alias: str, **options: float) -> dict[str, Any]:
        return {"alias": alias, **options}

    built = Blueprint(target).apply({"alias": C("a"), "top_p": C("0.5"), "seed": 3.0}).make()
    assert built == {"alias": "a", "top_p": 0.5, "seed": 3.0}
    with pytest.raises(BlueprintError, match=r"top_p\.deep"):
        Blueprint(target).apply({"alias": C("a"), "top_p.deep": C("1")}).make()


# -- layers, presets, help -----------------------------------------------------------------


def presets() -> Blueprint[Review]:
    return (
        Blueprint(Review)
        .preset("fast", {"summarizer.alias": "fast", "...temperature": 0.0, "rounds": 2})
        .preset("careful", {"summarizer.alias": "smart", "judge": StrictJudge, "rounds": 5})
    )


def test_presets_are_layers_and_later_layers_win() -> None:
    blueprint = presets().apply_preset("fast").apply(parse_cli_args(["rounds=4"]))
    built = blueprint.make()
    assert built.rounds == 4 and built.summarizer.alias == "fast"
    assert temperatures(built) == [0.0, 0.0]
    stacked = presets().apply_preset("fast").apply_preset("careful").make()
    assert stacked.rounds == 5 and isinstance(stacked.judge, StrictJudge)
    assert stacked.judge.llm.temperature == 0.0  # "fast"'s wildcard still reaches it
    assert presets().presets == ("fast", "careful")


def test_layers_are_lazy_and_clone_is_independent() -> None:
    base = presets().apply_preset("fast")
    fork = base.clone().apply({"rounds": C("9")})
    assert base.make().rounds == 2
    assert fork.make().rounds == 9
    first, second = base.make(), base.make()
    assert first is not second and first.summarizer is not second.summarizer


def test_unknown_preset_fails_at_make() -> None:
    blueprint = presets().apply_preset("fsat")  # no error yet
    with pytest.raises(BlueprintError, match=r"unknown preset 'fsat'.*did you mean 'fast'"):
        blueprint.make()


def test_help_shows_type_value_and_layer_of_every_argument() -> None:
    blueprint = presets().apply_preset("fast").apply(parse_cli_args(["judge.alias=picky"]))
    text = blueprint.help()
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert rows["summarizer.alias"].split()[1:4] == ["str", "'fast'", "fast"]
    # LLMInference's own docstring describes it: the first sentence, whole.
    assert rows["summarizer.alias"].endswith(
        'The endpoint\'s name in the resources (``"fast"``); with no resources, the '
        "embedded local model answers."
    )
    assert rows["judge.alias"].split()[1:] == ["str", "'picky'", "command", "line"]
    assert rows["rounds"].split()[1:4] == ["int", "2", "fast"]
    assert "How many judging rounds to run." in rows["rounds"]  # the docstring's Args
    assert rows["tone"].split()[1:] == ["Tone", "Tone.PLAIN", "default"]
    assert rows["judge.temperature"].split()[1:] == ["float", "0.0", "fast", "(...temperature)"]
    assert rows["summarizer.max_tokens"].split()[1:6] == ["int", "|", "None", "None", "default"]
    assert "Presets: fast, careful" in text
    assert "Summarize a text, then judge the summary." in text
    infos = {info.path: info for info in blueprint.describe()}
    assert infos["summarizer.temperature"] == ArgInfo(
        path="summarizer.temperature",
        type="float | None",
        value="0.0",
        layer="fast",
        required=False,
        key="...temperature",
        doc="The sampling temperature; None uses the endpoint's default.",
    )
    assert infos["summarizer.alias"].required


def test_help_lists_problems_instead_of_raising() -> None:
    text = Blueprint(Review).apply({"roudns": C("2")}).help()
    assert "Problems (make() would fail):" in text
    assert "roudns (from command line): unknown argument; did you mean 'rounds'?" in text
    assert "summarizer.alias: missing required argument" in text
    rows = [line.split()[:4] for line in text.splitlines()]
    assert ["summarizer.alias", "str", "<missing>", "required"] in rows


def test_help_names_a_file_target_by_its_file_not_by_an_internal_module_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline loaded from ``review.py:Review`` was headed ``Review
    (_plait_blueprint_review_<hash>:Review)`` in ``--help``: a name nobody wrote."""
    (tmp_path / "review.py").write_text(
        "class Review:\n    def __init__(self, rounds: int = 2) -> None:\n"
        "        self.rounds = rounds\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    first = Blueprint("review.py:Review").help().splitlines()[0]
    assert first == "Review  (review.py:Review)"
    elsewhere = Blueprint(f"{tmp_path / 'review.py'}:Review")
    assert "_plait_blueprint_" not in elsewhere.help()


# -- errors ----------------------------------------------------------------------------------


def test_every_problem_is_reported_at_make_naming_path_and_layer() -> None:
    blueprint = Blueprint(Review)
    blueprint.apply({"summarizer.temperatur": C("1"), "rounds": C("x")}, layer="cfg")
    blueprint.apply({"...temprature": C("0"), "style": "tiny", "bad..key": 1})
    with pytest.raises(BlueprintError) as info:
        blueprint.make()
    problems = info.value.problems
    assert "summarizer.alias: missing required argument (str); " in problems[0]
    expected = [
        "rounds (from cfg): expected an integer, got 'x'",
        "style (from command line): expected Literal['short', 'long'], got str 'tiny'",
        "summarizer.temperatur (from cfg): unknown argument; did you mean "
        "'summarizer.temperature'?",
        "...temprature (from command line): matches no argument; did you mean '...temperature'?",
    ]
    for line in expected:
        assert any(p.startswith(line) for p in problems), (line, problems)
    assert any("'bad..key' is not a valid argument name" in p for p in problems)
    assert len(problems) == 6


def test_arguments_under_a_plain_value_are_errors() -> None:
    with pytest.raises(
        BlueprintError, match=re.escape("rounds.x (from command line): cannot apply")
    ):
        review().apply({"rounds.x": C("1")}).make()
    instance = Judge()
    with pytest.raises(BlueprintError, match="'judge' is set to the object Judge"):
        review().apply({"judge": instance, "judge.alias": C("x")}).make()


def test_constructor_errors_name_the_path() -> None:
    blueprint = review().apply({"summarizer.max_tokens": C("-1"), "judge.alias": C("")})
    with pytest.raises(BlueprintError) as info:
        blueprint.make()
    assert info.value.problems == [
        "summarizer: LLMInference(...) raised ValueError: max_tokens must be a positive "
        "integer or None, got -1",
        "judge: Judge(...) raised ValueError: LLMInference(alias=...) must be a non-empty "
        "string, got ''",
    ]
    assert isinstance(info.value.__cause__, ValueError)


def test_pydantic_field_errors_point_at_the_argument() -> None:
    blueprint = Blueprint(EndpointConfig).apply({"model": C("m"), "max_concurrent": C("0")})
    with pytest.raises(BlueprintError) as info:
        blueprint.make()
    assert info.value.problems == [
        "max_concurrent (from command line): Input should be greater than or equal to 1"
    ]
    secret = Blueprint(EndpointConfig).apply({"model": C("m"), "api_key": C("sk-1")}).make()
    assert secret.resolved_api_key() == "sk-1"


def test_parse_cli_args() -> None:
    args = parse_cli_args(["a.b=1", "empty=", "--judge=StrictJudge", "eq=x=y"])
    assert args == {"a.b": "1", "empty": "", "judge": "StrictJudge", "eq": "x=y"}
    assert all(type(v) is Castable for v in args.values())
    assert repr(args["a.b"]) == "Castable('1')"
    with pytest.raises(BlueprintError, match="'fast' is not an argument"):
        parse_cli_args(["rounds=1", "fast"])


# -- resources and other targets -------------------------------------------------------------


def resources(model: str, max_concurrent: int = 4, provider: str = "openai") -> ResourceConfig:
    return ResourceConfig(
        {"fast": {"model": model, "provider": provider, "max_concurrent": max_concurrent}}
    )


def test_resource_config_from_a_function() -> None:
    config = Blueprint(resources).apply(parse_cli_args(["model=m", "max_concurrent=2"])).make()
    assert config["fast"].model == "m" and config["fast"].max_concurrent == 2


def test_resource_config_from_dotted_items_over_a_whole_mapping() -> None:
    aliases = '{"fast": {"model": "m", "timeout": 5}, "smart": {"model": "big"}}'
    blueprint = (
        Blueprint(ResourceConfig)
        .apply({"aliases": C(aliases)}, layer="resources.toml")
        .apply(parse_cli_args(["aliases.fast.max_concurrent=3", "aliases.local.provider=local"]))
    )
    config = blueprint.make()
    assert list(config) == ["fast", "smart", "local"]
    assert config["fast"] == EndpointConfig(model="m", timeout=5, max_concurrent=3)
    assert config["smart"].model == "big"
    assert config["local"].provider == "local"
    infos = {info.path: info for info in blueprint.describe()}
    assert (infos["aliases.fast.timeout"].value, infos["aliases.fast.timeout"].layer) == (
        "5",
        "resources.toml",
    )
    assert infos["aliases.fast.max_concurrent"].layer == "command line"
    # Leaf by leaf, the later layer wins: a whole mapping given after a dotted key.
    later = (
        Blueprint(ResourceConfig)
        .apply({"aliases.fast.timeout": 7, "aliases.fast.model": "m"}, layer="preset")
        .apply({"aliases": {"fast": EndpointConfig(model="n", timeout=9)}}, layer="file")
        .apply({"aliases.fast.max_retries": C("0")})
        .make()
    )
    assert later["fast"] == EndpointConfig(model="n", timeout=9, max_retries=0)
    typo = Blueprint(ResourceConfig).apply({"aliases": {"fast": {"model": "m", "tiemout": 1}}})
    typo.apply({"aliases.fast.max_concurrent": 2})
    with pytest.raises(BlueprintError, match=re.escape("aliases.fast.tiemout (from command line)")):
        typo.make()


def test_file_targets_and_file_factories(tmp_path: Path) -> None:
    source = tmp_path / "my_pipeline.py"
    source.write_text(
        textwrap.dedent(
            """
            from __future__ import annotations

            import plait

            class Shout(plait.Module):
                def __init__(self, inner: plait.LLMInference, times: int = 1) -> None:
                    super().__init__()
                    self.inner = inner
                    self.times = times

                def forward(self, text):
                    return self.inner(text)
            """
        )
    )
    built = Blueprint(f"{source}:Shout").apply(parse_cli_args(["inner.alias=a", "times=3"])).make()
    assert type(built).__name__ == "Shout" and built.times == 3 and built.inner.alias == "a"
    again = Blueprint(f"{source}:Shout").target
    assert again is type(built)  # one module per file: the classes stay the same objects
    judge = review().apply({"judge": C(f"{source}:Shout"), "judge.inner.alias": C("x")})
    with pytest.raises(BlueprintError, match="Shout does not make a Judge"):
        judge.make()
    with pytest.raises(BlueprintError, match="has no attribute 'Nope'"):
        Blueprint(f"{source}:Nope")
    with pytest.raises(BlueprintError, match="cannot import module"):
        Blueprint("no_such_module_here:Thing")


PROTOTYPE = Judge(alias="proto")


def test_an_object_target_is_already_built() -> None:
    blueprint: Blueprint[Any] = Blueprint(f"{__name__}:PROTOTYPE")
    assert blueprint.make() is PROTOTYPE  # returned, not called
    with pytest.raises(BlueprintError, match="alias \\(from command line\\): unknown argument"):
        blueprint.apply({"alias": C("x")}).make()


def test_module_name_target_string() -> None:
    blueprint: Blueprint[Any] = Blueprint(f"{__name__}:Review")
    assert blueprint.target is Review
    assert blueprint.apply({"summarizer.alias": C("a")}).make().summarizer.alias == "a"
