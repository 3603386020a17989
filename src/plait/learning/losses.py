"""Losses: modules that grade an output and say, in words, what to improve.

plait trains prompts from textual feedback, so a loss here is a `Module` whose
``forward(output, target=None)`` returns a `Feedback`: a score in [0, 1] the
trainer can average, and a text naming what went wrong, which ``backward()``
sends upstream to every parameter that shaped the output.

A loss that only computes (`ExactMatch`, `Contains`, `FunctionLoss`) has a plain
``forward`` and runs on the real output as a leaf of the traced graph.  A loss
that asks an LLM (`LLMJudge`, `RubricJudge`) or calls other losses
(`CompositeLoss`) has ``async def forward``: it too runs on real values, while the
calls it makes go through plait's runtime, so limits, caches, budgets and mocks
apply to a judge exactly as to the pipeline it grades.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from plait._signature import shape_of
from plait._text import data_text
from plait.inference import LLMInference
from plait.learning.feedback import Feedback, feedback_text
from plait.learning.step import Inputs
from plait.module import BackwardContext, BackwardResult, Module
from plait.not_data import code_in
from plait.values import Value, ValueKind

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = [
    "CompositeLoss",
    "Contains",
    "ExactMatch",
    "FunctionLoss",
    "LLMJudge",
    "Loss",
    "MetricError",
    "MetricExample",
    "MetricLoss",
    "RubricJudge",
    "VerifierLoss",
    "aggregate",
    "as_feedback",
    "exact_text",
]

#: How much of an output or target a feedback text quotes: enough to recognise it,
#: short enough that a batch of feedback still fits in an optimizer's prompt.
CLIP = 200


# -- helpers ---------------------------------------------------------------------------
def _clip(text: str, limit: int = CLIP) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[: limit - 3].rstrip() + "..."


def _payload(obj: Any) -> Any:
    while isinstance(obj, Value):
        obj = obj.payload
    return obj


def _render(obj: Any) -> str:
    """An output as a judge or a comparison sees it: text as is, structures as JSON.

    Code is refused: the repr of a function a pipeline returned by mistake would be
    scored as if it were the pipeline's answer (and could even contain the target).
    """
    obj = _payload(obj)
    if isinstance(obj, str):
        return obj
    why = code_in(obj)
    if why is not None:
        raise TypeError(f"the output cannot be scored: {why}; return text or data")
    return data_text(obj)


def as_feedback(obj: Any) -> Feedback:
    """The `Feedback` in ``obj``, so code can read a loss's result however it came back.

    A trainer averaging a minibatch fails here on the item at fault, not later.

    Args:
        obj: A `Feedback`, or a `Value` holding one (what a loss returns in
            ``train()`` mode).

    Returns:
        The feedback itself.

    Raises:
        ValueError: ``obj`` is the error `Value` of a failed call.
        TypeError: ``obj`` holds anything but a `Feedback`.
    """
    if isinstance(obj, Value) and obj.kind is ValueKind.ERROR:
        raise ValueError(
            f"cannot read feedback from a failed call ({obj.payload!r}); "
            "skip failed items before aggregating"
        )
    payload = _payload(obj)
    if isinstance(payload, Feedback):
        return payload
    raise TypeError(
        f"expected a Feedback (or a Value holding one, as a loss returns in train mode), "
        f"got {type(payload).__name__}"
    )


def _snake(name: str) -> str:
    """``LLMJudge`` -> ``llm_judge``: child names for a composite's feedback labels."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _check_scale(scale: Any, who: str) -> tuple[float, float]:
    ok = (
        isinstance(scale, tuple | list)
        and len(scale) == 2
        and all(isinstance(x, int | float) and not isinstance(x, bool) for x in scale)
        and all(math.isfinite(x) for x in scale)
        and scale[0] < scale[1]
    )
    if not ok:
        raise ValueError(
            f"{who}(scale=...) must be a pair (low, high) with low < high, got {scale!r}"
        )
    return float(scale[0]), float(scale[1])


def _normalize(score: float, scale: tuple[float, float]) -> float:
    low, high = scale
    return min(1.0, max(0.0, (float(score) - low) / (high - low)))


def _field(reply: Any, name: str) -> Any:
    return reply.get(name) if isinstance(reply, Mapping) else getattr(reply, name)


def _fmt(x: float) -> str:
    return f"{x:g}"


# -- the base class --------------------------------------------------------------------
class Loss(Module):
    """Base class of losses: a module that grades an output and says what to improve.

    Subclass it and implement ``forward(output, target=None)`` returning a
    `Feedback`; make it ``async def`` when it calls an LLM or other modules
    (``await self.judge(prompt)``).  Subclassing `Loss` rather than `Module` gives
    the backward pass its rule for losses: the feedback text goes to the graded
    output and nothing goes to the target, which is data, not something training
    should change.

    Examples:
        ```python
        from plait.learning import Feedback, Loss


        class ShortAnswer(Loss):
            # Full marks for an answer of at most five words.
            def forward(self, output: str, target: str | None = None) -> Feedback:
                words = len(output.split())
                if words <= 5:
                    return Feedback(1.0, "the answer is short enough")
                return Feedback(0.0, f"the answer has {words} words; use at most five")


        print(ShortAnswer()("The meeting is on Monday at ten in room four."))
        ```
    """

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        """Send the feedback text to the graded output, and nothing to the target.

        Args:
            feedback: The loss's output: its `Feedback`, or a `Value` holding it.
            ctx: The loss call's inputs, as the backward pass recorded them.

        Returns:
            The feedback text for the ``output`` input (or for the first input,
                when the loss names it differently).
        """
        name = "output"
        if ctx.inputs and name not in ctx.inputs:
            name = next(iter(ctx.inputs))
        return BackwardResult(input_feedback={name: feedback_text(feedback)})


# -- programmatic losses ---------------------------------------------------------------
def _describe(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else repr(fn)


def _takes_target(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts a second positional argument (so single-argument checks work)."""
    try:
        shape = shape_of(fn)
    except (TypeError, ValueError):
        return True
    return shape.var_positional or shape.positional >= 2


class FunctionLoss(Loss):
    """A loss from a plain function, for checks code can decide.

    Use it for valid JSON, length limits, a unit test on generated code.  The
    function returns a `Feedback`, a float in [0, 1], a bool, or
    ``(score, text)``.  A bool becomes 1.0 or 0.0 with a default text; a bare
    float gets a text naming the function and its score, so prefer returning
    ``(score, "what is wrong")``: the text is all an optimizer learns from.

    Args:
        fn: ``fn(output, target)``, or ``fn(output)`` for a function of one
            argument (it is then called with the output alone).  Synchronous.
        name: How feedback texts name the check (default: the function's name).

    Raises:
        TypeError: ``fn`` is not callable, or is an ``async`` function (subclass
            `Loss` with ``async def forward`` for that).

    Examples:
        >>> from plait.learning import FunctionLoss
        >>> def brief(output: str) -> tuple[float, str]:
        ...     if len(output) <= 20:
        ...         return 1.0, "brief enough"
        ...     return 0.0, "keep the answer under 20 characters"
        >>> print(FunctionLoss(brief)("An answer that goes on and on."))
        score 0.00: keep the answer under 20 characters
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        super().__init__()
        if not callable(fn):
            raise TypeError(f"{type(self).__name__}(fn) needs a callable, got {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{type(self).__name__} wraps synchronous functions; {_describe(fn)} is async: "
                "subclass plait.learning.Loss with `async def forward(self, output, target=None)`"
            )
        self.fn = fn
        self.name = name or _describe(fn)
        self._pass_target = _takes_target(fn)

    def forward(self, output: Any, target: Any = None) -> Feedback:
        """Score ``output`` with the function.

        Args:
            output: The pipeline's output.
            target: The expected answer; passed on when the function takes two
                arguments.

        Returns:
            The function's verdict as a `Feedback`.

        Raises:
            TypeError: The function returned something other than a Feedback, a
                number, a bool or a ``(score, text)`` pair.
            ValueError: The function's score lies outside [0, 1].
        """
        result = self.fn(output, target) if self._pass_target else self.fn(output)
        return self._to_feedback(result)

    def _to_feedback(self, result: Any) -> Feedback:
        if isinstance(result, Feedback):
            return result
        if isinstance(result, bool):
            if result:
                return Feedback(1.0, f"the output passed the check {self.name}")
            return Feedback(0.0, f"the output failed the check {self.name}")
        if isinstance(result, int | float):
            score = self._score(result)
            return Feedback(score, f"{self.name} scored the output {score:.2f} (1.0 is best)")
        if (
            isinstance(result, tuple)
            and len(result) == 2
            and isinstance(result[0], int | float)
            and isinstance(result[1], str)
        ):
            return Feedback(self._score(result[0]), result[1])
        raise TypeError(
            f"loss function {self.name} returned {type(result).__name__} "
            f"({_clip(repr(result), 80)}); "
            "it must return a Feedback, a float score in [0, 1], a bool, or a (score, text) tuple"
        )

    def _score(self, score: float) -> float:
        value = float(score)
        if not 0.0 <= value <= 1.0:  # also rejects NaN
            raise ValueError(f"loss function {self.name} returned score {score!r}, outside [0, 1]")
        return value

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The check's name.
        """
        return self.name


class MetricError(ValueError):
    """An evaluation metric that raised, or returned something that is no score: the
    message names the metric, so the example's error row says whose fault it is."""


class MetricExample(dict[str, Any]):
    """The example a metric is shown: its input field(s) and its target field, read as
    ``example["label"]`` or, as DSPy's examples are, ``example.label``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"the example has no field {name!r} (its fields: {', '.join(self) or 'none'})"
            ) from None


class MetricLoss(Loss):
    """A loss from an evaluation metric, ``metric(example, prediction)``, as DSPy writes them.

    So a metric you already have scores plait's pipelines unchanged.  ``example``
    is a `MetricExample`: the example's input (under ``input_field``; several
    fields passed by name, or a record passed whole, keep their own names) and its
    target (under ``target_field``, when it has one); ``prediction`` is what the
    pipeline returned.  A metric with a third parameter (DSPy's ``trace``) is
    given None for it.  It returns a bool (1.0 or 0.0), a number in [0, 1], a
    ``(score, text)`` pair or a `Feedback`; the score is the example's.

    A metric that raises, or returns anything else, raises `MetricError` naming it:
    that example fails (``plait eval`` reports it as an error row) while the others
    are scored.

    Args:
        metric: A synchronous function ``metric(example, prediction)`` or
            ``metric(example, prediction, trace=None)``.
        name: How feedback texts name the metric (default: the function's name).
        target_field: The name the example's target has in ``example``.
        input_field: The name a single input has in ``example`` (None: a record
            given whole keeps its own field names).

    Raises:
        TypeError: ``metric`` is a class, not callable, ``async``, or takes
            arguments a metric is not given; raised at construction, before
            anything runs.

    Examples:
        >>> from plait.learning import MetricLoss
        >>> def answer_match(example, prediction, trace=None):
        ...     return example.answer.lower() == prediction.lower()
        >>> metric = MetricLoss(answer_match, target_field="answer", input_field="question")
        >>> metric("Paris", "paris", "What is the capital of France?").score
        1.0
    """

    reads_input: ClassVar[bool] = True
    """`TrainingStep` passes the example's input too (`loss_call`)."""

    def __init__(
        self,
        metric: Callable[..., Any],
        name: str | None = None,
        target_field: str = "target",
        input_field: str | None = "input",
    ) -> None:
        super().__init__()
        self.name = name or _describe(metric)
        self.trace_argument = _metric_arity(metric, self.name) == 3
        self.metric = metric
        self.target_field = target_field
        self.input_field = input_field

    def forward(self, output: Any, target: Any = None, input: Any = None) -> Feedback:
        """Score one example's output with the metric.

        Args:
            output: What the pipeline returned (the metric's ``prediction``).
            target: The example's target, put in ``example`` under ``target_field``.
            input: The example's input, put in ``example`` under ``input_field``.

        Returns:
            The metric's score and a text naming it, or the metric's own text.

        Raises:
            MetricError: The metric raised, or returned something that is no score.
        """
        example = MetricExample(self._input_fields(_payload(input)))
        target = _payload(target)
        if target is not None:
            example[self.target_field] = target
        trace = (None,) if self.trace_argument else ()
        try:
            result = self.metric(example, _payload(output), *trace)
        except Exception as exc:
            raise MetricError(f"the metric {self.name} raised {type(exc).__name__}: {exc}") from exc
        return self._feedback(result)

    def _input_fields(self, input: Any) -> dict[str, Any]:
        if isinstance(input, Inputs) or (self.input_field is None and isinstance(input, Mapping)):
            return dict(input)
        return {self.input_field or "input": input}

    def _feedback(self, result: Any) -> Feedback:
        if isinstance(result, Feedback):
            return result
        text = None
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str):
            result, text = result
        if isinstance(result, bool):
            score = 1.0 if result else 0.0
        elif isinstance(result, int | float) and 0.0 <= float(result) <= 1.0:  # NaN fails
            score = float(result)
        else:
            raise MetricError(
                f"the metric {self.name} returned {_clip(repr(result), 80)} "
                f"({type(result).__name__}); a metric returns a bool or a score in [0, 1]"
            )
        if text is None:
            text = f"the metric {self.name} scored the output {score:g} (1 is best)"
        return Feedback(score, text)

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The metric's name.
        """
        return self.name


def _metric_arity(metric: Any, name: str) -> int:
    """How many arguments ``metric`` is called with: 2 (example, prediction), or 3 when
    it requires a third (DSPy's ``trace``).  TypeError, saying why, for anything that
    is not a synchronous function of that shape."""
    if inspect.isclass(metric):
        raise TypeError(f"{name} is a class, not a function of (example, prediction)")
    if not callable(metric):
        raise TypeError(
            f"{name} is not a function but {_clip(repr(metric), 40)} ({type(metric).__name__})"
        )
    if inspect.iscoroutinefunction(metric) or inspect.iscoroutinefunction(type(metric).__call__):
        raise TypeError(f"{name} is async; a metric is a plain (synchronous) function")
    try:
        shape = shape_of(metric)
    except (TypeError, ValueError):
        return 2  # a builtin without a signature: try it as a metric
    keyword_only = [
        p.name
        for p in shape.parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    ]
    required = sum(
        1
        for p in shape.parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        and p.default is inspect.Parameter.empty
    )
    fits = shape.var_positional or shape.positional >= 2
    if keyword_only or not fits or required > 3:
        raise TypeError(
            f"{name} takes {shape.signature}; a metric takes (example, prediction), or DSPy's "
            "(example, pred, trace=None)"
        )
    return 3 if required == 3 else 2


class VerifierLoss(FunctionLoss):
    """A pass/fail loss from a checker, for tasks whose answer can be verified.

    Use it when the answer parses, the code compiles or the number matches, or
    does not.  The checker returns a bool or ``(bool, reason)``; a reason takes
    precedence over ``failure_text``, because it can name the particular
    problem.  Anything but a bool is a TypeError when the loss runs: a verifier
    that starts returning scores should be a `FunctionLoss`.

    Args:
        fn: ``fn(output, target)``, or ``fn(output)``, returning a bool or a
            ``(bool, reason)`` pair.
        failure_text: What a failed check means ("the reply is not valid JSON"),
            for a checker that gives no reason.
        name: How feedback texts name the check (default: the function's name).

    Raises:
        TypeError: ``fn`` is not callable, or is an ``async`` function.

    Examples:
        >>> import json
        >>> from plait.learning import VerifierLoss
        >>> def parses(output: str) -> bool:
        ...     try:
        ...         json.loads(output)
        ...     except ValueError:
        ...         return False
        ...     return True
        >>> print(VerifierLoss(parses, failure_text="the reply is not valid JSON")("{oops"))
        score 0.00: the reply is not valid JSON
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        failure_text: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(fn, name=name)
        self.failure_text = failure_text

    def _to_feedback(self, result: Any) -> Feedback:
        reason: str | None = None
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], str):
            result, reason = result
        if not isinstance(result, bool):
            raise TypeError(
                f"verifier {self.name} returned {type(result).__name__}; a VerifierLoss check "
                "must return a bool or a (bool, reason) tuple (use FunctionLoss for scores)"
            )
        if result:
            return Feedback(1.0, reason or f"the output passed the check {self.name}")
        text = reason or self.failure_text or f"the output failed the check {self.name}"
        return Feedback(0.0, text)


def _need_target(loss: Loss, target: Any) -> str:
    target = _payload(target)
    if target is None:
        raise ValueError(
            f"{type(loss).__name__} compares the output with a target, but target is None: "
            "call it as loss(output, target)"
        )
    return _render(target)


_SPACE = re.compile(r"\s+")


def _match_text(obj: Any) -> str:
    """An output or target as `ExactMatch` reads it: an Enum as its value (a label a
    pipeline returns as ``Label.SPAM`` is the label "spam", not the JSON text
    ``"spam"`` with its quotes), anything else as `_render` makes it."""
    obj = _payload(obj)
    return _render(obj.value if isinstance(obj, enum.Enum) else obj)


def _fold(text: str, normalize: bool) -> str:
    return _SPACE.sub(" ", text).strip().casefold() if normalize else text


def exact_text(obj: Any, normalize: bool = True) -> str:
    """The text `ExactMatch` compares for ``obj``, so other counts agree with the loss.

    Kept next to the loss, so that anything counting matches (the confusion table
    of ``plait eval``) counts exactly what the loss scores.

    Args:
        obj: An output or a target (an Enum counts as its value; structures as JSON).
        normalize: Trim, lower-case and collapse runs of whitespace, as
            ``ExactMatch(normalize=True)`` does.

    Returns:
        The text compared.

    Raises:
        TypeError: ``obj`` is code (a function, a class) rather than text or data.
    """
    return _fold(_match_text(obj), normalize)


class ExactMatch(Loss):
    """Score 1.0 when the output equals the target, else 0.0: for answers with one right form.

    Use it for a label, a number, a name.  An Enum counts as its value
    (`exact_text` is the text compared).  The failure text quotes both sides, so
    an optimizer sees the gap.

    Args:
        normalize: Trim, lower-case and collapse runs of whitespace on both sides
            first, so formatting noise is not punished.

    Examples:
        >>> from plait.learning import ExactMatch
        >>> print(ExactMatch()("  Paris ", "paris"))
        score 1.00: the output matches the expected answer
        >>> ExactMatch()("Lyon", "Paris").score
        0.0
    """

    def __init__(self, normalize: bool = True) -> None:
        super().__init__()
        self.normalize = normalize

    def forward(self, output: Any, target: Any = None) -> Feedback:
        """Compare ``output`` with ``target``.

        Args:
            output: The pipeline's output.
            target: The expected answer.

        Returns:
            1.0 with a short text on a match; else 0.0 with a text quoting both sides.

        Raises:
            ValueError: ``target`` is None.
        """
        _need_target(self, target)
        expected = _match_text(target)
        actual = _match_text(output)
        if _fold(actual, self.normalize) == _fold(expected, self.normalize):
            return Feedback(1.0, "the output matches the expected answer")
        how = " (compared ignoring case and surrounding whitespace)" if self.normalize else ""
        return Feedback(
            0.0,
            f'expected exactly "{_clip(expected)}" but the output was "{_clip(actual)}"{how}',
            {"expected": expected, "actual": actual},
        )

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The ``normalize`` setting.
        """
        return f"normalize={self.normalize}"


class Contains(Loss):
    """Score the fraction of required strings the output contains.

    Use it when an answer must mention something (a fact, a keyword, a citation)
    but may say more.  The target is one string or a list of them; the failure
    text names each missing one and quotes the output.

    Args:
        case_sensitive: Match case exactly (by default case is ignored).

    Examples:
        >>> from plait.learning import Contains
        >>> print(Contains()("Monday at 10.", ["monday", "10", "room"]))
        score 0.67: the output does not contain "room"; the output was "Monday at 10."
    """

    def __init__(self, case_sensitive: bool = False) -> None:
        super().__init__()
        self.case_sensitive = case_sensitive

    def forward(self, output: Any, target: Any = None) -> Feedback:
        """Check ``output`` for each required string.

        Args:
            output: The pipeline's output.
            target: The required string, or a list of them.

        Returns:
            The fraction found, with a text naming the missing ones.

        Raises:
            ValueError: ``target`` is None or an empty list.
        """
        raw = _payload(target)
        if isinstance(raw, list | tuple):
            if not raw:
                raise ValueError("Contains needs at least one required string; target is empty")
            required = [_render(item) for item in raw]
        else:
            required = [_need_target(self, raw)]
        actual = _render(output)

        def fold(text: str) -> str:
            return text if self.case_sensitive else text.casefold()

        haystack = fold(actual)
        missing = [item for item in required if fold(item) not in haystack]
        score = 1.0 - len(missing) / len(required)
        if not missing:
            return Feedback(score, "the output contains every required string")
        names = ", ".join(f'"{_clip(item, 80)}"' for item in missing)
        return Feedback(
            score,
            f'the output does not contain {names}; the output was "{_clip(actual)}"',
            {"missing": missing},
        )

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The ``case_sensitive`` setting.
        """
        return f"case_sensitive={self.case_sensitive}"


# -- LLM judges ------------------------------------------------------------------------
_JUDGE_SYSTEM = (
    "You are a strict, fair grader. Judge the output only against the criteria given. "
    "In the feedback, name concretely what is wrong or missing and how to fix it; if "
    "nothing is, say so briefly. Then give the score."
)


def _criteria_list(criteria: str | Sequence[str]) -> list[str]:
    items = [criteria] if isinstance(criteria, str) else list(criteria)
    if not items or not all(isinstance(c, str) and c.strip() for c in items):
        raise ValueError(
            f"LLMJudge(criteria=...) must be a non-empty string or list of non-empty strings, "
            f"got {criteria!r}"
        )
    return [c.strip() for c in items]


class LLMJudge(Loss):
    """An LLM grades the output against criteria, for quality no function can decide.

    Use it when quality is a matter of judgement (helpfulness, tone,
    faithfulness).  One call with a typed reply: feedback first, so the model
    reasons before it scores, then a score on ``scale``, normalized to [0, 1].
    The target, when given, is shown as a reference answer.  The judge's prompt
    is fixed, not a learnable parameter: training should improve the pipeline,
    not the grader.  Its call goes through plait's runtime, so limits, caches,
    budgets and mocks apply to it as to the pipeline it grades.

    Args:
        alias: The resource alias the judge's calls go to.
        criteria: What a good output does: one criterion or a list of them.
        scale: The judge's score range ``(low, high)``; 1 to 10 by default, which
            models use more consistently than fractions.
        temperature: The judge call's temperature.
        max_tokens: The judge call's reply limit (None: the endpoint's default).
        system_prompt: The judge's instructions (a strict, fair grader by default).

    Raises:
        ValueError: ``criteria`` is empty or holds an empty string, or ``scale``
            is not a pair ``(low, high)`` with ``low < high``.

    Examples:
        ```python
        from plait import EndpointConfig, ResourceConfig
        from plait.learning import LLMJudge

        endpoint = EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")
        resources = ResourceConfig({"judge": endpoint})
        judge = LLMJudge("judge", criteria="names the day of the meeting").bind(resources=resources)
        feedback = judge.run_sync("The meeting is on Monday.")
        print(feedback.score, feedback.text)
        ```
    """

    _reply_types: ClassVar[dict[tuple[float, float], type[BaseModel]]] = {}

    def __init__(
        self,
        alias: str,
        criteria: str | Sequence[str],
        *,
        scale: tuple[float, float] = (1, 10),
        temperature: float | None = 0.0,
        max_tokens: int | None = None,
        system_prompt: str = _JUDGE_SYSTEM,
    ) -> None:
        super().__init__()
        self.criteria = _criteria_list(criteria)
        self.scale = _check_scale(scale, "LLMJudge")
        self.judge = LLMInference(
            alias,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            response_format=self._reply_type(self.scale),
        )

    @classmethod
    def _reply_type(cls, scale: tuple[float, float]) -> type[BaseModel]:
        # One class per scale: schemas are cached by type, so equal judges share one.
        found = cls._reply_types.get(scale)
        if found is None:
            from pydantic import Field, create_model

            low, high = scale
            found = create_model(
                "JudgeVerdict",
                feedback=(str, Field(description="What is wrong or missing, and how to fix it.")),
                score=(
                    float,
                    Field(ge=low, le=high, description=f"{_fmt(low)} (worst) to {_fmt(high)}"),
                ),
            )
            cls._reply_types[scale] = found
        return found

    def prompt(self, output: Any, target: Any = None) -> str:
        """The judge's user message; a method so that a subclass can reword it.

        Args:
            output: The output to grade.
            target: A reference answer to show the judge, or None.

        Returns:
            The message: the criteria, the reference (if any), the output and the scale.
        """
        low, high = self.scale
        lines = ["Grade the output against these criteria:"]
        lines += [f"- {c}" for c in self.criteria]
        reference = _payload(target)
        if reference is not None:
            lines += [
                "",
                "Reference answer (what a good output should agree with):",
                _render(reference),
            ]
        lines += [
            "",
            "Output to grade:",
            _render(output),
            "",
            f"Score from {_fmt(low)} (fails the criteria) to {_fmt(high)} (fully meets them).",
        ]
        return "\n".join(lines)

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        """Ask the judge to grade ``output``.

        Args:
            output: The output to grade.
            target: A reference answer, or None.

        Returns:
            The normalized score and the judge's feedback; ``details`` holds the
                raw score, the scale and the criteria.
        """
        reply = await self.judge(self.prompt(output, target))
        raw = float(_field(reply, "score"))
        text = str(_field(reply, "feedback")).strip() or "the judge gave no feedback"
        return Feedback(
            _normalize(raw, self.scale),
            text,
            {"raw_score": raw, "scale": self.scale, "criteria": list(self.criteria)},
        )

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The criteria and the scale.
        """
        return f"criteria={self.criteria!r}, scale={self.scale}"


def _rubric_items(rubric: Any) -> list[tuple[str, str]]:
    items = list(rubric.items()) if isinstance(rubric, Mapping) else list(rubric)
    ok = bool(items) and all(
        isinstance(item, tuple)
        and len(item) == 2
        and all(isinstance(part, str) and part.strip() for part in item)
        for item in items
    )
    if not ok:
        raise ValueError(
            "RubricJudge(rubric=...) must be a non-empty dict {criterion: description} or a "
            f"list of (criterion, description) pairs of non-empty strings, got {rubric!r}"
        )
    names = [name.strip() for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"RubricJudge criteria must be distinct, got {names!r}")
    return [(name.strip(), text.strip()) for name, text in items]


class RubricJudge(Loss):
    """An LLM scores the output on each criterion of a rubric, to show which part fails.

    Use it when quality has several separable parts (accuracy, completeness,
    clarity).  One structured call: the reply holds a feedback and a score per
    criterion; the loss's score is the mean of the normalized scores,
    ``details["criteria"]`` keeps each one, and the text leads with the weakest
    criteria so an optimizer fixes those first.

    Args:
        alias: The resource alias the judge's calls go to.
        rubric: ``{criterion: description}``, or a list of ``(criterion,
            description)`` pairs.
        scale: The score range ``(low, high)`` of each criterion (1 to 5 by default).
        temperature: The judge call's temperature.
        max_tokens: The judge call's reply limit (None: the endpoint's default).
        system_prompt: The judge's instructions (a strict, fair grader by default).

    Raises:
        ValueError: The rubric is empty, repeats a criterion or holds an empty
            string, or ``scale`` is not a pair ``(low, high)`` with ``low < high``.

    Examples:
        ```python
        from plait import EndpointConfig, ResourceConfig
        from plait.learning import RubricJudge

        endpoint = EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")
        resources = ResourceConfig({"judge": endpoint})
        judge = RubricJudge(
            "judge",
            {"accuracy": "agrees with the reference", "brevity": "one sentence at most"},
        ).bind(resources=resources)
        feedback = judge.run_sync("The meeting is on Monday.", "Monday at 10")
        print(feedback.score, feedback.details["criteria"]["accuracy"]["score"])
        ```
    """

    weakest: ClassVar[int] = 3
    """How many criteria below full marks the feedback text names."""

    def __init__(
        self,
        alias: str,
        rubric: Mapping[str, str] | Sequence[tuple[str, str]],
        *,
        scale: tuple[float, float] = (1, 5),
        temperature: float | None = 0.0,
        max_tokens: int | None = None,
        system_prompt: str = _JUDGE_SYSTEM,
    ) -> None:
        super().__init__()
        self.rubric = _rubric_items(rubric)
        self.scale = _check_scale(scale, "RubricJudge")
        self.judge = LLMInference(
            alias,
            system_prompt=system_prompt,
            temperature=temperature,
            max_tokens=max_tokens,
            response_format=self._reply_type(),
        )

    def _reply_type(self) -> type[BaseModel]:
        from pydantic import Field, create_model

        low, high = self.scale
        grade = create_model(
            "CriterionGrade",
            feedback=(str, Field(description="What is wrong or missing for this criterion.")),
            score=(float, Field(ge=low, le=high, description=f"{_fmt(low)} to {_fmt(high)}")),
        )
        # Field names are placeholders; the JSON keys are the criterion names (aliases),
        # which need not be Python identifiers.
        fields: dict[str, Any] = {
            f"c{i}": (grade, Field(alias=name, description=text))
            for i, (name, text) in enumerate(self.rubric)
        }
        model: type[BaseModel] = create_model("RubricGrades", **fields)
        return model

    def prompt(self, output: Any, target: Any = None) -> str:
        """The judge's user message; a method so that a subclass can reword it.

        Args:
            output: The output to grade.
            target: A reference answer to show the judge, or None.

        Returns:
            The message: the rubric, the reference (if any), the output and the scale.
        """
        low, high = self.scale
        lines = ["Grade the output on each criterion of this rubric:"]
        lines += [f"- {name}: {text}" for name, text in self.rubric]
        reference = _payload(target)
        if reference is not None:
            lines += [
                "",
                "Reference answer (what a good output should agree with):",
                _render(reference),
            ]
        lines += [
            "",
            "Output to grade:",
            _render(output),
            "",
            f"For each criterion give feedback, then a score from {_fmt(low)} (fails it) "
            f"to {_fmt(high)} (fully meets it).",
        ]
        return "\n".join(lines)

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        """Ask the judge to grade ``output`` on every criterion.

        Args:
            output: The output to grade.
            target: A reference answer, or None.

        Returns:
            The mean normalized score and a text naming the weakest criteria;
                ``details["criteria"]`` holds each criterion's score and feedback.
        """
        reply = await self.judge(self.prompt(output, target))
        low, high = self.scale
        grades: dict[str, dict[str, Any]] = {}
        for i, (name, _) in enumerate(self.rubric):
            grade = _field(reply, f"c{i}") if not isinstance(reply, Mapping) else reply[name]
            raw = float(_field(grade, "score"))
            grades[name] = {
                "score": raw,
                "normalized": _normalize(raw, self.scale),
                "feedback": str(_field(grade, "feedback")).strip(),
            }
        total = sum(g["normalized"] for g in grades.values()) / len(grades)
        short = [(name, g) for name, g in grades.items() if g["normalized"] < 1.0]
        short.sort(key=lambda item: item[1]["normalized"])  # stable: rubric order on ties
        if not short:
            text = "every rubric criterion is fully met"
        else:
            parts = [
                f"{name} ({_fmt(g['score'])}/{_fmt(high)}): {g['feedback'] or 'no feedback given'}"
                for name, g in short[: self.weakest]
            ]
            text = "weakest criteria: " + "; ".join(parts)
        return Feedback(total, text, {"criteria": grades, "scale": (low, high)})

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The criteria's names and the scale.
        """
        return f"criteria={[name for name, _ in self.rubric]!r}, scale={self.scale}"


# -- combining losses ------------------------------------------------------------------
class CompositeLoss(Loss):
    """A weighted average of several losses, for an output that must do several things at once.

    Use it for "the right answer and a good explanation".  The children run
    concurrently through plait's runtime; the score is
    ``sum(weight * score) / sum(weight)`` and the text gives each child's
    feedback labelled by its name (``exact_match``, ``llm_judge`` ...), so an
    optimizer can tell which requirement failed.

    Args:
        losses: ``{loss: weight}``, or a list of ``(loss, weight)`` pairs; each
            loss a `Loss` module, each weight a positive number.

    Raises:
        ValueError: No loss is given, or a weight is not a positive number.
        TypeError: An entry is not a ``(loss, weight)`` pair, or a loss is not a
            `Loss` (wrap a function with `FunctionLoss`).

    Examples:
        ```python
        from plait import EndpointConfig, ResourceConfig
        from plait.learning import CompositeLoss, ExactMatch, LLMJudge

        endpoint = EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")
        resources = ResourceConfig({"judge": endpoint})
        judge = LLMJudge("judge", criteria="answers politely")
        loss = CompositeLoss({ExactMatch(): 2, judge: 1}).bind(resources=resources)
        feedback = loss.run_sync("Monday", "monday")
        print(feedback.details["components"]["exact_match"]["score"])
        ```
    """

    def __init__(self, losses: Mapping[Loss, float] | Sequence[tuple[Loss, float]]) -> None:
        super().__init__()
        pairs = list(losses.items()) if isinstance(losses, Mapping) else list(losses)
        if not pairs:
            raise ValueError("CompositeLoss needs at least one (loss, weight)")
        self.weights: dict[str, float] = {}
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise TypeError(
                    f"CompositeLoss takes {{loss: weight}} or [(loss, weight), ...], got {pair!r}"
                )
            loss, weight = pair
            if not isinstance(loss, Loss):
                raise TypeError(
                    f"CompositeLoss children must be Loss modules, got {type(loss).__name__} "
                    "(wrap a function with FunctionLoss(fn))"
                )
            if (
                isinstance(weight, bool)
                or not isinstance(weight, int | float)
                or not math.isfinite(weight)
                or weight <= 0
            ):
                raise ValueError(
                    f"CompositeLoss weight for {type(loss).__name__} must be a positive "
                    f"number, got {weight!r}"
                )
            name = base = _snake(type(loss).__name__)
            n = 1
            while name in self.weights or hasattr(self, name):
                n += 1
                name = f"{base}_{n}"
            setattr(self, name, loss)
            self.weights[name] = float(weight)

    async def forward(self, output: Any, target: Any = None) -> Feedback:
        """Run every child loss on ``output`` and combine their scores.

        Args:
            output: The output to grade.
            target: The target, passed to every child.

        Returns:
            The weighted mean score and each child's labelled feedback;
                ``details["components"]`` holds each child's score, weight and text.

        Raises:
            TypeError: A child returned something other than a `Feedback`.
        """
        names = list(self.weights)

        async def one(name: str) -> Feedback:
            # Inside a run, calling a child returns an awaitable (the engine runs it);
            # called outside one, a plain child just returns its Feedback.
            result = getattr(self, name)(output, target)
            if inspect.isawaitable(result):
                result = await result
            try:
                return as_feedback(result)
            except TypeError:
                raise TypeError(
                    f"CompositeLoss child {name} ({type(getattr(self, name)).__name__}) returned "
                    f"{type(_payload(result)).__name__}, not a Feedback"
                ) from None

        results = await asyncio.gather(*(one(name) for name in names))
        total = sum(self.weights.values())
        score = sum(self.weights[n] * fb.score for n, fb in zip(names, results, strict=True))
        parts = [
            f"[{n}] (score {fb.score:.2f}, weight {_fmt(self.weights[n])}) {fb.text}"
            for n, fb in zip(names, results, strict=True)
        ]
        details = {
            "components": {
                n: {
                    "score": fb.score,
                    "weight": self.weights[n],
                    "text": fb.text,
                    "details": fb.details,
                }
                for n, fb in zip(names, results, strict=True)
            }
        }
        return Feedback(min(1.0, score / total), "\n".join(parts), details)

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            Each child's name and weight.
        """
        return ", ".join(f"{n}={_fmt(w)}" for n, w in self.weights.items())


# -- batches -----------------------------------------------------------------------------
def aggregate(feedbacks: Sequence[Feedback | Value], k: int = 3) -> Feedback:
    """One `Feedback` for a minibatch, so one summary shows the failures that matter most.

    A trainer reports the mean; an optimizer reading one summary should see the
    worst failures, so the text lists the lowest-scoring items (below 1.0) with
    their scores, worst first, instead of every item's feedback.

    Args:
        feedbacks: The minibatch's feedback, each a `Feedback` or a `Value` holding one.
        k: How many of the lowest-scoring items the text quotes.

    Returns:
        The mean score and the ``k`` worst items' texts; ``details`` holds every
            score, the count and the worst items' positions.

    Raises:
        TypeError: ``feedbacks`` is a single Feedback or Value rather than a
            sequence, or an item holds no Feedback.
        ValueError: ``feedbacks`` is empty, ``k`` is below 1, or an item is a
            failed call's error Value.

    Examples:
        >>> from plait.learning import Feedback, aggregate
        >>> batch = [Feedback(1.0, "fine"), Feedback(0.0, "no date"), Feedback(0.5, "vague")]
        >>> print(aggregate(batch, k=1))
        score 0.50: mean score 0.50 over 3 outputs; the 1 lowest:
        - (score 0.00) no date
    """
    if isinstance(feedbacks, Feedback | Value | str):
        raise TypeError("aggregate() takes a sequence of Feedback (or Values holding them)")
    items = [as_feedback(fb) for fb in feedbacks]
    if not items:
        raise ValueError("aggregate() needs at least one Feedback; the batch is empty")
    if k < 1:
        raise ValueError(f"aggregate(k=...) must be at least 1, got {k!r}")
    scores = [fb.score for fb in items]
    mean = sum(scores) / len(scores)
    worst = sorted(
        (i for i, fb in enumerate(items) if fb.score < 1.0), key=lambda i: items[i].score
    )[:k]
    header = f"mean score {mean:.2f} over {len(items)} output{'s' if len(items) != 1 else ''}"
    if not worst:
        text = f"{header}; every output fully met the criteria"
    else:
        lines = [f"- (score {items[i].score:.2f}) {items[i].text}" for i in worst]
        text = f"{header}; the {len(worst)} lowest:\n" + "\n".join(lines)
    return Feedback(
        min(1.0, mean),
        text,
        {"scores": scores, "count": len(items), "worst": worst},
    )
