"""The functional API: plait's atomic LLM call as plain async functions.

```python
import asyncio

import plait
import plait.functional as F

fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
resources = plait.ResourceConfig({"fast": fast})


async def main() -> None:
    with plait.ExecutionSettings(resources=resources):
        reply = await F.chat_complete("fast", [F.system("Be brief."), F.user("Hi!")])
        if reply.is_error:  # reply.payload is the exception, reply.meta["traceback"] where
            raise SystemExit(reply.meta["message"])
        print(F.text_of(reply))
        summary = await F.complete("fast", "A long text.", system="Summarize in one line.")
        print(F.text_of(summary))


asyncio.run(main())
```

Every LLM call plait makes takes one path (`plait.execution.calls`): the calls of
an `LLMInference` (the engine builds the request from the module and hands it
over), the calls of this API inside an ``async def forward``, and calls made
outside any pipeline.  So all of them are an ``"llm"`` message on the
handler stack (``cache``, ``record``/``replay``, ``mock``, ``override``,
``budget``, ``profile`` and checkpoints apply), then, unless a handler answered,
a request through the run-wide limiter of the current run (inside a module) and
the endpoint's own concurrency, rate limits and retries.

Where the call runs, and on which resources:

* inside a module running on plait's runtime (an ``async def forward``): on that
  run's engine, with its resources, limits and handlers;
* anywhere else: on ``resources=`` when given, else on the resources of the
  enclosing ``ExecutionSettings(resources=...)``, else on the embedded local
  model, exactly as a module would be.

What comes back is a `Value` of kind ``RESPONSE`` whose payload is an
`LLMResponse`: ``.text``, ``.parsed`` (the validated object when
``response_format`` asked for one), ``.usage``, ``.model`` and
``.finish_reason``.  Its ``meta`` holds ``module_path`` (the name handlers saw),
``alias`` (the one the call went to, after any override), ``usage``, ``model``
and ``answered_by`` (``"endpoint"``, ``"cache"``, ``"replay"``, ``"mock"``,
``"checkpoint"`` or ``"handler"``); when a handler of your own answered with
plain data instead of an `LLMResponse`, that data is kept as ``raw_reply``.
Outside a run there is no run-wide limit: the endpoint's ``max_concurrent`` and
rate limits still apply, shared with every run in the process.

Failures are values, as everywhere in plait: a call that fails (the endpoint
refused, retries ran out, a replay has no recording of it, a budget is spent, a
handler raised) returns a `Value` of kind ``ERROR`` instead of raising; its payload is the
exception and its ``meta`` holds ``error_type``, ``message``, ``traceback`` and
``module_path``.  A message content that is itself an ERROR value short-circuits:
no request is made and that error comes back.  `text_of` and `parsed_of` raise
`ExecutionError` on an ERROR value, so code that does not check gets the cause.
Arguments that can never work (an alias the resources do not configure,
malformed messages, a bad temperature) are bugs in the calling code, not
failures of a call, and raise at once with the fix in the message.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from plait._text import as_text, prompt_text
from plait.execution.calls import CallSite
from plait.providers.base import LLMRequest, LLMResponse, check_reply_checks
from plait.values import ExecutionError, Value, ValueKind, error_value

__all__ = [
    "ROLES",
    "LLMResponse",
    "assistant",
    "chat_complete",
    "complete",
    "parsed_of",
    "system",
    "text_of",
    "user",
]

ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a chat message may have (``"developer"`` is OpenAI's newer name for ``"system"``)."""

#: Keyword names that are not provider fields: the request or the call sets them.
_RESERVED_EXTRA = {
    "model": "the model is the alias's: configure it in the resources, or pass another alias",
    "messages": "pass the messages as the second argument",
    "stream": "plait does not stream replies",
    "alias": "pass the alias as the first argument",
    "prompt": "chat_complete takes messages; use complete(alias, prompt) for one prompt",
    "system": "put F.system(text) first in messages, or use complete(alias, prompt, system=...)",
    "n": "plait reads one reply per request; for n samples use LLMInference(n=...), or make "
    "n calls (inside a seeded run each gets its own seed)",
}
_NAMED = (
    "temperature",
    "max_tokens",
    "response_format",
    "resources",
    "name",
    "validate",
    "max_reasks",
    "max_tokens_per_call",
)


# -- message builders ---------------------------------------------------------------------
def system(content: Any) -> dict[str, Any]:
    """A system message: instructions that come before the conversation.

    Args:
        content: The instructions' text.

    Returns:
        ``{"role": "system", "content": content}``.
    """
    return {"role": "system", "content": content}


def user(content: Any) -> dict[str, Any]:
    """A user message: one turn of the user's.

    Args:
        content: Text, a text `Value`, a previous reply, or a list of OpenAI content
            parts.

    Returns:
        ``{"role": "user", "content": content}``.
    """
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    """An assistant message: a previous turn of the model's in the conversation.

    Args:
        content: The turn's text, or a previous reply.

    Returns:
        ``{"role": "assistant", "content": content}``.
    """
    return {"role": "assistant", "content": content}


# -- accessors ----------------------------------------------------------------------------
def text_of(value: Value | LLMResponse | str) -> str:
    """The text of a reply (or of any text value).

    Args:
        value: A reply (a `Value` of kind RESPONSE), an `LLMResponse`, a text
            `Value` or a string.

    Returns:
        The text.

    Raises:
        ExecutionError: On an ERROR value: the call failed (its cause is
            ``__cause__``).
        TypeError: When ``value`` is none of those.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, LLMResponse):
        return value.text
    if isinstance(value, Value):
        if value.kind is ValueKind.ERROR:
            raise ExecutionError(value)
        payload = value.payload
        return payload.text if isinstance(payload, LLMResponse) else as_text(payload)
    raise TypeError(f"text_of() takes a Value, an LLMResponse or a str, got {type(value).__name__}")


def parsed_of(value: Value | LLMResponse) -> Any:
    """The validated object of a reply to a call with ``response_format``.

    Args:
        value: A reply (a `Value` of kind RESPONSE or STRUCTURED) or an `LLMResponse`.

    Returns:
        The object (an instance of the ``response_format`` type, or data of its
        shape).

    Raises:
        ExecutionError: On an ERROR value: the call failed.
        ValueError: When the call asked for no ``response_format`` (read its text
            with `text_of`).
        TypeError: When ``value`` is not a reply.
    """
    if isinstance(value, Value):
        if value.kind is ValueKind.ERROR:
            raise ExecutionError(value)
        if value.kind is ValueKind.STRUCTURED:
            return value.payload
        payload = value.payload
    else:
        payload = value
    if not isinstance(payload, LLMResponse):
        raise TypeError(
            f"parsed_of() takes a reply (a Value of kind RESPONSE or STRUCTURED, or an "
            f"LLMResponse), got {value!r}"
        )
    if payload.parsed is None:
        raise ValueError(
            "this reply has no parsed object: the call set no response_format (pass one, "
            "e.g. response_format=MyModel), or read the reply's text with text_of()"
        )
    return payload.parsed


# -- the calls ----------------------------------------------------------------------------
async def chat_complete(
    alias: str,
    messages: Iterable[Mapping[str, Any]],
    *,
    temperature: float | None = None,
    max_tokens: int | None = None,
    response_format: Any = None,
    resources: Any = None,
    name: str | None = None,
    validate: Callable[[Any], Any] | None = None,
    max_reasks: int = 1,
    max_tokens_per_call: int | None = None,
    **extra: Any,
) -> Value:
    """Send one chat request to ``alias``; a `Value` of kind RESPONSE (or ERROR) comes back.

    Args:
        alias: The endpoint's name in the resources.
        messages: ``{"role": ..., "content": ...}`` dicts (`system`, `user` and
            `assistant` build them); roles are those in `ROLES`, content is text, a
            list of OpenAI content parts, or a `Value`/reply (its text is used; an
            ERROR value is returned as is, with no request made).
        temperature: The sampling temperature; None uses the endpoint's default.
        max_tokens: The most tokens the reply may have; None uses the endpoint's.
        response_format: A type the reply must validate into (a pydantic model,
            dataclass, TypedDict or e.g. ``list[str]``); read it with `parsed_of`.
        resources: Where the alias leads, overriding the run's or the enclosing
            `ExecutionSettings`' (a `ResourceConfig`, `ResourceManager` or mapping;
            inside a module, such a call keeps the run's handlers but not its
            concurrency limit).
        name: The module path handlers and profiles see (inside a module it is
            appended to the module's path; default: that path, or
            ``"chat_complete"``).
        validate: A function of the reply (the parsed object, or the text) that
            rejects it by raising ``ValueError`` or ``AssertionError`` or by
            returning False; the error is sent back for another answer.
        max_reasks: How many times a rejected reply (one ``validate`` rejects, or
            one that does not parse into ``response_format``) is sent back with
            its error for another answer; then the call is an ERROR naming the
            last error.
        max_tokens_per_call: The most tokens (prompts and replies) the call's
            attempts may spend together; None: no bound.
        **extra: Any other provider field (``seed``, ``top_p``, ``stop``,
            ``tools``...), sent as it is.

    Returns:
        A `Value` of kind RESPONSE whose payload is the `LLMResponse`, or of kind
        ERROR when the call failed.

    Raises:
        TypeError: When an argument can never work (an alias that is not a
            string, a keyword that is not a provider field, malformed messages).
        ValueError: When the messages are empty or malformed, or ``max_tokens``,
            ``max_reasks`` or ``max_tokens_per_call`` is out of its range.
        plait.ConfigurationError: When the resources do not
            configure ``alias``.
    """
    _check_call(alias, temperature, max_tokens, response_format, name, extra)
    check_reply_checks(validate, max_reasks, max_tokens_per_call, "chat_complete")
    site = CallSite.here(resources, name, "chat_complete")
    checks = (validate, max_reasks, max_tokens_per_call)
    request = _request(alias, temperature, max_tokens, response_format, extra, *checks)
    return await _send_messages(site, request, messages)


async def complete(
    alias: str,
    prompt: Any,
    *,
    system: Any = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
    response_format: Any = None,
    resources: Any = None,
    name: str | None = None,
    demos: Any = None,
    validate: Callable[[Any], Any] | None = None,
    max_reasks: int = 1,
    max_tokens_per_call: int | None = None,
    **extra: Any,
) -> Value:
    """One user turn (with an optional system prompt): the request an `LLMInference` makes.

    An ``LLMInference(alias, system_prompt=s, temperature=t)`` called on ``prompt``
    and ``complete(alias, prompt, system=s, temperature=t)`` send the same request,
    so they share caches and recordings.

    Args:
        alias: The endpoint's name in the resources.
        prompt: Text, a `Value` or a reply, or any object (a dict, a pydantic
            model...), which is sent as its JSON text as a module would send it.
        system: The system prompt; None or empty for none.
        temperature: As in `chat_complete`.
        max_tokens: As in `chat_complete`.
        response_format: As in `chat_complete`.
        resources: As in `chat_complete`.
        name: As in `chat_complete` (default: ``"complete"``).
        demos: Input/output pairs (`plait.demos`), sent between the system prompt
            and the prompt as user/assistant turns.
        validate: As in `chat_complete`.
        max_reasks: As in `chat_complete`.
        max_tokens_per_call: As in `chat_complete`.
        **extra: Provider fields, as in `chat_complete`.

    Returns:
        A `Value` of kind RESPONSE whose payload is the `LLMResponse`, or of kind
        ERROR when the call failed.

    Raises:
        TypeError: When ``prompt`` is None or bytes, or an argument can never work
            (see `chat_complete`).
        ValueError: As in `chat_complete`.
        plait.demos.DemoError: When ``demos`` are not input/output pairs.

    Examples:
        ```python
        import asyncio

        import plait
        import plait.functional as F

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})


        async def main() -> None:
            reply = await F.complete(
                "fast", "The roof leaks.", system="Summarize.", resources=resources
            )
            print(reply.kind.name, F.text_of(reply))


        asyncio.run(main())
        ```
    """
    _check_call(alias, temperature, max_tokens, response_format, name, extra)
    check_reply_checks(validate, max_reasks, max_tokens_per_call, "complete")
    if prompt is None:
        raise TypeError("complete() needs a prompt (text, a Value or an object), got None")
    messages: list[dict[str, Any]] = []
    if system is not None and system != "":
        messages.append({"role": "system", "content": _prompt_content(system, "system")})
    if demos is not None:
        from plait.demos import demo_messages, normalize_demos
        from plait.labels import label_choices

        labels = label_choices(response_format)  # answers shown as the labels asked for
        messages.extend(demo_messages(normalize_demos(demos, "complete(demos=...)", labels)))
    messages.append({"role": "user", "content": _prompt_content(prompt, "prompt")})
    site = CallSite.here(resources, name, "complete")
    checks = (validate, max_reasks, max_tokens_per_call)
    request = _request(alias, temperature, max_tokens, response_format, extra, *checks)
    return await _send_messages(site, request, messages)


def _request(
    alias: str,
    temperature: float | None,
    max_tokens: int | None,
    response_format: Any,
    extra: dict[str, Any],
    validate: Callable[[Any], Any] | None,
    max_reasks: int,
    max_tokens_per_call: int | None,
) -> LLMRequest:
    """The request `complete` and `chat_complete` describe, its messages still to be
    checked and set (`_send_messages`)."""
    return LLMRequest(
        alias=alias,
        messages=[],
        temperature=temperature,
        max_tokens=max_tokens,
        response_format=response_format,
        extra=dict(extra),
        validate=validate,
        max_reasks=max_reasks,
        max_tokens_per_call=max_tokens_per_call,
    )


async def _send_messages(site: CallSite, request: LLMRequest, messages: Any) -> Value:
    """Check the messages and the alias, then make the one request both calls describe
    (``request`` with ``messages`` in place)."""
    checked, failed = _checked_messages(messages)
    site.check_alias(request.alias)
    if failed is not None:
        return error_value(failed.payload, module_path=site.name, cause=failed)
    request.messages = checked
    return await site.call(request)


# -- checks -------------------------------------------------------------------------------
def _check_call(
    alias: Any,
    temperature: Any,
    max_tokens: Any,
    response_format: Any,
    name: Any,
    extra: dict[str, Any],
) -> None:
    if not isinstance(alias, str) or not alias:
        raise TypeError(
            f"the alias must be a non-empty string naming an endpoint of the resources, "
            f"got {alias!r}"
        )
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise TypeError(f"temperature must be a number or None, got {temperature!r}")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ValueError(f"max_tokens must be a positive integer or None, got {max_tokens!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name must be a non-empty string or None, got {name!r}")
    if response_format is not None:
        from plait.structured import schema_for

        schema_for(response_format)  # a type with no JSON schema: TypeError naming the fix
    for key in extra:
        why = _RESERVED_EXTRA.get(key)
        if why is not None:
            raise TypeError(f"{key}= is not a provider field here: {why}")
        close = difflib.get_close_matches(key, _NAMED, n=1, cutoff=0.8)
        if close:
            raise TypeError(
                f"unknown keyword {key}=; did you mean {close[0]}=? (any other keyword is "
                "sent to the provider as a request field)"
            )
    if extra:
        try:
            json.dumps(extra)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"provider fields must be JSON data, but {sorted(extra)} are not ({exc})"
            ) from None


def _prompt_content(content: Any, what: str) -> Any:
    """A prompt as a module would send it: text as is, an object as its JSON text."""
    if isinstance(content, str | Value | LLMResponse):
        return content
    if isinstance(content, bytes):
        raise TypeError(f"the {what} must be text, got bytes: decode it first")
    return prompt_text(content, f"the {what}")


def _checked_messages(
    messages: Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], Value | None]:
    """Validated copies of ``messages`` with Values replaced by their text.

    Also returns the first ERROR value found in a content, if any (the call is then
    not made).  Raises TypeError/ValueError naming the message and the fix.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Iterable):
        raise TypeError(
            "messages must be a list of {'role': ..., 'content': ...} dicts (F.user(text) "
            f"builds one), got {type(messages).__name__}; for a single prompt use "
            "plait.functional.complete(alias, prompt)"
        )
    checked: list[dict[str, Any]] = []
    failed: Value | None = None
    for i, message in enumerate(messages):
        if isinstance(message, Value) or not isinstance(message, Mapping):
            raise TypeError(
                f"messages[{i}] must be a dict with 'role' and 'content' (F.user(text), "
                f"F.system(text) and F.assistant(text) build them), got {message!r}"
            )
        role = message.get("role")
        if role not in ROLES:
            raise ValueError(
                f"messages[{i}] has role {role!r}; a message's role is one of "
                f"{', '.join(map(repr, ROLES))}"
            )
        for key in message:
            if not isinstance(key, str):
                raise TypeError(f"messages[{i}] has a non-string key {key!r}")
        if "content" not in message:
            raise ValueError(f"messages[{i}] ({role}) has no 'content'")
        content, error = _content(message["content"], i, role, message)
        if error is not None and failed is None:
            failed = error
        copy = dict(message)
        copy["content"] = content
        checked.append(copy)
    if not checked:
        raise ValueError("messages is empty: give at least one message, e.g. [F.user(text)]")
    if all(m["role"] in ("system", "developer") for m in checked):
        raise ValueError(
            "messages hold only system instructions: add the user's turn, e.g. F.user(text)"
        )
    return checked, failed


def _content(
    content: Any, i: int, role: str, message: Mapping[str, Any]
) -> tuple[Any, Value | None]:
    if isinstance(content, str):
        return content, None
    if isinstance(content, Value):
        if content.kind is ValueKind.ERROR:
            return "", content
        return text_of(content), None
    if isinstance(content, LLMResponse):
        return content.text, None
    if content is None:
        if role == "assistant" and message.get("tool_calls"):
            return None, None
        raise ValueError(
            f"messages[{i}] ({role}) has content None; give it text (only an assistant "
            "message carrying tool_calls may have none)"
        )
    if isinstance(content, list | tuple):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                raise TypeError(
                    f"messages[{i}]['content'][{j}] must be a content part such as "
                    f"{{'type': 'text', 'text': '...'}}, got {part!r}"
                )
            if part["type"] == "text" and not isinstance(part.get("text"), str):
                raise TypeError(
                    f"messages[{i}]['content'][{j}] is a text part without a str 'text'"
                )
            parts.append(dict(part))
        if not parts:
            raise ValueError(f"messages[{i}] ({role}) has an empty list of content parts")
        return parts, None
    raise TypeError(
        f"messages[{i}] ({role}) has content of type {type(content).__name__}; content is a "
        "str, a list of content parts, or a Value/reply (F.text_of(x) or json.dumps(x) "
        "turn other objects into text)"
    )
