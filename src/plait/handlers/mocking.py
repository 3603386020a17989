"""`mock`: answer chosen LLM calls with canned or computed replies, and send the rest.

A pipeline's tests should not need a server for the calls they are not about, and
a change to one module should be testable while the rest of the pipeline stays
real.  So a mock names the calls it answers, by module path (``"summarizer"``,
``"stage3.*"``, matched with `fnmatch` against the dotted path from the root
module) or by alias (``"smart"``), and lets every other call through, unless
``strict=True`` asks for every call to be answered (a test that must never touch
the network).

A reply is either a value or a callable.  A callable receives the `LLMRequest`
(the request as it stands when the mock sees it, so after any override entered
inside the mock) and may be sync or ``async``; it returns what a value would be.
For a plain request a value is the reply's text.  For a request with a
``response_format`` a value is the reply object (a dict, a model instance, a
list ...), or a string holding that object as JSON (where the object has one
text field, e.g. ``{"new_value": str}``, any other string is that field's value,
so plain-text replies keep working); either way it is validated
and converted exactly as a real reply is, so a mock cannot hand a module
something the real endpoint could not.  A callable may also return a complete
`LLMResponse` (to set usage or a finish reason), which is used as it is.

Mocked replies carry ``msg.meta["mock"] = True`` and zero usage: no tokens were
spent, so a `budget` does not charge for them.
"""

from __future__ import annotations

import fnmatch
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from plait.effects import Handler, Message
from plait.handlers.llm import answer, request_of
from plait.providers.base import LLMRequest, LLMResponse, Usage
from plait.structured import WRAP_KEY, is_wrapped, parse_reply

__all__ = ["Mock", "UnmockedCallError", "mock"]

#: The model name mocked replies report, so a log or profile shows where they came from.
MOCK_MODEL = "mock"

Reply = Any
"""A reply text, a reply object, an `LLMResponse`, or a callable of the request giving one."""


class UnmockedCallError(LookupError):
    """A strict mock met a call that none of its patterns answers (the message names it)."""


class Mock(Handler):
    """Answers the LLM calls whose module path or alias matches a pattern (see `mock`).

    Patterns are tried in the order given and the first match wins, so put the
    specific ones before the catch-alls.  A call an inner handler has already
    answered (a cache hit, a checkpoint) is left alone.

    Args:
        replies: Module-path glob or alias to reply (a value, or a callable of the
            `LLMRequest`).
        strict: Refuse (`UnmockedCallError`) every call no pattern answers.

    Raises:
        TypeError: When ``replies`` is not a mapping of non-empty strings.
    """

    def __init__(self, replies: Mapping[str, Reply], *, strict: bool = False) -> None:
        if not isinstance(replies, Mapping):
            raise TypeError(
                "mock() takes a mapping of module-path glob or alias -> reply, got "
                f"{type(replies).__name__}"
            )
        for pattern in replies:
            if not isinstance(pattern, str) or not pattern:
                raise TypeError(f"mock() patterns must be non-empty strings, got {pattern!r}")
        self.replies: dict[str, Reply] = dict(replies)
        self.strict = strict

    def match(self, name: str, alias: str) -> str | None:
        """The first pattern that names this module path or alias, if any.

        Args:
            name: The call's module path.
            alias: The call's alias.

        Returns:
            The pattern, or None.
        """
        for pattern in self.replies:
            if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(alias, pattern):
                return pattern
        return None

    def process_llm(self, msg: Message) -> Awaitable[None] | None:
        """Answer the call when a pattern matches it.

        Args:
            msg: The LLM call's message.

        Returns:
            None, or an awaitable when the reply is an ``async`` callable's.

        Raises:
            UnmockedCallError: In a strict mock, when no pattern matches.
        """
        # A plain method (not ``async def``): module calls recorded while tracing go
        # through the synchronous stack, and only an async callable needs awaiting.
        if msg.done:
            return None
        request = request_of(msg)
        pattern = self.match(msg.name, request.alias)
        if pattern is None:
            if self.strict:
                known = ", ".join(repr(p) for p in self.replies) or "none"
                raise UnmockedCallError(
                    f"mock(strict=True) has no reply for the LLM call at module path "
                    f"{msg.name!r} (alias {request.alias!r}); its patterns are: {known}"
                )
            return None
        reply = self.replies[pattern]
        if not callable(reply):
            self._answer(msg, request, pattern, reply)
            return None
        result = reply(request)
        if inspect.isawaitable(result):
            return self._answer_later(msg, request, pattern, result)
        self._answer(msg, request, pattern, result)
        return None

    async def _answer_later(
        self, msg: Message, request: LLMRequest, pattern: str, pending: Awaitable[Any]
    ) -> None:
        self._answer(msg, request, pattern, await pending)

    def _answer(self, msg: Message, request: LLMRequest, pattern: str, reply: Any) -> None:
        response = reply if isinstance(reply, LLMResponse) else _response(msg, request, reply)
        answer(msg, response)
        msg.meta["mock"] = True
        msg.meta["mock_pattern"] = pattern


def _response(msg: Message, request: LLMRequest, reply: Any) -> LLMResponse:
    if request.embed:  # the vectors; their shape is checked where they are used
        return LLMResponse(json.dumps(reply), reply, Usage(), MOCK_MODEL, "stop")
    tp = request.response_format
    if tp is None:
        if not isinstance(reply, str):
            raise TypeError(
                f"mock reply for {msg.name!r} must be a str (the call has no response_format), "
                f"got {type(reply).__name__}"
            )
        return LLMResponse(reply, None, Usage(), MOCK_MODEL, "stop")
    # Go through the reply's wire form and the endpoint's own validation: the text is
    # then what a real reply would have been, so caches and checkpoints that store
    # the text and parse it again on load get the same object back.
    field = _text_field(tp) if isinstance(reply, str) else None
    if isinstance(reply, str) and field is not None:
        try:
            data = json.loads(reply)
        except ValueError:
            data = None
        if not (isinstance(data, dict) and field in data):
            data = {field: reply}
    elif isinstance(reply, str):
        # The object's JSON, or, for a type a string is (a label of a Literal, a str
        # Enum's value, str itself), the string as it stands.
        try:
            return _structured(tp, json.loads(reply))
        except ValueError:
            try:
                return _structured(tp, reply)
            except ValueError as exc:
                raise ValueError(
                    f"mock reply for {msg.name!r} is the str {reply[:60]!r}, which is no "
                    f"{_type_name(tp)} ({exc}): give the object, or its JSON"
                ) from None
    else:
        from pydantic_core import to_jsonable_python

        try:
            data = to_jsonable_python(reply)
        except Exception as exc:
            raise TypeError(
                f"mock reply for {msg.name!r} cannot be turned into JSON for "
                f"{_type_name(tp)}: {exc}"
            ) from None
    try:
        return _structured(tp, data)
    except ValueError as exc:
        raise ValueError(f"mock reply for {msg.name!r}: {exc}") from None


def _structured(tp: Any, data: Any) -> LLMResponse:
    """The reply an endpoint would give with ``data`` for ``tp``: its wire text, read
    back through the endpoint's own validation (ValueError where ``data`` does not fit)."""
    text = json.dumps({WRAP_KEY: data} if is_wrapped(tp) else data)
    return LLMResponse(text, parse_reply(tp, text), Usage(), MOCK_MODEL, "stop")


def _text_field(tp: Any) -> str | None:
    """The one property of ``tp``'s object schema when it is a single string, else None."""
    from plait.structured import schema_for

    schema = schema_for(tp)
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict):
        return None
    if len(properties) != 1:
        return None
    ((name, prop),) = properties.items()
    return str(name) if isinstance(prop, dict) and prop.get("type") == "string" else None


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def mock(
    replies: Mapping[str, Reply | Callable[[LLMRequest], Any]], *, strict: bool = False
) -> Mock:
    """Answer the LLM calls matching ``replies`` with canned or computed replies.

    A test of one module should not need a server for the calls it is not about.
    Every call no pattern names is sent as usual, unless ``strict=True``.  A reply
    is validated as a real one would be (a structured reply must fit the call's
    ``response_format``), and mocked replies cost nothing: a `budget` does not
    count them.

    Args:
        replies: Module-path glob (``"summarizer"``, ``"stage3.*"``) or alias
            (``"fast"``) to reply: text, an object for a call with a
            ``response_format``, an `LLMResponse`, or a callable (sync or
            ``async``) of the `LLMRequest` returning one of those.
        strict: Refuse every call no pattern answers (a test that must never
            touch the network).

    Returns:
        The `Mock` handler: enter it with ``with``.

    Raises:
        TypeError: When ``replies`` is not a mapping of non-empty strings.

    Examples:
        ```python
        import plait
        from plait.handlers import mock


        class Pipeline(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.summarizer = plait.LLMInference("fast", system_prompt="Summarize.")
                self.shout = plait.LLMInference("smart", system_prompt="Shout it.")

            def forward(self, text: str) -> str:
                return self.shout(self.summarizer(text))


        replies = {"summarizer": "short", "smart": lambda request: request.prompt_text.upper()}
        with mock(replies, strict=True):
            print(Pipeline().run_sync("A long text."))
        ```
    """
    return Mock(replies, strict=strict)
