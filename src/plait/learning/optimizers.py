"""Optimizers: turn the feedback parameters accumulated into better values.

The lifecycle is torch's: ``backward()`` calls ``param.accumulate_feedback(text)``
on every parameter that shaped an output; ``await optimizer.step()`` rewrites each
trainable parameter that received feedback and installs the result with
``apply_update`` (which clears its buffer and bumps its module's state version);
``optimizer.zero_feedback()`` starts the next batch clean.

A rewrite is an LLM call, made through plait like any other (so resources,
limits, handlers such as ``mock``, ``cache`` and ``budget`` all apply).  The
prompt always carries the parameter's ``description``: it is the contract of
what the value is for, and a rewrite that satisfies the feedback but breaks the
contract is worse than none.

Order of updates.  By default parameters are rewritten one after another in
dependency order, upstream first (closer to the pipeline's inputs, as the last
backward pass saw them; ties and parameters no backward pass reached keep the
optimizer's parameter order), and each rewrite is shown the updates already
made in this step: a downstream prompt receives what the upstream one
produces, so when both got the same complaint the downstream rewrite can see
the upstream fix and avoid fixing it twice.  ``order=`` names the order explicitly, and an
entry that is a list of names is a group rewritten concurrently; with
``concurrent=True`` every parameter not named in ``order`` is treated as
independent and all are rewritten at once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self, TypedDict

from plait._text import data_text
from plait.handlers.overriding import override
from plait.inference import LLMInference
from plait.learning.backward import upstream_rank
from plait.module import Module
from plait.parameter import Parameter
from plait.providers.base import ReplyFormatError
from plait.values import ExecutionError

if TYPE_CHECKING:
    from plait.resources.config import ResourceConfig
    from plait.resources.manager import ResourceManager

__all__ = [
    "Optimizer",
    "OptimizerStepError",
    "Proposal",
    "Rejection",
    "Rewrite",
    "SFAOptimizer",
    "TextGradOptimizer",
    "Update",
    "aggregate_feedback",
    "check_rewrite",
    "meta_markers",
    "rewrite_budget",
    "rewrite_max_tokens",
]

OrderEntry = str | Sequence[str]
"""A qualified parameter name, or a group of names rewritten concurrently."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """A new value for one parameter and the feedback text it was derived from."""

    value: Any
    feedback: str
    markers: tuple[str, ...] = ()
    """Headings and delimiters of the prompt that asked for it (an echo of one is refused)."""
    refused: str | None = None
    """Why there is no usable value (the rewriter's reply was not one): always refused."""


@dataclass(frozen=True, slots=True)
class Update:
    """An update made earlier in the same step, shown to later rewrites as context."""

    name: str
    description: str
    old_value: Any
    new_value: Any


@dataclass(frozen=True, slots=True)
class Rejection:
    """A proposed value that `check_rewrite` refused: the parameter kept its old value.

    ``step`` is the optimizer's step count when it happened (0 for the first step);
    the parameter keeps its feedback, so the next step tries again.
    """

    step: int
    name: str
    value: Any
    reason: str


class OptimizerStepError(RuntimeError):
    """Some rewrites of a step failed; those that succeeded stay, so a retry redoes the rest.

    Updates that succeeded before the failure stay applied (``applied``); failed
    parameters keep their old value and their feedback, so the next ``step()``
    retries them.  Later stages of the step were not attempted.

    Args:
        failures: Qualified parameter name -> the exception its rewrite raised.
        applied: Qualified parameter name -> the new value installed before the failure.
    """

    def __init__(self, failures: dict[str, Exception], applied: dict[str, Any]) -> None:
        self.failures = failures
        self.applied = applied
        detail = "; ".join(f"{name}: {type(e).__name__}: {e}" for name, e in failures.items())
        super().__init__(
            f"optimizer step failed for {len(failures)} parameter(s) ({detail}); "
            f"{len(applied)} update(s) were applied and stay applied"
        )
        self.__cause__ = next(iter(failures.values()))


class Optimizer:
    """Base class of optimizers that rewrite parameters from their feedback.

    It holds the parameters, orders their updates (upstream first, see the module
    doc) and applies each proposal; subclasses implement ``_propose``, the new
    value for one parameter.  Only parameters with ``requires_grad`` are ever
    updated, checked at each step so freezing a parameter after building the
    optimizer takes effect; a parameter given twice (shared between modules) is
    held once.

    Args:
        params: The parameters to optimize (``model.parameters()``).
        order: The order of updates by qualified name; an entry that is a list of
            names is a group rewritten concurrently.  Parameters not named come
            after, upstream first.
        concurrent: Rewrite every parameter ``order`` does not name at once, as
            independent.

    Raises:
        TypeError: ``params`` is a module or a single parameter rather than an
            iterable of parameters, or ``order`` is malformed.
        ValueError: No parameters were given, or ``order`` names one twice.
    """

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        order: Sequence[OrderEntry] | None = None,
        concurrent: bool = False,
    ) -> None:
        if isinstance(params, Module):
            raise TypeError(
                f"{type(self).__name__}() takes parameters, not a module: pass module.parameters()"
            )
        if isinstance(params, Parameter):
            raise TypeError(f"{type(self).__name__}() takes an iterable of parameters: [param]")
        held: dict[int, Parameter] = {}
        for param in params:
            if not isinstance(param, Parameter):
                raise TypeError(
                    f"{type(self).__name__}() takes Parameters, got {type(param).__name__}"
                )
            held.setdefault(id(param), param)
        if not held:
            raise ValueError(f"{type(self).__name__}() got no parameters to optimize")
        self.params: list[Parameter] = list(held.values())
        self.order: list[OrderEntry] = _check_order(order)
        self.concurrent = concurrent
        self.steps = 0
        self.rejected: list[Rejection] = []
        """Every rewrite refused by `check_rewrite`, oldest first."""
        self.resources: ResourceConfig | ResourceManager | Any = None

    # -- configuration -------------------------------------------------------------
    def bind(self, resources: ResourceConfig | ResourceManager | Any) -> Self:
        """Send the optimizer's own LLM calls to ``resources``.

        Without a binding, the resources active when `step` runs serve them (the
        `Trainer`'s, or an `ExecutionSettings` around the call).

        Args:
            resources: A `ResourceConfig`, a `ResourceManager`, or a mapping of
                aliases to endpoint settings.

        Returns:
            The optimizer itself, for chaining.
        """
        self.resources = resources
        for module in self._modules():
            module.bind(resources=resources)
        return self

    def _modules(self) -> list[Module]:
        """The modules that make this optimizer's LLM calls (bound by `bind`)."""
        return []

    # -- the loop ------------------------------------------------------------------
    def zero_feedback(self) -> None:
        """Clear every held parameter's feedback, to start the next batch clean (``zero_grad``)."""
        for param in self.params:
            param.zero_feedback()

    async def step(self) -> dict[str, Any]:
        """Rewrite every trainable parameter that has feedback.

        Parameters without feedback, and frozen ones, are left exactly as they are
        (their module state version does not move).  A proposal that
        `check_rewrite` refuses leaves its parameter (and its feedback) as it was
        and is recorded in ``rejected``.

        Returns:
            The new values, by qualified parameter name.

        Raises:
            OptimizerStepError: Some rewrites failed; those applied before stay.
            KeyError: ``order`` names a parameter the optimizer does not hold.
            ValueError: Two held parameters share a qualified name (run the
                pipeline first, so names are full paths).
        """
        names = self._names()
        pending = [p for p in self.params if p.requires_grad and p.get_accumulated_feedback()]
        applied: dict[str, Any] = {}
        earlier: list[Update] = []
        for stage in self._stages(pending, names):
            results = await asyncio.gather(
                *(self._propose(p, names[id(p)], tuple(earlier)) for p in stage),
                return_exceptions=True,
            )
            failures: dict[str, Exception] = {}
            for param, result in zip(stage, results, strict=True):
                name = names[id(param)]
                if isinstance(result, BaseException):
                    if not isinstance(result, Exception):
                        raise result
                    failures[name] = result
                    continue
                old_value = param.value
                reason = (
                    result.refused if result.refused is not None else self._check(param, result)
                )
                if reason is not None:
                    self.rejected.append(Rejection(self.steps, name, result.value, reason))
                    continue
                param.apply_update(result.value)
                self._updated(param, name, old_value, result)
                earlier.append(Update(name, param.description or "", old_value, result.value))
                applied[name] = result.value
            if failures:
                self.steps += 1
                raise OptimizerStepError(failures, applied)
        self.steps += 1
        return applied

    def _check(self, param: Parameter, proposal: Proposal) -> str | None:
        """Why the proposal may not replace ``param``'s value, or None: `check_rewrite`."""
        return check_rewrite(param.value, proposal.value, proposal.markers)

    async def _propose(self, param: Parameter, name: str, earlier: tuple[Update, ...]) -> Proposal:
        raise NotImplementedError(f"{type(self).__name__} must implement _propose()")

    def _updated(self, param: Parameter, name: str, old_value: Any, proposal: Proposal) -> None:
        """Hook run after a proposal is applied (optimizers with memory record it here)."""

    # -- naming and ordering -------------------------------------------------------
    def _names(self) -> dict[int, str]:
        """Qualified name of each held parameter; two parameters may not share one.

        Names are dotted paths from the root module that last ran them, so they are
        only complete once the pipeline has run; before that two modules' parameters
        can both be called ``system_prompt``.
        """
        names: dict[int, str] = {}
        owners: dict[str, Parameter] = {}
        for param in self.params:
            name = param.qualified_name
            if name in owners:
                raise ValueError(
                    f"two optimized parameters are both named {name!r}: names are dotted "
                    "paths assigned when the pipeline runs, so run it (forward and backward) "
                    "before step(), or give the optimizer parameters of one root module"
                )
            owners[name] = param
            names[id(param)] = name
        return names

    def _stages(self, pending: list[Parameter], names: dict[int, str]) -> list[list[Parameter]]:
        """Groups of parameters to rewrite: groups run in sequence, members concurrently."""
        by_name = {names[id(p)]: p for p in self.params}
        waiting = {id(p) for p in pending}
        stages: list[list[Parameter]] = []
        for entry in self.order:
            group = [entry] if isinstance(entry, str) else list(entry)
            unknown = [name for name in group if name not in by_name]
            if unknown:
                raise KeyError(
                    f"order= names unknown parameter(s) {', '.join(map(repr, unknown))}; "
                    f"the optimizer holds: {', '.join(by_name)}"
                )
            stage = [by_name[name] for name in group if id(by_name[name]) in waiting]
            waiting.difference_update(id(p) for p in stage)
            if stage:
                stages.append(stage)
        rest = sorted((p for p in pending if id(p) in waiting), key=upstream_rank)
        if self.concurrent:
            return [*stages, rest] if rest else stages
        return stages + [[p] for p in rest]

    # -- persistence ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The optimizer's own state, for a checkpoint; parameter values live in the module.

        Returns:
            JSON-ready data: its type and step count.
        """
        return {"type": type(self).__name__, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, to resume a run.

        Args:
            state: The saved state, from an optimizer of the same type.

        Raises:
            ValueError: ``state`` comes from another type of optimizer.
        """
        kind = state.get("type")
        if kind != type(self).__name__:
            raise ValueError(f"state_dict of a {kind} cannot be loaded into {type(self).__name__}")
        self.steps = int(state.get("steps", 0))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.params)} parameters, steps={self.steps})"


def _check_order(order: Sequence[OrderEntry] | None) -> list[OrderEntry]:
    if order is None:
        return []
    if isinstance(order, str):
        raise TypeError("order= takes a list of parameter names, not one string")
    entries: list[OrderEntry] = []
    seen: set[str] = set()
    for entry in order:
        group = [entry] if isinstance(entry, str) else list(entry)
        for name in group:
            if not isinstance(name, str):
                raise TypeError(f"order= entries are names or lists of names, got {name!r}")
            if name in seen:
                raise ValueError(f"order= names {name!r} twice")
            seen.add(name)
        entries.append(entry if isinstance(entry, str) else tuple(group))
    return entries


# -- feedback ------------------------------------------------------------------------
def aggregate_feedback(items: Iterable[Any]) -> list[str]:
    """Distinct feedback texts in first-seen order, with a count where one repeats.

    A batch often reports the same problem many times; repeating it verbatim wastes
    the rewrite prompt, while the count keeps how widespread the problem was.
    """
    counts: dict[str, int] = {}
    for item in items:
        text = " ".join(str(item).split())
        if text:
            counts[text] = counts.get(text, 0) + 1
    return [text if n == 1 else f"{text} (reported {n} times)" for text, n in counts.items()]


# -- checking a rewrite ---------------------------------------------------------------
MAX_REWRITE_TOKENS = 4096
"""Cap of the rewriter's default ``max_tokens``."""


def rewrite_budget(old: Any) -> int:
    """Most characters a rewrite of ``old`` may have: ``max(4 * len(old), len(old) + 400)``.

    Lengths are of the value as text (structured values as JSON).  A rewrite may grow
    a short prompt by a few sentences or a long one several times over; beyond that
    it is rambling, or the meta-prompt coming back, not a value.
    """
    size = len(data_text(old))
    return max(4 * size, size + 400)


def rewrite_max_tokens(old: Any) -> int:
    """The rewriter's default ``max_tokens`` for a parameter holding ``old``.

    Room for a reply as long as `rewrite_budget` allows (about four characters a
    token) plus 64 tokens for the structured reply's own JSON, capped at
    `MAX_REWRITE_TOKENS`: a rewrite of a one-line prompt cannot run on for pages.
    """
    return min(MAX_REWRITE_TOKENS, rewrite_budget(old) // 4 + 64)


def meta_markers(prompt: str) -> tuple[str, ...]:
    """The meta-prompt's own headings and delimiters, which a real value never contains.

    The ``#`` headings of ``prompt`` (without a parenthetical aside) outside the
    ``<<<``/``>>>`` fences that show values, the fences themselves, and the phrases
    small models echo ("The new value is").
    """
    markers = ["<<<", ">>>", "The new value is", "Reply with ONLY the new value"]
    fenced = False
    for line in prompt.splitlines():
        text = line.strip()
        if text == "<<<":
            fenced = True
        elif text == ">>>":
            fenced = False
        elif not fenced and text.startswith("#"):
            heading = text.split(" (")[0].strip()  # without its parenthetical aside
            if heading not in markers:
                markers.append(heading)
    return tuple(markers)


def check_rewrite(old: Any, new: Any, meta_markers: Iterable[str] = ()) -> str | None:
    """Why ``new`` may not replace ``old``, or None when it may.

    Refused: an empty or blank value; one containing any of ``meta_markers`` (the
    rewrite prompt's headings and delimiters, an echo of the prompt rather than a
    value) unless ``old`` already contained it; one longer than `rewrite_budget`
    of ``old``.  Matching ignores case.
    """
    text = data_text(new)
    if not text.strip():
        return "the new value is empty"
    old_text = data_text(old).casefold()
    folded = text.casefold()
    for marker in meta_markers:
        needle = marker.strip().casefold()
        if needle and needle in folded and needle not in old_text:
            return f"the new value echoes the rewrite prompt ({marker.strip()!r})"
    budget = rewrite_budget(old)
    if len(text) > budget:
        return f"the new value has {len(text)} characters, over the budget of {budget}"
    return None


_REWRITE_SYSTEM = (
    "You improve one parameter of an LLM pipeline (a prompt or other setting that steers a "
    "model) using feedback on the outputs it shaped. Keep to what the parameter is for. "
    "Reply with ONLY the new value: no preamble, no explanation, no quotes or code fences."
)

_REWRITE_SYSTEM_STRUCTURED = (
    "You improve one parameter of an LLM pipeline (a prompt or other setting that steers a "
    "model) using feedback on the outputs it shaped. Keep to what the parameter is for. "
    "Reply with a JSON object whose only field, new_value, holds ONLY the new value: no "
    "preamble, no explanation, no headings or delimiters of the request."
)

_SUMMARY_SYSTEM = (
    "You condense feedback about one parameter of an LLM pipeline into a short list of "
    "distinct, actionable points. Keep every distinct point; drop repetition."
)

_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n?```$", re.DOTALL)


class Rewrite(TypedDict):
    """The rewriter's structured reply: the new value as one field, nothing around it.

    A structured (non-string) parameter's new value is JSON text in ``new_value``.
    """

    new_value: str


class _Call(Module):
    """One named LLM call, run as its own root so mocks can match its path."""

    def __init__(
        self,
        name: str,
        alias: str,
        system_prompt: str,
        temperature: float | None,
        response_format: Any = None,
    ):
        super().__init__()
        self._call_name = name
        llm = LLMInference(
            alias, system_prompt, temperature=temperature, response_format=response_format
        )
        setattr(self, name, llm)

    @property
    def llm(self) -> LLMInference:
        module = getattr(self, self._call_name)
        assert isinstance(module, LLMInference)
        return module

    def forward(self, prompt: str) -> Any:
        return self.llm(prompt)


async def ask_rewrite(
    call: _Call, prompt: str, param: Parameter, name: str
) -> tuple[Any, str | None]:
    """One new value for ``param`` asked of the rewriter ``call``: the value, or None and
    why the reply is none.  Unless the call sets ``max_tokens``, the reply may be at
    most `rewrite_max_tokens` of the current value.  An endpoint that fails raises (the
    step fails); a reply that is no value (a small model running past ``max_tokens``
    mid-JSON) is a refused rewrite, like an echo, not a broken run."""
    try:
        if call.llm.max_tokens is None:
            with override(call._call_name, max_tokens=rewrite_max_tokens(param.value)):
                reply = await call(prompt)
        else:
            reply = await call(prompt)
    except ExecutionError as exc:
        if not isinstance(exc.__cause__, ReplyFormatError):
            raise
        return None, f"the rewriter's reply was not a value ({exc.__cause__})"
    if isinstance(reply, dict):  # the structured reply (a plain-text handler gives str)
        reply = reply.get("new_value", "")
    return _parse_reply(reply, param, name), None


class SFAOptimizer(Optimizer):
    """Rewrites each prompt from the feedback it received, with one LLM call per parameter.

    For each parameter the feedback is de-duplicated and, beyond
    ``max_feedback_chars``, condensed by a second LLM call; then an LLM on
    ``alias`` is shown the parameter's description, its current value, that
    feedback and the updates made earlier in this step, and asked for only the
    new value.  The two calls run as root modules with paths ``"rewriter"`` and
    ``"summarizer"``, so ``mock({"rewriter": ...})`` or ``mock({"optimizer":
    ...})`` (the alias) answers them in tests.  A structured (non-string)
    parameter is shown and requested as JSON.

    Each proposal is checked by `check_rewrite` (not empty, no echo of this
    prompt's headings or ``<<<``/``>>>`` fences, at most `rewrite_budget`
    characters); a refused one leaves the parameter and its feedback as they were
    and is recorded in ``rejected``.  Unless ``rewriter.max_tokens`` is set, each
    rewrite asks for at most `rewrite_max_tokens` of the current value.

    Args:
        params: The parameters to optimize (``model.parameters()``).
        alias: The resource alias of the rewriting model (it may be stronger than
            the pipeline's).
        temperature: The rewrite calls' temperature.
        max_feedback_chars: Beyond this many characters a parameter's feedback is
            condensed by an LLM call before the rewrite.
        order: The order of updates (see `Optimizer`).
        concurrent: Rewrite the parameters ``order`` does not name at once.
        check: Check each proposal with `check_rewrite`; False applies every
            proposal (for a test server that echoes its prompt).
        structured: Ask for the new value through structured output, `Rewrite`
            (``{"new_value": ...}``), so it comes back as one field rather than
            mixed with talk; False asks for plain text (for an endpoint without
            structured output).

    Raises:
        ValueError: ``max_feedback_chars`` is below 1, or as `Optimizer`.
        TypeError: As `Optimizer`.

    Examples:
        ```python
        import plait
        from plait.handlers import mock
        from plait.learning import Contains, SFAOptimizer, Trainer
        from plait.providers import LLMRequest


        class Reply(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference(
                    "fast", plait.Parameter("Answer the customer.", description="how to answer")
                )

            def forward(self, message: str) -> str:
                return self.llm(message)


        def model(request: LLMRequest) -> str:
            # A stand-in model: it gives the tracking link once its instructions ask for it.
            instructions = request.messages[0]["content"]
            return "Here is your tracking link." if "tracking" in instructions else "Sorry."


        pipeline = Reply()
        optimizer = SFAOptimizer(pipeline.parameters())  # rewrites through the "optimizer" alias
        train = [("Where is my parcel?", "tracking"), ("Has my order shipped?", "tracking")]
        val = [("When will my parcel arrive?", "tracking")]
        trainer = Trainer(pipeline, Contains(), optimizer, train, val)
        with mock({"fast": model, "optimizer": "Answer, and give the tracking link."}):
            history = trainer.fit_sync()
        print(history.initial_val_score, "->", history.best_val_score)
        print(pipeline.llm.system_prompt.value)
        ```
    """

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        alias: str = "optimizer",
        temperature: float | None = 0.7,
        max_feedback_chars: int = 4000,
        order: Sequence[OrderEntry] | None = None,
        concurrent: bool = False,
        check: bool = True,
        structured: bool = True,
    ) -> None:
        super().__init__(params, order=order, concurrent=concurrent)
        self.check = check
        if max_feedback_chars < 1:
            raise ValueError(f"max_feedback_chars must be positive, got {max_feedback_chars}")
        self.alias = alias
        self.max_feedback_chars = max_feedback_chars
        self.structured = structured
        self._rewriter = _Call(
            "rewriter",
            alias,
            _REWRITE_SYSTEM_STRUCTURED if structured else _REWRITE_SYSTEM,
            temperature,
            Rewrite if structured else None,
        )
        self._summarizer = _Call("summarizer", alias, _SUMMARY_SYSTEM, temperature)

    @property
    def rewriter(self) -> LLMInference:
        """The LLM call that proposes new values: set its ``temperature`` or ``max_tokens`` here."""
        return self._rewriter.llm

    def _modules(self) -> list[Module]:
        return [self._rewriter, self._summarizer]

    def _check(self, param: Parameter, proposal: Proposal) -> str | None:
        return super()._check(param, proposal) if self.check else None

    async def _propose(self, param: Parameter, name: str, earlier: tuple[Update, ...]) -> Proposal:
        feedback = await self._feedback_text(param, name)
        prompt = self.rewrite_prompt(param, name, feedback, earlier)
        value, refused = await ask_rewrite(self._rewriter, prompt, param, name)
        if refused is not None:
            return Proposal(None, feedback, refused=refused)
        return Proposal(value, feedback, meta_markers(prompt))

    async def _feedback_text(self, param: Parameter, name: str) -> str:
        """The parameter's feedback as one block: de-duplicated, condensed if too long."""
        text = "\n".join(
            f"- {item}" for item in aggregate_feedback(param.get_accumulated_feedback())
        )
        if len(text) <= self.max_feedback_chars:
            return text
        summary = await self._summarizer(
            f"Feedback on outputs shaped by the parameter `{name}`, whose role is:\n"
            f"{param.description}\n\nFeedback:\n{text}\n\n"
            "Condense this into a list of distinct, actionable points."
        )
        return str(summary).strip()

    def rewrite_prompt(
        self, param: Parameter, name: str, feedback: str, earlier: tuple[Update, ...] = ()
    ) -> str:
        """The prompt that asks for a new value; subclasses add sections through ``_context``.

        Args:
            param: The parameter to rewrite.
            name: Its qualified name.
            feedback: Its feedback, as one block of text.
            earlier: Updates already made in this step, shown as context.

        Returns:
            The rewrite prompt.

        Raises:
            TypeError: A value the prompt shows cannot be written as JSON.
        """
        structured = not isinstance(param.value, str)
        sections = [
            f"Rewrite the parameter `{name}` of an LLM pipeline.",
            "## What the parameter is for (the new value must still serve this)\n"
            f"{param.description}",
            f"## Current value\n{_show(param.value, name)}",
            f"## Feedback on outputs it shaped\n{feedback}",
            *self._context(param),
        ]
        if earlier:
            lines = [
                f"- `{u.name}` ({u.description}) is now:\n{_show(u.new_value, u.name)}"
                for u in earlier
            ]
            sections.append(
                "## Updates already made in this step to parameters upstream of it\n"
                "Take them into account; do not fix again what they already fix.\n"
                + "\n".join(lines)
            )
        ask = (
            "Write an improved value that addresses the feedback while keeping to what the "
            "parameter is for. Change only what the feedback calls for. "
        )
        ask += (
            "Reply with ONLY the new value as JSON of the same shape"
            if structured
            else "Reply with ONLY the new value"
        )
        ask += " (as text), in the field new_value." if self.structured else "."
        sections.append(ask)
        return "\n\n".join(sections)

    def _context(self, param: Parameter) -> list[str]:
        """Extra prompt sections for ``param`` (memory of earlier steps, in subclasses)."""
        return []

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's own state, for a checkpoint.

        Returns:
            JSON-ready data: its type, step count and alias.
        """
        return {**super().state_dict(), "alias": self.alias}


class TextGradOptimizer(SFAOptimizer):
    """`SFAOptimizer` with momentum, so a rewrite does not undo what an earlier step fixed.

    Feedback from one batch says what to fix now; a rewrite that forgets earlier
    feedback tends to reintroduce what an earlier step fixed.  So each rewrite
    also sees the parameter's last ``momentum`` values with the feedback that led
    away from each ("past feedback that still applies"), as TextGrad's momentum
    does.

    Args:
        params: The parameters to optimize (``model.parameters()``).
        momentum: How many earlier values (and their feedback) each rewrite sees.
        alias: The resource alias of the rewriting model.
        temperature: The rewrite calls' temperature.
        max_feedback_chars: Beyond this many characters a parameter's feedback is
            condensed by an LLM call before the rewrite.
        order: The order of updates (see `Optimizer`).
        concurrent: Rewrite the parameters ``order`` does not name at once.
        check: Check each proposal with `check_rewrite`.
        structured: Ask for the new value through structured output.

    Raises:
        ValueError: ``momentum`` is not a non-negative integer, or as `SFAOptimizer`.
        TypeError: As `Optimizer`.

    Examples:
        ```python
        import plait
        from plait.handlers import mock
        from plait.learning import Contains, TextGradOptimizer, Trainer
        from plait.providers import LLMRequest


        class Reply(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference(
                    "fast", plait.Parameter("Answer the customer.", description="how to answer")
                )

            def forward(self, message: str) -> str:
                return self.llm(message)


        def model(request: LLMRequest) -> str:
            # A stand-in model: it gives the tracking link once its instructions ask for it.
            instructions = request.messages[0]["content"]
            return "Here is your tracking link." if "tracking" in instructions else "Sorry."


        pipeline = Reply()
        optimizer = TextGradOptimizer(pipeline.parameters(), momentum=3)
        train = [("Where is my parcel?", "tracking"), ("Has my order shipped?", "tracking")]
        val = [("When will my parcel arrive?", "tracking")]
        trainer = Trainer(pipeline, Contains(), optimizer, train, val)
        with mock({"fast": model, "optimizer": "Answer, and give the tracking link."}):
            history = trainer.fit_sync()
        print(history.initial_val_score, "->", history.best_val_score)
        print(pipeline.llm.system_prompt.value)
        ```
    """

    def __init__(
        self,
        params: Iterable[Parameter],
        *,
        momentum: int = 3,
        alias: str = "optimizer",
        temperature: float | None = 0.7,
        max_feedback_chars: int = 4000,
        order: Sequence[OrderEntry] | None = None,
        concurrent: bool = False,
        check: bool = True,
        structured: bool = True,
    ) -> None:
        super().__init__(
            params,
            alias=alias,
            temperature=temperature,
            max_feedback_chars=max_feedback_chars,
            order=order,
            concurrent=concurrent,
            check=check,
            structured=structured,
        )
        if not isinstance(momentum, int) or momentum < 0:
            raise ValueError(f"momentum must be a non-negative integer, got {momentum!r}")
        self.momentum = momentum
        self._history: dict[int, deque[dict[str, Any]]] = {}

    def history(self, param: Parameter) -> list[dict[str, Any]]:
        """The earlier values of ``param`` that its rewrites remember.

        Args:
            param: A parameter the optimizer holds.

        Returns:
            ``[{"value": old value, "feedback": feedback that replaced it}, ...]``,
                oldest first.
        """
        return [dict(entry) for entry in self._history.get(id(param), ())]

    def _updated(self, param: Parameter, name: str, old_value: Any, proposal: Proposal) -> None:
        if self.momentum:
            entries = self._history.setdefault(id(param), deque(maxlen=self.momentum))
            entries.append({"value": old_value, "feedback": proposal.feedback})

    def _context(self, param: Parameter) -> list[str]:
        entries = self._history.get(id(param))
        if not entries:
            return []
        name = param.qualified_name
        lines = [
            f"{i}. Value:\n{_show(entry['value'], name)}\nFeedback it received:\n"
            f"{entry['feedback']}"
            for i, entry in enumerate(entries, start=1)
        ]
        return [
            "## Past feedback that still applies\n"
            "Earlier values of this parameter and the feedback that led to rewriting each, "
            "oldest first. Keep the fixes they asked for unless the new feedback says "
            "otherwise.\n" + "\n".join(lines)
        ]

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's own state, its memory included, for a checkpoint.

        Returns:
            JSON-ready data: type, step count, alias, momentum and each
                parameter's remembered values by qualified name.
        """
        names = self._names()
        history = {
            names[id(p)]: [dict(e) for e in self._history[id(p)]]
            for p in self.params
            if self._history.get(id(p))
        }
        return {**super().state_dict(), "momentum": self.momentum, "history": history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step count and the remembered values, to resume a run.

        Args:
            state: What `state_dict` returned.

        Raises:
            ValueError: ``state`` comes from another type of optimizer.
            KeyError: ``state`` remembers values of a parameter this optimizer
                does not hold.
        """
        super().load_state_dict(state)
        names = self._names()
        by_name = {names[id(p)]: p for p in self.params}
        history = state.get("history", {})
        unknown = [name for name in history if name not in by_name]
        if unknown:
            raise KeyError(
                f"optimizer state has history for unknown parameter(s) "
                f"{', '.join(map(repr, unknown))}; the optimizer holds: {', '.join(by_name)}"
            )
        self._history = {
            id(by_name[name]): deque(
                ({"value": e["value"], "feedback": str(e["feedback"])} for e in entries),
                maxlen=self.momentum,
            )
            for name, entries in history.items()
            if self.momentum
        }


def _show(value: Any, name: str) -> str:
    """A value as the prompt shows it: text as is, structures as JSON, fenced off."""
    if isinstance(value, str):
        return f"<<<\n{value}\n>>>"
    try:
        return f"<<<\n{json.dumps(value, indent=2, ensure_ascii=False)}\n>>>"
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"parameter {name!r} holds a {type(value).__name__}, which the optimizer cannot "
            f"show as JSON ({exc})"
        ) from None


def _parse_reply(reply: Any, param: Parameter, name: str) -> Any:
    """The new value from the LLM's reply; a structured value that is not JSON is an error."""
    text = str(reply).strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    if text.startswith("<<<") and text.endswith(">>>"):
        text = text[3:-3].strip()
    if not text or isinstance(param.value, str):
        return text  # an empty value is refused by `check_rewrite`, not an error
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(
            f"the optimizer LLM's proposal for structured parameter {name!r} is not JSON: {exc}"
        ) from None
