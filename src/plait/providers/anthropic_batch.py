"""Anthropic's Message Batches: many Messages requests in one, at half the price.

The wire half of a batch run for the ``anthropic`` provider (`plait.resources.batching`
keeps the queue, the ledger and the polling), through the official SDK's
``messages.batches``.  Each item's ``params`` are what `AnthropicProvider` sends
online, with the prompt-cache breakpoint kept for an hour (a batch's requests may be
answered an hour apart), and each result is read by the same
`AnthropicProvider._response`.

Anthropic keeps no metadata on a batch, so `find` (a run killed while submitting
asks whether its batch got through) matches the batches created since the run
recorded its intent by their request count; the custom ids in the results then
confirm it, and a call whose id is not among them is submitted again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from plait._jsonl import loads
from plait.providers.anthropic import AnthropicProvider
from plait.providers.base import BatchStatus, LLMRequest, LLMResponse, ProviderError
from plait.providers.openai import _dumps
from plait.resources.config import EndpointConfig

__all__ = ["AnthropicBatchAPI"]

#: Anthropic's limits per batch: 100,000 requests and 256 MB.
MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
#: Result types another batch may answer (an expired request was never run).
_RETRYABLE = frozenset({"expired"})


class AnthropicBatchAPI:
    """One Anthropic model's Message Batches (`plait.providers.base.BatchAPI`)."""

    def __init__(self, config: EndpointConfig) -> None:
        self.provider = AnthropicProvider(config)
        self.max_requests = min(config.batch_max_requests or MAX_REQUESTS, MAX_REQUESTS)
        self.max_bytes = min(config.batch_max_bytes or MAX_BYTES, MAX_BYTES)

    def line(self, custom_id: str, request: LLMRequest) -> bytes:
        params = self.provider._params(request, cache_ttl="1h")
        params.update(params.pop("extra_body", None) or {})  # the raw body, as the SDK sends it
        return _dumps({"custom_id": custom_id, "params": params})

    async def submit(self, lines: list[bytes], token: str) -> str:
        import anthropic

        client = await self.provider._client()
        requests: Any = [loads(line) for line in lines]
        try:
            batch = await client.messages.batches.create(requests=requests)
        except anthropic.AnthropicError as exc:
            raise self.provider.error(exc, client) from exc
        return str(batch.id)

    async def find(self, token: str, since: float, size: int) -> str | None:
        """Not by ``token`` (Anthropic keeps none): the newest batch created since
        ``since`` with ``size`` requests."""
        import anthropic

        client = await self.provider._client()
        try:
            async for batch in client.messages.batches.list(limit=100):
                if batch.created_at.timestamp() < since:
                    return None  # newest first: the rest are older
                counts = batch.request_counts
                total = (
                    counts.processing
                    + counts.succeeded
                    + counts.errored
                    + counts.canceled
                    + counts.expired
                )
                if total == size:
                    return str(batch.id)
        except anthropic.AnthropicError as exc:
            raise self.provider.error(exc, client) from exc
        return None

    async def status(self, batch_id: str) -> BatchStatus:
        import anthropic

        client = await self.provider._client()
        try:
            batch = await client.messages.batches.retrieve(batch_id)
        except anthropic.AnthropicError as exc:
            raise self.provider.error(exc, client) from exc
        counts = batch.request_counts
        done = counts.succeeded + counts.errored + counts.canceled + counts.expired
        return BatchStatus(
            ended=batch.processing_status == "ended",
            state=batch.processing_status,
            done=done,
            total=done + counts.processing,
            files=(batch_id,),
        )

    async def results(
        self, status: BatchStatus
    ) -> AsyncIterator[tuple[str, LLMResponse | ProviderError]]:
        import anthropic

        client = await self.provider._client()
        try:
            decoder = await client.messages.batches.results(status.files[0])
            async for item in decoder:
                yield item.custom_id, self._outcome(item.result)
        except anthropic.AnthropicError as exc:
            raise self.provider.error(exc, client) from exc

    async def cancel(self, batch_id: str) -> None:
        import anthropic

        client = await self.provider._client()
        try:
            await client.messages.batches.cancel(batch_id)
        except anthropic.AnthropicError as exc:
            raise self.provider.error(exc, client) from exc

    def _outcome(self, result: Any) -> LLMResponse | ProviderError:
        kind = result.type
        if kind == "succeeded":
            reply = self.provider._response(result.message, None)
            reply.tier = "batch"
            return reply
        if kind == "errored":
            error = result.error.error
            return ProviderError(
                f"batch item failed ({error.type}): {error.message}",
                retryable=error.type in ("api_error", "overloaded_error", "rate_limit_error"),
            )
        return ProviderError(f"batch item {kind}", retryable=kind in _RETRYABLE)
