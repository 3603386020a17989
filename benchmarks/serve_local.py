"""plait's embedded model behind an OpenAI-compatible HTTP server, on loopback only.

For comparisons with other frameworks (``benchmarks/dspy_learning.py``): they send
their chat requests here, and each runs on plait's own in-process runtime with the
settings plait's default local alias uses (`plait.resources.manager.LOCAL_DEFAULT`:
the packaged SmolLM2-135M-Instruct, ``max_concurrent=4`` parallel slots, prompt
caching on, the same context length, threads and flash-attention setting), built by
`plait.providers.local.LocalProvider` exactly as a plait call's request is (its
``max_tokens`` default and clamp, ``cache_prompt``, streamed from the runtime so a
client that goes away stops its generation).

Endpoints:

* ``POST /v1/chat/completions``: OpenAI's chat completions, non-streaming or
  ``"stream": true`` (server-sent events).  ``n`` must be 1.  Fields other than
  ``messages``, ``model``, ``temperature``, ``max_tokens`` (or
  ``max_completion_tokens``) and the streaming ones (``stop``, ``seed``,
  ``response_format``, ``logprobs``...) are passed to llama.cpp as plait passes an
  alias's extra arguments.
* ``GET /v1/models``: the one model.
* ``GET /stats``: requests received, completed and failed, prompt, cached and
  completion tokens, requests in flight.  Counters only grow: a client diffs two reads.

Started by hand or as a benchmark's subprocess::

    .venv/bin/python benchmarks/serve_local.py [--port 0] [--ready-file F] [--exit-on-stdin-eof]

The model is loaded before the server listens; then the chosen port is written to
``--ready-file`` (atomically: the file appears whole) and the line
``serving http://127.0.0.1:PORT/v1`` is printed, so a parent can wait on either.
With ``--exit-on-stdin-eof`` the server stops when its standard input closes, so a
parent that gives it a pipe never leaves it running, however the parent ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from plait.providers.base import LLMRequest, LLMResponse, ProviderError
from plait.providers.local import LocalProvider, _load, _models, slots_for
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.resources.manager import LOCAL_DEFAULT

#: Request fields the server handles itself; every other one goes to the runtime.
_OWN_FIELDS = frozenset(
    {"messages", "model", "temperature", "max_tokens", "max_completion_tokens", "n"}
    | {"stream", "stream_options"}
)


@dataclass
class Stats:
    """What the server has done since it started."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


STATS: web.AppKey[Stats] = web.AppKey("stats", Stats)
PROVIDER: web.AppKey[LocalProvider] = web.AppKey("provider", LocalProvider)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def _request_of(body: dict[str, Any]) -> LLMRequest:
    """The OpenAI request ``body`` as the `LLMRequest` a plait call would make."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    temperature = body.get("temperature")
    extra = {k: v for k, v in body.items() if k not in _OWN_FIELDS and v is not None}
    return LLMRequest(
        alias="served",
        messages=messages,
        temperature=None if temperature is None else float(temperature),
        max_tokens=None if budget is None else int(budget),
        extra=extra,
    )


class _Generation:
    """One request running on the runtime, its pieces handed to the event loop."""

    def __init__(self, provider: LocalProvider, request: LLMRequest) -> None:
        self.provider = provider
        self.body = provider._body(request)
        self.stop = threading.Event()
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.pieces: list[dict[str, Any]] = []
        self.done: asyncio.Future[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        model = _models[self.provider._key]

        def on_piece(piece: Any) -> bool:
            if isinstance(piece, dict):
                loop.call_soon_threadsafe(self.queue.put_nowait, piece)
            return self.stop.is_set()

        def generate() -> None:
            try:
                model.server.handle_chat_completions(self.body, on_piece)
            finally:
                loop.call_soon_threadsafe(self.queue.put_nowait, None)

        self.done = loop.run_in_executor(model.workers, generate)

    async def next_piece(self) -> dict[str, Any] | None:
        piece = await self.queue.get()
        if piece is not None:
            self.pieces.append(piece)
        return piece


def _completion(reply: LLMResponse, created: int, ident: str) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": reply.text},
        "finish_reason": reply.finish_reason or "stop",
    }
    if reply.logprobs:
        choice["logprobs"] = {"content": reply.logprobs}
    usage = reply.usage
    return {
        "id": ident,
        "object": "chat.completion",
        "created": created,
        "model": reply.model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        },
    }


def _count(stats: Stats, reply: LLMResponse) -> None:
    stats.completed += 1
    stats.prompt_tokens += reply.usage.prompt_tokens
    stats.cached_tokens += reply.usage.cache_read_tokens
    stats.completion_tokens += reply.usage.completion_tokens


async def chat_completions(request: web.Request) -> web.StreamResponse:
    stats = request.app[STATS]
    provider = request.app[PROVIDER]
    stats.requests += 1
    try:
        body = await request.json()
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        if int(body.get("n") or 1) != 1:
            raise ValueError("only n=1 is supported")
        llm_request = _request_of(body)
    except (ValueError, TypeError) as exc:
        stats.failed += 1
        return _error(400, str(exc))
    generation = _Generation(provider, llm_request)
    stats.in_flight += 1
    try:
        generation.start()
        if body.get("stream"):
            return await _stream(request, generation, body)
        while await generation.next_piece() is not None:
            pass
        reply = provider._response(generation.pieces)
        _count(stats, reply)
        ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        return web.json_response(_completion(reply, int(time.time()), ident))
    except ProviderError as exc:
        stats.failed += 1
        return _error(500, str(exc), "server_error")
    except BaseException:
        generation.stop.set()  # the client went away: stop at the next token
        stats.failed += 1
        raise
    finally:
        stats.in_flight -= 1


async def _stream(
    request: web.Request, generation: _Generation, body: dict[str, Any]
) -> web.StreamResponse:
    """Relays the runtime's pieces as server-sent events, as OpenAI's API streams them."""
    stats = request.app[STATS]
    provider = request.app[PROVIDER]
    first = await generation.next_piece()
    if first is not None:
        provider._response([first])  # an error before any text is an HTTP error
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    piece = first
    while piece is not None:
        if "error" in piece:
            await response.write(f"data: {json.dumps(piece)}\n\n".encode())
            break
        out = dict(piece)
        out["model"] = provider.model_name
        if not want_usage and not out.get("choices") and out.get("usage"):
            piece = await generation.next_piece()
            continue  # the usage-only last piece, which this client did not ask for
        if not want_usage:
            out.pop("usage", None)
        await response.write(f"data: {json.dumps(out)}\n\n".encode())
        piece = await generation.next_piece()
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    try:
        _count(stats, provider._response(generation.pieces))
    except ProviderError:
        stats.failed += 1
    return response


async def models(request: web.Request) -> web.Response:
    name = request.app[PROVIDER].model_name
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "plait"}]}
    )


async def stats_view(request: web.Request) -> web.Response:
    return web.json_response(asdict(request.app[STATS]))


def make_app(config: EndpointConfig) -> web.Application:
    """The server's app for ``config`` (a ``provider="local"`` alias); loads the model."""
    provider = LocalProvider(config)
    _load(provider.model_path, config.context_length, slots_for(config))
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[STATS] = Stats()
    app[PROVIDER] = provider
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats_view)
    return app


def _stop_at_stdin_eof(stop: asyncio.Event) -> None:
    """Sets ``stop`` when standard input closes: a parent that holds the other end of
    the pipe ends the server by exiting, however it exits."""
    loop = asyncio.get_running_loop()

    def wait() -> None:
        sys.stdin.buffer.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait, name="stdin-eof", daemon=True).start()


async def serve(
    app: web.Application, port: int, ready_file: Path | None, stdin_eof: bool = False
) -> None:
    stop = asyncio.Event()
    if stdin_eof:
        _stop_at_stdin_eof(stop)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    chosen = int(runner.addresses[0][1])
    if ready_file is not None:
        partial = ready_file.with_name(ready_file.name + ".part")
        partial.write_text(f"{chosen}\n")
        os.replace(partial, ready_file)
    print(f"serving http://127.0.0.1:{chosen}/v1", flush=True)
    try:
        await stop.wait()  # until the process is stopped, or stdin closes
    finally:
        await runner.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0: a free port (the default)")
    parser.add_argument("--ready-file", type=Path, help="written with the port once serving")
    parser.add_argument("--model-path", help="a .gguf file (default: the packaged model)")
    parser.add_argument("--slots", type=int, default=LOCAL_DEFAULT.max_concurrent)
    parser.add_argument(
        "--no-prompt-caching",
        action="store_true",
        help="compute every prompt whole (the alias setting prompt_caching = false)",
    )
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop when standard input closes (a parent's pipe: the server dies with it)",
    )
    args = parser.parse_args()
    config = LOCAL_DEFAULT.model_copy(
        update={
            "model_path": args.model_path,
            "max_concurrent": args.slots,
            "prompt_caching": not args.no_prompt_caching,
        }
    )
    try:
        app = make_app(config)
    except (ConfigurationError, ProviderError) as exc:
        print(f"serve_local: {exc}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(app, args.port, args.ready_file, args.exit_on_stdin_eof))
    return 0


if __name__ == "__main__":
    sys.exit(main())
