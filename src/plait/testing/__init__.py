"""Fake OpenAI and Anthropic servers on 127.0.0.1, to test pipelines without a paid endpoint.

plait's own test suite runs against them.  `FakeOpenAIServer` speaks the
OpenAI Chat Completions API (and its Batch API and embeddings), `FakeAnthropicServer`
the Anthropic Messages API (and its Message Batches and prompt cache).  Each
runs in a child process; replies are a pure function of the request (a chat
request is answered ``[SYSTEM PROMPT] USER TEXT``, a schema with a minimal
instance of it), and faults, latency and rate limits are injected on demand
(`FakeOpenAIServer.configure`, or directives in a message such as
``[[status:429]]``).  From a shell, ``python -m plait.testing.fake_openai --port
8000`` serves until interrupted (``python -m plait.testing.fake_anthropic``
likewise).

The controlling helpers defined here use only the standard library, so that
importing ``plait.testing`` stays cheap.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import IO, Any, ClassVar, Final, Literal, Self

__all__ = [
    "ANTHROPIC_API_KEY_ENV",
    "ANTHROPIC_READY_PREFIX",
    "API_KEY_ENV",
    "BATCH_CONFIG_DEFAULTS",
    "PLACEHOLDER_PATTERN",
    "READY_PREFIX",
    "FakeAnthropicServer",
    "FakeOpenAIServer",
    "find_placeholder",
    "take_placeholder_requests",
]

READY_PREFIX: Final = "PLAIT_FAKE_OPENAI_READY"
"""The start of the line the fake OpenAI server prints on stdout once it accepts connections.

The whole line is ``PLAIT_FAKE_OPENAI_READY port=8000``: wait for it before sending."""

API_KEY_ENV: Final = "PLAIT_FAKE_OPENAI_API_KEY"
"""The environment variable the fake OpenAI server reads the API key it requires from.

Unset, any key is accepted.  An environment variable keeps the key out of ``ps`` output."""

ANTHROPIC_READY_PREFIX: Final = "PLAIT_FAKE_ANTHROPIC_READY"
"""The fake Anthropic server's counterpart of `READY_PREFIX`."""

ANTHROPIC_API_KEY_ENV: Final = "PLAIT_FAKE_ANTHROPIC_API_KEY"
"""The fake Anthropic server's counterpart of `API_KEY_ENV`."""

BATCH_CONFIG_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "batch_turnaround_s": 0.2,
        "batch_max_requests": 50_000,
        "batch_max_bytes": 200 * 1024 * 1024,
        "batch_item_fail_rate": 0.0,
        "batch_expire": False,
        "batch_expire_fraction": 0.5,
        "batch_fail_validation": False,
        "batch_gate": None,
        "batch_create_gate": None,
        "batch_content_gate": None,
        "batch_validate_on_upload": True,
    }
)
"""The fake OpenAI server's batch settings as it starts.

``configure(**BATCH_CONFIG_DEFAULTS)`` puts them back; ``plait.testing.fake_batches``
says what each one does."""

_STARTUP_TIMEOUT_S: Final = 30.0
_STOP_TIMEOUT_S: Final = 10.0
_HTTP_TIMEOUT_S: Final = 30.0
# The server package's parent directory, so the child can import plait even when the parent
# process only found it through sys.path manipulation rather than an installed distribution.
_SRC_DIR: Final = str(Path(__file__).resolve().parents[2])

# Loopback traffic must never be routed through an HTTP proxy configured in the environment.
_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Control calls made by the placeholder bookkeeping: short, because a test's teardown waits.
_PLACEHOLDER_TIMEOUT_S: Final = 5.0


# -- tracing placeholders --------------------------------------------------------------------

PLACEHOLDER_PATTERN: Final = re.compile(
    r"[\ue000\ue001]"  # the tracer's private-use delimiters, as characters
    r"|\\u[eE]00[01]"  # ... or as the escape text json.dumps / repr() leave behind
    r"|(?:<|\\u003[cC])traced output of "  # what older tracers rendered
)
"""Text that only a tracing placeholder produces, to catch requests sent too early.

A request containing it was sent with a not-yet-computed output standing in for
real text, which is always a bug in the client."""

_EXCERPT_CHARS: Final = 80


def find_placeholder(body: bytes | str) -> dict[str, str] | None:
    """Where a tracing placeholder appears in a request body: a sign of a client bug.

    A placeholder is plait's stand-in for an output not computed yet; a request
    that carries one was sent too early.  Both fake servers check every request
    with this.

    Args:
        body: The request body, JSON or not.

    Returns:
        None when the body holds no placeholder; else ``{"where": ...,
            "excerpt": ...}``, ``where`` the JSON path of the string that holds it
            (``$.messages[1].content``, a key...) or ``"body"`` when the body is
            not JSON, ``excerpt`` the text around it with the placeholder's
            invisible characters spelled out as escapes.

    Examples:
        >>> from plait.testing import find_placeholder
        >>> print(find_placeholder(b'{"messages": [{"content": "hello"}]}'))
        None
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    match = PLACEHOLDER_PATTERN.search(text)
    if match is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"where": "body", "excerpt": _excerpt(text, match.start())}
    found = _find_in_json(parsed, "$")
    if found is not None:
        return found
    # Only reachable when the match straddles JSON syntax; still a placeholder's debris.
    return {"where": "body", "excerpt": _excerpt(text, match.start())}


def _find_in_json(node: Any, path: str) -> dict[str, str] | None:
    if isinstance(node, str):
        match = PLACEHOLDER_PATTERN.search(node)
        if match is not None:
            return {"where": path, "excerpt": _excerpt(node, match.start())}
        return None
    if isinstance(node, dict):
        for key, value in node.items():
            found = _find_in_json(key, f"{path} (key {key!r})")
            if found is None:
                found = _find_in_json(value, f"{path}.{key}")
            if found is not None:
                return found
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found = _find_in_json(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def _excerpt(text: str, at: int) -> str:
    start = max(at - _EXCERPT_CHARS, 0)
    piece = text[start : at + _EXCERPT_CHARS]
    piece = piece.replace("\ue000", "\\ue000").replace("\ue001", "\\ue001")
    piece = piece.replace("\x1f", "\\x1f")
    prefix = "..." if start > 0 else ""
    suffix = "..." if at + _EXCERPT_CHARS < len(text) else ""
    return f"{prefix}{piece}{suffix}"


#: Fake servers running now; a test harness asks each of them for placeholder requests.
_live_servers: weakref.WeakSet[_FakeServerProcess] = weakref.WeakSet()
#: Placeholder requests collected from servers as they stopped, not yet taken.
_stopped_hits: list[dict[str, Any]] = []
_hits_lock = threading.Lock()


def take_placeholder_requests() -> list[dict[str, Any]]:
    """The requests with a tracing placeholder the fake servers received, for a harness to fail on.

    Covers the servers running now and those stopped since the last call, oldest
    server first; taking them marks them as reported.  ``reset()`` does not clear
    these, so a test cannot hide one by resetting a server's statistics.  plait's
    own suite calls this after every test and fails the test when the list is
    not empty.

    Returns:
        Each request's record (``where``, ``excerpt``, ``endpoint``, ``model``,
            ``seq``) plus ``server``, naming the server that received it.
    """
    with _hits_lock:
        hits = list(_stopped_hits)
        _stopped_hits.clear()
    for server in sorted(_live_servers, key=lambda s: s._started_seq):
        hits.extend(server._take_new_placeholders())
    return hits


_start_counter = itertools.count(1)


class _FakeServerProcess:
    """Runs one of the fake servers in a child process and talks to its control endpoints.

    A separate process keeps the server's event loop and CPU use apart from the code under test,
    which matters when the server is used to measure client-side concurrency. Subclasses name
    the module to run and the conventions it follows; the process handling is shared.
    """

    _module: ClassVar[str]
    _ready_prefix: ClassVar[str]
    _api_key_env: ClassVar[str]
    _label: ClassVar[str]
    """How error messages name the server, e.g. ``"fake OpenAI server"``."""

    def __init__(self, *, api_key: str | None = None) -> None:
        self._api_key = api_key
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._stdout_thread: threading.Thread | None = None
        self._stderr_path: str | None = None
        self._final_stderr = ""
        self._placeholders_taken = 0
        """``seq`` of the last placeholder record handed out by `take_placeholder_requests`."""
        self._final_placeholders: list[dict[str, Any]] = []
        self._started_seq = 0
        self.returncode: int | None = None
        """Exit status of the child after :meth:`stop`; 0 means it shut down cleanly."""

    # -- lifecycle -------------------------------------------------------------------------

    def _extra_args(self) -> list[str]:
        """Command-line options beyond ``--port``."""
        return []

    def start(self) -> Self:
        """Start the server in a child process and wait until it accepts connections.

        ``with server:`` starts it and stops it at the end of the block.  A
        started server is returned as it is.

        Returns:
            The server, for chaining.

        Raises:
            RuntimeError: The server exited, or did not become ready in 30 s; the
                message quotes its stderr.
        """
        if self._proc is not None:
            return self
        cmd = [sys.executable, "-m", self._module, "--port", "0", *self._extra_args()]
        env = dict(os.environ)
        env.pop(self._api_key_env, None)
        if self._api_key is not None:
            env[self._api_key_env] = self._api_key
        pythonpath = env.get("PYTHONPATH")
        env["PYTHONPATH"] = _SRC_DIR if not pythonpath else _SRC_DIR + os.pathsep + pythonpath

        # stderr goes to a file rather than a pipe: nobody drains it while tests run, and a pipe
        # that fills up would stall the server. The file is read by path (a fresh file offset),
        # so reading it never disturbs where the child appends.
        slug = self._module.rpartition(".")[2].replace("_", "-")
        fd, self._stderr_path = tempfile.mkstemp(prefix=f"plait-{slug}-", suffix=".stderr")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=fd, env=env
            )
        except BaseException:
            os.close(fd)
            self._discard_stderr_file()
            raise
        os.close(fd)
        self._proc = proc
        self.returncode = None

        lines: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        self._stdout_thread = threading.Thread(
            target=_pump_stdout,
            args=(proc.stdout, lines, self._ready_prefix),
            name=f"{slug}-stdout",
            daemon=True,
        )
        self._stdout_thread.start()

        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = lines.get(timeout=max(remaining, 0.0)) if remaining > 0 else None
            except queue.Empty:
                line = None
            if line is None:
                exited = proc.poll() is not None
                self.stop()
                reason = "exited" if exited else f"did not become ready in {_STARTUP_TIMEOUT_S}s"
                raise RuntimeError(
                    f"{self._label} {reason} (exit status {self.returncode}); "
                    f"stderr:\n{self._final_stderr}"
                )
            if line.startswith(self._ready_prefix):
                self._port = int(line.split("port=", 1)[1])
                self._placeholders_taken = 0
                self._final_placeholders = []
                self._started_seq = next(_start_counter)
                _live_servers.add(self)
                return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL if it lingers); safe to call repeatedly.

        Its exit status is then in ``returncode``.
        """
        proc = self._proc
        if proc is None:
            return
        if self._port is not None and proc.poll() is None:
            # Ask for placeholder requests before the process (and its memory) is gone.
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                self._final_placeholders = self._fetch_placeholders()
            unreported = self._take_new_placeholders(self._final_placeholders)
            if unreported:
                with _hits_lock:
                    _stopped_hits.extend(unreported)
        _live_servers.discard(self)
        self._proc = None
        self._port = None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.returncode = proc.returncode
        if self._stdout_thread is not None:
            self._stdout_thread.join(timeout=_STOP_TIMEOUT_S)
            self._stdout_thread = None
        if proc.stdout is not None:
            proc.stdout.close()
        self._final_stderr = self.stderr_output()
        self._discard_stderr_file()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stderr_output(self) -> str:
        """What the server logged, to debug a test.

        Returns:
            Everything it wrote to stderr so far (or in total, once stopped).
        """
        if self._stderr_path is None:
            return self._final_stderr
        try:
            return Path(self._stderr_path).read_bytes().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return self._final_stderr

    def _discard_stderr_file(self) -> None:
        if self._stderr_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._stderr_path)
            self._stderr_path = None

    # -- addresses -------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The server process's id (to pin it to a CPU, or watch its CPU time)."""
        if self._proc is None:
            raise RuntimeError("the server is not running; call start() first")
        return self._proc.pid

    @property
    def port(self) -> int:
        """The port it listens on, on 127.0.0.1 (it raises RuntimeError before `start`)."""
        if self._port is None:
            raise RuntimeError(f"the {self._label} is not running; call start() first")
        return self._port

    # -- control endpoints -----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """What the server received since the last `reset`, for a test's assertions.

        Returns:
            Its statistics (``requests_total``, ``status_counts``, ``max_in_flight``,
                each request's record in ``requests``...).
        """
        return self._as_dict(self._call("GET", "/_stats"))

    def placeholder_requests(self) -> list[dict[str, Any]]:
        """Every request since start whose body held a tracing placeholder (a client bug).

        Unlike the statistics, ``reset()`` does not clear this list.  After `stop` it
        still answers, from what the server reported as it stopped.

        Returns:
            The requests' records, oldest first.
        """
        if self._port is None:
            return list(self._final_placeholders)
        return self._fetch_placeholders()

    def _fetch_placeholders(self) -> list[dict[str, Any]]:
        answer = self._as_dict(self._call("GET", "/_placeholders", timeout=_PLACEHOLDER_TIMEOUT_S))
        records = answer.get("requests")
        if not isinstance(records, list):
            raise RuntimeError(f"{self._label} /_placeholders returned no request list")
        return [dict(record) for record in records if isinstance(record, dict)]

    def _take_new_placeholders(
        self, records: list[dict[str, Any]] | None = None
    ) -> list[dict[str, Any]]:
        """Placeholder requests not taken before (from ``records``, else asked of the
        server), each labelled with this server."""
        port = self._port
        if records is None:
            if port is None:
                records = self._final_placeholders
            else:
                try:
                    records = self._fetch_placeholders()
                except (OSError, RuntimeError, ValueError):
                    # A server that no longer answers cannot report; one that crashed shows
                    # up in its own test through the failed requests.
                    return []
        new = [r for r in records if _seq(r) > self._placeholders_taken]
        self._placeholders_taken = max([self._placeholders_taken, *map(_seq, new)])
        where = f"{self._label} on port {port}" if port is not None else self._label
        return [{"server": where, **record} for record in new]

    def reset(self) -> None:
        """Forget what the server received and restore its default settings, between tests."""
        self._call("POST", "/_reset", {})

    def _call(
        self, method: str, path: str, body: Any = None, timeout: float = _HTTP_TIMEOUT_S
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with _OPENER.open(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            detail = err.read().decode("utf-8", errors="replace")
            err.close()
            if err.code == 400:
                raise ValueError(f"{self._label} rejected {path}: {detail}") from None
            raise RuntimeError(f"{self._label} {path} failed ({err.code}): {detail}") from None

    def _as_dict(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise RuntimeError(f"{self._label} returned {type(value).__name__}, expected object")
        return value


class FakeOpenAIServer(_FakeServerProcess):
    """A fake OpenAI-compatible server on 127.0.0.1, to test a pipeline with no paid endpoint.

    It runs in a child process (``with FakeOpenAIServer() as server:`` starts and
    stops it) and answers a chat request with ``[SYSTEM PROMPT] USER TEXT``, a
    request with a JSON schema with a minimal instance of it, so replies are
    predictable.  Faults and latency are injected with `configure` (``rate_429``,
    ``rate_500``, ``latency_ms``...) or by a directive in the last user message
    (``[[status:429]]``, ``[[latency_ms:250]]``, ``[[reply:any text]]``,
    ``[[gate:NAME]]`` to hold a request until `open_gate`); `stats` tells what it
    received.  It also speaks OpenAI's Batch API (``batch_*`` settings, `batches`)
    and embeddings.

    Args:
        latency_ms: Added to every reply.
        api_key: The key the server requires (None: any key).
        seed: Seeds the server's random stream (injected faults, sampling).
        rpm_limit: Enforce a requests-per-window limit, stated on every reply
            in OpenAI's rate-limit headers (a 429 with Retry-After beyond it).
            ``configure(rpm_limit=..., tpm_limit=..., limit_window_s=...)``
            changes the limits later (``limit_retry_after=False``: refusals say
            when to come back only in the reset headers), and
            ``stats()["rate_limit"]["refused"]`` counts the refusals.
        tpm_limit: Enforce a tokens-per-window limit likewise.
        limit_window_s: The limits' window, in seconds.

    Examples:
        ```python
        import plait
        from plait.testing import FakeOpenAIServer

        with FakeOpenAIServer() as server:
            endpoint = {
                "model": "gpt-4o-mini",
                "base_url": server.base_url,
                "api_key": "sk-test",
                "max_retries": 0,
            }
            resources = plait.ResourceConfig({"fast": endpoint})
            llm = plait.LLMInference("fast", "Be brief.").bind(resources=resources)
            print(llm.run_sync("Hello"))  # [Be brief.] Hello
            server.configure(rate_500=1.0)  # from now on every request fails with a 500
            print(llm.run_sync(["Hello again"]))  # the input's error Value
            print(server.stats()["status_counts"])  # {'200': 1, '500': 1}
        ```
    """

    _module = "plait.testing.fake_openai"
    _ready_prefix = READY_PREFIX
    _api_key_env = API_KEY_ENV
    _label = "fake OpenAI server"

    def __init__(
        self,
        *,
        latency_ms: float = 0.0,
        api_key: str | None = None,
        seed: int = 0,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
        limit_window_s: float = 60.0,
    ) -> None:
        super().__init__(api_key=api_key)
        self._latency_ms = latency_ms
        self._seed = seed
        self._limits = (rpm_limit, tpm_limit, limit_window_s)

    def _extra_args(self) -> list[str]:
        return [
            "--host",
            "127.0.0.1",
            "--latency-ms",
            repr(float(self._latency_ms)),
            "--seed",
            str(int(self._seed)),
            *_limit_args(*self._limits),
        ]

    def stats(self, *, bodies: bool = False) -> dict[str, Any]:
        """What the server received since the last `reset`, for a test's assertions.

        Args:
            bodies: Also give each request record the request's JSON body as
                ``"body"`` (what the client sent, messages and all).

        Returns:
            Its statistics: ``requests_total``, ``status_counts``,
                ``max_in_flight``, ``rate_limit``, each request's record in
                ``requests``...
        """
        path = "/_stats?bodies=1" if bodies else "/_stats"
        return self._as_dict(self._call("GET", path))

    def batches(self) -> dict[str, Any]:
        """What the Batch API received since the last `reset`, for a batch run's tests.

        Returns:
            ``{"batches_created", "files_uploaded", "batch_requests_total",
                "batch_lines_answered", "batches": [...], "custom_ids": {...},
                "api_calls": {...}}``: ``batches`` in creation order (each with
                ``id``, ``status``, ``requests``, ``request_counts``...),
                ``custom_ids`` counting every line of every created batch, so a
                test can check that no request was submitted twice.
        """
        return self._as_dict(self._call("GET", "/_batches"))

    def submitted_twice(self) -> dict[str, int]:
        """The batch requests submitted more than once since the last `reset` (paid twice).

        Returns:
            Custom id -> times submitted, for those submitted more than once.
        """
        counts = self.batches()["custom_ids"]
        return {custom_id: n for custom_id, n in counts.items() if n > 1}

    @property
    def base_url(self) -> str:
        """What an OpenAI client expects as ``base_url`` (includes the ``/v1`` prefix)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def configure(self, **config: Any) -> dict[str, Any]:
        """Change the server's behaviour for the next requests: faults, latency, limits, batches.

        `reset` restores every default.

        Args:
            **config: Settings to change, such as ``latency_ms``, ``jitter_ms``,
                ``rate_429``, ``rate_500``, ``rate_timeout``, ``rate_drop`` (the
                share of requests that fail so), ``rate_stall`` with ``stall_s``
                (the share answered that many seconds late), ``retry_after_s``,
                ``answer_like_demos`` (answer as the demonstration next to the
                input), ``gate_texts``, ``reply_headers``, ``rpm_limit``,
                ``tpm_limit`` and the ``batch_*`` settings (see
                `BATCH_CONFIG_DEFAULTS`).

        Returns:
            The server's whole configuration after the change.

        Raises:
            ValueError: The server rejects a setting (an unknown key, a bad value).
        """
        return self._as_dict(self._call("POST", "/_config", config))

    # -- gates: hold requests in flight until the test says so ----------------------------
    def open_gate(self, name: str) -> None:
        """Release every request held at a gate, and let later ones through.

        Args:
            name: The gate (``[[gate:NAME]]`` in a message, or ``gate_texts``).
        """
        self._call("POST", "/_gate", {"open": name})

    def close_gate(self, name: str) -> None:
        """Make later requests for a gate wait there again (an opened gate stays open otherwise).

        Args:
            name: The gate.
        """
        self._call("POST", "/_gate", {"close": name})

    def parked(self, name: str) -> int:
        """How many requests wait at a gate right now.

        Args:
            name: The gate.

        Returns:
            The number of requests held there.
        """
        parked = self._as_dict(self._call("GET", "/_gate")).get("parked", {})
        return int(parked.get(name, 0))

    def wait_parked(self, name: str, count: int, timeout: float = 60.0) -> None:
        """Wait until requests are held at a gate: a test waits for a state, never for time.

        Args:
            name: The gate.
            count: How many requests must wait there.
            timeout: Seconds after which a hang becomes a failure (a slow machine
                only makes the wait longer).

        Raises:
            AssertionError: ``count`` requests never waited there within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        seen = self.parked(name)
        while seen < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{count} request(s) never waited at gate {name!r} of the {self._label} "
                    f"(still {seen} after {timeout:g} s)"
                )
            time.sleep(0.005)
            seen = self.parked(name)


def _limit_args(rpm: int | None, tpm: int | None, window_s: float) -> list[str]:
    args = ["--limit-window-s", repr(float(window_s))]
    if rpm is not None:
        args += ["--rpm-limit", str(int(rpm))]
    if tpm is not None:
        args += ["--tpm-limit", str(int(tpm))]
    return args


class FakeAnthropicServer(_FakeServerProcess):
    """A fake Anthropic Messages API on 127.0.0.1, to test a pipeline with no paid endpoint.

    It runs in a child process (``with FakeAnthropicServer() as server:``) and
    answers as `FakeOpenAIServer` does.  Without ``api_key`` it accepts any
    ``x-api-key``, but still requires one, as the real API does.  It also speaks
    the Message Batches API and keeps prompt-cache books for blocks marked
    ``cache_control``; `configure` steers both, `batches` and ``stats()`` show
    what happened, and ``reset()`` forgets requests, batches and cache entries and
    restores the default settings.

    Args:
        api_key: The key the server requires (None: any key).
        rpm_limit: Enforce a requests-per-window limit, stated in Anthropic's
            ``anthropic-ratelimit-*`` headers (resets as RFC 3339 times).
        tpm_limit: Enforce a tokens-per-window limit likewise.
        limit_window_s: The limits' window, in seconds.

    Examples:
        ```python
        import plait
        from plait.testing import FakeAnthropicServer

        with FakeAnthropicServer() as server:
            endpoint = {
                "provider": "anthropic",
                "model": "claude-sonnet-4-5",
                "base_url": server.base_url,
                "api_key": "sk-test",
            }
            resources = plait.ResourceConfig({"smart": endpoint})
            llm = plait.LLMInference("smart", "Be brief.").bind(resources=resources)
            print(llm.run_sync("Hello"))  # [Be brief.] Hello
            print(server.stats()["requests_total"])  # 1
        ```
    """

    _module = "plait.testing.fake_anthropic"
    _ready_prefix = ANTHROPIC_READY_PREFIX
    _api_key_env = ANTHROPIC_API_KEY_ENV
    _label = "fake Anthropic server"

    def __init__(
        self,
        *,
        api_key: str | None = None,
        rpm_limit: int | None = None,
        tpm_limit: int | None = None,
        limit_window_s: float = 60.0,
    ) -> None:
        super().__init__(api_key=api_key)
        self._limits = (rpm_limit, tpm_limit, limit_window_s)

    def _extra_args(self) -> list[str]:
        return _limit_args(*self._limits)

    @property
    def base_url(self) -> str:
        """What the Anthropic SDK expects as ``base_url``: it appends ``/v1/messages`` itself."""
        return f"http://127.0.0.1:{self.port}"

    def configure(
        self,
        *,
        batch_turnaround_s: float | None = None,
        batch_item_fail_rate: float | None = None,
        batch_expire: bool | None = None,
        batch_expire_fraction: float | None = None,
        batch_max_requests: int | None = None,
        batch_max_bytes: int | None = None,
        batch_gate_open: bool | None = None,
        batch_create_gate_open: bool | None = None,
        batch_results_gate_open: bool | None = None,
        batch_results_order: Literal["submitted", "reversed", "shuffled"] | None = None,
        batch_params_validation: Literal["create", "results"] | None = None,
        seed: int | None = None,
        cache_min_tokens: int | None = None,
        cache_clock_offset_s: float | None = None,
        reply_headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Change the settings given (the others stay), for the next requests and batches.

        ``reset()`` restores every default.

        Args:
            batch_turnaround_s: How long a batch stays in processing before it
                ends (default 0.2).
            batch_item_fail_rate: Chance that a batched request ends ``errored``
                (``api_error``), drawn from the server's random stream (default 0).
            batch_expire: Batches end with ``batch_expire_fraction`` of their
                requests (rounded up, the last submitted) ``expired`` (default False).
            batch_expire_fraction: The share that expires (default 0.5).
            batch_max_requests: The most requests in one batch (default 100,000).
            batch_max_bytes: The most bytes in one batch (default 256 MiB).
            batch_gate_open: While False no batch ends, not even a canceled one
                (see `close_batch_gate`; default True).
            batch_create_gate_open: While False a batch creation waits after
                making the batch, before it answers (``batches()["held"]`` counts
                them; default True).
            batch_results_gate_open: While False a results download waits before
                it answers (default True).
            batch_results_order: The order of a batch's results file:
                ``"submitted"`` (default), ``"reversed"`` or ``"shuffled"``.
            batch_params_validation: ``"create"`` (default): invalid params refuse
                the whole batch with 400; ``"results"``: the batch is accepted and
                those requests get ``errored`` results.
            seed: Restarts the server's random stream (default 0).
            cache_min_tokens: Shorter prefixes are not cached (default 1024).
            cache_clock_offset_s: Seconds added to the prompt cache's clock (see
                `advance_cache_clock`; default 0).
            reply_headers: Headers added, as given, to every reply of
                ``/v1/messages`` (default none).

        Returns:
            The server's whole configuration after the change.

        Raises:
            ValueError: The server refuses a value.
        """
        given = {
            "batch_turnaround_s": batch_turnaround_s,
            "batch_item_fail_rate": batch_item_fail_rate,
            "batch_expire": batch_expire,
            "batch_expire_fraction": batch_expire_fraction,
            "batch_max_requests": batch_max_requests,
            "batch_max_bytes": batch_max_bytes,
            "batch_gate_open": batch_gate_open,
            "batch_create_gate_open": batch_create_gate_open,
            "batch_results_gate_open": batch_results_gate_open,
            "batch_results_order": batch_results_order,
            "batch_params_validation": batch_params_validation,
            "seed": seed,
            "cache_min_tokens": cache_min_tokens,
            "cache_clock_offset_s": cache_clock_offset_s,
            "reply_headers": reply_headers,
        }
        changes = {key: value for key, value in given.items() if value is not None}
        return self._as_dict(self._call("POST", "/_config", changes))

    def config(self) -> dict[str, Any]:
        """The server's current settings.

        Returns:
            Every setting `configure` takes, with its value.
        """
        return self._as_dict(self._call("GET", "/_config"))

    def batches(self) -> dict[str, Any]:
        """What the Message Batches API received since the last ``reset()``, for batch tests.

        Returns:
            ``batches_total``, ``requests_total``, ``bytes_total``,
                ``status_counts`` (processing status -> batches), ``result_counts``
                (result type -> requests), ``rejected`` (creations refused),
                ``calls`` (route -> calls), ``order`` (batch ids, oldest first),
                ``custom_ids`` (custom_id -> times submitted), ``cache``
                (``read_tokens``, ``write_tokens``) and ``batches`` (batch id ->
                its counts, status and items).
        """
        return self._as_dict(self._call("GET", "/_batches"))

    def close_batch_gate(self) -> None:
        """Hold every batch in processing (``in_progress`` or ``canceling``) from now on.

        A test can then act while batches are in flight (interrupt the run, say);
        `open_batch_gate` lets them end.
        """
        self.configure(batch_gate_open=False)

    def open_batch_gate(self) -> None:
        """Let held batches end (those whose turnaround has passed end at once)."""
        self.configure(batch_gate_open=True)

    def advance_cache_clock(self, seconds: float) -> None:
        """Move the prompt cache's clock forward, to test expiry without waiting.

        Args:
            seconds: How far: ``301`` expires the ``5m`` entries not used since,
                ``3601`` the ``1h`` ones too.
        """
        offset = float(self.config()["cache_clock_offset_s"])
        self.configure(cache_clock_offset_s=offset + seconds)


def _seq(record: dict[str, Any]) -> int:
    """A placeholder record's number on its server (1 for the first)."""
    seq = record.get("seq")
    return seq if isinstance(seq, int) else 0


def _pump_stdout(stream: IO[bytes], lines: queue.Queue[str | None], ready_prefix: str) -> None:
    """Forward stdout lines until READY, then keep draining so the child can never block."""
    ready = False
    for raw in iter(stream.readline, b""):
        if not ready:
            line = raw.decode("utf-8", errors="replace").strip()
            lines.put(line)
            ready = line.startswith(ready_prefix)
    lines.put(None)
