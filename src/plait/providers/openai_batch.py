"""OpenAI's Batch API: a file of requests in, a file of replies out, at half the price.

The wire half of a batch run (`plait.resources.batching` keeps the queue, the ledger
and the polling): upload the requests as JSON lines (``POST /files``, purpose
``batch``), create the batch (``POST /batches``) with plait's token for it in its
``metadata``, read its status, and download its output and error files.  Any server
that copies this API (and plait's fake, `plait.testing`) is spoken to alike.

Each line is the same chat-completions body `OpenAIProvider` would send online, and
each result line is read by the same `OpenAIProvider.reply`, so a batch-made reply is
the reply the call would have had online.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from plait.providers.base import BatchStatus, LLMRequest, LLMResponse, ProviderError
from plait.providers.http import current_session, get_session
from plait.providers.openai import (
    _TRANSPORT_ERRORS,
    OpenAIProvider,
    _dumps,
    _endpoint_url,
    _http_error,
    _loads,
)
from plait.resources.config import EndpointConfig

__all__ = ["OpenAIBatchAPI"]

#: OpenAI's limits per batch file: 50,000 requests and 200 MB.
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
#: The chat route a line names, as the API wants it (relative to the API root).
_ROUTE = "/v1/chat/completions"
#: The metadata key under which plait records its own name for a batch.
TOKEN_KEY = "plait_batch"
#: Error codes of a line that a later batch may answer (a line of an expired batch
#: was never run; a server error may pass); any other code is the request's own fault.
_RETRYABLE_CODES = frozenset({"batch_expired", "server_error", "internal_error", "timeout"})
_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
#: Why a whole batch may fail and succeed when submitted again later: the queue of
#: batches the organisation may have waiting is full.
_RETRYABLE_BATCH_CODES = frozenset({"token_limit_exceeded", "request_limit_exceeded"})


class OpenAIBatchAPI:
    """One OpenAI-compatible endpoint's Batch API (`plait.providers.base.BatchAPI`)."""

    def __init__(self, config: EndpointConfig) -> None:
        self.provider = OpenAIProvider(config)
        base = config.base_url or "https://api.openai.com/v1"
        self.files_url, _ = _endpoint_url(base, "files")
        self.batches_url, _ = _endpoint_url(base, "batches")
        self.max_requests = min(config.batch_max_requests or MAX_REQUESTS, MAX_REQUESTS)
        self.max_bytes = min(config.batch_max_bytes or MAX_BYTES, MAX_BYTES)
        self.window = config.batch_completion_window
        self.shown_url = self.provider.shown_url

    def line(self, custom_id: str, request: LLMRequest) -> bytes:
        if request.label_method not in (None, "grammar"):
            raise ProviderError(
                f"label_method={request.label_method!r} scores labels from a reply's "
                "log-probabilities, one request at a time, which a batch cannot do: run "
                "without --batch-api, or use label_method='grammar' (an enum schema)"
            )
        body = self.provider._payload(request)
        body.pop("service_tier", None)  # a batch is its own tier
        return _dumps({"custom_id": custom_id, "method": "POST", "url": _ROUTE, "body": body})

    async def submit(self, lines: list[bytes], token: str) -> str:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field(
            "file",
            b"\n".join(lines) + b"\n",
            filename=f"{token}.jsonl",
            content_type="application/jsonl",
        )
        uploaded = await self._call("POST", self.files_url, data=form)
        body = {
            "input_file_id": uploaded["id"],
            "endpoint": _ROUTE,
            "completion_window": self.window,
            "metadata": {TOKEN_KEY: token},
        }
        created = await self._call("POST", self.batches_url, data=_dumps(body), json_body=True)
        return str(created["id"])

    async def find(self, token: str, since: float, size: int) -> str | None:
        after: str | None = None
        while True:
            url = f"{self.batches_url}?limit=100" + (f"&after={after}" if after else "")
            page = await self._call("GET", url)
            for batch in page.get("data") or []:
                if (batch.get("metadata") or {}).get(TOKEN_KEY) == token:
                    return str(batch["id"])
                if float(batch.get("created_at") or 0) < since:
                    return None  # newest first: everything after this is older
            if not page.get("has_more") or not page.get("data"):
                return None
            after = str(page["data"][-1]["id"])

    async def status(self, batch_id: str) -> BatchStatus:
        batch = await self._call("GET", f"{self.batches_url}/{batch_id}")
        state = str(batch.get("status") or "")
        problem, retryable = None, False
        if state == "failed":
            errors = (batch.get("errors") or {}).get("data") or []
            problem = "; ".join(str(e.get("message") or e.get("code")) for e in errors) or state
            codes = {str(e.get("code")) for e in errors}
            retryable = bool(codes) and codes <= _RETRYABLE_BATCH_CODES
        counts = batch.get("request_counts") or {}
        return BatchStatus(
            ended=state in _ENDED,
            state=state,
            done=int(counts.get("completed") or 0) + int(counts.get("failed") or 0),
            total=int(counts.get("total") or 0),
            problem=problem,
            problem_retryable=retryable,
            files=tuple(
                str(batch[name]) for name in ("output_file_id", "error_file_id") if batch.get(name)
            ),
        )

    async def results(
        self, status: BatchStatus
    ) -> AsyncIterator[tuple[str, LLMResponse | ProviderError]]:
        for file_id in status.files:
            raw = await self._call("GET", f"{self.files_url}/{file_id}/content", raw=True)
            for line in raw.splitlines():
                if line.strip():
                    yield self._outcome(_loads(line))

    async def cancel(self, batch_id: str) -> None:
        await self._call("POST", f"{self.batches_url}/{batch_id}/cancel")

    def _outcome(self, item: dict[str, Any]) -> tuple[str, LLMResponse | ProviderError]:
        custom_id = str(item.get("custom_id"))
        response = item.get("response")
        if isinstance(response, dict):
            status = int(response.get("status_code") or 0)
            body = response.get("body")
            raw = json.dumps(body).encode()
            if status != 200:
                return custom_id, _http_error(status, raw, None)
            try:
                reply = self.provider.reply(body, raw)
            except ProviderError as exc:
                return custom_id, exc
            reply.tier = "batch"
            return custom_id, reply
        error = item.get("error") or {}
        code = str(error.get("code") or "error")
        message = str(error.get("message") or code)
        return custom_id, ProviderError(
            f"batch item failed ({code}): {message}", retryable=code in _RETRYABLE_CODES
        )

    async def _call(
        self, method: str, url: str, *, data: Any = None, json_body: bool = False, raw: bool = False
    ) -> Any:
        session = current_session() or await get_session()
        headers = dict(self.provider._headers)
        if not json_body:
            headers.pop("Content-Type", None)  # multipart, or no body: aiohttp sets it
        try:
            async with session.request(
                method, url, data=data, headers=headers, timeout=self.provider._timeout
            ) as resp:
                content = await resp.read()
                if resp.status != 200:
                    raise _http_error(resp.status, content, resp.headers.get("Retry-After"))
        except _TRANSPORT_ERRORS as exc:
            raise self.provider.transport_error(exc) from exc
        if raw:
            return content
        try:
            return _loads(content)
        except ValueError as exc:
            raise ProviderError(
                f"malformed reply from {self.shown_url}: {content[:200]!r}"
            ) from exc
