"""Anthropic's Messages API, through the official ``anthropic`` SDK.

The SDK rather than raw aiohttp (as the OpenAI provider uses) because it keeps up
with the API's version headers and credential sources (``ANTHROPIC_API_KEY``,
profiles, workload identity); its extra client CPU matters less here than against
a local OpenAI-compatible server, since one remote API's rate limits come first.
It is an optional extra (``pip install plait[anthropic]``), imported only when an
alias uses this provider, so ``import plait`` never loads it.

Structured output travels as a single forced tool call whose input schema is the
requested type's; the tool's input comes back as JSON text for the endpoint layer
to validate, like any other provider's reply.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import weakref
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from plait._secrets import redact_url, scrub
from plait.providers.base import LLMRequest, LLMResponse, ProviderError, Usage, status_error
from plait.providers.ratelimits import anthropic_limits
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.structured import schema_name, wire_schema

if TYPE_CHECKING:
    import anthropic
    from anthropic.types import Message

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicProvider"]

#: Anthropic requires ``max_tokens``; this is sent when a request leaves it unset.
DEFAULT_MAX_TOKENS = 1024

# plait's neutral finish reasons are OpenAI's, which the other providers already speak.
# The forced tool call of a structured request is its normal end, hence "stop".
_FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


async def _closer(client: anthropic.AsyncAnthropic) -> AsyncGenerator[None, None]:
    """Parked for the life of an event loop; closes the client when the loop shuts down.

    A loop has no close hook, but ``asyncio.run`` and plait's runtime loop finalize
    async generators on shutdown, which runs the ``finally`` on that loop.
    """
    try:
        yield
    finally:
        await client.close()


class AnthropicProvider:
    """Sends `LLMRequest`s to one Anthropic model (one attempt per `send`).

    The SDK's HTTP client belongs to the event loop it first ran on, and a provider
    may serve plait's runtime loop and a user's own loop in turn, so there is one
    client per loop.  The key is read from the config (a `SecretStr`) only to make a
    client, so the provider holds it nowhere but in the SDK clients, whose reprs do
    not show it.
    """

    def __init__(self, config: EndpointConfig) -> None:
        try:
            import anthropic
        except ImportError as exc:
            raise ImportError(
                "the 'anthropic' provider needs the Anthropic SDK: pip install plait[anthropic]"
            ) from exc

        self.config = config
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop,
            tuple[anthropic.AsyncAnthropic, AsyncGenerator[None, None]],
        ] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # Made now so that missing credentials fail when the configuration is loaded,
        # not at the first call; the first loop to send adopts it.
        try:
            self._spare: anthropic.AsyncAnthropic | None = self._new_client()
        except anthropic.AnthropicError as exc:  # e.g. a broken credentials profile
            raise ConfigurationError(f"Anthropic model {config.model!r}: {exc}") from exc
        if not (
            self._spare.api_key
            or self._spare.auth_token
            or getattr(self._spare, "credentials", None)
        ):
            raise ConfigurationError(
                f"Anthropic model {config.model!r} has no API key: set api_key or api_key_env "
                "in its ResourceConfig entry, or export ANTHROPIC_API_KEY"
            )

    def __repr__(self) -> str:
        shown = redact_url(self.config.base_url) if self.config.base_url else ""
        where = f", base_url={shown!r}" if shown else ""
        return f"AnthropicProvider(model={self.config.model!r}{where})"

    def _new_client(self) -> anthropic.AsyncAnthropic:
        import anthropic

        options: dict[str, Any] = {"max_retries": 0, "timeout": self.config.timeout}
        if self.config.base_url:
            options["base_url"] = self.config.base_url
        key = self.config.resolved_api_key()
        if key:
            options["api_key"] = key
        # Without a key of our own the SDK looks in its usual places (ANTHROPIC_API_KEY ...).
        return anthropic.AsyncAnthropic(**options)

    async def _client(self) -> anthropic.AsyncAnthropic:
        loop = asyncio.get_running_loop()
        entry = self._clients.get(loop)
        if entry is not None and not entry[0].is_closed():
            return entry[0]
        with self._lock:
            client, self._spare = self._spare, None
        if client is None:
            client = self._new_client()
        closer = _closer(client)
        await closer.__anext__()
        self._clients[loop] = (client, closer)
        return client

    def _params(self, request: LLMRequest, cache_ttl: str | None = None) -> dict[str, Any]:
        """The Messages API's parameters for ``request``, with a prompt-cache breakpoint
        at the end of its fixed prefix when that is long enough to be cached
        (``cache_ttl`` "1h" for a batch, whose calls may be hours apart)."""
        system: list[str] = []
        turns: list[dict[str, Any]] = []
        mark = self._cache_mark(request, cache_ttl)
        marked_system = False
        for position, message in enumerate(request.messages):
            role = message.get("role")
            last_fixed = mark is not None and position == request.prefix_messages - 1
            if role == "system":
                system.append(_text(message.get("content")))
                marked_system = marked_system or last_fixed
            elif role in ("user", "assistant"):
                content = message.get("content", "")
                if last_fixed and mark is not None:
                    content = _marked(content, mark)
                turns.append({"role": role, "content": content})
            else:
                raise ProviderError(
                    f"Anthropic's Messages API has no {role!r} role (only system, user and "
                    "assistant messages can be sent)"
                )
        params: dict[str, Any] = {
            "model": self.config.model,
            "messages": turns,
            "max_tokens": DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens,
        }
        if system:
            joined = "\n\n".join(system)
            params["system"] = (
                [{"type": "text", "text": joined, "cache_control": mark}]
                if marked_system and mark is not None
                else joined
            )
        if request.label_method not in (None, "grammar"):
            raise ProviderError(
                f"label_method={request.label_method!r} scores labels by their "
                "log-probabilities, which Anthropic's API does not return: leave label_method "
                "unset (the labels go as a tool schema with an enum) or use an OpenAI-"
                "compatible or the embedded model"
            )
        if request.response_format is not None:
            name = schema_name(request.response_format)
            params["tools"] = [
                {
                    "name": name,
                    "description": "Give the answer by calling this tool.",
                    "input_schema": wire_schema(request.response_format),
                }
            ]
            params["tool_choice"] = {"type": "tool", "name": name}
        # Sampling settings go in the raw body: newer SDKs dropped them from `create`'s
        # signature, while the API still takes them.
        body = dict(request.extra)
        # The Messages API has no seed (it would refuse the field): a run seed still
        # keys the cache and checkpoint entries, but the reply is not reproducible.
        body.pop("seed", None)
        if request.temperature is not None:
            body.setdefault("temperature", request.temperature)
        if body:
            params["extra_body"] = body
        return params

    def _cache_mark(self, request: LLMRequest, ttl: str | None) -> dict[str, Any] | None:
        """The ``cache_control`` to put at the end of the request's fixed prefix, or None
        when it has none, caching is off, or it is shorter than the model caches."""
        fixed = request.messages[: request.prefix_messages]
        if not fixed or not self.config.prompt_caching:
            return None
        chars = sum(len(_text(m.get("content"))) for m in fixed)
        if chars // 4 < self.config.cache_min_tokens:
            return None
        mark: dict[str, Any] = {"type": "ephemeral"}
        if ttl is not None:
            mark["ttl"] = ttl
        return mark

    async def send(self, request: LLMRequest) -> LLMResponse:
        import anthropic

        params = self._params(request)
        client = await self._client()
        try:
            # The raw response: its headers state the rate limits (the parsed one drops them).
            raw = await client.messages.with_raw_response.create(**params)
            message = raw.parse()
            if inspect.isawaitable(message):  # the SDK's async response parses asynchronously
                message = await message
        except anthropic.AnthropicError as exc:
            raise self.error(exc, client) from exc
        response = self._response(message, request)
        response.limits = anthropic_limits(raw.headers)
        return response

    def error(self, exc: Exception, client: anthropic.AsyncAnthropic) -> ProviderError:
        """The SDK's exception as plait's `ProviderError` (a status, retryable or not)."""
        import anthropic

        where = redact_url(str(client.base_url))
        if isinstance(exc, anthropic.APIStatusError):
            return _http_error(exc)
        if isinstance(exc, anthropic.APITimeoutError):
            return ProviderError(
                f"request to {where} timed out after {self.config.timeout} s",
                retryable=True,
                transport="timeout",
            )
        if isinstance(exc, anthropic.APIConnectionError):
            cause = exc.__cause__
            detail = f"{type(cause).__name__}: {cause}" if cause is not None else exc.message
            return ProviderError(
                f"connection to {where} failed: {scrub(detail)}",
                retryable=True,
                transport="connection",
            )
        message = exc.message if isinstance(exc, anthropic.APIError) else str(exc)
        return ProviderError(f"unusable reply from {where}: {scrub(message)}")

    def _response(self, message: Message, request: LLMRequest | None) -> LLMResponse:
        from anthropic.types import TextBlock, ToolUseBlock

        text = "".join(block.text for block in message.content if isinstance(block, TextBlock))
        # A batch result comes without its request: the tool it forced is its only one.
        structured = request is None or request.response_format is not None
        if structured:
            name = schema_name(request.response_format) if request is not None else None
            for block in message.content:
                if isinstance(block, ToolUseBlock) and (name is None or block.name == name):
                    text = json.dumps(block.input)
                    break
            # Without the tool call the text goes back as it is: validating it fails, and
            # the endpoint layer re-asks with the error, as for any malformed reply.
        stop = message.stop_reason
        return LLMResponse(
            text=text,
            usage=usage_of(message.usage),
            model=message.model or self.config.model,
            finish_reason=_FINISH_REASONS.get(stop, stop) if stop is not None else None,
        )


def usage_of(used: Any) -> Usage:
    """Anthropic's usage as plait's: its ``input_tokens`` leave out the prompt tokens read
    from and written to the cache, which plait counts in ``prompt_tokens`` too."""
    read = int(getattr(used, "cache_read_input_tokens", None) or 0)
    written = int(getattr(used, "cache_creation_input_tokens", None) or 0)
    creation = getattr(used, "cache_creation", None)
    hour = int(getattr(creation, "ephemeral_1h_input_tokens", None) or 0) if creation else 0
    return Usage(
        int(used.input_tokens) + read + written,
        int(used.output_tokens),
        cache_read_tokens=read,
        cache_write_tokens=written,
        cache_write_1h_tokens=hour,
    )


def _marked(content: Any, mark: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's content as blocks, the last one carrying the cache breakpoint."""
    if isinstance(content, list):
        blocks = [dict(block) if isinstance(block, dict) else block for block in content]
        if blocks and isinstance(blocks[-1], dict):
            blocks[-1]["cache_control"] = mark
        return blocks
    return [{"type": "text", "text": _text(content), "cache_control": mark}]


def _text(content: Any) -> str:
    """A system message's text, from a string or a list of text parts."""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _http_error(exc: anthropic.APIStatusError) -> ProviderError:
    """Quote the server's own error (``type: message``), whatever shape its body has."""
    body = exc.body
    message = ""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        message = str(error.get("message") or "")
        if message and error.get("type"):
            message = f"{error['type']}: {message}"
    elif isinstance(body, str):
        message = body.strip()[:500]
    if not message:
        message = exc.response.reason_phrase or exc.message
    headers = exc.response.headers
    return status_error(
        exc.status_code, message, headers.get("retry-after"), limits=anthropic_limits(headers)
    )
