"""`LLMInference`: the atomic LLM call every other module is a composition of."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar

from plait._text import prompt_text
from plait.demos import (
    DEMOS_DESCRIPTION,
    choose_demos,
    demo_messages,
    is_pool,
    normalize_demo_value,
)
from plait.labels import (
    LABEL_METHOD_DESCRIPTION,
    LabelMethod,
    check_label_method,
    label_choices,
    labels_instruction,
)
from plait.module import BackwardContext, BackwardResult, Module
from plait.parameter import Parameter
from plait.providers.base import check_reply_checks
from plait.structured import schema_for
from plait.values import Value

__all__ = ["LLMInference"]


class LLMInference(Module):
    """The atomic LLM call: every other module is a composition of these.

    ``alias`` names an endpoint in the resources; ``system_prompt`` may be a string
    (fixed) or a `Parameter` (learnable); ``response_format`` asks for a typed,
    validated reply (a pydantic model, dataclass, TypedDict or e.g. ``list[str]``).

    ``demos`` gives the call learnable demonstrations (`plait.demos`): a list of
    ``(input, output)`` pairs or ``{"input": ..., "output": ...}`` dicts, possibly
    empty, or a pool chosen from per input (``knn_demos(k=4)``: each call is shown
    the ``k`` pairs most like its input), becomes a `Parameter` named ``demos`` that
    `BootstrapFewShot` fills; a
    `Parameter` holding such a list is used as it is (``requires_grad=False``
    fixes the examples).  They are sent as user/assistant turns after the system
    prompt and before the input.  Without ``demos`` the call has none.

    A ``response_format`` that is a ``Literal`` of texts or a text `Enum` makes the
    call answer with one of those labels, always (`plait.labels`); ``label_method``
    says how the label is chosen: ``"grammar"`` (decoding constrained to the labels),
    ``"logprob"`` (each label scored by its log-probability) or ``"calibrated"``
    (scored, less the label prior of a content-free input); None is the endpoint's
    best (`plait.labels.DEFAULT_LOCAL_METHOD` on the embedded model, a schema with an
    ``enum`` elsewhere).  The method is held by a `Parameter` named ``label_method``
    (``label_method_parameter``; ``requires_grad=False``: no rewriter touches it),
    so a method chosen by training (`plait.learning.RecipeSearch`) is saved in
    ``state_dict()``, checkpoints and ``parameters.json`` and loaded back by
    ``--parameters``; a file written before it existed leaves the method given
    here.  ``call.label_method`` reads (and sets) the method in force.  Its demonstrations
    answer with the label itself: an answer that states a label (in any case, as
    the reply's JSON ``{"value": "billing"}``, or an `Enum` member) is kept, saved
    and shown to the model as that label's text.

    ``n`` asks for that many samples of the same request: the call returns a list
    of ``n`` outputs, each a request of its own with its own seed (`plait.sampling`),
    sent concurrently and cached, recorded and checkpointed one by one.  In a
    traced ``forward`` the result is a list of ``n`` values to index, iterate or
    pass on.  It is meant for ``temperature > 0`` (self-consistency, best-of-n).

    Args:
        alias: The endpoint's name in the resources (``"fast"``); with no resources,
            the embedded local model answers.
        system_prompt: The system prompt: text (fixed) or a `Parameter` (learnable
            when ``requires_grad=True``).  Empty: no system message.
        temperature: The sampling temperature; None uses the endpoint's default.
        max_tokens: The most tokens the reply may have; None uses the endpoint's.
        response_format: The type the reply must parse into (a pydantic model, a
            dataclass, a TypedDict, ``list[str]``...), or a label type (a
            ``Literal`` of texts or a text `Enum`); None for plain text.
        demos: Demonstrations: a list of ``(input, output)`` pairs or
            ``{"input": ..., "output": ...}`` dicts, a pool (`plait.demos.knn_demos`),
            or a `Parameter` holding either.
        n: How many samples of the request to make (the call then returns a list).
        label_method: How a label is chosen: ``"grammar"``, ``"logprob"``,
            ``"calibrated"``, or None for the endpoint's best.
        validate: A function of each reply (the parsed object, or the text) that
            rejects it by raising ``ValueError`` or ``AssertionError`` (a pydantic
            validation error is a ``ValueError``) or by returning False; the error
            is sent back to the model for another answer.
        max_reasks: How many times a rejected reply (one ``validate`` rejects, or
            one that does not parse into ``response_format``) is sent back; then the
            input's result is an ERROR naming the last error.
        max_tokens_per_call: The most tokens (prompts and replies) one call's
            attempts may spend together; a re-ask that would go over is not sent.
        escalate_to: A cascade: the alias (or aliases, in order) that answer the
            call again when ``accept`` rejects the answer of ``alias`` (and of each
            tier before). Each tier's calls are calls of their own alias: counted,
            priced, cached and checkpointed there.
        accept: With ``escalate_to``, whether a tier's answer is kept: a function of
            the reply (the parsed object, or the text) that rejects it by returning
            False or raising ``ValueError`` or ``AssertionError``; or a number in
            (0, 1], the least probability of the chosen label (for a label call
            scored by ``label_method="logprob"`` or ``"calibrated"``).

    Raises:
        ValueError: When ``alias`` is empty, ``n``, ``max_tokens`` or
            ``max_tokens_per_call`` is not a positive integer, ``max_reasks`` is
            negative, ``temperature`` is not a number, the demonstrations are not
            input/output pairs, or ``label_method`` is unknown or given without a
            label type.
        TypeError: When ``validate`` is not callable, ``system_prompt`` is neither
            text nor a `Parameter`,
            ``response_format`` is a type with no JSON schema, or its labels are
            empty or differ only in case.

    Examples:
        ```python
        from typing import Literal

        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize in one line.")
        print(summarize.bind(resources=resources).run_sync("A long report about roofs."))

        sentiment = plait.LLMInference(
            "fast",
            system_prompt="Classify the review.",
            response_format=Literal["positive", "negative"],  # always one of the labels
        )
        print(sentiment.bind(resources=resources).run_sync("Great roof, fair price."))
        ```
    """

    _calls_llm: ClassVar[bool] = True

    alias: str
    temperature: float | None
    max_tokens: int | None
    response_format: Any
    system_prompt: Parameter | None
    demos: Parameter | None
    n: int
    validate: Callable[[Any], Any] | None
    max_reasks: int
    max_tokens_per_call: int | None
    escalate_to: tuple[str, ...]
    accept: Callable[[Any], Any] | float | None

    def __init__(
        self,
        alias: str,
        system_prompt: str | Parameter = "",
        temperature: float | None = 1.0,
        max_tokens: int | None = None,
        response_format: type | Any = None,
        demos: Sequence[Any] | Parameter | None = None,
        n: int = 1,
        label_method: LabelMethod | None = None,
        validate: Callable[[Any], Any] | None = None,
        max_reasks: int = 1,
        max_tokens_per_call: int | None = None,
        escalate_to: str | Sequence[str] | None = None,
        accept: Callable[[Any], Any] | float | None = None,
    ) -> None:
        super().__init__()
        self.escalate_to = _tiers(alias, escalate_to, accept)
        if self.escalate_to and not callable(accept) and label_choices(response_format) is None:
            raise ValueError(
                f"LLMInference(accept={accept!r}) accepts a reply by its label's probability, "
                "so the call must answer with labels (response_format=Literal[...] and "
                "label_method='logprob' or 'calibrated'); for any other reply give accept a "
                "function of the reply"
            )
        self.accept = accept
        check_reply_checks(validate, max_reasks, max_tokens_per_call, "LLMInference")
        self.validate = validate
        self.max_reasks = max_reasks
        self.max_tokens_per_call = max_tokens_per_call
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(
                f"LLMInference(n=...) is the number of samples, a positive integer; got {n!r}"
            )
        self.n = n
        if not isinstance(alias, str) or not alias:
            raise ValueError(f"LLMInference(alias=...) must be a non-empty string, got {alias!r}")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
        if temperature is not None and not isinstance(temperature, int | float):
            raise ValueError(f"temperature must be a number or None, got {temperature!r}")
        self.alias = alias
        self.temperature = temperature
        self.max_tokens = max_tokens
        labels = label_choices(response_format)  # bad labels: an error now, too
        if response_format is not None:
            schema_for(response_format)  # a bad type is an error now, not at the first call
        if label_method is not None:
            check_label_method(label_method)
            if labels is None:
                raise ValueError(
                    "label_method is only for a response_format of labels (a Literal of "
                    'texts or a text Enum, e.g. response_format=Literal["yes", "no"]), got '
                    f"response_format={response_format!r}"
                )
        self.response_format = response_format
        if isinstance(system_prompt, Parameter):
            self.system_prompt = system_prompt
        elif isinstance(system_prompt, str):
            self.system_prompt = (
                Parameter(system_prompt, requires_grad=False) if system_prompt else None
            )
        else:
            raise TypeError(
                f"system_prompt must be a str or a Parameter, got {type(system_prompt).__name__}"
            )
        # A label call's demonstrations answer with the label itself, whoever wrote them
        # (a user, a parameters file, training): the check normalizes loaded values too.
        check = partial(normalize_demo_value, labels=labels) if labels else normalize_demo_value
        if isinstance(demos, Parameter):
            normalize_demo_value(demos.value, "LLMInference(demos=Parameter(...)).value", labels)
            if demos.check is None:  # a saved list or pool loads back into it, checked
                demos.check = check
            self.demos = demos
        elif demos is not None:
            self.demos = Parameter(
                normalize_demo_value(demos, "LLMInference(demos=...)", labels),
                description=DEMOS_DESCRIPTION,
                check=check,
            )
        else:
            self.demos = None
        # A label call's method is a value like its prompt: saved, loaded, chosen by
        # training.  Fixed for the rewriters (requires_grad=False): it is not text.
        # Registered by hand under the name "label_method", which stays the attribute
        # that reads the method itself (`label_method` below).
        method = None
        if labels is not None:
            method = Parameter(
                label_method,
                description=LABEL_METHOD_DESCRIPTION,
                requires_grad=False,
                check=check_label_method,
            )
            self._parameters["label_method"] = method
            method._owner = weakref.ref(self)
            method._name = "label_method"
        object.__setattr__(self, "_label_method", method)

    @property
    def label_method_parameter(self) -> Parameter | None:
        """The `Parameter` holding a label call's method (None for any other call).

        Named ``label_method`` in ``state_dict()``; what `plait.learning.RecipeSearch`
        sets when it chooses a method.
        """
        param: Parameter | None = self.__dict__.get("_label_method")
        return param

    @property
    def label_method(self) -> str | None:
        """How this call chooses its label now (the ``label_method`` parameter's value).

        ``"grammar"``, ``"logprob"``, ``"calibrated"``, or None for the endpoint's
        best (and for a call that does not answer with labels).  Setting it sets the
        parameter; a call without labels takes only None.

        Examples:
            >>> from typing import Literal
            >>> import plait
            >>> call = plait.LLMInference("fast", response_format=Literal["yes", "no"])
            >>> print(call.label_method)
            None
            >>> call.load_state_dict({"label_method": "calibrated"})
            >>> call.label_method
            'calibrated'
        """
        param = self.label_method_parameter
        if param is None:
            return None
        value = param.current()
        return value if isinstance(value, str) else None

    @label_method.setter
    def label_method(self, value: str | None) -> None:
        param = self.label_method_parameter
        if param is None:
            if value is not None:
                raise ValueError(
                    "label_method is only for a response_format of labels (a Literal of "
                    'texts or a text Enum, e.g. response_format=Literal["yes", "no"])'
                )
            return
        param.value = check_label_method(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "label_method":  # the method's value, not a new attribute
            type(self).label_method.__set__(self, value)  # type: ignore[attr-defined]
            return
        super().__setattr__(name, value)

    def input_text(self, prompt: Any) -> str:
        """The text of ``prompt`` as the last user turn carries it.

        Args:
            prompt: The input: text, or data sent as its text (a dict or list as
                JSON, a pydantic model as its JSON, a number as ``str()`` gives it).

        Returns:
            The text.

        Raises:
            TypeError: For a prompt with no text of its own (None, bytes, a
                function), naming its type.
        """
        return (
            prompt if isinstance(prompt, str) else prompt_text(prompt, f"{self._label()}'s prompt")
        )

    def messages(
        self, prompt: Any, similarity: Sequence[float] | None = None
    ) -> list[dict[str, Any]]:
        """The chat messages this call sends for ``prompt``.

        The system prompt comes first, then the demonstrations as user/assistant
        turns, then ``prompt`` as the last user turn.  A call that answers with
        labels says them at the end of the system prompt.  Parameter values are
        read as the running input sees them (see `Parameter.current`).

        Args:
            prompt: The input (see `input_text`).
            similarity: For demonstrations ranked by an embedding alias, each pool
                pair's similarity to ``prompt``; None otherwise.

        Returns:
            ``{"role": ..., "content": ...}`` dicts, in order.

        Raises:
            plait.demos.DemoError: When the demonstrations are not a list of
                input/output pairs (naming the parameter).
            TypeError: For a prompt with no text of its own (None, bytes, a function).

        Examples:
            >>> import plait
            >>> call = plait.LLMInference("fast", system_prompt="Be brief.")
            >>> call.messages("Hello")
            [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hello'}]
        """
        messages: list[dict[str, Any]] = []
        system = self.system_prompt
        fmt = self.response_format
        labels = label_choices(fmt) if fmt is not None else None
        if system is not None:
            content = system.current()
            if not isinstance(content, str):  # text needs no check (nor a label built)
                content = prompt_text(content, f"{self._label()}'s system prompt")
            if labels is not None:
                content = (
                    f"{content}\n\n{labels_instruction(labels)}"
                    if content
                    else (labels_instruction(labels))
                )
            messages.append({"role": "system", "content": content})
        elif labels is not None:
            messages.append({"role": "system", "content": labels_instruction(labels)})
        if type(prompt) is not str:  # text, the usual prompt, needs no call
            prompt = self.input_text(prompt)
        if self.demos is not None:
            where = f"the demonstrations of {self.qualified_path or 'this LLMInference'}"
            shown = choose_demos(self.demos.current(), prompt, labels, where, similarity)
            messages.extend(demo_messages(shown))
        messages.append({"role": "user", "content": prompt})
        return messages

    def _label(self) -> str:
        return self.qualified_path or "LLMInference"

    def forward(self, prompt: Any) -> Any:
        """Not called: plait's runtime makes the request when the module is called.

        Args:
            prompt: The input.

        Returns:
            Never returns.

        Raises:
            RuntimeError: Always: call the module instead (``await call(prompt)``,
                ``call.run_sync(prompt)``).
        """
        raise RuntimeError(
            "LLMInference.forward() is not called directly: plait's runtime makes the request. "
            "Call the module (await module(prompt), module.run_sync(prompt)) instead"
        )

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        """Pass the feedback on to the prompt, and ask for a better system prompt.

        Args:
            feedback: Feedback on the call's output.
            ctx: The call's inputs, output and place in the graph.

        Returns:
            The feedback for the prompt's producer and, when the system prompt is
            learnable, a request to improve it.
        """
        result = BackwardResult()
        result.input_feedback["prompt"] = feedback.payload
        if self.system_prompt is not None and self.system_prompt.requires_grad:
            result.parameter_feedback["system_prompt"] = (
                f"Given output feedback: {feedback.payload}\n"
                "Suggest improvements to the system prompt."
            )
        return result

    def extra_repr(self) -> str:
        """The call's settings as the module's ``repr`` shows them.

        Returns:
            Text such as ``"alias='fast', temperature=1.0"``.
        """
        parts = [f"alias={self.alias!r}"]
        if self.temperature is not None:
            parts.append(f"temperature={self.temperature}")
        if self.max_tokens is not None:
            parts.append(f"max_tokens={self.max_tokens}")
        if self.response_format is not None:
            parts.append(f"response_format={getattr(self.response_format, '__name__', '?')}")
        method = self.label_method
        if method is not None:
            parts.append(f"label_method={method!r}")
        if self.n != 1:
            parts.append(f"n={self.n}")
        if self.demos is not None:
            count = self.demos.current()
            if is_pool(count):
                parts.append(f"demos=knn(k={count.get('k')}, pool={len(count.get('pool', ()))})")
            else:
                parts.append(f"demos={len(count) if isinstance(count, list) else '?'}")
        return ", ".join(parts)


def _tiers(alias: str, escalate_to: str | Sequence[str] | None, accept: Any) -> tuple[str, ...]:
    """A cascade's aliases after ``alias``, checked with its ``accept``."""
    if escalate_to is None:
        if accept is not None:
            raise ValueError(
                "LLMInference(accept=...) judges a tier of a cascade: give escalate_to too "
                "(the alias that answers again when accept rejects the answer)"
            )
        return ()
    tiers = (escalate_to,) if isinstance(escalate_to, str) else tuple(escalate_to)
    if not tiers or not all(isinstance(t, str) and t for t in tiers):
        raise ValueError(
            "LLMInference(escalate_to=...) is an alias, or a list of aliases, to answer "
            f"again; got {escalate_to!r}"
        )
    if alias in tiers or len(set(tiers)) != len(tiers):
        raise ValueError(
            f"LLMInference(escalate_to={escalate_to!r}) names an alias twice in the cascade "
            f"from {alias!r} (a cascade to itself would pay again for the same answer); "
            "escalate to other aliases"
        )
    if accept is None:
        raise ValueError(
            "LLMInference(escalate_to=...) needs accept=: a function of the reply, or the "
            "least label probability to keep a tier's answer"
        )
    if isinstance(accept, bool) or not (
        callable(accept) or (isinstance(accept, int | float) and 0 < accept <= 1)
    ):
        raise ValueError(
            "LLMInference(accept=...) is a function of the reply or a probability in "
            f"(0, 1]; got {accept!r}"
        )
    return tiers
