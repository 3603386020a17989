"""An OpenAI-compatible Chat Completions server with deterministic replies and fault injection.

Run as ``python -m plait.testing.fake_openai --host 127.0.0.1 --port 0``. Once it accepts
connections it prints ``PLAIT_FAKE_OPENAI_READY port=<port>`` on stdout and writes nothing more
there. Tests normally drive it through :class:`plait.testing.FakeOpenAIServer`.

Replies are a pure function of the request so that tests can predict them:

* the reply echoes the last user message, prefixed with ``[<system prompt>] `` when a system
  message is present;
* directives in the last user message steer a single request (``[[NAME@MODEL:...]]``
  steers only a request for that model, so two tiers of a cascade can answer apart):
  ``[[status:429]]``,
  ``[[latency_ms:250]]``, ``[[stall_once:SECONDS]]`` (the first request with this body
  since the last reset is answered that much later, a copy of it at once: a slow
  replica, for tests of hedging), ``[[reply:any text]]`` and ``[[gate:NAME]]``, which parks the
  request (it counts as in flight) until ``POST /_gate {"open": "NAME"}``; ``/_stats``
  counts the requests parked at each gate, so a test waits for a state, never for time
  (``POST /_config {"gate_texts": {"TEXT": "NAME"}}`` parks requests whose last user
  message contains TEXT at gate NAME, leaving the requests themselves unchanged);
* ``POST /_config {"reply_headers": {"NAME": "VALUE"}}`` adds those headers, as given, to
  every reply of ``/v1/chat/completions`` and ``/v1/embeddings`` (errors included, over the
  rate-limit headers of the same name), so a test can send what a provider or a proxy in
  front of it might (``x-ratelimit-limit-requests: inf``); ``{}`` stops it;
* ``[[sample:N]]`` makes the reply a sample: `` ~draw K`` is appended, K in ``[0, N)``
  drawn from the request's integer ``seed`` (the same seed, the same K) or, without
  one, from the server's own random stream (as a real sampler would);
* a JSON-schema ``response_format`` yields a minimal instance of the schema;
* with ``POST /_config {"answer_like_demos": true}``, a request that shows
  demonstrations (user/assistant turns before its last user message) is answered
  with the last of their answers, the one next to the input (where plait puts the
  demonstration most like it), as a model copying its nearest example would; a
  ``[[reply:...]]`` directive still comes first;
* ``"logprobs": true`` adds each reply word's log-probability (-0.1) and, with
  ``top_logprobs`` (at most 20, as OpenAI allows), that many alternatives; the
  directive ``[[top:TOKEN LOGPROB|TOKEN LOGPROB|...]]`` sets the first token's
  alternatives (the likeliest is the reply), for tests of scoring by log-probability.

``POST /v1/embeddings`` answers every text of ``input`` with a 64-number vector made
from its words (`fake_embedding`): each word adds one to the axis its hash picks, except
that the words of a small topic table (``TOPIC_WORDS``: "parcel", "package",
"delivery"...) all add to their topic's axis, so texts that share no word can still be
near (what BM25 cannot see, and a test of ranking by embeddings needs).  These requests
count in ``/_stats`` like chat ones (with ``"model"`` and the body).

A wrong API key gets a 401 (``"Incorrect API key provided."``); with ``quote_key_in_401``
set, the message quotes the key the request sent, as some real providers do, so a test can
check that a key echoed back by an endpoint is never written anywhere by the client.

Server-wide behaviour (latency, jitter, random faults) is changed at runtime through
``POST /_config`` and observed through ``GET /_stats`` (each request's record holds the
Authorization header and query string it came with; ``GET /_stats?bodies=1`` adds each
request's JSON body to its record). The control endpoints never require the API key: they
belong to the test harness, not to the client under test.

A request whose body holds a tracing placeholder (plait's stand-in for an output not computed
yet, see :func:`plait.testing.find_placeholder`) is answered as usual but recorded, and listed
by ``GET /_placeholders`` and in the statistics as ``placeholder_requests``. ``POST /_reset``
does not clear that list: the test harness fails any test that sent one.

Status codes in the statistics follow HTTP, with two additions: ``0`` is a connection the server
dropped on purpose (``rate_drop``) and ``499`` is a request whose client went away first.

The server also speaks OpenAI's Batch API: ``POST /v1/files`` (batch input files),
``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``,
``POST /v1/batches``, ``GET /v1/batches``, ``GET /v1/batches/{id}`` and
``POST /v1/batches/{id}/cancel``, with ``batch_*`` settings in ``/_config`` (turnaround, limits,
item failures, expiry, failed validation, a gate that holds batches in progress) and its own
statistics at ``GET /_batches``. Each batch line is answered by the same reply logic as
``/v1/chat/completions`` (`FakeOpenAIApp.answer_line`), so a body gets the same reply either
way; batch lines never count in this route's statistics (``/_stats`` shows them apart as
``batch_lines_answered``). :mod:`plait.testing.fake_batches` describes it all.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import importlib
import ipaddress
import json
import math
import os
import random
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from types import EllipsisType
from typing import Any, Final

from aiohttp import web

from plait._digest import json_digest
from plait.testing import API_KEY_ENV, READY_PREFIX, find_placeholder
from plait.testing.fake_batches import BatchSettings, BatchStore

__all__ = [
    "MODEL_ID",
    "FakeOpenAIApp",
    "RateWindow",
    "add_limit_arguments",
    "estimate_tokens",
    "main",
    "reply_headers",
    "request_key",
    "schema_instance",
]

MODEL_ID: Final = "fake-model"

#: How many placeholder requests the server keeps (the count goes on beyond it).
MAX_PLACEHOLDER_RECORDS: Final = 100


class PlaceholderLog:
    """Requests whose body held a tracing placeholder, kept for the test harness.

    Never cleared (not even by ``/_reset``), so a test cannot hide one; both fake
    servers keep one and say so on stderr as each arrives.
    """

    def __init__(self, server: str) -> None:
        self.server = server
        self.total = 0
        self.records: list[dict[str, Any]] = []

    def check(self, raw: bytes, endpoint: str, model: str | None = None) -> None:
        """Record ``raw`` if it holds a placeholder; ``model`` names the model when the
        body does not at its top level (a batch input line)."""
        found = find_placeholder(raw)
        if found is None:
            return
        self.total += 1
        if model is None:
            parsed = _parsed_body(raw)
            model = parsed.get("model") if isinstance(parsed, dict) else None
        record = {
            "seq": self.total,
            "endpoint": endpoint,
            "model": model if isinstance(model, str) else None,
            **found,
        }
        if len(self.records) < MAX_PLACEHOLDER_RECORDS:
            self.records.append(record)
        print(
            f"{self.server}: request {endpoint} holds a tracing placeholder at "
            f"{found['where']}: {found['excerpt']!r}",
            file=sys.stderr,
            flush=True,
        )

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "requests": list(self.records)}


_DIRECTIVE = re.compile(
    r"\[\[(status|latency_ms|reply|gate|sample|top|stall_once)(?:@([^:\]]+))?:(.*?)\]\]",
    re.DOTALL,
)
_JSON_HEADERS: Final = {"Content-Type": "application/json"}
_MAX_SCHEMA_DEPTH: Final = 64
# Values for string formats that pydantic validates, so structured replies parse as models.
_STRING_FORMATS: Final[dict[str, str]] = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00",
    "duration": "P0D",
    "email": "x@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
}
_ERROR_KINDS: Final[dict[int, tuple[str, str | None]]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    409: ("conflict_error", None),
    422: ("invalid_request_error", None),
    429: ("requests", "rate_limit_exceeded"),
}


# -- pure helpers (also useful to tests that predict server output) ---------------------------


def estimate_tokens(chars: int) -> int:
    """Token count the server reports for ``chars`` characters: ceil(chars / 4)."""
    return -(-chars // 4)


def request_key(model: str, messages: Any) -> str:
    """Identity of a request in ``/_stats``: lets tests count repeats of the same prompt.

    It is the first 16 hex digits of the SHA-256 of the canonical JSON (sorted keys, no
    whitespace, UTF-8) of ``[model, messages]``.  A lone surrogate (which JSON can
    carry as ``\\ud800`` but UTF-8 cannot) is hashed by its code point, not refused.
    """
    return json_digest([model, messages], None, compact=True, ensure_ascii=False, size=8)


def schema_instance(schema: Any) -> Any:
    """A small value that validates against ``schema``, chosen without any randomness.

    Objects get every declared property, arrays one item, unions their first option. Bounds
    (``minimum``, ``minLength``, ``minItems`` ...) are respected where that is cheap so that the
    instance still validates. Recursive ``$ref`` cycles resolve to ``null``.
    """
    return _instance(schema, schema, (), 0)


def _instance(schema: Any, root: Any, refs: tuple[str, ...], depth: int) -> Any:
    if depth > _MAX_SCHEMA_DEPTH or not isinstance(schema, dict):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str):
        if ref in refs:
            return None
        return _instance(_resolve_ref(root, ref), root, (*refs, ref), depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _instance(options[0], root, refs, depth + 1)
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and all_of:
        parts = [_instance(part, root, refs, depth + 1) for part in all_of]
        if "properties" in schema:
            parts.append(_instance({**schema, "allOf": None}, root, refs, depth + 1))
        if all(isinstance(part, dict) for part in parts):
            merged: dict[str, Any] = {}
            for part in parts:
                merged.update(part)
            return merged
        return parts[0]

    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [k for k in kind if k != "null"]
        kind = non_null[0] if non_null else "null"
    if kind is None:
        if "properties" in schema or "additionalProperties" in schema:
            kind = "object"
        elif "items" in schema or "prefixItems" in schema:
            kind = "array"
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: _instance(sub, root, refs, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        return _array_instance(schema, root, refs, depth)
    if kind == "string":
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _STRING_FORMATS:
            return _STRING_FORMATS[fmt]
        length = _non_negative_int(schema.get("minLength"), 1)
        max_length = schema.get("maxLength")
        if isinstance(max_length, int) and not isinstance(max_length, bool):
            length = min(length, max(max_length, 0))
        return "x" * length
    if kind == "integer":
        return int(_number_instance(schema, integer=True))
    if kind == "number":
        return float(_number_instance(schema, integer=False))
    if kind == "boolean":
        return False
    return None


def _array_instance(schema: dict[str, Any], root: Any, refs: tuple[str, ...], depth: int) -> Any:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list):
        return [_instance(sub, root, refs, depth + 1) for sub in prefix]
    count = max(_non_negative_int(schema.get("minItems"), 1), 1)
    max_items = schema.get("maxItems")
    if isinstance(max_items, int) and not isinstance(max_items, bool):
        count = min(count, max(max_items, 0))
    if count == 0:
        return []
    items = schema.get("items")
    item = _instance(items, root, refs, depth + 1) if isinstance(items, dict) else None
    return [item] * count


def _number_instance(schema: dict[str, Any], *, integer: bool) -> float:
    def bound(name: str) -> float | None:
        value = schema.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        return None

    value = 0.0
    low, high = bound("minimum"), bound("maximum")
    ex_low, ex_high = bound("exclusiveMinimum"), bound("exclusiveMaximum")
    if low is not None and value < low:
        value = math.ceil(low) if integer else low
    if ex_low is not None and value <= ex_low:
        value = math.floor(ex_low) + 1 if integer else ex_low + 1.0
    if high is not None and value > high:
        value = math.floor(high) if integer else high
    if ex_high is not None and value >= ex_high:
        value = math.ceil(ex_high) - 1 if integer else ex_high - 1.0
    return value


def _non_negative_int(value: Any, default: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return max(value, default)
    return default


def _resolve_ref(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        raise ValueError(f"only local $ref values are supported, got {ref!r}")
    node = root
    for token in ref[1:].split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise ValueError(f"unresolvable $ref {ref!r}")
    return node


# -- the rate limit the server enforces and states ---------------------------------------------


class RateWindow:
    """A requests/min and tokens/min limit enforced in fixed windows, as the fake servers
    state it in their rate-limit headers.

    Time is cut into windows of ``window_s`` seconds (60: a minute); each window admits
    ``requests_per_minute * window_s / 60`` requests and as many tokens (a request's
    prompt and reply tokens, charged when it is answered), and a request beyond that is
    refused (429) until the window ends.  The headers state the per-minute limits, what
    is left of the window and when it ends, which is all a client needs to run at the
    limit without a refusal.  Shorter windows let tests and benchmarks see several of
    them in seconds.  ``refused`` counts the requests refused so far.
    """

    def __init__(
        self, requests_per_minute: int | None, tokens_per_minute: int | None, window_s: float
    ) -> None:
        if window_s <= 0:
            raise ValueError("the limit's window must be a positive number of seconds")
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self.window_s = window_s
        self.request_allowance = (
            max(1, round(requests_per_minute * window_s / 60)) if requests_per_minute else None
        )
        self.token_allowance = (
            max(1, round(tokens_per_minute * window_s / 60)) if tokens_per_minute else None
        )
        self.window = -1
        self.requests = 0
        self.tokens = 0
        self.refused = 0
        #: Whether a refusal carries Retry-After; without it only the reset headers say
        #: when to come back, as on some of OpenAI's 429s.
        self.retry_after = True

    def _roll(self, now: float) -> float:
        """Start a new window if ``now`` is past the current one; seconds until it ends."""
        window = int(now // self.window_s)
        if window != self.window:
            self.window, self.requests, self.tokens = window, 0, 0
        return (window + 1) * self.window_s - now

    def admit(self, tokens: int, now: float) -> bool:
        """Whether a request of ``tokens`` fits the window (then it is counted)."""
        self._roll(now)
        if self.request_allowance is not None and self.requests >= self.request_allowance:
            self.refused += 1
            return False
        allowance = self.token_allowance
        if allowance is not None and self.tokens + min(tokens, allowance) > allowance:
            self.refused += 1
            return False
        self.requests += 1
        self.tokens += tokens
        return True

    def state(self, now: float) -> tuple[int | None, int | None, int | None, int | None, float]:
        """Requests and tokens per minute, what is left of each in this window, and the
        seconds until it ends."""
        reset = self._roll(now)
        left_requests = (
            None if self.request_allowance is None else self.request_allowance - self.requests
        )
        left_tokens = None if self.token_allowance is None else self.token_allowance - self.tokens
        return (
            self.requests_per_minute,
            self.tokens_per_minute,
            left_requests,
            None if left_tokens is None else max(0, left_tokens),
            reset,
        )

    def openai_headers(self, now: float, refused: bool) -> dict[str, str]:
        """The state in OpenAI's spelling (durations such as ``1.25s``), with Retry-After
        on a refusal."""
        rpm, tpm, left_requests, left_tokens, reset = self.state(now)
        headers: dict[str, str] = {}
        if rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(left_requests)
            headers["x-ratelimit-reset-requests"] = _go_duration(reset)
        if tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(tpm)
            headers["x-ratelimit-remaining-tokens"] = str(left_tokens)
            headers["x-ratelimit-reset-tokens"] = _go_duration(reset)
        if refused and self.retry_after:
            headers["retry-after"] = f"{math.ceil(reset)}"
            headers["retry-after-ms"] = str(math.ceil(reset * 1000))
        return headers

    def anthropic_headers(self, now: float, refused: bool) -> dict[str, str]:
        """The state in Anthropic's spelling (resets as RFC 3339 times, to the
        microsecond), with retry-after (whole seconds, as Anthropic sends it) on a refusal."""
        from datetime import UTC, datetime, timedelta

        rpm, tpm, left_requests, left_tokens, reset = self.state(now)
        ends = (datetime.now(UTC) + timedelta(seconds=reset)).isoformat().replace("+00:00", "Z")
        headers: dict[str, str] = {}
        if rpm is not None:
            headers["anthropic-ratelimit-requests-limit"] = str(rpm)
            headers["anthropic-ratelimit-requests-remaining"] = str(left_requests)
            headers["anthropic-ratelimit-requests-reset"] = ends
        if tpm is not None:
            for budget in ("tokens", "input-tokens"):
                headers[f"anthropic-ratelimit-{budget}-limit"] = str(tpm)
                headers[f"anthropic-ratelimit-{budget}-remaining"] = str(left_tokens)
                headers[f"anthropic-ratelimit-{budget}-reset"] = ends
        if refused:
            headers["retry-after"] = str(math.ceil(reset))
        return headers

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "window_s": self.window_s,
            "refused": self.refused,
        }


def _go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes a reset: ``20ms`` under a second, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    rest = math.ceil(rest * 1000) / 1000
    return f"{int(minutes)}m{rest:g}s" if minutes else f"{rest:g}s"


# -- runtime configuration and statistics ----------------------------------------------------


class _Config:
    """Mutable server behaviour; everything ``POST /_config`` may change."""

    _RATES: Final = (
        "rate_429",
        "rate_500",
        "rate_drop",
        "rate_timeout",
        "rate_flex_unavailable",
        "rate_stall",
    )
    _DURATIONS: Final = ("latency_ms", "jitter_ms", "retry_after_s", "timeout_hang_s", "stall_s")

    def __init__(self, *, latency_ms: float, seed: int) -> None:
        self.latency_ms = latency_ms
        self.jitter_ms = 0.0
        self.rate_429 = 0.0
        self.rate_500 = 0.0
        self.rate_drop = 0.0
        self.rate_timeout = 0.0
        #: The share of ``service_tier: "flex"`` requests refused with OpenAI's 429
        #: ``resource_unavailable`` (the flex tier out of capacity).
        self.rate_flex_unavailable = 0.0
        self.retry_after_s = 1.0
        self.timeout_hang_s = 30.0
        #: The share of requests answered only after ``stall_s`` more seconds (a slow
        #: replica: the reply is a good one, late); drawn only while it is above 0, so
        #: a seed's other faults fall where they did before it existed.
        self.rate_stall = 0.0
        self.stall_s = 10.0
        self.seed = seed
        self.quote_key_in_401 = False
        #: Text -> gate name: a request whose last user message contains the text parks at
        #: that gate as if it carried ``[[gate:NAME]]``, while the request itself stays the
        #: same (a test can reorder replies without changing what was asked).
        self.gate_texts: dict[str, str] = {}
        #: Answer a request that shows demonstrations (user/assistant turns before its
        #: last user message) with the answer of the one next to its input, as a model
        #: that copies its nearest example would: replies that depend on the
        #: demonstrations chosen, for tests of learning them.
        self.answer_like_demos = False
        #: Headers added, as given, to every reply of the chat and embeddings routes.
        self.reply_headers: dict[str, str] = {}
        #: The batch API's settings (``batch_*`` keys), see :mod:`plait.testing.fake_batches`.
        self.batch = BatchSettings()

    def as_dict(self) -> dict[str, Any]:
        names = (
            *self._DURATIONS,
            *self._RATES,
            "seed",
            "quote_key_in_401",
            "gate_texts",
            "answer_like_demos",
            "reply_headers",
        )
        return {**{name: getattr(self, name) for name in names}, **self.batch.as_dict()}

    def apply(self, changes: dict[str, Any]) -> None:
        """Set what `validate` returned."""
        batch_keys = BatchSettings.names()
        for key, value in changes.items():
            setattr(self.batch if key in batch_keys else self, key, value)

    def validate(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Check every change before applying any, so a bad request leaves config untouched."""
        clean: dict[str, Any] = {}
        for key, value in changes.items():
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            if key in self._RATES:
                if not is_number or not 0.0 <= value <= 1.0:
                    raise ValueError(f"{key} must be a probability between 0 and 1")
                clean[key] = float(value)
            elif key in self._DURATIONS:
                if not is_number or not 0.0 <= value < math.inf:
                    raise ValueError(f"{key} must be a finite non-negative number")
                clean[key] = float(value)
            elif key == "seed":
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError("seed must be an integer")
                clean[key] = value
            elif key in ("quote_key_in_401", "answer_like_demos"):
                if not isinstance(value, bool):
                    raise ValueError(f"{key} must be true or false")
                clean[key] = value
            elif key == "gate_texts":
                if not isinstance(value, dict) or not all(
                    isinstance(text, str) and text and isinstance(name, str) and name.strip()
                    for text, name in value.items()
                ):
                    raise ValueError("gate_texts maps non-empty texts to gate names")
                clean[key] = {text: name.strip() for text, name in value.items()}
            elif key == "reply_headers":
                clean[key] = reply_headers(value)
            elif key in BatchSettings.names():
                clean[key] = self.batch.check(key, value)
            else:
                raise ValueError(f"unknown config key {key!r}")
        return clean


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def reply_headers(value: Any) -> dict[str, str]:
    """``value`` checked as headers to add to replies: a JSON object of header names
    (HTTP tokens) to values on one line; raises ValueError naming what is wrong."""
    if not isinstance(value, dict):
        raise ValueError("reply_headers must be an object of header names to values")
    for name, text in value.items():
        if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"reply_headers: {name!r} is not a header name")
        if not isinstance(text, str) or "\r" in text or "\n" in text:
            raise ValueError(f"reply_headers: the value of {name} must be text on one line")
    return dict(value)


class _Outcome:
    """What one chat request turned into, filled in as the request progresses."""

    __slots__ = (
        "authorization",
        "body",
        "completion_tokens",
        "key",
        "model",
        "prompt_tokens",
        "query",
        "status",
        "system",
    )

    def __init__(self) -> None:
        self.body = b""
        #: What the client sent beside the body: its Authorization header and query string.
        self.authorization = ""
        self.query = ""
        self.status = 499
        self.model = ""
        self.key = ""
        self.system: str | None = None
        self.prompt_tokens = 0
        self.completion_tokens = 0


class _Stats:
    """Counters plus a time-weighted histogram of concurrency.

    The histogram is updated only when the in-flight count changes, so its cost per request is
    constant no matter how long the server runs.
    """

    def __init__(self, now: float) -> None:
        self.in_flight = 0
        self.generation = 0
        self.reset(now)

    def reset(self, now: float) -> None:
        # Requests still in flight keep counting towards ``in_flight`` (it is the live value),
        # but they started before this reset, so they are not recorded when they finish.
        self.generation += 1
        self.t0 = now
        self.last_change = now
        self.requests_total = 0
        self.max_in_flight = self.in_flight
        self.busy_time = 0.0
        self.in_flight_time = 0.0
        self.time_at_level: dict[int, float] = {}
        self.status_counts: dict[str, int] = {}
        self.completed_by_key: dict[str, int] = {}
        self.records: list[dict[str, Any]] = []
        # The raw body of each record, parsed only when asked for (GET /_stats?bodies=1).
        self.bodies: list[bytes] = []

    def _advance(self, now: float) -> None:
        elapsed = now - self.last_change
        if elapsed > 0.0:
            level = self.in_flight
            self.time_at_level[level] = self.time_at_level.get(level, 0.0) + elapsed
            if level:
                self.busy_time += elapsed
                self.in_flight_time += level * elapsed
            self.last_change = now

    def enter(self, now: float) -> int:
        self._advance(now)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.requests_total += 1
        return self.generation

    def leave(self, now: float, generation: int, t_start: float, outcome: _Outcome) -> None:
        self._advance(now)
        self.in_flight -= 1
        if generation != self.generation:
            return
        status = str(outcome.status)
        self.status_counts[status] = self.status_counts.get(status, 0) + 1
        if outcome.status == 200:
            self.completed_by_key[outcome.key] = self.completed_by_key.get(outcome.key, 0) + 1
        self.records.append(
            {
                "t_start": t_start - self.t0,
                "t_end": now - self.t0,
                "model": outcome.model,
                "status": outcome.status,
                "key": outcome.key,
                "system": outcome.system,
                "prompt_tokens": outcome.prompt_tokens,
                "completion_tokens": outcome.completion_tokens,
                "authorization": outcome.authorization,
                "query": outcome.query,
            }
        )
        self.bodies.append(outcome.body)

    def snapshot(self, now: float, *, bodies: bool = False) -> dict[str, Any]:
        self._advance(now)
        records = list(self.records)
        if bodies:
            records = [
                {**record, "body": _parsed_body(body)}
                for record, body in zip(records, self.bodies, strict=True)
            ]
        return {
            "requests_total": self.requests_total,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "status_counts": dict(self.status_counts),
            "busy_time_s": self.busy_time,
            "in_flight_time_s": self.in_flight_time,
            "time_at_level_s": {str(k): v for k, v in sorted(self.time_at_level.items())},
            "uptime_s": now - self.t0,
            # `time.monotonic()` at the last reset: the same clock as the client's on one host,
            # so request records can be lined up with client-side timestamps.
            "t0_monotonic": self.t0,
            "requests": records,
            "completed_by_key": dict(self.completed_by_key),
        }


#: Words the fake's embeddings put on one axis per topic (the topic's name).
TOPIC_WORDS = {
    "parcel": ("parcel", "package", "delivery", "courier", "shipment", "shipping"),
    "money": ("charge", "charged", "refund", "invoice", "payment", "billing", "card"),
    "crash": ("crash", "crashes", "error", "bug", "broken", "freezes"),
}
_TOPIC_OF = {word: topic for topic, words in TOPIC_WORDS.items() for word in words}
EMBEDDING_SIZE = 64


def fake_embedding(text: str) -> list[float]:
    """A unit vector for ``text``: one per word on the axis its hash (or its topic) picks."""
    vector = [0.0] * EMBEDDING_SIZE
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        token = _TOPIC_OF.get(word, word)
        axis = (
            int.from_bytes(hashlib.blake2b(token.encode(), digest_size=4).digest()) % EMBEDDING_SIZE
        )
        vector[axis] += 1.0
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]


def _embeddings_reply(raw: bytes, outcome: _Outcome) -> web.Response:
    try:
        body = json.loads(raw)
        texts = body["input"]
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError("input must be a string or a list of strings")
    except (ValueError, KeyError, TypeError) as exc:
        return _error_response(400, f"bad embeddings request: {exc}")
    outcome.model = str(body.get("model", ""))
    outcome.prompt_tokens = sum(len(t.split()) for t in texts)
    return web.json_response(
        {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": fake_embedding(t)}
                for i, t in enumerate(texts)
            ],
            "model": outcome.model,
            "usage": {
                "prompt_tokens": outcome.prompt_tokens,
                "total_tokens": outcome.prompt_tokens,
            },
        }
    )


def _fault_body(status: int) -> dict[str, Any]:
    """The error body of an injected failure with HTTP ``status``."""
    if status == 429:
        return _error_body(429, "Rate limit reached (injected by the fake server).")
    return _error_body(status, f"Injected failure with HTTP status {status}.")


def _parsed_body(raw: bytes) -> Any:
    """A recorded body as JSON, or as text when it was not JSON."""
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", errors="replace")


# -- HTTP layer --------------------------------------------------------------------------------


class _BadRequest(Exception):
    """A request the real API would reject with 400; the message goes back to the client."""


def _error_body(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | EllipsisType | None = ...,
) -> dict[str, Any]:
    """OpenAI's error object for ``status``; ``code`` defaults to the usual one for the status."""
    kind, usual = _ERROR_KINDS.get(status, ("server_error" if status >= 500 else "api_error", None))
    if isinstance(code, EllipsisType):
        code = usual
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error_response(
    status: int,
    message: str,
    headers: dict[str, str] | None = None,
    *,
    param: str | None = None,
    code: str | EllipsisType | None = ...,
) -> web.Response:
    body = _error_body(status, message, param=param, code=code)
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def _json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    all_headers = _JSON_HEADERS if headers is None else {**_JSON_HEADERS, **headers}
    return web.Response(status=status, body=json.dumps(payload).encode(), headers=all_headers)


def _content_text(content: Any) -> str:
    """Plain text of a message's content, including the list-of-parts form."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


class _Directives:
    __slots__ = ("gate", "latency_ms", "reply", "sample", "stall_once", "status", "text", "top")

    def __init__(self, text: str, model: str = "") -> None:
        self.gate: str | None = None
        self.sample: int | None = None
        self.status: int | None = None
        self.latency_ms: float | None = None
        self.reply: str | None = None
        self.top: list[tuple[str, float]] | None = None
        self.stall_once: float | None = None
        self.text = text
        if "[[" not in text:
            return
        found = False
        for match in _DIRECTIVE.finditer(text):
            found = True
            name, scope, value = match.group(1), match.group(2), match.group(3)
            if scope is not None and scope != model:
                continue  # ``[[name@MODEL:...]]`` steers requests for that model only
            if name == "status":
                if not (value.isascii() and value.isdigit() and len(value) == 3):
                    raise _BadRequest(f"invalid directive [[status:{value}]]")
                status = int(value)
                if status != 200 and not 400 <= status <= 599:
                    raise _BadRequest("[[status:NNN]] supports 200 and 400-599")
                self.status = status
            elif name == "latency_ms":
                self.latency_ms = _non_negative(name, value)
            elif name == "stall_once":
                self.stall_once = _non_negative(name, value)
            elif name == "gate":
                if not value.strip():
                    raise _BadRequest("[[gate:NAME]] needs a name")
                self.gate = value.strip()
            elif name == "top":
                self.top = _top_directive(value)
            elif name == "sample":
                if not (value.isascii() and value.isdigit() and int(value) >= 1):
                    raise _BadRequest("[[sample:N]] needs a positive integer N")
                self.sample = int(value)
            else:
                self.reply = value
        if found:
            # Directives are usually appended to a prompt with a space; drop that padding too.
            self.text = _DIRECTIVE.sub("", text).strip()


def _non_negative(name: str, value: str) -> float:
    """A directive's number (``[[latency_ms:N]]``, ``[[stall_once:N]]``), checked."""
    try:
        number = float(value)
    except ValueError:
        raise _BadRequest(f"invalid directive [[{name}:{value}]]") from None
    if not 0.0 <= number < math.inf:
        raise _BadRequest(f"[[{name}:N]] needs a non-negative number")
    return number


def _top_directive(value: str) -> list[tuple[str, float]]:
    """``[[top:TOKEN LOGPROB|...]]`` as (token, logprob) pairs, likeliest first."""
    pairs: list[tuple[str, float]] = []
    for item in value.split("|"):
        token, _, number = item.strip().rpartition(" ")
        try:
            logprob = float(number)
        except ValueError:
            raise _BadRequest(f"invalid directive [[top:{value}]]: TOKEN LOGPROB|...") from None
        if not token or logprob > 0:
            raise _BadRequest(f"invalid directive [[top:{value}]]: TOKEN LOGPROB|...")
        pairs.append((token, logprob))
    return sorted(pairs, key=lambda pair: -pair[1])


def _logprobs(plan: _Plan, text: str) -> dict[str, Any]:
    """The ``logprobs`` of a choice: each word of ``text`` a token, or the first token's
    alternatives as ``[[top:...]]`` set them."""
    k = plan.top_logprobs or 0
    top = plan.directives.top
    if top is not None:
        entries = [{"token": t, "logprob": lp, "bytes": None} for t, lp in top[:k]]
        first = {"token": top[0][0], "logprob": top[0][1], "bytes": None, "top_logprobs": entries}
        return {"content": [first]}
    words = re.findall(r"\S+\s*", text)
    return {
        "content": [
            {
                "token": word,
                "logprob": -0.1,
                "bytes": None,
                "top_logprobs": [{"token": word, "logprob": -0.1, "bytes": None}][:k],
            }
            for word in words
        ]
    }


class FakeOpenAIApp:
    """The request handlers and the state they share; one instance per server process."""

    def __init__(
        self,
        *,
        latency_ms: float = 0.0,
        api_key: str | None = None,
        seed: int = 0,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
        limit_window_s: float = 60.0,
    ):
        self.config = _Config(latency_ms=latency_ms, seed=seed)
        #: The requests/min and tokens/min limit enforced and stated on every reply (None:
        #: no limit, no rate-limit headers); ``/_config`` changes it (``rpm_limit``,
        #: ``tpm_limit``, ``limit_window_s``).
        self.limit: RateWindow | None = None
        self._set_limit(rpm_limit, tpm_limit, limit_window_s)
        self._rng = random.Random(seed)
        self._auth = f"Bearer {api_key}".encode() if api_key else None
        self._stats = _Stats(time.monotonic())
        self._completions = 0
        self.placeholders_seen = PlaceholderLog("fake OpenAI server")
        # Gates: requests carrying [[gate:NAME]] wait on gates[NAME] until it is opened.
        self._gates: dict[str, asyncio.Event] = {}
        #: The requests (by key) a ``[[stall_once:...]]`` directive has already stalled.
        self._stalled_once: set[str] = set()
        self._parked: dict[str, int] = {}
        #: The batch API's files and batches (see :mod:`plait.testing.fake_batches`).
        self.batches = BatchStore(self, self.config.batch)

    def _set_limit(
        self, rpm: int | None, tpm: int | None, window_s: float, retry_after: bool = True
    ) -> None:
        self._limit_window_s = window_s
        self.limit = RateWindow(rpm, tpm, window_s) if rpm or tpm else None
        if self.limit is not None:
            self.limit.retry_after = retry_after

    def _limit_settings(self) -> dict[str, Any]:
        limit = self.limit
        return {
            "rpm_limit": None if limit is None else limit.requests_per_minute,
            "tpm_limit": None if limit is None else limit.tokens_per_minute,
            "limit_window_s": self._limit_window_s,
            "limit_retry_after": True if limit is None else limit.retry_after,
        }

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/_stats", self.stats)
        app.router.add_post("/_reset", self.reset)
        app.router.add_get("/_placeholders", self.placeholders)
        app.router.add_get("/_gate", self.get_gates)
        app.router.add_post("/_gate", self.set_gate)
        app.router.add_get("/_config", self.get_config)
        app.router.add_post("/_config", self.set_config)
        self.batches.add_routes(app)
        return app

    def _authorized(self, request: web.Request) -> bool:
        if self._auth is None:
            return True
        given = request.headers.get("Authorization", "").encode()
        return hmac.compare_digest(given, self._auth)

    def _refusal(self, request: web.Request) -> str:
        """The 401 message: quoting the key received when ``quote_key_in_401`` is set."""
        given = request.headers.get("Authorization")
        if given is None:
            return "You didn't provide an API key."
        if self.config.quote_key_in_401:
            return f"Incorrect API key provided: {given.removeprefix('Bearer ')}."
        return "Incorrect API key provided."

    # -- what the batch store asks of its host (see fake_batches.BatchHost) -------------------

    def refusal(self, request: web.Request) -> web.Response | None:
        """The 401 the online route would give this request, or None when its key is right."""
        return None if self._authorized(request) else _error_response(401, self._refusal(request))

    def error_response(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> web.Response:
        return _error_response(status, message, param=param, code=code)

    def check_placeholders(self, raw: bytes, endpoint: str, model: str | None) -> None:
        self.placeholders_seen.check(raw, endpoint, model)

    def seed(self) -> int:
        return self.config.seed

    # -- control endpoints ---------------------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        bodies = request.query.get("bodies", "") not in ("", "0", "false")
        snapshot = self._stats.snapshot(time.monotonic(), bodies=bodies)
        snapshot["gated"] = dict(self._parked)
        snapshot["placeholder_requests"] = list(self.placeholders_seen.records)
        snapshot["placeholder_requests_total"] = self.placeholders_seen.total
        snapshot["batch_lines_answered"] = self.batches.lines_answered
        snapshot["rate_limit"] = None if self.limit is None else self.limit.as_dict()
        return _json_response(snapshot)

    async def placeholders(self, request: web.Request) -> web.Response:
        return _json_response(self.placeholders_seen.as_dict())

    async def reset(self, request: web.Request) -> web.Response:
        self._stats.reset(time.monotonic())
        self._stalled_once.clear()
        self._set_limit(*self._limit_settings().values())  # the same limit, a fresh count
        self.batches.reset()
        # Open every gate, so a test that failed half-way never leaves requests parked for
        # the next one; later requests on the same names find closed gates again.
        for event in self._gates.values():
            event.set()
        self._gates.clear()
        return _json_response({"reset": True})

    def _gate(self, name: str) -> asyncio.Event:
        event = self._gates.get(name)
        if event is None:
            event = self._gates[name] = asyncio.Event()
        return event

    async def get_gates(self, request: web.Request) -> web.Response:
        opened = sorted(name for name, event in self._gates.items() if event.is_set())
        return _json_response({"parked": dict(self._parked), "open": opened})

    async def set_gate(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error_response(400, 'expected {"open": NAME} or {"close": NAME}')
        if not isinstance(body, dict) or len(body) != 1 or not body.keys() <= {"open", "close"}:
            return _error_response(400, 'expected {"open": NAME} or {"close": NAME}')
        action, name = next(iter(body.items()))
        if not isinstance(name, str) or not name:
            return _error_response(400, "a gate's name is a non-empty string")
        if action == "open":
            self._gate(name).set()
        else:  # close: later requests park again; those parked keep waiting for an open
            event = self._gates.get(name)
            if event is None or event.is_set():
                self._gates[name] = asyncio.Event()
        return _json_response({"parked": self._parked.get(name, 0), action: name})

    async def get_config(self, request: web.Request) -> web.Response:
        return _json_response({**self.config.as_dict(), **self._limit_settings()})

    async def set_config(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            return _error_response(400, "config body must be a JSON object")
        if not isinstance(body, dict):
            return _error_response(400, "config body must be a JSON object")
        limit = self._limit_settings()
        try:
            for key in list(limit):
                if key in body:
                    limit[key] = _limit_value(key, body.pop(key))
            changes = self.config.validate(body)
        except ValueError as err:
            return _error_response(400, str(err))
        self.config.apply(changes)
        if limit != self._limit_settings():
            self._set_limit(*limit.values())
        if "seed" in changes:
            self._rng.seed(changes["seed"])
        return _json_response({**self.config.as_dict(), **self._limit_settings()})

    # -- OpenAI endpoints ----------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        return _json_response({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

    async def embeddings(self, request: web.Request) -> web.Response:
        """``POST /v1/embeddings``: a `fake_embedding` per text of ``input``."""
        stats = self._stats
        t_start = time.monotonic()
        generation = stats.enter(t_start)
        outcome = _Outcome()
        try:
            raw = await request.read()
            outcome.body = raw
            outcome.authorization = request.headers.get("Authorization", "")
            outcome.query = request.query_string
            if not self._authorized(request):
                response = _error_response(401, self._refusal(request))
            else:
                response = _embeddings_reply(raw, outcome)
                if self.limit is not None:  # one limit for every route, as one model's
                    response = self._limited(response, outcome.prompt_tokens)
            response.headers.update(self.config.reply_headers)
            outcome.status = response.status
            return response
        finally:
            stats.leave(time.monotonic(), generation, t_start, outcome)

    def _limited(self, response: web.Response, tokens: int) -> web.Response:
        """``response`` under the server's limit: refused (429) when ``tokens`` more do
        not fit the window, and either way with the limit's headers."""
        assert self.limit is not None
        now = time.monotonic()
        refused = response.status == 200 and not self.limit.admit(tokens, now)
        if refused:
            response = _json_response(
                _error_body(
                    429,
                    "Rate limit reached for requests or tokens per min (enforced by the "
                    "fake server's limit).",
                    code="rate_limit_exceeded",
                ),
                429,
            )
        response.headers.update(self.limit.openai_headers(now, refused))
        return response

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        # aiohttp calls the handler once the headers are parsed, which is where in-flight
        # accounting starts; it ends once the response has been written (or the link is gone).
        stats = self._stats
        t_start = time.monotonic()
        generation = stats.enter(t_start)
        outcome = _Outcome()
        try:
            response = await self._complete(request, outcome, t_start)
            if response is None:
                outcome.status = 0
                if request.transport is not None:
                    request.transport.close()
                # Never reaches the client: aiohttp notices the closed transport and gives up.
                return web.Response(status=500)
            response.headers.update(self.config.reply_headers)
            outcome.status = response.status
            try:
                await response.prepare(request)
                await response.write_eof()
            except ConnectionError:
                outcome.status = 499
            return response
        except asyncio.CancelledError:
            outcome.status = 499
            raise
        except BaseException:
            outcome.status = 500
            raise
        finally:
            stats.leave(time.monotonic(), generation, t_start, outcome)

    async def _complete(
        self, request: web.Request, outcome: _Outcome, t_start: float
    ) -> web.Response | None:
        """Decide the reply; ``None`` means drop the connection without answering.

        The latency counts from the request's arrival, as a real endpoint's would, so the
        server's own parsing time does not stretch it.
        """
        raw = await request.read()
        outcome.body = raw
        outcome.authorization = request.headers.get("Authorization", "")
        outcome.query = request.query_string
        self.placeholders_seen.check(raw, request.path)
        if not self._authorized(request):
            return _error_response(401, self._refusal(request))
        try:
            plan = _parse_request(raw, outcome)
        except _BadRequest as err:
            return _error_response(400, str(err))

        # The same number of draws for every valid request keeps the random stream aligned
        # with the request sequence, whichever faults happen to be enabled.
        config, rng = self.config, self._rng
        jitter = rng.random() * config.jitter_ms
        drop = rng.random() < config.rate_drop
        hang = rng.random() < config.rate_timeout
        limited = rng.random() < config.rate_429
        failed = rng.random() < config.rate_500
        # Drawn for flex requests only, so other requests' faults stay where they were.
        unavailable = plan.service_tier == "flex" and rng.random() < config.rate_flex_unavailable

        stalled = config.rate_stall > 0 and rng.random() < config.rate_stall

        directives = plan.directives
        if directives.status is not None:
            drop = hang = limited = failed = unavailable = False
        if hang:
            delay_s = config.timeout_hang_s
        elif directives.latency_ms is not None:
            delay_s = directives.latency_ms / 1000.0
        else:
            delay_s = (config.latency_ms + jitter) / 1000.0
        if directives.stall_once is not None and plan.key not in self._stalled_once:
            self._stalled_once.add(plan.key)  # the first such request only: a slow replica
            delay_s += directives.stall_once
        elif stalled:
            delay_s += config.stall_s
        delay_s -= time.monotonic() - t_start
        if delay_s > 0.0:
            await asyncio.sleep(delay_s)
        gate_name = self._gate_name(directives)
        if gate_name is not None:
            await self.park(gate_name)

        if drop:
            return None
        if hang:
            return _error_response(504, "The server timed out producing a reply.")
        if unavailable:  # OpenAI's flex tier out of capacity: a 429 without Retry-After
            message = "Resource Unavailable: the flex tier has no capacity now; retry later."
            payload = _error_body(429, message, code="resource_unavailable")
            return _json_response(payload, 429)
        if limited:
            status, payload = 429, _fault_body(429)
        elif failed:
            status, payload = 500, _fault_body(500)
        else:
            status, payload = self._reply(plan, rng)
        response = _json_response(payload, status, self._fault_headers(status))
        if self.limit is not None:
            used = payload["usage"]["total_tokens"] if status == 200 else 0
            response = self._limited(response, used)
        if response.status == 200:
            outcome.completion_tokens = payload["usage"]["completion_tokens"]
        return response

    # -- the reply itself, shared by the online route and the batch API ------------------------

    def _reply(self, plan: _Plan, rng: random.Random) -> tuple[int, dict[str, Any]]:
        """The status and JSON body that answer ``plan`` once the online-only faults
        (drops, hangs, random 429s and 500s) are out of the way: a ``[[status:NNN]]`` error,
        or the completion. ``rng`` draws a ``[[sample:N]]`` request's sample when the
        request has no seed."""
        directives = plan.directives
        if directives.status is not None and directives.status != 200:
            return directives.status, _fault_body(directives.status)
        if directives.sample is not None:
            source = random.Random(plan.seed) if plan.seed is not None else rng
            plan.draw = source.randrange(directives.sample)
        text, finish_reason = plan.reply(like_demos=self.config.answer_like_demos)
        completion_tokens = estimate_tokens(len(text))
        self._completions += 1
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": finish_reason,
        }
        if plan.top_logprobs is not None:
            choice["logprobs"] = _logprobs(plan, text)
        payload = {
            "id": f"chatcmpl-{self._completions}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": plan.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": plan.prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": plan.prompt_tokens + completion_tokens,
            },
            "service_tier": "flex" if plan.service_tier == "flex" else "default",
        }
        return 200, payload

    async def answer_line(
        self, body: Any, rng: random.Random, interrupt: asyncio.Event
    ) -> tuple[int, dict[str, Any]] | None:
        """A batch line's answer: what ``/v1/chat/completions`` answers for ``body``, bar the
        online-only faults and latency (a batch's timing is its turnaround). A line that
        names a gate parks there first; ``None`` means ``interrupt`` was set while it waited
        (its batch was cancelled), so the line was never answered."""
        try:
            plan = _plan_body(body)
        except _BadRequest as err:
            return 400, _error_body(400, str(err))
        gate_name = self._gate_name(plan.directives)
        if gate_name is not None and not await self.park(gate_name, interrupt):
            return None
        return self._reply(plan, rng)

    def _fault_headers(self, status: int) -> dict[str, str] | None:
        if status != 429:
            return None
        retry_after = self.config.retry_after_s
        return {"Retry-After": f"{retry_after:g}", "retry-after-ms": str(round(retry_after * 1000))}

    # -- gates -------------------------------------------------------------------------------

    def _gate_name(self, directives: _Directives) -> str | None:
        """The gate a request parks at: its ``[[gate:NAME]]``, else a ``gate_texts`` match."""
        if directives.gate is not None:
            return directives.gate
        texts = self.config.gate_texts
        return next((name for text, name in texts.items() if text in directives.text), None)

    async def park(self, name: str, interrupt: asyncio.Event | None = None) -> bool:
        """Wait at gate ``name`` (counted in ``/_gate`` and ``/_stats``) until it opens: True;
        or until ``interrupt`` is set first: False."""
        gate = self._gate(name)
        if gate.is_set():
            return True
        self._parked[name] = self._parked.get(name, 0) + 1
        try:
            if interrupt is None:
                await gate.wait()
                return True
            waits = (asyncio.ensure_future(gate.wait()), asyncio.ensure_future(interrupt.wait()))
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            return gate.is_set()
        finally:
            self._parked[name] -= 1
            if not self._parked[name]:
                del self._parked[name]


class _Plan:
    """A validated chat request, reduced to what is needed to produce its reply."""

    __slots__ = (
        "demo_answer",
        "directives",
        "draw",
        "key",
        "max_tokens",
        "model",
        "prompt_tokens",
        "seed",
        "service_tier",
        "structured",
        "system",
        "top_logprobs",
    )

    def __init__(
        self,
        model: str,
        system: str | None,
        directives: _Directives,
        structured: str | None,
        max_tokens: int | None,
        seed: int | None,
        prompt_tokens: int,
        key: str,
    ) -> None:
        self.model = model
        self.seed = seed
        self.prompt_tokens = prompt_tokens
        #: The request's identity in the statistics (see `request_key`).
        self.key = key
        #: The sample drawn for a ``[[sample:N]]`` request (set when it is answered).
        self.draw: int | None = None
        self.system = system
        self.directives = directives
        self.structured = structured
        self.max_tokens = max_tokens
        #: The ``service_tier`` asked for (None: the default tier).
        self.service_tier: str | None = None
        #: With ``logprobs`` asked for: how many alternatives per token (else None).
        self.top_logprobs: int | None = None
        #: The last assistant turn before the last user message: the answer of the
        #: demonstration shown next to the input (None when the request shows none).
        self.demo_answer: str | None = None

    def reply(self, like_demos: bool = False) -> tuple[str, str]:
        """The reply's text and finish reason; ``like_demos``: a request that shows
        demonstrations is answered as the one next to its input was."""
        if self.directives.reply is not None:
            text = self.directives.reply
        elif like_demos and self.demo_answer is not None:
            text = self.demo_answer
        elif self.structured is not None:
            text = self.structured
        elif self.directives.top is not None:
            text = self.directives.top[0][0]
        elif self.system is not None:
            text = f"[{self.system}] {self.directives.text}"
        else:
            text = self.directives.text
        if self.draw is not None:
            text = f"{text} ~draw {self.draw}"
        if self.max_tokens is not None and estimate_tokens(len(text)) > self.max_tokens:
            return text[: self.max_tokens * 4], "length"
        return text, "stop"


def _parse_request(raw: bytes, outcome: _Outcome) -> _Plan:
    """The plan for an online request's raw body, noting in ``outcome`` what the
    statistics record (the model even when the request is refused)."""
    try:
        body = json.loads(raw)
    except ValueError:
        raise _BadRequest("request body is not valid JSON") from None
    model = body.get("model") if isinstance(body, dict) else None
    if isinstance(model, str):
        outcome.model = model
    plan = _plan_body(body)
    outcome.key = plan.key
    outcome.system = plan.system
    outcome.prompt_tokens = plan.prompt_tokens
    return plan


def _plan_body(body: Any) -> _Plan:
    """A chat-completions request body (parsed JSON), validated and reduced to its reply's
    plan; a body the real API would refuse raises `_BadRequest`. The online route and
    every batch line go through here, so both answer the same body the same way."""
    if not isinstance(body, dict):
        raise _BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _BadRequest("you must provide a model parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages must be a non-empty array")
    if body.get("stream"):
        raise _BadRequest("stream=true is not supported by the fake server")

    system: str | None = None
    last_user = ""
    answered: str | None = None  # the last assistant turn so far
    demo_answer: str | None = None  # the last one before the last user message
    chars = 0
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _BadRequest("each message must be an object with a role")
        text = _content_text(message.get("content"))
        chars += len(text)
        role = message["role"]
        if role == "user":
            last_user = text
            demo_answer = answered
        elif role == "assistant":
            answered = text
        elif role == "system" and system is None:
            system = text

    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise _BadRequest("max_tokens must be a positive integer")
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise _BadRequest("seed must be an integer")

    directives = _Directives(last_user, model)
    structured = None
    if directives.reply is None:
        structured = _structured_reply(body.get("response_format"))
    tier = body.get("service_tier")
    if tier is not None and tier not in _SERVICE_TIERS:
        raise _BadRequest(f"service_tier must be one of {', '.join(_SERVICE_TIERS)}")
    key = request_key(model, messages)
    plan = _Plan(
        model, system, directives, structured, max_tokens, seed, estimate_tokens(chars), key
    )
    plan.service_tier = tier
    plan.demo_answer = demo_answer
    if body.get("logprobs"):
        k = body.get("top_logprobs", 0)
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 20:
            raise _BadRequest("top_logprobs must be an integer between 0 and 20")
        plan.top_logprobs = k
    elif body.get("top_logprobs") is not None:
        raise _BadRequest("logprobs must be true when top_logprobs is set")
    return plan


_SERVICE_TIERS: Final = ("auto", "default", "flex", "priority")


def _structured_reply(response_format: Any) -> str | None:
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise _BadRequest("response_format must be an object")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict):
            raise _BadRequest("response_format.json_schema must be an object")
        schema = spec.get("schema")
    elif kind == "json_object":
        schema = response_format.get("schema")
    else:
        raise _BadRequest(f"unsupported response_format type {kind!r}")
    if schema is None:
        return "{}"
    try:
        return json.dumps(schema_instance(schema))
    except ValueError as err:
        raise _BadRequest(f"invalid schema: {err}") from None


# -- process entry point -----------------------------------------------------------------------


def _limit_value(key: str, value: Any) -> Any:
    """A rate-limit setting of ``/_config``, checked: a positive integer or null for the
    limits, a positive number of seconds for the window, true or false for whether a
    refusal carries Retry-After."""
    if key == "limit_retry_after":
        if not isinstance(value, bool):
            raise ValueError("limit_retry_after must be true or false")
        return value
    if key == "limit_window_s":
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise ValueError("limit_window_s must be a positive number of seconds")
        return float(value)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{key} must be a positive integer (per minute) or null for none")
    return value


def _loopback_host(host: str) -> str:
    """Accept only loopback addresses: the server has no real auth and must not be reachable."""
    if host == "localhost":
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    if address is None or not address.is_loopback:
        raise ValueError(
            f"refusing to bind to {host!r}: the fake OpenAI server only listens on loopback "
            "addresses (127.0.0.0/8 or ::1)"
        )
    return str(address)


async def _serve(host: str, port: int, app_state: FakeOpenAIApp) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if os.name == "posix":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))

    # handler_cancellation: a client that gives up (e.g. on an injected hang) stops counting as
    # in flight right away instead of when the hang ends.
    runner = web.AppRunner(
        app_state.make_app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
    )
    await runner.setup()
    site = web.SockSite(runner, sock, backlog=1024)
    await site.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except NotImplementedError:  # pragma: no cover - Windows
            signal.signal(signum, lambda *_: loop.call_soon_threadsafe(stop.set))

    print(f"{READY_PREFIX} port={sock.getsockname()[1]}", flush=True)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """``--rpm-limit``, ``--tpm-limit`` and ``--limit-window-s`` (both fake servers)."""

    def positive(kind: type[Any]) -> Callable[[str], Any]:
        def parse(text: str) -> Any:
            value = kind(text)
            if not value > 0:
                raise argparse.ArgumentTypeError(f"must be positive, got {text}")
            return value

        return parse

    parser.add_argument(
        "--rpm-limit", type=positive(int), default=None, help="requests per minute enforced"
    )
    parser.add_argument(
        "--tpm-limit", type=positive(int), default=None, help="tokens per minute enforced"
    )
    parser.add_argument(
        "--limit-window-s",
        type=positive(float),
        default=60.0,
        help="the limit's window in seconds (60; each admits its share of the per-minute limits)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m plait.testing.fake_openai",
        description="OpenAI-compatible fake server for tests and benchmarks (loopback only).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require this bearer token (default: ${API_KEY_ENV}, or no auth)",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_limit_arguments(parser)
    args = parser.parse_args(argv)

    try:
        host = _loopback_host(args.host)
    except ValueError as err:
        parser.error(str(err))
    if not 0 <= args.port <= 65535:
        parser.error(f"invalid port {args.port}")
    if not 0.0 <= args.latency_ms < math.inf:
        parser.error("--latency-ms must be a finite non-negative number")
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None

    app_state = FakeOpenAIApp(
        latency_ms=args.latency_ms,
        api_key=api_key,
        seed=args.seed,
        rpm_limit=args.rpm_limit,
        tpm_limit=args.tpm_limit,
        limit_window_s=args.limit_window_s,
    )
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(host, args.port, app_state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
