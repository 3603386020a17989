"""Demonstrations ranked by an embedding alias: the similarities a pool's call needs.

A pool chosen from per input (`plait.knn_demos`) with ``embed="alias"`` shows each
call the pairs whose inputs' embeddings are nearest the call's own input.  The
embeddings are LLM calls like any other: an `LLMRequest` with ``embed=True`` goes
down the one call path (`CallSite.invoke`), so every handler sees it (a cache
answers it on the next run, ``record`` keeps it, a budget prices it, a mock answers
it in tests) and the alias's limits and retries hold.

What it costs: the pool's inputs are embedded once per run and alias (in requests
of up to `CHUNK` texts, shared by every call that needs them, concurrent ones
included), and each call's input once.  A pool no bigger than ``k`` is shown whole
and embeds nothing.  The pool's requests belong to the run, not to the input that
happened to ask first: handlers see them with input index `SHARED_INPUT` at node
``embed:<alias>``, so a checkpoint replays them after a restart whichever input
asks for them then (nothing completed is paid twice).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from plait.demos import demo_text
from plait.execution.calls import RAW_REPLY, CallSite
from plait.providers.base import LLMRequest, LLMResponse
from plait.values import ExecutionError, ValueKind

__all__ = ["CHUNK", "SHARED_INPUT", "PoolEmbeddings", "cosine", "embed_texts"]

#: Texts per embedding request (OpenAI takes up to 2,048 inputs; smaller requests
#: retry more cheaply and fit servers with lower limits).
CHUNK = 256
#: The input index the pool's embedding requests carry: they serve every input.
SHARED_INPUT = -1


class PoolEmbeddings:
    """A run's embeddings of pool inputs, by alias and text: each fetched once, the
    fetch shared by every call that waits for it."""

    def __init__(self) -> None:
        self._vectors: dict[tuple[str, str], asyncio.Future[list[float]]] = {}

    async def similarities(
        self, site: CallSite, alias: str, pool: Sequence[dict[str, Any]], text: str
    ) -> list[float]:
        """Each pool pair's cosine similarity to ``text``, embedded on ``alias``."""
        inputs = [demo_text(pair["input"]) for pair in pool]
        vectors, (query,) = await asyncio.gather(
            self.vectors(site, alias, inputs), embed_texts(site, alias, [text])
        )
        return [cosine(query, vector) for vector in vectors]

    async def vectors(self, site: CallSite, alias: str, texts: Sequence[str]) -> list[list[float]]:
        """The embeddings of ``texts``, fetching only those no call has asked for yet."""
        loop = asyncio.get_running_loop()
        missing = list(dict.fromkeys(t for t in texts if (alias, t) not in self._vectors))
        chunks = [missing[i : i + CHUNK] for i in range(0, len(missing), CHUNK)]
        for chunk in chunks:
            futures = [loop.create_future() for _ in chunk]
            for text, future in zip(chunk, futures, strict=True):
                self._vectors[(alias, text)] = future
            shared = CallSite(
                site.name,
                site.resources,
                run=site.run,
                index=SHARED_INPUT,
                node_id=f"embed:{alias}",
                priority=site.priority,
            )
            task = asyncio.ensure_future(self._fetch(shared, alias, chunk, futures))
            task.add_done_callback(_consume)
        # Taken now: a fetch that fails forgets its futures (so a later call asks again).
        # Shielded: one caller cancelled (its input's run gave up) leaves the fetch to
        # the others waiting for it.
        waiting = [asyncio.shield(self._vectors[(alias, text)]) for text in texts]
        return list(await asyncio.gather(*waiting))

    async def _fetch(
        self,
        site: CallSite,
        alias: str,
        chunk: list[str],
        futures: list[asyncio.Future[list[float]]],
    ) -> None:
        try:
            vectors = await embed_texts(site, alias, chunk)
        except asyncio.CancelledError:
            self._forget(alias, chunk, futures)
            for future in futures:
                future.cancel()
            raise
        except Exception as exc:
            # Forgotten, so a later call asks again rather than inheriting the failure.
            self._forget(alias, chunk, futures)
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: a failure nobody awaits is not logged
            return
        for future, vector in zip(futures, vectors, strict=True):
            if not future.done():
                future.set_result(vector)

    def _forget(
        self, alias: str, chunk: list[str], futures: list[asyncio.Future[list[float]]]
    ) -> None:
        for text, future in zip(chunk, futures, strict=True):
            if self._vectors.get((alias, text)) is future:
                del self._vectors[(alias, text)]


def _consume(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


async def embed_texts(site: CallSite, alias: str, texts: Sequence[str]) -> list[list[float]]:
    """``texts`` embedded on ``alias`` in one request down the call path; a failed
    request raises `ExecutionError` naming the alias and its cause."""
    request = LLMRequest(
        alias=alias, messages=[{"role": "user", "content": text} for text in texts], embed=True
    )
    value = await site.invoke(request)
    if value.kind is ValueKind.ERROR:
        raise ExecutionError(value)
    reply: Any = value.meta.get(RAW_REPLY, value.payload)
    if isinstance(reply, LLMResponse):
        reply = reply.parsed
    return _checked_vectors(reply, alias, len(texts))


def _checked_vectors(reply: Any, alias: str, count: int) -> list[list[float]]:
    """``reply`` as ``count`` vectors of one length, or a ValueError saying what came."""
    if (
        not isinstance(reply, list)
        or len(reply) != count
        or not all(isinstance(v, list) and v for v in reply)
    ):
        shape = f"{len(reply)} item(s)" if isinstance(reply, list) else type(reply).__name__
        raise ValueError(
            f"alias {alias!r} answered an embedding request for {count} text(s) with {shape}, "
            "not one vector (a list of numbers) per text"
        )
    vectors = [[float(x) for x in vector] for vector in reply]
    if len({len(v) for v in vectors}) > 1:
        raise ValueError(f"alias {alias!r} answered embeddings of different lengths")
    return vectors


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (0 when either is all zeros)."""
    if len(a) != len(b):
        raise ValueError(
            f"embeddings of different lengths ({len(a)} and {len(b)}): the pool and the "
            "input were embedded by different models; one embedding alias must rank a pool"
        )
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norms if norms else 0.0
