"""Drive a headless Chromium through the Chrome DevTools Protocol, for the site's test.

Why the DevTools Protocol over aiohttp's websocket client rather than Playwright:
aiohttp is already one of plait's dependencies, so the browser test adds none; Debian's
``chromium`` is whatever version Debian ships, while each Playwright release drives the
one Chromium build it pins (and would fetch its own builds and a Node driver, which
this machine's network refuses); and the few commands the test needs (navigate, click,
type, evaluate, screenshot, and the console, log and network events) are the protocol's
stable core.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from tests.page_runner import stop_group

CHROMIUM: Final = Path("/usr/bin/chromium")
"""Debian's Chromium (``apt-get install chromium``); nothing is downloaded at run time."""

FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--window-size=1400,1000",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)
"""Headless, no sandbox (CI runs as root), nothing that would reach outside this
machine (updates, sync, QUIC probes), and DevTools on a loopback port it picks."""

WAIT_S: Final = 60.0
"""How long a wait for the page's own state may last before it is a failure."""


class BrowserError(AssertionError):
    """The browser did not get where the test expected: the message says where."""


@dataclass
class Problem:
    """A console error, an uncaught exception, a failed request or one leaving the site."""

    kind: str
    text: str
    page: str

    def __str__(self) -> str:
        return f"{self.kind} on {self.page}: {self.text}"


@dataclass
class Tab:
    """One page target of the browser, attached in flat mode, with its workers."""

    ws: aiohttp.ClientWebSocketResponse
    session: str
    origin: str
    """The only origin the site may load from (anything else is a problem)."""
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _pending: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _urls: dict[str, str] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    location: str = "about:blank"

    async def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send a command (to the page, or to ``session``: a worker) and await its result."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params}
        target = self.session if session is None else session
        if target:
            message["sessionId"] = target
        await self.ws.send_str(json.dumps(message))
        return await asyncio.wait_for(future, WAIT_S)

    def receive(self, message: dict[str, Any]) -> None:
        """Route one message: a command's reply, or an event to record and check."""
        if "id" in message:
            future = self._pending.pop(message["id"], None)
            if future is not None and not future.done():
                if "error" in message:
                    future.set_exception(BrowserError(f"DevTools refused: {message['error']}"))
                else:
                    future.set_result(message.get("result", {}))
            return
        method, params = message.get("method", ""), message.get("params", {})
        self.events.append((message.get("sessionId", ""), method, params))
        self._check(method, params)
        self._changed.set()

    def _check(self, method: str, params: dict[str, Any]) -> None:
        """Turn an event that means something went wrong into a Problem."""
        page = self.location
        if method == "Page.frameNavigated" and not params["frame"].get("parentId"):
            self.location = params["frame"]["url"]
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            self.problems.append(Problem("console error", args, page))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text", "")
            self.problems.append(Problem("uncaught exception", text, page))
        elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
            entry = params["entry"]
            self.problems.append(
                Problem("logged error", f"{entry['text']} {entry.get('url', '')}", page)
            )
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            self._urls[params["requestId"]] = url
            if not url.startswith((self.origin, "data:", "blob:", "about:")):
                self.problems.append(Problem("request off the site", url, page))
        elif method == "Network.responseReceived" and params["response"]["status"] >= 400:
            response = params["response"]
            self.problems.append(
                Problem("failed request", f"{response['status']} {response['url']}", page)
            )
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            url = self._urls.get(params["requestId"], params["requestId"])
            self.problems.append(Problem("failed request", f"{params['errorText']} {url}", page))

    async def watch(self, session: str) -> None:
        """Report what ``session`` (the page or a worker) logs and loads."""
        for domain in ("Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable", session=session)

    async def until(self, what: str, check: Callable[[], Any]) -> Any:
        """Wait until ``check()`` gives something true (re-checked on each event and
        each tenth of a second); fail naming ``what`` after WAIT_S."""
        deadline = time.monotonic() + WAIT_S
        while True:
            value = check()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"waited {WAIT_S:g} s for {what} on {self.location}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 0.1)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited if a promise)."""
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def _loaded_since(self, index: int) -> bool:
        loaded = any(
            method == "Page.loadEventFired" and session == self.session
            for session, method, _ in self.events[index:]
        )
        return loaded and await self.evaluate("document.readyState") == "complete"

    async def goto(self, url: str) -> None:
        index = len(self.events)
        await self.send("Page.navigate", url=url)
        await self.until(f"{url} to load", lambda: self._loaded_since(index))
        self.location = await self.evaluate("location.href")

    async def click(self, selector_js: str, *, navigates: bool) -> None:
        """Click, as a mouse does, the element ``selector_js`` evaluates to."""
        box = await self.evaluate(
            f"""(() => {{
                const el = {selector_js};
                if (!el) return null;
                el.scrollIntoView({{block: "center"}});
                const r = el.getBoundingClientRect();
                return r.width && r.height ? {{x: r.x + r.width / 2, y: r.y + r.height / 2}} : null;
            }})()"""
        )
        if box is None:
            raise BrowserError(f"nothing visible to click: {selector_js} on {self.location}")
        index = len(self.events)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=box["x"],
                y=box["y"],
                button="left",
                clickCount=0 if kind == "mouseMoved" else 1,
            )
        if navigates:
            await self.until("the page clicked to load", lambda: self._loaded_since(index))
            self.location = await self.evaluate("location.href")

    async def type(self, text: str) -> None:
        """Type ``text`` key by key into the focused element."""
        for char in text:
            await self.send("Input.dispatchKeyEvent", type="keyDown", key=char, text=char)
            await self.send("Input.dispatchKeyEvent", type="keyUp", key=char)

    async def screenshot(self, path: Path) -> None:
        shot = await self.send("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))


async def _pump(ws: aiohttp.ClientWebSocketResponse, tab: Tab) -> None:
    async for message in ws:
        if message.type == aiohttp.WSMsgType.TEXT:
            data = json.loads(message.data)
            tab.receive(data)
            if data.get("method") == "Target.attachedToTarget":
                # A worker of the page (the site's search runs in one): report what it
                # logs and loads too, then let it run.
                worker = data["params"]["sessionId"]
                asyncio.get_running_loop().create_task(_watch_worker(tab, worker))


async def _watch_worker(tab: Tab, session: str) -> None:
    with contextlib.suppress(BrowserError, ConnectionError, TimeoutError):
        await tab.watch(session)
        await tab.send("Runtime.runIfWaitingForDebugger", session=session)


def _devtools_url(profile: Path, proc: subprocess.Popen[bytes], log: Path) -> str:
    """The browser's DevTools websocket, from the file Chromium writes once it listens."""
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + WAIT_S
    while not port_file.is_file() or len(port_file.read_text().splitlines()) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise BrowserError(
                f"Chromium did not start (status {proc.poll()}):\n{log.read_text(errors='replace')}"
            )
        time.sleep(0.05)
    port, path = port_file.read_text().splitlines()[:2]
    return f"ws://127.0.0.1:{port}{path}"


@contextlib.asynccontextmanager
async def open_tab(origin: str, profile: Path, log: Path) -> AsyncIterator[Tab]:
    """Start Chromium on a fresh profile, open one tab watched for problems, and stop
    the browser (its whole process group) when done."""
    with open(log, "wb") as sink:
        proc = subprocess.Popen(
            [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = await asyncio.to_thread(_devtools_url, profile, proc, log)
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(url, max_msg_size=0) as ws,
        ):
            tab = Tab(ws, "", origin)
            pump = asyncio.get_running_loop().create_task(_pump(ws, tab))
            try:
                target = await tab.send("Target.createTarget", url="about:blank")
                attached = await tab.send(
                    "Target.attachToTarget", targetId=target["targetId"], flatten=True
                )
                tab.session = attached["sessionId"]
                await tab.send("Page.enable")
                await tab.watch(tab.session)
                await tab.send(
                    "Target.setAutoAttach",
                    autoAttach=True,
                    waitForDebuggerOnStart=True,
                    flatten=True,
                )
                yield tab
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
    finally:
        await asyncio.to_thread(stop_group, proc.pid)
        proc.wait()
