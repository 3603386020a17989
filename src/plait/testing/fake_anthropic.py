"""A fake of Anthropic's Messages API, so the Anthropic provider is tested over real HTTP.

Run as ``python -m plait.testing.fake_anthropic --port 0``; it listens on 127.0.0.1 only and,
once it accepts connections, prints ``PLAIT_FAKE_ANTHROPIC_READY port=<port>`` on stdout. Tests
normally drive it through :class:`plait.testing.FakeAnthropicServer`.

Replies are a pure function of the request (and of the prompt cache), so tests can predict them:

* the text echoes the last user message, prefixed with ``[<system prompt>] `` when there is one,
  and is cut to ``max_tokens`` (``stop_reason`` ``"max_tokens"``);
* a ``tool_choice`` that forces a tool yields a ``tool_use`` block whose input is a minimal
  instance of the tool's ``input_schema`` (the same one the OpenAI fake builds);
* ``[[status:NNN]]`` in the last user message answers with that error status, in the API's own
  error shape; a 429 carries ``retry-after: RETRY_AFTER_S``;
* ``usage`` counts :func:`~plait.testing.fake_openai.estimate_tokens` of the prompt's
  characters (text blocks by their text, tools and other blocks by their compact JSON), split
  by prompt caching: blocks marked ``cache_control`` are cached as the real API caches them
  (see :mod:`plait.testing._anthropic_cache`), with ``cache_read_input_tokens``,
  ``cache_creation_input_tokens`` and ``input_tokens`` for the rest.

``POST /v1/messages/batches`` and the routes under it are the Message Batches API: each request
of a batch is answered by the same :meth:`FakeAnthropicApp.reply` as ``/v1/messages`` (a
``[[status:NNN]]`` gives an ``errored`` result), once the batch has ended.

Control endpoints (never behind the API key; they belong to the test harness):

* ``GET /_stats`` lists the online requests received (bodies only: credentials are never kept)
  with the status each got and what each read from and wrote to the cache, and the batches
  (``"batches"``, also ``GET /_batches``);
* ``GET``/``POST /_config`` reads and changes the settings in :class:`_Config`;
* ``POST /_reset`` forgets requests, batches and cache entries and restores the default config.

A request whose body holds a tracing placeholder (see :func:`plait.testing.find_placeholder`)
is answered as usual but recorded; ``GET /_placeholders`` and the statistics'
``placeholder_requests`` list them, and ``POST /_reset`` does not clear them, because the test
harness fails any test that sent one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import json
import math
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from aiohttp import web

from plait.testing import ANTHROPIC_API_KEY_ENV, ANTHROPIC_READY_PREFIX
from plait.testing._anthropic_cache import (
    CacheControlError,
    CacheUse,
    Prompt,
    PromptCache,
    json_chars,
    without_cache_control,
)
from plait.testing.fake_openai import (
    PlaceholderLog,
    RateWindow,
    add_limit_arguments,
    estimate_tokens,
    reply_headers,
    schema_instance,
)

__all__ = ["RETRY_AFTER_S", "FakeAnthropicApp", "main"]

RETRY_AFTER_S: Final = 2
"""The ``retry-after`` header (seconds) of an injected 429."""

BATCH_MAX_REQUESTS: Final = 100_000
"""The real API's limit on requests in one Message Batch (the default of the fake's)."""

BATCH_MAX_BYTES: Final = 256 * 1024 * 1024
"""The real API's limit on a Message Batch's size (the default of the fake's)."""

_BATCH_LIFETIME: Final = timedelta(hours=24)
_CUSTOM_ID: Final = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_STATUS_DIRECTIVE = re.compile(r"\[\[status:(\d{3})\]\]")
_ERROR_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_RESULT_TYPES: Final = ("succeeded", "errored", "canceled", "expired")


class _BadRequest(Exception):
    """A request the real API would refuse with 400; the message goes back to the client."""


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(_error_body(status, message), status=status, headers=headers)


def _rfc3339(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat().replace("+00:00", "Z")


# -- one Messages request -------------------------------------------------------------------------


def _blocks(content: Any, where: str, *, text_only: bool = False) -> list[dict[str, Any]]:
    """Content as a list of blocks (a string is one text block), each checked."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _BadRequest(f"{where}: Input should be a valid string or list of content blocks")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _BadRequest(f"{where}.{i}: each content block needs a type")
        if text_only and block["type"] != "text":
            raise _BadRequest(f"{where}.{i}.type: Input should be 'text'")
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise _BadRequest(f"{where}.{i}.text: Field required")
    return content


def _text(blocks: list[dict[str, Any]]) -> str:
    """The text of a block list (non-text blocks count for nothing)."""
    return "".join(block["text"] for block in blocks if block["type"] == "text")


def _block_chars(block: dict[str, Any]) -> int:
    if block["type"] == "text":
        return len(block["text"])
    return json_chars(without_cache_control(block))


def _forced_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    """The tool the request obliges the model to call, if any."""
    choice = body.get("tool_choice")
    if body.get("tools") is None:
        if choice is not None:
            raise _BadRequest("tool_choice: may only be specified while providing tools")
        return None
    tools: list[dict[str, Any]] = body["tools"]
    if not isinstance(tools, list) or not all(
        isinstance(tool, dict)
        and isinstance(tool.get("name"), str)
        and isinstance(tool.get("input_schema"), dict)
        for tool in tools
    ):
        raise _BadRequest("tools: each tool needs a name and an input_schema object")
    if choice is None:
        return None
    if not isinstance(choice, dict):
        raise _BadRequest("tool_choice: Input should be an object")
    kind = choice.get("type")
    if kind in ("auto", "none"):
        return None
    if kind == "any":
        if not tools:
            raise _BadRequest("tool_choice: 'any' needs at least one tool")
        return tools[0]
    if kind == "tool":
        for tool in tools:
            if tool["name"] == choice.get("name"):
                return tool
        raise _BadRequest(f"tool_choice.name: no tool named {choice.get('name')!r}")
    raise _BadRequest(f"tool_choice.type: unknown type {kind!r}")


@dataclass(frozen=True)
class _Request:
    """A Messages request that passed validation: what its reply is computed from."""

    model: str
    max_tokens: int
    system_text: str | None
    last_user: str
    tool: dict[str, Any] | None
    prompt: Prompt


def _parse(body: dict[str, Any]) -> _Request:
    """Validate a Messages request body as the API does; raises `_BadRequest`."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _BadRequest("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise _BadRequest("max_tokens: Field required (a non-negative integer)")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages: Field required (a non-empty list)")
    if body.get("stream"):
        raise _BadRequest("stream: the fake server does not stream")
    tool = _forced_tool(body)

    # The prompt in the order the API caches it: tools, system, messages.
    prompt = Prompt(model)
    try:
        for i, definition in enumerate(body.get("tools") or ()):
            prompt.add(
                "tools", definition, json_chars(without_cache_control(definition)), f"tools.{i}"
            )
        system = body.get("system")
        system_text = None
        if system is not None:
            blocks = _blocks(system, "system", text_only=True)
            system_text = _text(blocks)
            for i, block in enumerate(blocks):
                prompt.add("system", block, _block_chars(block), f"system.{i}")
        prompt.mark("tool_choice", body.get("tool_choice"))
        last_user = ""
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ("user", "assistant"):
                raise _BadRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            where = f"messages.{i}.content"
            blocks = _blocks(message.get("content"), where)
            for j, block in enumerate(blocks):
                prompt.add(f"messages.{i}.{role}", block, _block_chars(block), f"{where}.{j}")
            if role == "user":
                last_user = _text(blocks)
        prompt.check()
    except CacheControlError as err:
        raise _BadRequest(str(err)) from None
    return _Request(model, max_tokens, system_text, last_user, tool, prompt)


@dataclass(frozen=True)
class Reply:
    """The answer to one Messages request, whichever route it came by."""

    status: int
    body: dict[str, Any]
    """The Message, or the error in the API's shape."""
    headers: dict[str, str] = field(default_factory=dict)
    cache: CacheUse | None = None
    """What the request read from and wrote to the prompt cache (None: it got an error)."""

    @classmethod
    def error(cls, status: int, message: str, headers: dict[str, str] | None = None) -> Reply:
        return cls(status, _error_body(status, message), headers or {})

    def cache_record(self) -> dict[str, int]:
        return self.cache.record() if self.cache is not None else {"read": 0, "write": 0}


# -- runtime configuration ------------------------------------------------------------------------


_RESULT_ORDERS: Final = ("submitted", "reversed", "shuffled")
_VALIDATION_MODES: Final = ("create", "results")


@dataclass
class _Config:
    """Everything ``POST /_config`` may change; ``POST /_reset`` restores these defaults."""

    batch_turnaround_s: float = 0.2
    """How long a batch stays ``in_progress`` (or ``canceling``) before it ends."""
    batch_item_fail_rate: float = 0.0
    """Probability that a request of a batch ends ``errored`` (``api_error``), drawn from the
    server's random stream (see ``seed``)."""
    batch_expire: bool = False
    """Batches end with their last requests ``expired``, as when a batch outlives 24 hours."""
    batch_expire_fraction: float = 0.5
    """With ``batch_expire``: the share of a batch's requests that expire (rounded up), the
    last ones in submission order."""
    batch_max_requests: int = BATCH_MAX_REQUESTS
    batch_max_bytes: int = BATCH_MAX_BYTES
    batch_gate_open: bool = True
    """While false, batches do not end (not even canceled ones): a test holds them in
    processing without depending on time, and opening the gate lets them end."""
    batch_create_gate_open: bool = True
    """While false, a batch creation waits after the batch is made, before it answers: a
    client killed there never learns the batch's id."""
    batch_results_gate_open: bool = True
    """While false, a results download waits before it answers."""
    batch_results_order: str = "submitted"
    """Order of the results file: ``submitted``, ``reversed`` or ``shuffled`` (the real API
    promises no order)."""
    batch_params_validation: str = "create"
    """``create``: a batch whose requests' params are invalid is refused with 400 (naming
    ``requests.N.params``); ``results``: it is accepted and those requests end ``errored``."""
    seed: int = 0
    cache_min_tokens: int = 1024
    """A prefix shorter than this is not cached (1,024 tokens for most models)."""
    cache_clock_offset_s: float = 0.0
    """Seconds added to the prompt cache's clock: raise it to make entries expire."""
    reply_headers: dict[str, str] = field(default_factory=dict)
    """Headers added, as given, to every reply of ``/v1/messages`` (errors included, over
    the rate-limit headers of the same name): what a provider or a proxy might send."""

    _UNIT: ClassVar[tuple[str, ...]] = ("batch_item_fail_rate", "batch_expire_fraction")
    _SECONDS: ClassVar[tuple[str, ...]] = ("batch_turnaround_s", "cache_clock_offset_s")
    _FLAGS: ClassVar[tuple[str, ...]] = (
        "batch_expire",
        "batch_gate_open",
        "batch_create_gate_open",
        "batch_results_gate_open",
    )
    _CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "batch_results_order": _RESULT_ORDERS,
        "batch_params_validation": _VALIDATION_MODES,
    }
    _COUNTS: ClassVar[dict[str, tuple[int, int]]] = {
        "batch_max_requests": (1, BATCH_MAX_REQUESTS),
        "batch_max_bytes": (1, BATCH_MAX_BYTES),
        "cache_min_tokens": (0, 10**9),
        "seed": (-(2**63), 2**63 - 1),
    }

    def as_dict(self) -> dict[str, Any]:
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def validate(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Check every change before applying any, so a bad request leaves config untouched."""
        clean: dict[str, Any] = {}
        for key, value in changes.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            integer = isinstance(value, int) and not isinstance(value, bool)
            if key in self._UNIT:
                if not number or not 0.0 <= value <= 1.0:
                    raise ValueError(f"{key} must be a number between 0 and 1")
                clean[key] = float(value)
            elif key in self._SECONDS:
                if not number or not 0.0 <= value < math.inf:
                    raise ValueError(f"{key} must be a finite non-negative number")
                clean[key] = float(value)
            elif key in self._FLAGS:
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false")
                clean[key] = value
            elif key in self._CHOICES:
                if value not in self._CHOICES[key]:
                    raise ValueError(f"{key} must be one of {', '.join(self._CHOICES[key])}")
                clean[key] = value
            elif key in self._COUNTS:
                low, high = self._COUNTS[key]
                if not integer or not low <= value <= high:
                    raise ValueError(f"{key} must be an integer from {low} to {high}")
                clean[key] = value
            elif key == "reply_headers":
                clean[key] = reply_headers(value)
            else:
                raise ValueError(f"unknown config key {key!r}")
        return clean


# -- Message Batches ------------------------------------------------------------------------------


@dataclass
class _Batch:
    id: str
    order: int
    """1 for the first batch the server accepted since it started (ids are never reused)."""
    created_at: datetime
    requests: list[tuple[str, dict[str, Any]]]
    size: int
    invalid: dict[int, str]
    """Requests whose params failed validation (``batch_params_validation: results``)."""
    processing_status: str = "in_progress"
    cancel_initiated_at: datetime | None = None
    ended_at: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    """custom_id -> its result type and cache use, for ``/_stats``."""
    deleted: bool = False
    cancel_requested: asyncio.Event = field(default_factory=asyncio.Event)

    def as_json(self, origin: str) -> dict[str, Any]:
        ended = self.processing_status == "ended"
        counts = {"processing": 0, **{kind: 0 for kind in _RESULT_TYPES}}
        if ended:
            counts.update(self.counts)
        else:
            counts["processing"] = len(self.requests)
        return {
            "id": self.id,
            "type": "message_batch",
            "processing_status": self.processing_status,
            "request_counts": counts,
            "ended_at": _rfc3339(self.ended_at),
            "created_at": _rfc3339(self.created_at),
            "expires_at": _rfc3339(self.created_at + _BATCH_LIFETIME),
            "cancel_initiated_at": _rfc3339(self.cancel_initiated_at),
            "archived_at": None,
            "results_url": f"{origin}/v1/messages/batches/{self.id}/results" if ended else None,
        }

    def stats(self, position: int) -> dict[str, Any]:
        """``/_stats``' view of it; ``position`` counts batches since the last reset, from 1."""
        reads = sum(item["cache"]["read"] for item in self.items.values())
        writes = sum(item["cache"]["write"] for item in self.items.values())
        return {
            "order": position,
            "requests": len(self.requests),
            "bytes": self.size,
            "processing_status": self.processing_status,
            "deleted": self.deleted,
            "request_counts": dict(self.counts),
            "custom_ids": [custom_id for custom_id, _ in self.requests],
            "cache": {"read_tokens": reads, "write_tokens": writes},
            "items": dict(self.items),
        }


def _check_batch(
    body: Any, config: _Config
) -> tuple[list[tuple[str, dict[str, Any]]], dict[int, str]]:
    """The requests of a batch-creation body, and those whose params are invalid (when that is
    not refused here); raises `_BadRequest`."""
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise _BadRequest("requests: Field required (a list of requests)")
    given: list[Any] = body["requests"]
    if not given:
        raise _BadRequest("requests: List should have at least 1 item")
    if len(given) > config.batch_max_requests:
        raise _BadRequest(
            f"requests: a Message Batch holds at most {config.batch_max_requests} requests, "
            f"got {len(given)}"
        )
    requests: list[tuple[str, dict[str, Any]]] = []
    invalid: dict[int, str] = {}
    seen: set[str] = set()
    for i, item in enumerate(given):
        if not isinstance(item, dict):
            raise _BadRequest(f"requests.{i}: Input should be an object")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
            raise _BadRequest(
                f"requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        if custom_id in seen:
            raise _BadRequest(
                f"requests.{i}.custom_id: {custom_id!r} is used by more than one request; "
                "custom_id must be unique within a Message Batch"
            )
        seen.add(custom_id)
        params = item.get("params")
        if not isinstance(params, dict):
            raise _BadRequest(f"requests.{i}.params: Field required (an object)")
        try:
            if params.get("stream"):
                raise _BadRequest("stream: streaming is not supported in Message Batches")
            if params.get("max_tokens") == 0:
                raise _BadRequest("max_tokens: Input should be greater than or equal to 1")
            _parse(params)
        except _BadRequest as err:
            if config.batch_params_validation == "create":
                raise _BadRequest(f"requests.{i}.params.{err}") from None
            invalid[i] = str(err)
        requests.append((custom_id, params))
    return requests, invalid


# -- the server -----------------------------------------------------------------------------------


class FakeAnthropicApp:
    """The handlers and what they share; one instance per server process."""

    def __init__(
        self,
        *,
        api_key: str | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
        limit_window_s: float = 60.0,
    ) -> None:
        self._key = api_key.encode() if api_key else None
        #: The limit ``/v1/messages`` enforces and states in ``anthropic-ratelimit-*``
        #: headers (None: none); `RateWindow` says how.
        self._limits = (rpm_limit, tpm_limit, limit_window_s)
        self.limit = RateWindow(*self._limits) if rpm_limit or tpm_limit else None
        self.config = _Config()
        self._rng = random.Random(self.config.seed)
        self._records: list[dict[str, Any]] = []
        self._messages = 0
        self._cache = PromptCache()
        self._batches: dict[str, _Batch] = {}
        self._batch_count = 0  # never reset: a batch id is never given out twice
        self._batch_tasks: set[asyncio.Task[None]] = set()
        self._custom_ids: Counter[str] = Counter()
        self._batch_calls: Counter[str] = Counter()
        self._batches_rejected = 0
        self._gate: asyncio.Event | None = None
        #: The gates of the ``create`` and ``results`` routes, and the requests held there.
        self._holds: dict[str, asyncio.Event] = {}
        self._held: dict[str, int] = {}
        # Requests that carried a tracing placeholder: never cleared, not even by /_reset.
        self.placeholders_seen = PlaceholderLog("fake Anthropic server")

    def make_app(self) -> web.Application:
        # Room for the largest batch the API takes; the configured limit is checked by hand,
        # so that refusing it answers in the API's error shape.
        app = web.Application(client_max_size=BATCH_MAX_BYTES + 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/batches", self.create_batch)
        app.router.add_get("/v1/messages/batches", self.list_batches)
        app.router.add_get("/v1/messages/batches/{batch_id}", self.retrieve_batch)
        app.router.add_delete("/v1/messages/batches/{batch_id}", self.delete_batch)
        app.router.add_post("/v1/messages/batches/{batch_id}/cancel", self.cancel_batch)
        app.router.add_get("/v1/messages/batches/{batch_id}/results", self.batch_results)
        app.router.add_get("/_stats", self.stats)
        app.router.add_get("/_batches", self.batch_stats)
        app.router.add_post("/_reset", self.reset)
        app.router.add_get("/_config", self.get_config)
        app.router.add_post("/_config", self.set_config)
        app.router.add_get("/_placeholders", self.placeholders)
        return app

    @property
    def gate(self) -> asyncio.Event:
        """Set while ``batch_gate_open``; made on first use, inside the server's loop."""
        if self._gate is None:
            self._gate = asyncio.Event()
            if self.config.batch_gate_open:
                self._gate.set()
        return self._gate

    def _now(self) -> float:
        return time.monotonic() + self.config.cache_clock_offset_s

    # -- the reply, whichever route the request came by -------------------------------------

    def reply(self, body: dict[str, Any], *, service_tier: str = "standard") -> Reply:
        """Answer one Messages request body: ``/v1/messages`` sends it back as it is, a batch
        turns it into a ``succeeded`` or ``errored`` result."""
        try:
            request = _parse(body)
            return self._answer(request, service_tier)
        except _BadRequest as err:
            return Reply.error(400, str(err))

    def _answer(self, request: _Request, service_tier: str) -> Reply:
        directive = _STATUS_DIRECTIVE.search(request.last_user)
        if directive is not None:
            status = int(directive.group(1))
            if status == 429:
                return Reply.error(
                    429,
                    "Number of requests has exceeded your rate limit (injected by the fake).",
                    {"retry-after": str(RETRY_AFTER_S)},
                )
            if 400 <= status <= 599:
                return Reply.error(status, f"Injected failure with HTTP status {status}.")
            raise _BadRequest(f"[[status:{status}]]: only 400-599 can be injected")

        tool = request.tool
        if tool is not None:
            try:
                value = schema_instance(tool["input_schema"])
            except ValueError as err:
                raise _BadRequest(f"tools.input_schema: {err}") from None
        cache = self._cache.account(
            request.prompt, now=self._now(), min_tokens=self.config.cache_min_tokens
        )
        self._messages += 1
        if tool is not None:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_fake_{self._messages}",
                "name": tool["name"],
                "input": value,
            }
            output_chars, stop_reason = len(json.dumps(value)), "tool_use"
        else:
            system, last_user = request.system_text, request.last_user
            text = last_user if system is None else f"[{system}] {last_user}"
            stop_reason = "end_turn"
            if estimate_tokens(len(text)) > request.max_tokens:
                text, stop_reason = text[: request.max_tokens * 4], "max_tokens"
            block = {"type": "text", "text": text}
            output_chars = len(text)
        message = {
            "id": f"msg_fake_{self._messages}",
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": [block],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                **cache.usage(),
                "output_tokens": estimate_tokens(output_chars),
                "service_tier": service_tier,
            },
        }
        return Reply(200, message, cache=cache)

    # -- shared request handling --------------------------------------------------------------

    def _refusal(self, request: web.Request) -> web.Response | None:
        """The error for a request without valid credentials or version header, if any."""
        # Older SDKs send the key as x-api-key, newer ones as a bearer token; the API takes both.
        given = request.headers.get("x-api-key")
        bearer = request.headers.get("Authorization", "")
        if given is None and bearer.startswith("Bearer "):
            given = bearer.removeprefix("Bearer ")
        if given is None:
            return _error(401, "x-api-key header is required")
        if self._key is not None and not hmac.compare_digest(given.encode(), self._key):
            return _error(401, "invalid x-api-key")
        if "anthropic-version" not in request.headers:
            return _error(400, "anthropic-version: header is required")
        return None

    async def _json_body(self, request: web.Request) -> tuple[Any, int] | web.Response:
        """The request's JSON body and its size, or the error that answers it."""
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, "Request exceeds the maximum allowed number of bytes.")
        self.placeholders_seen.check(raw, request.path)
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            return json.loads(raw), len(raw)
        except ValueError:
            return _error(400, "request body is not valid JSON")

    # -- /v1/messages -------------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.Response:
        record: dict[str, Any] = {"status": 0, "body": None, "cache": {"read": 0, "write": 0}}
        self._records.append(record)
        parsed = await self._json_body(request)
        if isinstance(parsed, web.Response):
            record["status"] = parsed.status
            return parsed
        body = parsed[0]
        if not isinstance(body, dict):
            record["status"] = 400
            return _error(400, "request body must be a JSON object")
        record["body"] = body
        reply = self.reply(body)
        headers = reply.headers
        if self.limit is not None:
            now = time.monotonic()
            refused = False
            if reply.status == 200:
                used = reply.body["usage"]
                tokens = sum(
                    int(used.get(name) or 0)
                    for name in (
                        "input_tokens",
                        "cache_read_input_tokens",
                        "cache_creation_input_tokens",
                        "output_tokens",
                    )
                )
                refused = not self.limit.admit(tokens, now)
                if refused:
                    reply = Reply.error(
                        429,
                        "This request would exceed your organization's rate limit (enforced "
                        "by the fake server's limit).",
                    )
            headers = {**headers, **self.limit.anthropic_headers(now, refused)}
        headers = {**headers, **self.config.reply_headers}
        record["status"] = reply.status
        record["cache"] = reply.cache_record()
        return web.json_response(reply.body, status=reply.status, headers=headers)

    # -- /v1/messages/batches -----------------------------------------------------------------

    def _find(self, request: web.Request) -> _Batch | web.Response:
        batch = self._batches.get(request.match_info["batch_id"])
        if batch is None or batch.deleted:
            return _error(404, f"Message Batch {request.match_info['batch_id']!r} not found")
        return batch

    @staticmethod
    def _origin(request: web.Request) -> str:
        return str(request.url.origin())

    def _batch_route(self, request: web.Request, route: str) -> _Batch | web.Response:
        """A call of ``route`` on the batch the URL names, counted: the batch, or the
        response refusing the call (no key, no such batch)."""
        self._batch_calls[route] += 1
        refused = self._refusal(request)
        if refused is not None:
            return refused
        return self._find(request)

    async def create_batch(self, request: web.Request) -> web.Response:
        self._batch_calls["create"] += 1
        parsed = await self._json_body(request)
        if isinstance(parsed, web.Response):
            self._batches_rejected += 1
            return parsed
        body, size = parsed
        if size > self.config.batch_max_bytes:
            self._batches_rejected += 1
            return _error(
                413,
                f"Message Batch too large: {size} bytes, the limit is "
                f"{self.config.batch_max_bytes} bytes.",
            )
        try:
            requests, invalid = _check_batch(body, self.config)
        except _BadRequest as err:
            self._batches_rejected += 1
            return _error(400, str(err))

        self._batch_count += 1
        batch = _Batch(
            id=f"msgbatch_fake{self._batch_count:012d}",
            order=self._batch_count,
            created_at=datetime.now(UTC),
            requests=requests,
            size=size,
            invalid=invalid,
        )
        self._batches[batch.id] = batch
        self._custom_ids.update(custom_id for custom_id, _ in requests)
        task = asyncio.create_task(self._process(batch, self.config.batch_turnaround_s))
        self._batch_tasks.add(task)
        task.add_done_callback(self._batch_tasks.discard)
        await self._hold("create")
        return web.json_response(batch.as_json(self._origin(request)))

    def _hold_gate(self, route: str) -> asyncio.Event:
        """The gate a ``create`` or ``results`` request waits at (set: open)."""
        gate = self._holds.get(route)
        if gate is None:
            gate = self._holds[route] = asyncio.Event()
            if getattr(self.config, f"batch_{route}_gate_open"):
                gate.set()
        return gate

    async def _hold(self, route: str) -> None:
        gate = self._hold_gate(route)
        if gate.is_set():
            return
        self._held[route] = self._held.get(route, 0) + 1
        try:
            await gate.wait()
        finally:
            self._held[route] -= 1

    async def _process(self, batch: _Batch, turnaround_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(batch.cancel_requested.wait(), turnaround_s)
        await self.gate.wait()
        self._finish(batch)

    def _finish(self, batch: _Batch) -> None:
        """End a batch: every request gets its result at once (in one step of the loop, so a
        cancel or a reset never sees half a batch)."""
        config = self.config
        total = len(batch.requests)
        expire_from = total
        if config.batch_expire and batch.processing_status != "canceling":
            expire_from = total - math.ceil(total * config.batch_expire_fraction)
        results: list[dict[str, Any]] = []
        for index, (custom_id, params) in enumerate(batch.requests):
            reply: Reply | None = None
            if batch.processing_status == "canceling":
                result: dict[str, Any] = {"type": "canceled"}
            elif index >= expire_from:
                result = {"type": "expired"}
            elif index in batch.invalid:
                result = {"type": "errored", "error": _error_body(400, batch.invalid[index])}
            elif config.batch_item_fail_rate > 0 and (
                self._rng.random() < config.batch_item_fail_rate
            ):
                message = "Internal server error (injected by the fake)."
                result = {"type": "errored", "error": _error_body(500, message)}
            else:
                reply = self.reply(params, service_tier="batch")
                if reply.status == 200:
                    result = {"type": "succeeded", "message": reply.body}
                else:
                    result = {"type": "errored", "error": reply.body}
            results.append({"custom_id": custom_id, "result": result})
            cache = reply.cache_record() if reply is not None else {"read": 0, "write": 0}
            batch.items[custom_id] = {"result": result["type"], "cache": cache}
        if config.batch_results_order == "reversed":
            results.reverse()
        elif config.batch_results_order == "shuffled":
            self._rng.shuffle(results)
        batch.results = results
        batch.counts = dict(Counter(line["result"]["type"] for line in results))
        batch.processing_status = "ended"
        batch.ended_at = datetime.now(UTC)

    async def retrieve_batch(self, request: web.Request) -> web.Response:
        batch = self._batch_route(request, "retrieve")
        if isinstance(batch, web.Response):
            return batch
        return web.json_response(batch.as_json(self._origin(request)))

    async def list_batches(self, request: web.Request) -> web.Response:
        self._batch_calls["list"] += 1
        refused = self._refusal(request)
        if refused is not None:
            return refused
        query = request.query
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 1000:
            return _error(400, "limit: Input should be an integer from 1 to 1000")
        after, before = query.get("after_id"), query.get("before_id")
        if after is not None and before is not None:
            return _error(400, "after_id and before_id cannot both be given")
        newest_first = sorted(self._batches.values(), key=lambda b: b.order, reverse=True)
        # Deleted batches still mark their place, so a cursor that names one keeps working.
        ids = [batch.id for batch in newest_first]
        cursor = after if after is not None else before
        if cursor is not None and cursor not in ids:
            name = "after_id" if after is not None else "before_id"
            return _error(400, f"{name}: no Message Batch with id {cursor!r}")
        if after is not None:
            candidates = newest_first[ids.index(after) + 1 :]
        elif before is not None:
            candidates = newest_first[: ids.index(before)]
        else:
            candidates = newest_first
        live = [batch for batch in candidates if not batch.deleted]
        page = live[-limit:] if before is not None else live[:limit]
        origin = self._origin(request)
        return web.json_response(
            {
                "data": [batch.as_json(origin) for batch in page],
                "has_more": len(live) > limit,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )

    async def cancel_batch(self, request: web.Request) -> web.Response:
        batch = self._batch_route(request, "cancel")
        if isinstance(batch, web.Response):
            return batch
        if batch.processing_status == "ended":
            return _error(400, f"Message Batch {batch.id!r} has already ended")
        if batch.processing_status == "in_progress":
            batch.processing_status = "canceling"
            batch.cancel_initiated_at = datetime.now(UTC)
            batch.cancel_requested.set()
        return web.json_response(batch.as_json(self._origin(request)))

    async def delete_batch(self, request: web.Request) -> web.Response:
        batch = self._batch_route(request, "delete")
        if isinstance(batch, web.Response):
            return batch
        if batch.processing_status != "ended":
            return _error(
                400,
                f"Message Batch {batch.id!r} is still processing: Message Batches can only be "
                "deleted once they have finished processing (cancel it first)",
            )
        batch.deleted = True
        return web.json_response({"id": batch.id, "type": "message_batch_deleted"})

    async def batch_results(self, request: web.Request) -> web.Response:
        batch = self._batch_route(request, "results")
        if isinstance(batch, web.Response):
            return batch
        if batch.processing_status != "ended":
            return _error(
                400,
                f"Message Batch {batch.id!r} has not finished processing "
                f"(processing_status: {batch.processing_status}); its results are available "
                "once it has ended",
            )
        await self._hold("results")
        text = "".join(json.dumps(line) + "\n" for line in batch.results)
        return web.Response(
            body=text.encode(),
            content_type="application/x-jsonl",
            headers={
                "Content-Disposition": f"attachment; filename*=utf-8''{batch.id}_results.jsonl"
            },
        )

    # -- control endpoints ----------------------------------------------------------------------

    def _batch_snapshot(self) -> dict[str, Any]:
        batches = sorted(self._batches.values(), key=lambda b: b.order)
        status_counts = Counter(batch.processing_status for batch in batches)
        result_counts: Counter[str] = Counter()
        for batch in batches:
            result_counts.update(batch.counts)
        per_batch = {batch.id: batch.stats(n) for n, batch in enumerate(batches, 1)}
        return {
            "batches_total": len(batches),
            "requests_total": sum(len(batch.requests) for batch in batches),
            "bytes_total": sum(batch.size for batch in batches),
            "status_counts": dict(status_counts),
            "result_counts": dict(result_counts),
            "rejected": self._batches_rejected,
            "calls": dict(self._batch_calls),
            "order": [batch.id for batch in batches],
            "custom_ids": dict(self._custom_ids),
            "held": {route: n for route, n in self._held.items() if n},
            "cache": {
                "read_tokens": sum(b["cache"]["read_tokens"] for b in per_batch.values()),
                "write_tokens": sum(b["cache"]["write_tokens"] for b in per_batch.values()),
            },
            "batches": per_batch,
        }

    async def stats(self, request: web.Request) -> web.Response:
        counts: dict[str, int] = {}
        for record in self._records:
            counts[str(record["status"])] = counts.get(str(record["status"]), 0) + 1
        return web.json_response(
            {
                "requests_total": len(self._records),
                "status_counts": counts,
                "requests": self._records,
                "cache": {
                    "read_tokens": sum(record["cache"]["read"] for record in self._records),
                    "write_tokens": sum(record["cache"]["write"] for record in self._records),
                    "entries": self._cache.live(self._now()),
                },
                "batches": self._batch_snapshot(),
                "placeholder_requests": list(self.placeholders_seen.records),
                "placeholder_requests_total": self.placeholders_seen.total,
                "rate_limit": None if self.limit is None else self.limit.as_dict(),
            }
        )

    async def batch_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self._batch_snapshot())

    async def placeholders(self, request: web.Request) -> web.Response:
        return web.json_response(self.placeholders_seen.as_dict())

    async def reset(self, request: web.Request) -> web.Response:
        for task in self._batch_tasks:
            task.cancel()
        self._batch_tasks.clear()
        self._batches.clear()
        self._custom_ids.clear()
        self._batch_calls.clear()
        self._batches_rejected = 0
        self._records = []
        self._cache.clear()
        if self.limit is not None:  # the same limit, with a fresh count
            self.limit = RateWindow(*self._limits)
        self._apply(_Config().as_dict())
        return web.json_response({"reset": True})

    def _apply(self, changes: dict[str, Any]) -> None:
        for key, value in changes.items():
            setattr(self.config, key, value)
        if "seed" in changes:
            self._rng.seed(changes["seed"])
        if "batch_gate_open" in changes:
            if changes["batch_gate_open"]:
                self.gate.set()
            else:
                self.gate.clear()
        for route in ("create", "results"):
            key = f"batch_{route}_gate_open"
            if key in changes:
                gate = self._hold_gate(route)
                if changes[key]:
                    gate.set()
                else:
                    gate.clear()

    async def get_config(self, request: web.Request) -> web.Response:
        return web.json_response(self.config.as_dict())

    async def set_config(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return _error(400, "config body must be a JSON object")
        if not isinstance(body, dict):
            return _error(400, "config body must be a JSON object")
        try:
            changes = self.config.validate(body)
        except ValueError as err:
            return _error(400, str(err))
        self._apply(changes)
        return web.json_response(self.config.as_dict())


async def _serve(port: int, app_state: FakeAnthropicApp) -> None:
    # No access log: it would be the one place a request's headers could leak.
    runner = web.AppRunner(app_state.make_app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    bound_port = runner.addresses[0][1]
    print(f"{ANTHROPIC_READY_PREFIX} port={bound_port}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m plait.testing.fake_anthropic",
        description="Fake Anthropic Messages API for tests (listens on 127.0.0.1 only).",
    )
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require this x-api-key (default: ${ANTHROPIC_API_KEY_ENV}, or any key)",
    )
    add_limit_arguments(parser)
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"invalid port {args.port}")
    api_key = args.api_key or os.environ.get(ANTHROPIC_API_KEY_ENV) or None
    app = FakeAnthropicApp(
        api_key=api_key,
        rpm_limit=args.rpm_limit,
        tpm_limit=args.tpm_limit,
        limit_window_s=args.limit_window_s,
    )
    asyncio.run(_serve(args.port, app))
    return 0


if __name__ == "__main__":
    sys.exit(main())
