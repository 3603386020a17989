"""`LLMInference`: the atomic LLM call every other module is a composition of."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from plait._text import prompt_text
from plait.demos import DEMOS_DESCRIPTION, demo_messages, normalize_demos
from plait.module import BackwardContext, BackwardResult, Module
from plait.parameter import Parameter
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
    empty, becomes a `Parameter` named ``demos`` that `BootstrapFewShot` fills; a
    `Parameter` holding such a list is used as it is (``requires_grad=False``
    fixes the examples).  They are sent as user/assistant turns after the system
    prompt and before the input.  Without ``demos`` the call has none.

    ``n`` asks for that many samples of the same request: the call returns a list
    of ``n`` outputs, each a request of its own with its own seed (`plait.sampling`),
    sent concurrently and cached, recorded and checkpointed one by one.  In a
    traced ``forward`` the result is a list of ``n`` values to index, iterate or
    pass on.  It is meant for ``temperature > 0`` (self-consistency, best-of-n).
    """

    _calls_llm: ClassVar[bool] = True

    alias: str
    temperature: float | None
    max_tokens: int | None
    response_format: Any
    system_prompt: Parameter | None
    demos: Parameter | None
    n: int

    def __init__(
        self,
        alias: str,
        system_prompt: str | Parameter = "",
        temperature: float | None = 1.0,
        max_tokens: int | None = None,
        response_format: type | Any = None,
        demos: Sequence[Any] | Parameter | None = None,
        n: int = 1,
    ) -> None:
        super().__init__()
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
        if response_format is not None:
            schema_for(response_format)  # a bad type is an error now, not at the first call
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
        if isinstance(demos, Parameter):
            normalize_demos(demos.value, "LLMInference(demos=Parameter(...)).value")
            self.demos = demos
        elif demos is not None:
            self.demos = Parameter(
                normalize_demos(demos, "LLMInference(demos=...)"), description=DEMOS_DESCRIPTION
            )
        else:
            self.demos = None

    def messages(self, prompt: Any) -> list[dict[str, Any]]:
        """The chat messages this call sends for ``prompt``: the system prompt, the
        demonstrations as user/assistant turns, then ``prompt`` as the last user turn.

        Parameter values are read as the running input sees them (see
        `Parameter.current`); demonstrations that are not a list of input/output
        pairs are a `plait.demos.DemoError` naming the parameter; a prompt with no
        text of its own (None, bytes, a function) is a TypeError naming its type.
        """
        messages: list[dict[str, Any]] = []
        system = self.system_prompt
        if system is not None:
            content = system.current()
            if not isinstance(content, str):  # text needs no check (nor a label built)
                content = prompt_text(content, f"{self._label()}'s system prompt")
            messages.append({"role": "system", "content": content})
        if self.demos is not None:
            where = f"the demonstrations of {self.qualified_path or 'this LLMInference'}"
            messages.extend(demo_messages(normalize_demos(self.demos.current(), where)))
        if not isinstance(prompt, str):
            prompt = prompt_text(prompt, f"{self._label()}'s prompt")
        messages.append({"role": "user", "content": prompt})
        return messages

    def _label(self) -> str:
        return self.qualified_path or "LLMInference"

    def forward(self, prompt: Any) -> Any:
        raise RuntimeError(
            "LLMInference.forward() is not called directly: plait's runtime makes the request. "
            "Call the module (await module(prompt), module.run_sync(prompt)) instead"
        )

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        result = BackwardResult()
        result.input_feedback["prompt"] = feedback.payload
        if self.system_prompt is not None and self.system_prompt.requires_grad:
            result.parameter_feedback["system_prompt"] = (
                f"Given output feedback: {feedback.payload}\n"
                "Suggest improvements to the system prompt."
            )
        return result

    def extra_repr(self) -> str:
        parts = [f"alias={self.alias!r}"]
        if self.temperature is not None:
            parts.append(f"temperature={self.temperature}")
        if self.max_tokens is not None:
            parts.append(f"max_tokens={self.max_tokens}")
        if self.response_format is not None:
            parts.append(f"response_format={getattr(self.response_format, '__name__', '?')}")
        if self.n != 1:
            parts.append(f"n={self.n}")
        if self.demos is not None:
            count = self.demos.current()
            parts.append(f"demos={len(count) if isinstance(count, list) else '?'}")
        return ", ".join(parts)
