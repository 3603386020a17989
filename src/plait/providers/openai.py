"""OpenAI-compatible chat completions over aiohttp.

Speaks to OpenAI and to every server that copies its API (vLLM, SGLang, Ollama,
llama.cpp's server, LM Studio).  aiohttp rather than the official SDK: we measured
the SDK at ~7x the client CPU per call, and on two cores client CPU is what caps
throughput.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp

from plait.providers.base import LLMRequest, LLMResponse, ProviderError, Usage
from plait.providers.http import get_session
from plait.resources.config import EndpointConfig
from plait.structured import parse_reply, schema_for, schema_name

__all__ = ["OpenAIProvider"]

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIProvider:
    """Sends `LLMRequest`s to one OpenAI-compatible endpoint, with retries."""

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        base = (config.base_url or DEFAULT_BASE_URL).rstrip("/")
        self.url = f"{base}/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        key = config.resolved_api_key()
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        self._timeout = aiohttp.ClientTimeout(total=config.timeout)

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.config.model!r}, url={self.url!r})"

    def _payload(self, request: LLMRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": request.messages}
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.response_format is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": schema_name(request.response_format),
                    "schema": schema_for(request.response_format),
                },
            }
        body.update(request.extra)
        return body

    async def complete(self, request: LLMRequest) -> LLMResponse:
        data = json.dumps(self._payload(request)).encode()
        attempts = 0
        while True:
            attempts += 1
            try:
                response = await self._post(data)
            except ProviderError as exc:
                if not exc.retryable or attempts > self.config.max_retries:
                    raise
                await asyncio.sleep(_backoff(attempts, exc.retry_after))
                continue
            response.attempts = attempts
            if request.response_format is not None:
                response.parsed = parse_reply(request.response_format, response.text)
            return response

    async def _post(self, data: bytes) -> LLMResponse:
        session = await get_session()
        try:
            async with session.post(
                self.url, data=data, headers=self._headers, timeout=self._timeout
            ) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise _http_error(resp.status, raw, resp.headers.get("Retry-After"))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise ProviderError(
                f"connection to {self.url} failed: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        except TimeoutError as exc:
            raise ProviderError(
                f"request to {self.url} timed out after {self.config.timeout} s", retryable=True
            ) from exc
        try:
            body = json.loads(raw)
            choice = body["choices"][0]
            text = choice["message"].get("content") or ""
            usage = body.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ProviderError(f"malformed reply from {self.url}: {raw[:200]!r}") from exc
        return LLMResponse(
            text=text,
            usage=Usage(
                int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
            ),
            model=str(body.get("model") or self.config.model),
            finish_reason=choice.get("finish_reason"),
        )


def _http_error(status: int, raw: bytes, retry_after: str | None) -> ProviderError:
    message = raw[:500].decode(errors="replace")
    try:
        parsed = json.loads(raw)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            message = str(parsed["error"].get("message") or message)
    except ValueError:
        pass
    delay: float | None = None
    if retry_after is not None:
        try:
            delay = float(retry_after)
        except ValueError:
            delay = None
    return ProviderError(
        f"HTTP {status}: {message}",
        status=status,
        retryable=status in _RETRYABLE_STATUS,
        retry_after=delay,
    )


def _backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, 60.0)
    base: float = min(0.25 * 2.0 ** (attempt - 1), 8.0)
    return base * (0.5 + random.random())
