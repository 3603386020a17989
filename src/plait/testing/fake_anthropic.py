"""A fake of Anthropic's Messages API, so the Anthropic provider is tested over real HTTP.

Run as ``python -m plait.testing.fake_anthropic --port 0``; it listens on 127.0.0.1 only and,
once it accepts connections, prints ``PLAIT_FAKE_ANTHROPIC_READY port=<port>`` on stdout. Tests
normally drive it through :class:`plait.testing.FakeAnthropicServer`.

Replies are a pure function of the request, so tests can predict them:

* the text echoes the last user message, prefixed with ``[<system prompt>] `` when there is one,
  and is cut to ``max_tokens`` (``stop_reason`` ``"max_tokens"``);
* a ``tool_choice`` that forces a tool yields a ``tool_use`` block whose input is a minimal
  instance of the tool's ``input_schema`` (the same one the OpenAI fake builds);
* ``[[status:NNN]]`` in the last user message answers with that error status, in the API's own
  error shape; a 429 carries ``retry-after: RETRY_AFTER_S``.

``GET /_stats`` lists the requests received (bodies only: credentials are never kept) with the
status each got, so tests can check how a client mapped its request; ``POST /_reset`` clears it.

A request whose body holds a tracing placeholder (see :func:`plait.testing.find_placeholder`)
is answered as usual but recorded; ``GET /_placeholders`` and the statistics'
``placeholder_requests`` list them, and ``POST /_reset`` does not clear them, because the test
harness fails any test that sent one.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any, Final

from aiohttp import web

from plait.testing import ANTHROPIC_API_KEY_ENV, ANTHROPIC_READY_PREFIX
from plait.testing.fake_openai import PlaceholderLog, estimate_tokens, schema_instance

__all__ = ["RETRY_AFTER_S", "FakeAnthropicApp", "main"]

RETRY_AFTER_S: Final = 2
"""The ``retry-after`` header (seconds) of an injected 429."""

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


class _BadRequest(Exception):
    """A request the real API would refuse with 400; the message goes back to the client."""


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    kind = _ERROR_TYPES.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return web.json_response(body, status=status, headers=headers)


def _text_of(content: Any, where: str) -> str:
    """The text of a string or of a list of content blocks (non-text blocks count for nothing)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _BadRequest(f"{where}: Input should be a valid string or list of content blocks")
    texts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _BadRequest(f"{where}.{i}: each content block needs a type")
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise _BadRequest(f"{where}.{i}.text: Field required")
            texts.append(block["text"])
    return "".join(texts)


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


class FakeAnthropicApp:
    """The handlers and what they share; one instance per server process."""

    def __init__(self, *, api_key: str | None = None) -> None:
        self._key = api_key.encode() if api_key else None
        self._records: list[dict[str, Any]] = []
        self._messages = 0
        # Requests that carried a tracing placeholder: never cleared, not even by /_reset.
        self.placeholders_seen = PlaceholderLog("fake Anthropic server")

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_get("/_stats", self.stats)
        app.router.add_post("/_reset", self.reset)
        app.router.add_get("/_placeholders", self.placeholders)
        return app

    async def stats(self, request: web.Request) -> web.Response:
        counts: dict[str, int] = {}
        for record in self._records:
            counts[str(record["status"])] = counts.get(str(record["status"]), 0) + 1
        return web.json_response(
            {
                "requests_total": len(self._records),
                "status_counts": counts,
                "requests": self._records,
                "placeholder_requests": list(self.placeholders_seen.records),
                "placeholder_requests_total": self.placeholders_seen.total,
            }
        )

    async def placeholders(self, request: web.Request) -> web.Response:
        return web.json_response(self.placeholders_seen.as_dict())

    async def reset(self, request: web.Request) -> web.Response:
        self._records = []
        return web.json_response({"reset": True})

    async def messages(self, request: web.Request) -> web.Response:
        record: dict[str, Any] = {"status": 0, "body": None}
        self._records.append(record)
        response = await self._answer(request, record)
        record["status"] = response.status
        return response

    async def _answer(self, request: web.Request, record: dict[str, Any]) -> web.Response:
        raw = await request.read()
        self.placeholders_seen.check(raw, request.path)
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
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        record["body"] = body
        try:
            return self._reply(body)
        except _BadRequest as err:
            return _error(400, str(err))

    def _reply(self, body: dict[str, Any]) -> web.Response:
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
        system = body.get("system")
        system_text = None if system is None else _text_of(system, "system")

        chars = len(system_text or "")
        last_user = ""
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ("user", "assistant"):
                raise _BadRequest(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            text = _text_of(message.get("content"), f"messages.{i}.content")
            chars += len(text)
            if role == "user":
                last_user = text
        tool = _forced_tool(body)

        directive = _STATUS_DIRECTIVE.search(last_user)
        if directive is not None:
            status = int(directive.group(1))
            if status == 429:
                return _error(
                    429,
                    "Number of requests has exceeded your rate limit (injected by the fake).",
                    {"retry-after": str(RETRY_AFTER_S)},
                )
            if 400 <= status <= 599:
                return _error(status, f"Injected failure with HTTP status {status}.")
            raise _BadRequest(f"[[status:{status}]]: only 400-599 can be injected")

        self._messages += 1
        if tool is not None:
            try:
                value = schema_instance(tool["input_schema"])
            except ValueError as err:
                raise _BadRequest(f"tools.input_schema: {err}") from None
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_fake_{self._messages}",
                "name": tool["name"],
                "input": value,
            }
            output_chars, stop_reason = len(json.dumps(value)), "tool_use"
        else:
            text = last_user if system_text is None else f"[{system_text}] {last_user}"
            stop_reason = "end_turn"
            if estimate_tokens(len(text)) > max_tokens:
                text, stop_reason = text[: max_tokens * 4], "max_tokens"
            block = {"type": "text", "text": text}
            output_chars = len(text)
        return web.json_response(
            {
                "id": f"msg_fake_{self._messages}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [block],
                "stop_reason": stop_reason,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": estimate_tokens(chars),
                    "output_tokens": estimate_tokens(output_chars),
                },
            }
        )


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
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"invalid port {args.port}")
    api_key = args.api_key or os.environ.get(ANTHROPIC_API_KEY_ENV) or None
    asyncio.run(_serve(args.port, FakeAnthropicApp(api_key=api_key)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
