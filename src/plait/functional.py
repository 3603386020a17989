"""The functional API of seed 000: plait's atomic LLM op as plain async functions.

``import plait.functional as F``::

    reply = await F.chat_complete("fast", [F.system("Be brief."), F.user(question)])
    if reply.is_error:
        ...  # reply.payload is the exception, reply.meta["traceback"] says where
    answer = F.text_of(reply)

    summary = await F.complete("fast", text, system="Summarize in one line.")

Every LLM call plait makes goes through `chat_complete`'s one implementation:
the calls of an `LLMInference` (the engine builds the request from the module
and hands it over), calls written by hand in an ``async def forward``, and
calls made outside any pipeline.  So all of them are an ``"llm"`` message on the
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

Failures follow seed 002: a call that fails (the endpoint refused, retries ran
out, a replay has no recording of it, a budget is spent, a handler raised)
returns a `Value` of kind ``ERROR`` instead of raising; its payload is the
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
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from plait.handlers.stack import Message, apply_stack
from plait.providers.base import LLMRequest, LLMResponse
from plait.resources.endpoint import CallTiming
from plait.tracing.graph import as_text, prompt_text
from plait.values import ExecutionError, Value, ValueKind, error_value, kind_of

if TYPE_CHECKING:
    from plait.execution.engine import _CallPriority
    from plait.resources.manager import ResourceManager

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

#: The roles a chat message may have ("developer" is OpenAI's newer name for "system").
ROLES = ("system", "developer", "user", "assistant", "tool")

#: The default action of one call: send the request (after handlers) and fill in timing.
Sender = Callable[[LLMRequest, CallTiming], Coroutine[Any, Any, LLMResponse]]

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
_NAMED = ("temperature", "max_tokens", "response_format", "resources", "name")

#: Where `_invoke` keeps a reply a handler gave in some other form than an `LLMResponse`.
_RAW_REPLY = "raw_reply"


# -- message builders ---------------------------------------------------------------------
def system(content: Any) -> dict[str, Any]:
    """A system message: ``{"role": "system", "content": content}``."""
    return {"role": "system", "content": content}


def user(content: Any) -> dict[str, Any]:
    """A user message; ``content`` may be text, a text `Value` or a previous reply."""
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    """An assistant message (a previous turn of the conversation)."""
    return {"role": "assistant", "content": content}


# -- accessors ----------------------------------------------------------------------------
def text_of(value: Value | LLMResponse | str) -> str:
    """The text of a reply (or of any text value); raises `ExecutionError` on an ERROR value."""
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

    Raises `ExecutionError` on an ERROR value, and `ValueError` when the call asked
    for no ``response_format`` (read its text with `text_of`).
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
    **extra: Any,
) -> Value:
    """Send one chat request to ``alias``; a `Value` of kind RESPONSE (or ERROR) comes back.

    ``messages`` are ``{"role": ..., "content": ...}`` dicts (`system`, `user` and
    `assistant` build them); roles are those in `ROLES`, content is text, a list
    of OpenAI content parts, or a `Value`/reply (its text is used; an ERROR value
    is returned as is, with no request made).  ``temperature`` and
    ``max_tokens`` left at None use the endpoint's defaults; ``response_format``
    asks for a validated object of that type (a pydantic model, dataclass,
    TypedDict or e.g. ``list[str]``).  ``resources`` (a `ResourceConfig`,
    `ResourceManager` or mapping) overrides where the alias leads (inside a
    module, such a call keeps the run's handlers but not its concurrency limit).  ``name`` is
    the module path handlers and profiles see (inside a module it is appended to
    the module's path; default: that path, or ``"chat_complete"``).  Any other
    keyword (``seed``, ``top_p``, ``stop``, ``tools`` ...) is sent to the
    provider as it is.
    """
    _check_call(alias, temperature, max_tokens, response_format, name, extra)
    site = _CallSite(resources, name, "chat_complete")
    return await _send_messages(
        site, alias, messages, temperature, max_tokens, response_format, extra
    )


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
    **extra: Any,
) -> Value:
    """One user turn (with an optional system prompt): the request an `LLMInference` makes.

    ``prompt`` is text, a `Value` or a reply, or any object (a dict, a pydantic
    model ...), which is sent as its JSON text as a module would send it.  The
    other arguments are `chat_complete`'s.  An `LLMInference(alias, system_prompt=s,
    temperature=t)` called on ``prompt`` and ``complete(alias, prompt, system=s,
    temperature=t)`` send the same request, so they share caches and recordings;
    ``demos`` (input/output pairs, `plait.demos`) go between the system prompt and
    the prompt as user/assistant turns, as an `LLMInference`'s demonstrations do.
    """
    _check_call(alias, temperature, max_tokens, response_format, name, extra)
    if prompt is None:
        raise TypeError("complete() needs a prompt (text, a Value or an object), got None")
    messages: list[dict[str, Any]] = []
    if system is not None and system != "":
        messages.append({"role": "system", "content": _prompt_content(system, "system")})
    if demos is not None:
        from plait.demos import demo_messages, normalize_demos

        messages.extend(demo_messages(normalize_demos(demos, "complete(demos=...)")))
    messages.append({"role": "user", "content": _prompt_content(prompt, "prompt")})
    site = _CallSite(resources, name, "complete")
    return await _send_messages(
        site, alias, messages, temperature, max_tokens, response_format, extra
    )


async def _send_messages(
    site: _CallSite,
    alias: str,
    messages: Any,
    temperature: float | None,
    max_tokens: int | None,
    response_format: Any,
    extra: dict[str, Any],
) -> Value:
    """Check the messages and the alias, then make the one request both calls describe."""
    checked, failed = _checked_messages(messages)
    site.check_alias(alias)
    if failed is not None:
        return error_value(failed.payload, module_path=site.name, cause=failed)
    request = LLMRequest(
        alias=alias,
        messages=checked,
        temperature=temperature,
        max_tokens=max_tokens,
        response_format=response_format,
        extra=dict(extra),
    )
    return await site.invoke(request)


# -- the one implementation ---------------------------------------------------------------
async def _invoke(
    request: LLMRequest,
    resources: ResourceManager,
    send: Sender,
    *,
    name: str,
    module: Any = None,
    node_id: str | None = None,
    input_index: int | None = None,
    upstream: list[str] | None = None,
    ref: str | None = None,
) -> Value:
    """The atomic LLM op: ``request`` as an ``"llm"`` message, then ``send`` unless answered.

    Never raises for a failed call (an ERROR value comes back).  The engine calls
    this for every `LLMInference` node, with the node's identity and its own
    sender; `chat_complete` and `complete` call it with the identity of where they
    run.
    """
    timing = CallTiming()

    def default(request: LLMRequest) -> Coroutine[Any, Any, LLMResponse]:
        return send(request, timing)

    msg = Message(
        type="llm",
        name=name,
        fn=default,
        kwargs={"request": request},
        module=module,
        node_id=node_id,
        input_index=input_index,
        # For handlers: where each alias leads, where this call's time went, and the
        # calls it waited for (node ids), which is what a profiler's critical path needs.
        meta={"resources": resources, "timing": timing, "upstream": upstream or []},
    )
    try:
        reply = await apply_stack(msg)
    except Exception as exc:
        return error_value(exc, module_path=name, ref=ref)
    final = msg.kwargs.get("request", request)
    meta: dict[str, Any] = {
        "module_path": name,
        "alias": final.alias if isinstance(final, LLMRequest) else request.alias,
        "answered_by": _answered_by(msg.meta, timing),
    }
    if isinstance(reply, LLMResponse):
        response = reply
    else:
        meta[_RAW_REPLY] = reply
        response = _as_response(reply)
    meta["usage"] = response.usage
    meta["model"] = response.model
    return Value(ValueKind.RESPONSE, response, ref=ref, meta=meta)


def _module_output(reply: Value) -> Value:
    """What an `LLMInference` node outputs for ``reply``: the text, or the parsed object.

    An ERROR value passes through; a reply a handler gave in another form than an
    `LLMResponse` is output as it was given.
    """
    if reply.kind is ValueKind.ERROR:
        return reply
    meta: dict[str, Any] = {"module_path": reply.meta["module_path"]}
    if _RAW_REPLY in reply.meta:
        raw = reply.meta[_RAW_REPLY]
        payload = raw.payload if isinstance(raw, Value) else raw
        return Value(kind_of(payload), payload, ref=reply.ref, meta=meta)
    response: LLMResponse = reply.payload
    meta["usage"] = response.usage
    kind = ValueKind.STRUCTURED if response.parsed is not None else ValueKind.TEXT
    return Value(kind, response.payload, ref=reply.ref, meta=meta)


async def _deliver(
    resources: ResourceManager, request: LLMRequest, timing: CallTiming
) -> LLMResponse:
    """The default action of a call made outside a run: the endpoint, built at the first
    request really sent (see `Engine._send` for a call inside a run)."""
    return await resources.endpoint(request.alias).complete(request, 0.0, timing)


class _CallSite:
    """Where a functional call runs: the current engine's node, or on its own."""

    __slots__ = ("engine", "index", "name", "node_id", "priority", "resources")

    def __init__(self, resources: Any, name: str | None, fallback: str) -> None:
        from plait.execution.engine import _CallPriority, _current_node, current_engine

        engine = current_engine.get()
        self.engine = engine
        self.node_id: str | None = None
        self.index: int | None = None
        self.priority: _CallPriority | None = None
        if engine is not None:
            where = _current_node.get()
            index, prefix = where if where is not None else (0, "eager/")
            enclosing = _path_of(prefix)
            # Named like the module's own children: "agent.vote", or "vote" in the root
            # (whose path is its class name and whose children's paths are unprefixed).
            root = engine.paths.get(id(engine.root))
            if enclosing and name and enclosing != root:
                self.name = f"{enclosing}.{name}"
            else:
                self.name = name or enclosing or fallback
            self.index = index
            self.node_id = f"{prefix}fn:{self.name}"
            self.priority = _CallPriority(engine, index, 1)
            self.resources = engine.resources if resources is None else _manager_for(resources)
        else:
            self.name = name or fallback
            if resources is None:
                from plait.execution.settings import get_execution_settings

                settings = get_execution_settings()
                resources = settings.resources if settings is not None else None
            self.resources = _manager_for(resources)

    def check_alias(self, alias: str) -> None:
        config = self.resources.config
        if config and alias not in config:
            from plait.resources.config import ConfigurationError

            known = ", ".join(sorted(config)) or "none"
            raise ConfigurationError(
                f"{self.name}: alias {alias!r} is not in the resources (they configure: "
                f"{known}); add it to the ResourceConfig (passed as resources=, to bind() "
                "or to ExecutionSettings), or call one of the configured aliases"
            )

    def seed(self, request: LLMRequest) -> int | None:
        """The seed this call sends: from its run's seed, or outside any run from the
        ``ExecutionSettings(seed=...)`` block it is in (the k-th identical call of the
        block gets the k-th seed); None when no seed is in force."""
        if self.engine is not None:
            if self.engine.seed is None:
                return None
            return self.engine.call_seed(self.name, self.index, self.node_id, request)
        from plait.execution.settings import get_execution_settings
        from plait.sampling import call_seed

        settings = get_execution_settings()
        if settings is None or settings.seed is None:
            return None
        request_digest = request.fingerprint()
        counter = settings.calls.next((self.name, request_digest))
        return call_seed(settings.seed, self.name, None, None, request_digest, counter)

    async def invoke(self, request: LLMRequest) -> Value:
        engine, resources, priority = self.engine, self.resources, self.priority
        if "seed" not in request.extra:  # a seed the call gives itself is kept
            seed = self.seed(request)
            if seed is not None:
                from plait.sampling import with_seed

                request = with_seed(request, seed)
        send: Sender
        if engine is not None and priority is not None and resources is engine.resources:

            def send(request: LLMRequest, timing: CallTiming) -> Coroutine[Any, Any, LLMResponse]:
                return engine._send(request, priority, timing)
        else:

            def send(request: LLMRequest, timing: CallTiming) -> Coroutine[Any, Any, LLMResponse]:
                return _deliver(resources, request, timing)

        return await _invoke(
            request,
            resources,
            send,
            name=self.name,
            node_id=self.node_id,
            input_index=self.index,
        )


def _path_of(prefix: str) -> str:
    """The module path of the node whose forward is running, from its node-id prefix."""
    last = prefix.rstrip("/").rpartition("/")[2]
    return last.partition(":")[2]


_default_manager: list[ResourceManager] = []
_managers: dict[int, tuple[weakref.ReferenceType[Any], ResourceManager]] = {}


def _manager_for(resources: Any) -> ResourceManager:
    """One `ResourceManager` per resources object, so its endpoints are built once."""
    from plait.resources.manager import ResourceManager

    if isinstance(resources, ResourceManager):
        return resources
    if resources is None:
        if not _default_manager:
            _default_manager.append(ResourceManager(None))
        return _default_manager[0]
    key, managers = id(resources), _managers
    found = managers.get(key)
    if found is not None and found[0]() is resources:
        return found[1]
    manager = ResourceManager.coerce(resources)

    def forget(_: object) -> None:
        managers.pop(key, None)

    try:
        ref = weakref.ref(resources, forget)
    except TypeError:  # a plain dict cannot be referred to weakly: not worth caching
        return manager
    managers[key] = (ref, manager)
    return manager


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


def _answered_by(meta: Mapping[str, Any], timing: CallTiming) -> str:
    """The endpoint, when a request was sent; else the handler that answered."""
    for span in timing.spans:
        if span.kind == "request":
            return "endpoint"
    if meta.get("mock"):
        return "mock"
    for flag in ("replay", "cache", "checkpoint"):
        if meta.get(flag) == "hit":
            return flag
    return "handler"


def _as_response(reply: Any) -> LLMResponse:
    """A reply a handler gave in another form (text, an object, a Value) as an `LLMResponse`."""
    if isinstance(reply, Value):
        reply = reply.payload
    if isinstance(reply, LLMResponse):
        return reply
    if isinstance(reply, str):
        return LLMResponse(reply)
    if reply is None:
        return LLMResponse("")
    return LLMResponse(as_text(reply), reply)
