"""OpenAI-compatible chat completions over aiohttp.

Speaks to OpenAI and to every server that copies its API (vLLM, SGLang, Ollama,
llama.cpp's server, LM Studio).  aiohttp rather than the official SDK: we measured
the SDK at ~7x the client CPU per call, and on two cores client CPU is what caps
throughput.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import orjson
from multidict import CIMultiDict

from plait._secrets import redact_url, register, scrub
from plait.labels import label_choices
from plait.providers.base import (
    LLMRequest,
    LLMResponse,
    ProviderError,
    Usage,
    logprobs_of,
    status_error,
)
from plait.providers.http import current_session, get_session
from plait.providers.ratelimits import ReportedLimits, openai_limits
from plait.providers.scoring import LabelPriors, score_labels
from plait.resources.config import EndpointConfig
from plait.structured import json_schema_format

__all__ = ["OpenAIProvider"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: The most alternatives per token OpenAI lists (``top_logprobs``).
OPENAI_TOP_LOGPROBS = 20


class OpenAIProvider:
    """Sends `LLMRequest`s to one OpenAI-compatible endpoint (one attempt per `send`)."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self.url, basic = _endpoint_url(config.base_url or DEFAULT_BASE_URL, "chat/completions")
        self.embeddings_url, _ = _endpoint_url(config.base_url or DEFAULT_BASE_URL, "embeddings")
        #: What messages show: credentials in the URL are hidden.
        self.shown_url = redact_url(self.url)
        # Built once as aiohttp's own header type, which it copies from without the
        # conversion a plain dict gets on every request.
        self._headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
        key = config.resolved_api_key()
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        elif basic:
            register(basic)
            self._headers["Authorization"] = f"Basic {basic}"
        self._timeout = aiohttp.ClientTimeout(total=config.timeout)
        #: Content-free label priors measured for ``"calibrated"`` label calls.
        self._priors = LabelPriors()

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.config.model!r}, url={self.shown_url!r})"

    def _payload(self, request: LLMRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": request.messages}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if self.config.service_tier is not None:
            body["service_tier"] = self.config.service_tier
        if request.cache_key is not None and self.config.prompt_caching:
            body["prompt_cache_key"] = request.cache_key
        if request.response_format is not None:
            body["response_format"] = json_schema_format(request.response_format)
        body.update(request.extra)
        if body.get("n", 1) != 1:
            raise ProviderError(
                f"n={body['n']!r}: plait reads one reply per request, so the other choices "
                "would be lost; use LLMInference(n=...) for several samples"
            )
        return body

    #: Takes embedding requests (``LLMRequest.embed``), on the endpoint's ``/embeddings``.
    embeds = True

    def send(self, request: LLMRequest) -> Coroutine[Any, Any, LLMResponse]:
        """Send ``request`` once (`plait.providers.base.Provider.send`).

        Returns:
            The coroutine of the attempt itself: a plain def, so a call's await chain
                (stepped again at each of its suspensions) has no frame here.
        """
        if request.embed:
            return self._send_embedding(request)
        if request.label_method is not None and request.label_method != "grammar":
            return self._send_scored(request)
        return self._send(request)

    async def _send_scored(self, request: LLMRequest) -> LLMResponse:
        """A label chosen by log-probability (`plait.labels`); the schema request
        (an ``enum``) when the endpoint lists no label among its alternatives."""
        labels = label_choices(request.response_format)
        if labels is None:
            raise ProviderError(
                f"label_method={request.label_method!r} needs a response_format of labels"
            )
        return await score_labels(
            self._send,
            request,
            labels,
            request.label_method or "logprob",
            top_k=OPENAI_TOP_LOGPROBS,
            priors=self._priors,
            fallback=lambda: self._send(replace(request, label_method="grammar")),
        )

    async def _send(self, request: LLMRequest) -> LLMResponse:
        # One coroutine for the whole attempt (every frame of a call's await chain is
        # stepped again at each of its suspensions), and the session looked up without
        # one when this loop already has it.
        data = _dumps(self._payload(request))
        session = current_session() or await get_session()
        try:
            async with session.post(
                self.url, data=data, headers=self._headers, timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                limits = openai_limits(resp.headers)
                if resp.status != 200:
                    raise _http_error(resp.status, raw, resp.headers.get("Retry-After"), limits)
        except _TRANSPORT_ERRORS as exc:
            raise self.transport_error(exc) from exc
        response = self.reply(_loads_or_none(raw), raw)
        response.limits = limits
        return response

    async def _post(self, url: str, data: bytes) -> tuple[bytes, ReportedLimits | None]:
        """One POST of ``data``: the body of a 200 reply and the limits its headers
        report, else the `ProviderError` its status or the transport's failure makes.
        (`_send` does the same exchange inline: a chat call's await chain is stepped
        again at every suspension, and it is the path every call takes.)"""
        session = current_session() or await get_session()
        try:
            async with session.post(
                url, data=data, headers=self._headers, timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                limits = openai_limits(resp.headers)
                if resp.status != 200:
                    raise _http_error(resp.status, raw, resp.headers.get("Retry-After"), limits)
        except _TRANSPORT_ERRORS as exc:
            raise self.transport_error(exc) from exc
        return raw, limits

    async def _send_embedding(self, request: LLMRequest) -> LLMResponse:
        """Every message's text embedded in one request; ``parsed`` is their vectors."""
        texts = [str(message.get("content", "")) for message in request.messages]
        data = _dumps({"model": self.config.model, "input": texts, **request.extra})
        raw, limits = await self._post(self.embeddings_url, data)
        body = _loads_or_none(raw)
        try:
            rows = sorted(body["data"], key=lambda row: row["index"])
            vectors = [[float(x) for x in row["embedding"]] for row in rows]
        except (TypeError, KeyError, ValueError) as exc:
            raise ProviderError(
                f"{redact_url(self.embeddings_url)} answered without embeddings "
                f"({type(exc).__name__}: {exc}): is {self.config.model!r} an embedding model?"
            ) from None
        if len(vectors) != len(texts):
            raise ProviderError(
                f"{redact_url(self.embeddings_url)} answered {len(vectors)} embedding(s) for "
                f"{len(texts)} text(s)"
            )
        tokens = body.get("usage", {}).get("prompt_tokens", 0) if isinstance(body, dict) else 0
        response = LLMResponse(
            # The vectors as JSON: what a cache or checkpoint keeps of a reply is its text.
            text=json.dumps(vectors, separators=(",", ":")),
            parsed=vectors,
            usage=Usage(prompt_tokens=int(tokens or 0)),
            model=str(body.get("model", self.config.model)),
        )
        response.limits = limits  # an embedding model's own limits, learned as a chat's
        return response

    def transport_error(self, exc: BaseException) -> ProviderError:
        """A failure to reach the endpoint (a refused or dropped connection, a timeout),
        as the retryable `ProviderError` every request to it raises."""
        if isinstance(exc, TimeoutError):
            message = f"request to {self.shown_url} timed out after {self.config.timeout} s"
            return ProviderError(message, retryable=True, transport="timeout")
        detail = f"{type(exc).__name__}: {scrub(str(exc))}"
        message = f"connection to {self.shown_url} failed: {detail}"
        return ProviderError(message, retryable=True, transport="connection")

    def reply(self, body: Any, raw: bytes) -> LLMResponse:
        """A chat completion's JSON ``body`` (None: ``raw`` was not JSON) as an
        `LLMResponse`: the online reply's and a batch result line's, read alike."""
        try:
            if body is None:
                raise ValueError("not JSON")
            choice = body["choices"][0]
            text = choice["message"].get("content") or ""
            usage = body.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            used = Usage(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                cache_read_tokens=int(details.get("cached_tokens") or 0),
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ProviderError(f"malformed reply from {self.shown_url}: {raw[:200]!r}") from exc
        served = body.get("service_tier") or self.config.service_tier
        return LLMResponse(
            text=text,
            usage=used,
            model=str(body.get("model") or self.config.model),
            finish_reason=choice.get("finish_reason"),
            tier="flex" if served == "flex" else "standard",
            logprobs=logprobs_of(choice) or None if "logprobs" in choice else None,
        )


#: What aiohttp raises when the endpoint cannot be reached or does not answer in time.
_TRANSPORT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)


def _loads_or_none(raw: bytes) -> Any:
    try:
        return _loads(raw)
    except ValueError:
        return None


#: What orjson must refuse (so `_dumps` falls back to `json`, which refuses them too)
#: rather than write in forms of its own: a request carries what `json` can send.
_ORJSON_REFUSE = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME


def _dumps(body: dict[str, Any]) -> bytes:
    """``body`` as JSON: orjson's (a few times cheaper than ``json.dumps``, and the
    request's JSON is on every call's path), or ``json``'s for what orjson refuses
    (integers beyond 64 bits, keys that are not text), raising as ``json`` does."""
    try:
        return orjson.dumps(body, option=_ORJSON_REFUSE)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(body).encode()


def _loads(raw: bytes) -> Any:
    """A reply's JSON: orjson's parse, or ``json``'s where orjson is stricter (lone
    surrogate escapes, integers beyond 64 bits), so what parsed before still does."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _endpoint_url(base_url: str, route: str) -> tuple[str, str | None]:
    """The URL of ``route`` under ``base_url``, and the basic-auth token of the
    credentials the URL held (None without).

    The route goes at the end of the path, before the query, so a query the server
    needs on every request (Azure's ``?api-version=``) is kept; the credentials are
    taken out of the URL because aiohttp refuses a URL with them next to an
    Authorization header, and a server that wants them reads that header anyway.
    """
    parts = urlsplit(base_url)
    path = f"{parts.path.rstrip('/')}/{route}"
    basic = None
    netloc = parts.netloc
    if "@" in netloc:
        netloc = netloc.rpartition("@")[2]
        user = unquote(parts.username or "")
        password = unquote(parts.password or "")
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
    return urlunsplit((parts.scheme, netloc, path, parts.query, "")), basic


def _http_error(
    status: int, raw: bytes, retry_after: str | None, limits: ReportedLimits | None = None
) -> ProviderError:
    message = raw[:500].decode(errors="replace")
    code = None
    try:
        parsed = json.loads(raw)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            message = str(parsed["error"].get("message") or message)
            code = str(parsed["error"].get("code") or "") or None
    except ValueError:
        pass
    return status_error(status, message, retry_after, code, limits)
