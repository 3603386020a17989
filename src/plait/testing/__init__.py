"""Test helpers for plait.

The fake servers themselves live in :mod:`plait.testing.fake_openai` (OpenAI-compatible chat
completions) and :mod:`plait.testing.fake_anthropic` (the Anthropic Messages API), and each runs
in its own process. The controlling helpers are defined here, and deliberately use only the
standard library, so that importing ``plait.testing`` stays cheap and so that running a server
with ``python -m plait.testing.fake_...`` does not import the server module twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Final, Self

__all__ = [
    "ANTHROPIC_API_KEY_ENV",
    "ANTHROPIC_READY_PREFIX",
    "API_KEY_ENV",
    "READY_PREFIX",
    "FakeAnthropicServer",
    "FakeOpenAIServer",
]

READY_PREFIX: Final = "PLAIT_FAKE_OPENAI_READY"
"""Start of the single stdout line the server prints once it accepts connections."""

API_KEY_ENV: Final = "PLAIT_FAKE_OPENAI_API_KEY"
"""Environment variable the server reads its API key from; keeps the key out of ``ps`` output."""

ANTHROPIC_READY_PREFIX: Final = "PLAIT_FAKE_ANTHROPIC_READY"
"""The fake Anthropic server's counterpart of :data:`READY_PREFIX`."""

ANTHROPIC_API_KEY_ENV: Final = "PLAIT_FAKE_ANTHROPIC_API_KEY"
"""The fake Anthropic server's counterpart of :data:`API_KEY_ENV`."""

_STARTUP_TIMEOUT_S: Final = 30.0
_STOP_TIMEOUT_S: Final = 10.0
_HTTP_TIMEOUT_S: Final = 30.0
# The server package's parent directory, so the child can import plait even when the parent
# process only found it through sys.path manipulation rather than an installed distribution.
_SRC_DIR: Final = str(Path(__file__).resolve().parents[2])

# Loopback traffic must never be routed through an HTTP proxy configured in the environment.
_OPENER: Final = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
                return self

    def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL if it lingers); safe to call repeatedly."""
        proc = self._proc
        if proc is None:
            return
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

    def reset(self) -> None:
        self._call("POST", "/_reset", {})

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with _OPENER.open(req, timeout=_HTTP_TIMEOUT_S) as resp:
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
    """The fake OpenAI-compatible server (:mod:`plait.testing.fake_openai`) in a child process."""

    _module = "plait.testing.fake_openai"
    _ready_prefix = READY_PREFIX
    _api_key_env = API_KEY_ENV
    _label = "fake OpenAI server"

    def __init__(
        self, *, latency_ms: float = 0.0, api_key: str | None = None, seed: int = 0
    ) -> None:
        super().__init__(api_key=api_key)
        self._latency_ms = latency_ms
        self._seed = seed

    def _extra_args(self) -> list[str]:
        return [
            "--host",
            "127.0.0.1",
            "--latency-ms",
            repr(float(self._latency_ms)),
            "--seed",
            str(int(self._seed)),
        ]

    @property
    def base_url(self) -> str:
        """What an OpenAI client expects as ``base_url`` (includes the ``/v1`` prefix)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def configure(self, **config: Any) -> dict[str, Any]:
        """Change fault injection / latency settings; returns the server's whole config.

        Raises ValueError when the server rejects the settings (e.g. an unknown key).
        """
        return self._as_dict(self._call("POST", "/_config", config))


class FakeAnthropicServer(_FakeServerProcess):
    """The fake Anthropic Messages API (:mod:`plait.testing.fake_anthropic`) in a child process.

    Without ``api_key`` the server accepts any ``x-api-key``, but still requires one, as the
    real API does.
    """

    _module = "plait.testing.fake_anthropic"
    _ready_prefix = ANTHROPIC_READY_PREFIX
    _api_key_env = ANTHROPIC_API_KEY_ENV
    _label = "fake Anthropic server"

    @property
    def base_url(self) -> str:
        """What the Anthropic SDK expects as ``base_url``: it appends ``/v1/messages`` itself."""
        return f"http://127.0.0.1:{self.port}"


def _pump_stdout(stream: IO[bytes], lines: queue.Queue[str | None], ready_prefix: str) -> None:
    """Forward stdout lines until READY, then keep draining so the child can never block."""
    ready = False
    for raw in iter(stream.readline, b""):
        if not ready:
            line = raw.decode("utf-8", errors="replace").strip()
            lines.put(line)
            ready = line.startswith(ready_prefix)
    lines.put(None)
