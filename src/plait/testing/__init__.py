"""Test helpers for plait.

The fake servers themselves live in :mod:`plait.testing.fake_openai` (OpenAI-compatible chat
completions, with the Batch API's files and batches from :mod:`plait.testing.fake_batches`) and
:mod:`plait.testing.fake_anthropic` (the Anthropic Messages API), and each runs in its own
process. The controlling helpers are defined here, and deliberately use only the
standard library, so that importing ``plait.testing`` stays cheap and so that running a server
with ``python -m plait.testing.fake_...`` does not import the server module twice.
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
"""Start of the single stdout line the server prints once it accepts connections."""

API_KEY_ENV: Final = "PLAIT_FAKE_OPENAI_API_KEY"
"""Environment variable the server reads its API key from; keeps the key out of ``ps`` output."""

ANTHROPIC_READY_PREFIX: Final = "PLAIT_FAKE_ANTHROPIC_READY"
"""The fake Anthropic server's counterpart of :data:`READY_PREFIX`."""

ANTHROPIC_API_KEY_ENV: Final = "PLAIT_FAKE_ANTHROPIC_API_KEY"
"""The fake Anthropic server's counterpart of :data:`API_KEY_ENV`."""

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
"""The fake OpenAI server's batch settings as it starts (``configure(**BATCH_CONFIG_DEFAULTS)``
puts them back); :mod:`plait.testing.fake_batches` says what each one does."""

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
"""Text that only a tracing placeholder produces: a request containing it was sent with a
not-yet-computed output standing in for real text, which is always a bug in the client."""

_EXCERPT_CHARS: Final = 80


def find_placeholder(body: bytes | str) -> dict[str, str] | None:
    """Where a tracing placeholder appears in a request body, or None if it has none.

    The answer is ``{"where": ..., "excerpt": ...}``: ``where`` is the JSON path of the string
    that holds it (``$.messages[1].content``, ``$.system``, a key, ...) or ``"body"`` when the body
    is not JSON, and ``excerpt`` is the text around it, with the placeholder's invisible
    characters spelled out as escapes.
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
    """Every request with a tracing placeholder that a fake server received and nobody has
    taken yet, oldest server first; taking them marks them as reported.

    Covers the servers running now and those stopped since the last call. Each entry is the
    server's record (``where``, ``excerpt``, ``endpoint``, ``model``, ``seq``) plus ``server``,
    naming the server that received it. ``reset()`` does not clear these, so a test cannot
    hide one by resetting a server's statistics. The test suite calls this after every test
    and fails the test when the list is not empty.
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
        """Spawn the server and block until it reports the port it listens on."""
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
        """Terminate the child (SIGTERM, then SIGKILL if it lingers); safe to call repeatedly."""
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
        """Everything the server wrote to stderr so far (or in total, once stopped)."""
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
        if self._port is None:
            raise RuntimeError(f"the {self._label} is not running; call start() first")
        return self._port

    # -- control endpoints -----------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return self._as_dict(self._call("GET", "/_stats"))

    def placeholder_requests(self) -> list[dict[str, Any]]:
        """Every request since start whose body held a tracing placeholder (oldest first).

        Unlike the statistics, ``reset()`` does not clear this list. After :meth:`stop` it
        still answers, from what the server reported as it stopped.
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
    """The fake OpenAI-compatible server (:mod:`plait.testing.fake_openai`) in a child process.

    Besides chat completions it speaks OpenAI's Batch API (``/v1/files``, ``/v1/batches``; see
    :mod:`plait.testing.fake_batches`): `configure` takes its ``batch_*`` settings, `batches`
    tells what it received, and a batch parked at a gate (``batch_gate``, or a line's
    ``[[gate:NAME]]``) is waited for with `wait_parked` and released with `open_gate`.
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
        """``rpm_limit`` and ``tpm_limit`` make the server enforce a requests/min and
        tokens/min limit in windows of ``limit_window_s`` seconds, and state it on every
        reply in OpenAI's rate-limit headers (a 429 with Retry-After beyond it);
        ``configure(rpm_limit=..., tpm_limit=..., limit_window_s=...)`` changes it
        (``limit_retry_after=False``: refusals say when to come back only in the reset
        headers) and ``stats()["rate_limit"]["refused"]`` counts the refusals."""
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
        """The server's statistics; with ``bodies`` each request record also carries the
        request's JSON body as ``"body"`` (what the client sent, messages and all)."""
        path = "/_stats?bodies=1" if bodies else "/_stats"
        return self._as_dict(self._call("GET", path))

    def batches(self) -> dict[str, Any]:
        """What the Batch API received since the last `reset` (``GET /_batches``).

        ``{"batches_created", "files_uploaded", "batch_requests_total",
        "batch_lines_answered", "batches": [{"id", "seq", "status", "requests",
        "input_bytes", "input_file_id", "metadata", "request_counts"}, ...],
        "custom_ids": {custom_id: times submitted}, "api_calls": {"METHOD /route": n}}``;
        ``batches`` is in creation order and ``custom_ids`` counts every line of every
        created batch, so a test can check that no request was submitted twice.
        """
        return self._as_dict(self._call("GET", "/_batches"))

    def submitted_twice(self) -> dict[str, int]:
        """The custom ids submitted in more than one batch line since the last `reset`."""
        counts = self.batches()["custom_ids"]
        return {custom_id: n for custom_id, n in counts.items() if n > 1}

    @property
    def base_url(self) -> str:
        """What an OpenAI client expects as ``base_url`` (includes the ``/v1`` prefix)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def configure(self, **config: Any) -> dict[str, Any]:
        """Change fault injection / latency / batch settings; returns the server's whole config.

        ``reply_headers={"x-ratelimit-limit-requests": "inf"}`` adds those headers, as given,
        to every chat and embeddings reply (``{}`` stops it).

        Raises ValueError when the server rejects the settings (e.g. an unknown key).
        """
        return self._as_dict(self._call("POST", "/_config", config))

    # -- gates: hold requests in flight until the test says so ----------------------------
    def open_gate(self, name: str) -> None:
        """Release every request parked at ``[[gate:NAME]]``, and let later ones through."""
        self._call("POST", "/_gate", {"open": name})

    def close_gate(self, name: str) -> None:
        """Make later ``[[gate:NAME]]`` requests park again (an opened gate stays open)."""
        self._call("POST", "/_gate", {"close": name})

    def parked(self, name: str) -> int:
        """How many requests wait at gate ``name`` right now."""
        parked = self._as_dict(self._call("GET", "/_gate")).get("parked", {})
        return int(parked.get(name, 0))

    def wait_parked(self, name: str, count: int, timeout: float = 60.0) -> None:
        """Return once ``count`` requests wait at gate ``name``.

        The timeout only turns a hang into a failure: the state itself is what a test
        waits for, so a slow machine only makes the wait longer.
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
    """The fake Anthropic Messages API (:mod:`plait.testing.fake_anthropic`) in a child process.

    Without ``api_key`` the server accepts any ``x-api-key``, but still requires one, as the
    real API does. It also speaks the Message Batches API (``client.messages.batches``) and
    keeps prompt-cache books for blocks marked ``cache_control``; :meth:`configure` steers
    both, :meth:`batches` and :meth:`stats` show what happened, and ``reset()`` forgets
    requests, batches and cache entries and restores the default settings.
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
        """The limits as `FakeOpenAIServer`'s, stated in Anthropic's spelling
        (``anthropic-ratelimit-*``, resets as RFC 3339 times)."""
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
        """Change the settings given (the others stay); returns the server's whole config.

        ``reset()`` restores every default. Raises ValueError when the server refuses a value.

        * ``batch_turnaround_s`` (0.2): how long a batch stays in processing before it ends;
        * ``batch_item_fail_rate`` (0): chance that a batched request ends ``errored``
          (``api_error``), drawn from the server's random stream, which ``seed`` (0) restarts;
        * ``batch_expire`` (False) with ``batch_expire_fraction`` (0.5): batches end with
          that share of their requests (rounded up, the last submitted) ``expired``;
        * ``batch_max_requests`` (100,000) and ``batch_max_bytes`` (256 MiB): the limits on
          one batch;
        * ``batch_gate_open`` (True): while False no batch ends, not even a canceled one (see
          :meth:`close_batch_gate`);
        * ``batch_create_gate_open`` and ``batch_results_gate_open`` (True): while False a
          batch creation waits after making the batch, before it answers, and a results
          download waits before it answers (``batches()["held"]`` counts them);
        * ``batch_results_order`` (``"submitted"``): the order of a batch's results file;
        * ``batch_params_validation`` (``"create"``): invalid params refuse the whole batch
          with 400; ``"results"`` accepts it and gives those requests ``errored`` results;
        * ``cache_min_tokens`` (1024): shorter prefixes are not cached;
        * ``cache_clock_offset_s`` (0): seconds added to the prompt cache's clock (see
          :meth:`advance_cache_clock`);
        * ``reply_headers`` ({}): headers added, as given, to every reply of
          ``/v1/messages`` (``{"anthropic-ratelimit-requests-limit": "inf"}``, say).
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
        """The server's current settings (see :meth:`configure`)."""
        return self._as_dict(self._call("GET", "/_config"))

    def batches(self) -> dict[str, Any]:
        """Statistics of the Message Batches received since the last ``reset()``.

        Keys: ``batches_total``, ``requests_total``, ``bytes_total``, ``status_counts``
        (processing status -> batches), ``result_counts`` (result type -> requests),
        ``rejected`` (creations refused), ``calls`` (route -> calls: ``create``,
        ``retrieve``, ``list``, ``cancel``, ``results``, ``delete``), ``order`` (batch ids,
        oldest first), ``custom_ids`` (every custom_id of an accepted batch -> how many
        times it was submitted), ``cache`` (``read_tokens``, ``write_tokens``) and
        ``batches``: batch id -> ``order``, ``requests``, ``bytes``, ``processing_status``,
        ``deleted``, ``request_counts``, ``custom_ids``, ``cache`` and ``items`` (custom_id
        -> its ``result`` type and ``cache`` ``{"read", "write"}``, once the batch ended).
        """
        return self._as_dict(self._call("GET", "/_batches"))

    def close_batch_gate(self) -> None:
        """Hold every batch in processing (``in_progress`` or ``canceling``) from now on."""
        self.configure(batch_gate_open=False)

    def open_batch_gate(self) -> None:
        """Let held batches end (those whose turnaround has passed end at once)."""
        self.configure(batch_gate_open=True)

    def advance_cache_clock(self, seconds: float) -> None:
        """Move the prompt cache's clock forward: ``301`` expires the ``5m`` entries not
        used since, ``3601`` the ``1h`` ones too."""
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
