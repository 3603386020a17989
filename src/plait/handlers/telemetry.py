"""A run as OpenTelemetry traces and metrics: `otel`, for the tools that ingest OTLP.

A run inside ``with otel():`` emits one trace:

* a ``run <Pipeline>`` span (the root, or a child of the span current where the run
  starts), with the run's backend, seed, and how many inputs ran and failed;
* a span per module call, nested as the pipeline is: an input's root module call
  under the run, each composite call's calls under it (the engine names each call's
  enclosing call in ``msg.meta["scope"]``), the calls an ``async def forward`` makes
  under that module's call;
* a span per LLM call, the child of its module's, named and attributed after the
  OpenTelemetry GenAI semantic conventions at version `SEMCONV_VERSION` (kind CLIENT,
  ``{gen_ai.operation.name} {gen_ai.request.model}``; their status is "Development", so
  the version is pinned here and changes only on purpose), plus plait's own
  attributes under ``plait.``: module path, node id, input index, alias, attempts,
  retries, 429s, queue / rate-limit / backoff seconds, cost, who answered (cache,
  checkpoint, mock, replay) and seed.  Each phase of the call (queue, rate wait, each
  attempt, backoff) is an event on its span.

and the conventions' two client metrics, ``gen_ai.client.token.usage`` (by
``gen_ai.token.type``) and ``gen_ai.client.operation.duration``, for the requests
really sent (a cache hit used no tokens and took no provider time).

Prompts and replies are recorded only with ``capture_content=True`` (or, when the
argument is not given, ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``), as
the conventions' opt-in attributes ``gen_ai.system_instructions``,
``gen_ai.input.messages`` and ``gen_ai.output.messages`` (JSON text), scrubbed of every
known secret first.

The spans go to the ``tracer_provider`` (and the metrics to the ``meter_provider``)
given, else to providers built from the standard ``OTEL_*`` environment variables
(`plait.handlers.otel_setup` says which, and what it leaves to the SDK).  Both are
flushed as each ``with`` block ends.

One handler may be entered by several runs at once (``asyncio.gather``): each run's
state lives on its own ``"run"`` message (`plait.effects.current_run`) and each call's
on its message, never on the handler, so each run gets its own tree.  Sent to Ray
workers (the handler is pickled), it carries the W3C ``traceparent`` of the driver's
run span and the driver's ``OTEL_*`` settings: each worker exports its own spans,
whose trace is the driver's (see `Telemetry.__getstate__`).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from plait._secrets import register, scrub
from plait._version import __version__
from plait.effects import Handler, Message, current_run
from plait.handlers.llm import call_outcome, endpoint_config
from plait.providers.base import LLMRequest, LLMResponse, ProviderError
from plait.resources.endpoint import CallTiming, Span
from plait.resources.pricing import Prices

try:
    from opentelemetry import metrics, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from plait.handlers.otel_setup import (
        ExportSettings,
        TelemetrySettingsError,
        build_resource,
        capture_content_from,
        export_settings,
        meter_provider,
        tracer_provider,
    )
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "plait's OpenTelemetry handler needs the OpenTelemetry SDK and its OTLP exporter: "
        "pip install 'plait[otel]'"
    ) from exc

__all__ = ["SCHEMA_URL", "SEMCONV_VERSION", "Telemetry", "TelemetrySettingsError", "otel"]

SEMCONV_VERSION = "1.40.0"
"""The version of the OpenTelemetry semantic conventions (GenAI spans and metrics) followed."""
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
"""The schema URL the spans and metrics carry, saying `SEMCONV_VERSION` to the backend."""
#: The bucket boundaries the conventions advise for the two client metrics.
_TOKEN_BUCKETS = [4.0**k for k in range(14)]
_DURATION_BUCKETS = [0.01 * 2.0**k for k in range(14)]
#: Where each provider is when its alias names no base URL.
_DEFAULT_HOSTS = {"openai": "api.openai.com", "anthropic": "api.anthropic.com"}
#: Queue waits shorter than this took a free slot: no event of their own.
_MIN_QUEUE_S = 5e-5
#: Environment variables a Ray worker takes from the driver to export the same way.
_SETTINGS_PREFIX = "OTEL_"
_propagator = TraceContextTextMapPropagator()


def otel(
    tracer_provider: Any = None,
    meter_provider: Any = None,
    *,
    capture_content: bool | None = None,
    service_name: str | None = None,
) -> Telemetry:
    """A handler that exports each run as OpenTelemetry spans and GenAI metrics.

    Args:
        tracer_provider: Where the spans go (an SDK provider of yours; given one of the
            two, the other is the application's global one).  With neither, providers
            are built from the standard ``OTEL_*`` variables: ``OTEL_TRACES_EXPORTER``,
            ``OTEL_METRICS_EXPORTER`` (``otlp``, ``console``, ``none``),
            ``OTEL_EXPORTER_OTLP_*``, ``OTEL_SDK_DISABLED`` (see
            `plait.handlers.otel_setup`).
        meter_provider: Where the metrics go.
        capture_content: Record prompts and replies, scrubbed of secrets.  Not given:
            as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (``true``:
            yes; unset: no); given, it wins over the variable.
        service_name: The resource's ``service.name`` when neither ``OTEL_SERVICE_NAME``
            nor ``OTEL_RESOURCE_ATTRIBUTES`` names one (default ``plait``).

    Returns:
        The handler, to enter around runs (``with otel(): ...``).

    Raises:
        TelemetrySettingsError: An ``OTEL_*`` variable holds a value plait cannot
            honour (the message names it and the values it accepts).

    Examples:
        Spans kept in memory (a real setup sends them to a collector over OTLP):

        ```python
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        import plait
        from plait.handlers import otel

        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.").bind(resources=resources)

        with otel(tracer_provider=provider):
            summarize.run_sync("A long text.")
        print(sorted(span.name for span in spans.get_finished_spans()))
        ```
    """
    return Telemetry(
        tracer_provider,
        meter_provider,
        capture_content=capture_content,
        service_name=service_name,
    )


@dataclass(slots=True, eq=False)
class _RunState:
    """One run's spans, kept on its ``"run"`` message."""

    span: Any
    context: Any
    #: The context of each call in flight, by (input index, node id): its calls' parent.
    calls: dict[tuple[int | None, str], Any] = field(default_factory=dict)
    inputs: int = 0
    failed: int = 0


@dataclass(slots=True, eq=False)
class _Call:
    """One call's span, kept on its message while it runs."""

    span: Any
    run: _RunState | None
    key: tuple[int | None, str] | None
    #: `time.time_ns` minus `time.monotonic_ns` when it started: places its phases.
    offset_ns: int
    started: float


class Telemetry(Handler):
    """Emits OpenTelemetry spans and metrics for every run, module call and LLM call.

    Made by `otel`, whose arguments it takes (see the module docstring for the
    spans' shape and attributes).

    Args:
        tracer_provider: Where the spans go; None builds one from ``OTEL_*``.
        meter_provider: Where the metrics go; None builds one from ``OTEL_*``.
        capture_content: Record prompts and replies (scrubbed); None follows
            ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``.
        service_name: The resource's ``service.name`` when the environment names none.

    Raises:
        TelemetrySettingsError: When an ``OTEL_*`` variable holds a value plait
            cannot honour.
    """

    def __init__(
        self,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        *,
        capture_content: bool | None = None,
        service_name: str | None = None,
    ) -> None:
        #: The ``OTEL_*`` settings where the handler was made: a worker exports with them.
        self._settings = {k: v for k, v in os.environ.items() if k.startswith(_SETTINGS_PREFIX)}
        _register_headers(self._settings)
        self.capture_content = (
            capture_content_from(self._settings) if capture_content is None else capture_content
        )
        self.service_name = service_name
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        #: The providers given (a block's end restores them after shutting down its own).
        self._given = (tracer_provider, meter_provider)
        #: Where providers built here send each signal (checked now, before anything runs).
        self._export: ExportSettings | None = (
            export_settings(self._settings)
            if tracer_provider is None and meter_provider is None
            else None
        )
        #: On a Ray worker: the driver's run span, as W3C trace-context headers.
        self._remote_parent: dict[str, str] = {}
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._parts: tuple[Any, Any, Any] | None = None
        #: The providers made here from the environment, shut down by the last block.
        self._owned: list[Any] = []
        #: Where this handler keeps its state on a message (two handlers never share).
        self._key = f"_otel_{id(self)}"

    # -- providers ---------------------------------------------------------------------
    def _instruments(self) -> tuple[Any, Any, Any]:
        """The tracer and the two histograms, made at first use (not at construction:
        a handler made and sent to Ray workers builds its exporters there)."""
        parts = self._parts
        if parts is not None:
            return parts
        with self._lock:
            if self._parts is None:
                if self._tracer_provider is None and self._meter_provider is None:
                    settings = self._export or export_settings(self._settings)
                    resource = build_resource(self.service_name)
                    self._tracer_provider = tracer_provider(settings, resource)
                    self._meter_provider = meter_provider(settings, resource)
                    self._owned = [self._tracer_provider, self._meter_provider]
                # Given one, the other is the application's own (a no-op unless it set
                # one up): spans to your provider never send metrics somewhere else.
                if self._tracer_provider is None:
                    self._tracer_provider = trace.get_tracer_provider()
                if self._meter_provider is None:
                    self._meter_provider = metrics.get_meter_provider()
                tracer = self._tracer_provider.get_tracer(
                    "plait", __version__, schema_url=SCHEMA_URL
                )
                meter = self._meter_provider.get_meter("plait", __version__, schema_url=SCHEMA_URL)
                tokens = meter.create_histogram(
                    "gen_ai.client.token.usage",
                    unit="{token}",
                    description="Number of input and output tokens used.",
                    explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
                )
                duration = meter.create_histogram(
                    "gen_ai.client.operation.duration",
                    unit="s",
                    description="GenAI operation duration.",
                    explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
                )
                self._parts = (tracer, tokens, duration)
            return self._parts

    def flush(self) -> None:
        """Export every finished span and the metrics now."""
        for provider in (self._tracer_provider, self._meter_provider):
            force_flush = getattr(provider, "force_flush", None)
            if callable(force_flush):
                force_flush()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self._parts is None:
            return
        with self._lock:
            if self.entered:
                # Another block still has the handler (a server's requests each enter it
                # inside the server's own block): the batch processors export in their
                # own thread; a flush here would hold this block's thread (a server's
                # event loop) while the collector answers.  The last block flushes.
                return
            owned: list[Any] = []
            providers = (self._tracer_provider, self._meter_provider)
            if self._owned:
                # The last block of providers made here: shut them down, which exports
                # what they hold (and nothing keeps exporting behind the program's back,
                # or at its exit to a collector gone by then); a later block builds new.
                owned, self._owned = self._owned, []
                self._parts = None
                self._tracer_provider, self._meter_provider = self._given
        for provider in providers:
            # A no-op provider (no exporter asked for) has neither method.
            end = getattr(provider, "shutdown" if provider in owned else "force_flush", None)
            if callable(end):
                end()

    # -- travelling to Ray workers -------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The handler for a Ray worker: its settings, the ``OTEL_*`` variables seen
        here, and the parent of the worker's spans (the run being sent, else the span
        current here) as a W3C ``traceparent``.  Providers stay here: the worker builds
        its own exporters from those variables, and exports its spans itself (they join
        this trace through the ``traceparent``), so no span waits on the driver."""
        state = super().__getstate__()
        for name in (
            "_lock",
            "_parts",
            "_key",
            "_owned",
            "_given",
            "_tracer_provider",
            "_meter_provider",
        ):
            state.pop(name, None)
        carrier: dict[str, str] = {}
        run = current_run()
        found = run.meta.get(self._key) if run is not None else None
        if isinstance(found, _RunState):
            _propagator.inject(carrier, context=found.context)
        elif self._remote_parent:
            carrier = dict(self._remote_parent)
        else:
            _propagator.inject(carrier)
        state["_remote_parent"] = carrier
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tracer_provider = self._meter_provider = None
        self._given = (None, None)
        self._setup()
        for name, value in self._settings.items():
            os.environ[name] = value
        _register_headers(self._settings)

    # -- runs ------------------------------------------------------------------------------
    def process_run(self, msg: Message) -> None:
        """Open the run's span.

        Args:
            msg: The run's message.
        """
        if self._key in msg.meta:
            return
        tracer = self._instruments()[0]
        # Inside another run (one started by a module's code): under that run's span;
        # on a Ray worker: under the driver's run; else under the span current here.
        outer = current_run()  # this run is not current yet while it is processed
        found = outer.meta.get(self._key) if outer is not None else None
        if isinstance(found, _RunState):
            parent = found.context
        elif self._remote_parent:
            parent = _propagator.extract(self._remote_parent)
        else:
            parent = None
        worker = msg.meta.get("worker")
        attributes: dict[str, Any] = {"plait.pipeline": msg.name}
        for name in ("backend", "seed", "workers", "worker", "request"):
            value = msg.meta.get(name)
            if value is not None:
                attributes[f"plait.run.{name}"] = value
        span = tracer.start_span(
            f"run {msg.name}" if worker is None else f"run {msg.name} on {worker}",
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        msg.meta[self._key] = _RunState(span, trace.set_span_in_context(span, parent))

    def postprocess_run(self, msg: Message) -> None:
        """Close the run's span, with how many inputs ran and failed.

        Args:
            msg: The run's message.
        """
        state = msg.meta.pop(self._key, None)
        if not isinstance(state, _RunState):
            return
        span = state.span
        # The rows the run delivered, as the runtime counted them (inputs answered from
        # a checkpoint included), else the inputs whose calls passed through here.
        span.set_attribute("plait.run.inputs", int(msg.meta.get("inputs", state.inputs)))
        failed = msg.meta.get("failed", state.failed if "inputs" not in msg.meta else 0)
        span.set_attribute("plait.run.failed_inputs", int(failed))
        if msg.error is not None:
            _record_failure(span, msg.error)
        elif msg.meta.get("stopped"):
            span.set_attribute("plait.run.stopped", str(msg.meta["stopped"]))
            span.set_status(Status(StatusCode.ERROR, f"stopped: {msg.meta['stopped']}"))
        span.end()

    # -- module calls ------------------------------------------------------------------------
    def process_module(self, msg: Message) -> None:
        """Open a module call's span.

        Args:
            msg: The module call's message.
        """
        self._open(
            msg,
            msg.name,
            SpanKind.INTERNAL,
            {
                "plait.module.type": type(msg.module).__name__,
                "plait.module.composite": bool(msg.meta.get("composite")),
            },
        )

    def postprocess_module(self, msg: Message) -> None:
        """Close a module call's span.

        Args:
            msg: The module call's message.
        """
        call = msg.meta.pop(self._key, None)
        if not isinstance(call, _Call):
            return
        if msg.error is not None:
            _record_failure(call.span, msg.error)
        self._close(msg, call)

    # -- LLM calls -------------------------------------------------------------------------
    def process_llm(self, msg: Message) -> None:
        """Open an LLM call's span.

        Args:
            msg: The LLM call's message.
        """
        request = msg.kwargs.get("request")
        operation = _operation(request)
        model = _model_of(msg)
        self._open(
            msg,
            f"{operation} {model}" if model else operation,
            SpanKind.CLIENT,
            {"gen_ai.operation.name": operation},
        )

    def postprocess_llm(self, msg: Message) -> None:
        """Close an LLM call's span with its attributes, events and metrics.

        Args:
            msg: The LLM call's message.
        """
        call = msg.meta.pop(self._key, None)
        if not isinstance(call, _Call):
            return
        span = call.span
        request = msg.kwargs.get("request")
        timing = msg.meta.get("timing")
        spans = list(timing.spans) if isinstance(timing, CallTiming) else []
        outcome = call_outcome(msg, spans)
        operation = _operation(request)
        config = _config_of(msg)
        base = self._request_attributes(config, request, operation)
        attributes = {**base, **_phase_attributes(spans), "plait.outcome": outcome}
        for phase in spans:
            _add_phase(span, phase, call.offset_ns)
        model = base.get("gen_ai.request.model")
        if model:  # a handler inside this one may have sent the call to another alias
            span.update_name(f"{operation} {model}")
        response = msg.value if isinstance(msg.value, LLMResponse) else None
        if response is not None:
            attributes.update(_response_attributes(response))
            if response.fallback is not None:  # priced as the alias that answered bills it
                config = _fallback_config(msg, response.fallback)
            cost = _cost(config, response)
            if cost is not None:
                attributes["plait.cost_usd"] = cost
        if self.capture_content and isinstance(request, LLMRequest):
            attributes.update(_content(request, response if msg.error is None else None))
        span.set_attributes(attributes)
        sent = any(phase.kind == "request" for phase in spans)
        if msg.error is not None:
            _record_failure(span, msg.error)
        if sent:
            self._measure(msg, base, response, time.monotonic() - call.started)
        self._close(msg, call)

    def _request_attributes(self, config: Any, request: Any, operation: str) -> dict[str, Any]:
        """The conventions' request attributes of the call as finally sent (a handler
        inside this one may have rewritten it), and plait's alias."""
        attributes: dict[str, Any] = {"gen_ai.operation.name": operation}
        if config is not None:
            attributes["gen_ai.provider.name"] = config.provider
            if config.model:
                attributes["gen_ai.request.model"] = config.model
            address, port = _server_of(config.provider, config.base_url)
            if address:
                attributes["server.address"] = address
            if port:
                attributes["server.port"] = port
        if isinstance(request, LLMRequest):
            attributes["plait.alias"] = request.alias
            if request.temperature is not None:
                attributes["gen_ai.request.temperature"] = float(request.temperature)
            if request.max_tokens is not None:
                attributes["gen_ai.request.max_tokens"] = int(request.max_tokens)
            seed = request.extra.get("seed")
            if isinstance(seed, int):
                attributes["gen_ai.request.seed"] = seed
                attributes["plait.seed"] = seed
        return attributes

    def _measure(
        self,
        msg: Message,
        base: dict[str, Any],
        response: LLMResponse | None,
        seconds: float,
    ) -> None:
        """The two client metrics for a request really sent."""
        _, tokens, duration = self._instruments()
        labels = {
            k: v
            for k, v in base.items()
            if k
            in (
                "gen_ai.operation.name",
                "gen_ai.provider.name",
                "gen_ai.request.model",
                "server.address",
                "server.port",
            )
        }
        if response is not None and response.model:
            labels["gen_ai.response.model"] = response.model
        if msg.error is not None:
            labels["error.type"] = _error_type(msg.error)
        duration.record(seconds, labels)
        if response is not None and msg.error is None:
            usage = response.usage
            tokens.record(usage.prompt_tokens, {**labels, "gen_ai.token.type": "input"})
            tokens.record(usage.completion_tokens, {**labels, "gen_ai.token.type": "output"})

    # -- spans of calls --------------------------------------------------------------------
    def _open(self, msg: Message, name: str, kind: Any, attributes: dict[str, Any]) -> None:
        if self._key in msg.meta:  # this handler entered twice: one span per call
            return
        tracer = self._instruments()[0]
        run = current_run()
        state = run.meta.get(self._key) if run is not None else None
        state = state if isinstance(state, _RunState) else None
        parent = None
        scope = msg.meta.get("scope")
        if state is not None:
            found = state.calls.get((msg.input_index, scope)) if scope else None
            parent = found if found is not None else state.context
        attributes = {**attributes, "plait.module.path": msg.name}
        if msg.node_id is not None:
            attributes["plait.node_id"] = msg.node_id
        if msg.input_index is not None:
            attributes["plait.input_index"] = msg.input_index
        span = tracer.start_span(name, context=parent, kind=kind, attributes=attributes)
        key = None
        if state is not None and msg.node_id is not None:
            key = (msg.input_index, msg.node_id)
            state.calls[key] = trace.set_span_in_context(span, parent)
            if scope is None:
                state.inputs += 1
        msg.meta[self._key] = _Call(
            span, state, key, time.time_ns() - time.monotonic_ns(), time.monotonic()
        )

    def _close(self, msg: Message, call: _Call) -> None:
        state = call.run
        if state is not None and call.key is not None:
            state.calls.pop(call.key, None)
            if msg.meta.get("scope") is None and msg.error is not None:
                state.failed += 1
        call.span.end()


# -- what the spans say ----------------------------------------------------------------------
def _register_headers(settings: dict[str, str]) -> None:
    """The exporters' header values (``OTEL_EXPORTER_OTLP_HEADERS``: a backend's API
    key) are secrets: scrubbed from anything plait writes."""
    for name, value in settings.items():
        if "HEADERS" in name:
            for pair in value.split(","):
                register(pair.partition("=")[2].strip() or None)


def _operation(request: Any) -> str:
    return "embeddings" if getattr(request, "embed", False) else "chat"


def _config_of(msg: Message) -> Any:
    """The endpoint configuration of the call's alias, if the message knows it (one
    built by hand, without the run's resources, does not)."""
    if msg.meta.get("resources") is None or not isinstance(msg.kwargs.get("request"), LLMRequest):
        return None
    try:
        return endpoint_config(msg)
    except Exception:  # an alias the resources do not configure: its error is the call's
        return None


def _fallback_config(msg: Message, alias: str) -> Any:
    """The configuration of the fallback ``alias`` that answered the call, if known."""
    resources = msg.meta.get("resources")
    try:
        return resources.config_for(alias) if resources is not None else None
    except Exception:
        return None


def _model_of(msg: Message) -> str:
    config = _config_of(msg)
    return str(config.model) if config is not None and config.model else ""


@functools.lru_cache(maxsize=256)
def _server_of(provider: str, base_url: str | None) -> tuple[str | None, int | None]:
    if not base_url:
        host = _DEFAULT_HOSTS.get(provider)
        return host, (443 if host else None)
    parts = urlsplit(base_url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None and parts.scheme in ("http", "https"):
        port = 443 if parts.scheme == "https" else 80
    return parts.hostname, port


def _phase_attributes(spans: list[Span]) -> dict[str, Any]:
    """plait's account of where the call's time went, from its `CallTiming`."""
    attempts = retries = rate_limited = 0
    queue = rate_wait = backoff = 0.0
    for phase in spans:
        length = max(phase.end - phase.start, 0.0)
        if phase.kind == "queue":
            queue += length
        elif phase.kind == "rate_wait":
            rate_wait += length
        elif phase.kind == "backoff":
            backoff += length
        elif phase.kind == "request":
            attempts += 1
            # Attempt numbers restart for a structured re-ask, which is not a retry.
            if int(phase.info.get("attempt", 1)) > 1:
                retries += 1
            if str(phase.info.get("error", "")).startswith("HTTP 429"):
                rate_limited += 1
    found: dict[str, Any] = {"plait.attempts": attempts, "plait.queue_wait_s": queue}
    # What most calls never meet is left out rather than said as zero: each attribute
    # costs the span's export.
    for name, value in (
        ("plait.retries", retries),
        ("plait.rate_limited", rate_limited),
        ("plait.rate_limit_wait_s", rate_wait),
        ("plait.backoff_s", backoff),
    ):
        if value:
            found[name] = value
    return found


def _add_phase(span: Any, phase: Span, offset_ns: int) -> None:
    """One phase of the call as an event at its start (its length an attribute); a
    queue wait that only took a free slot is left out (its time is in the totals)."""
    if phase.kind == "queue" and phase.end - phase.start < _MIN_QUEUE_S:
        return
    attributes: dict[str, Any] = {"plait.duration_s": max(phase.end - phase.start, 0.0)}
    for name, value in phase.info.items():
        if isinstance(value, str | int | float | bool):
            attributes[f"plait.{name}"] = scrub(value) if isinstance(value, str) else value
    span.add_event(
        f"plait.{phase.kind}",
        attributes=attributes,
        timestamp=int(phase.start * 1e9) + offset_ns,
    )


def _response_attributes(response: LLMResponse) -> dict[str, Any]:
    usage = response.usage
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "plait.tier": response.tier,
    }
    if usage.cache_read_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
    if response.model:
        attributes["gen_ai.response.model"] = response.model
    if response.fallback is not None:  # another alias answered (its model is the one above)
        attributes["plait.fallback"] = response.fallback
    if response.finish_reason:
        attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
    return attributes


def _cost(config: Any, response: LLMResponse) -> float | None:
    if config is None:
        return None
    prices = Prices.of(config)
    if not prices.known:
        return None
    try:
        return prices.cost(response.usage, response.tier)
    except ValueError:  # a tier this plait does not price
        return None


def _error_type(error: BaseException) -> str:
    """Low-cardinality, as the conventions ask: the HTTP status when there was one,
    else the exception's class."""
    if isinstance(error, ProviderError) and error.status is not None:
        return str(error.status)
    kind = type(error)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _record_failure(span: Any, error: BaseException) -> None:
    """ERROR status, ``error.type``, and the exception as the conventions' event, every
    text of it scrubbed (`record_exception` would write the raw message)."""
    message = scrub(f"{type(error).__name__}: {error}")
    span.set_status(Status(StatusCode.ERROR, message))
    span.set_attribute("error.type", _error_type(error))
    stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    span.add_event(
        "exception",
        {
            "exception.type": type(error).__qualname__,
            "exception.message": scrub(str(error)),
            "exception.stacktrace": scrub(stack),
        },
    )


def _text(content: Any) -> str:
    return content if isinstance(content, str) else json.dumps(content, default=str)


def _content(request: LLMRequest, response: LLMResponse | None) -> dict[str, str]:
    """Prompt and reply as the conventions' opt-in attributes (JSON of role and parts),
    scrubbed of secrets."""
    system = [
        {"type": "text", "content": _text(m.get("content", ""))}
        for m in request.messages
        if m.get("role") == "system"
    ]
    inputs = [
        {
            "role": str(m.get("role", "user")),
            "parts": [{"type": "text", "content": _text(m.get("content", ""))}],
        }
        for m in request.messages
        if m.get("role") != "system"
    ]
    found: dict[str, str] = {"gen_ai.input.messages": scrub(json.dumps(inputs))}
    if system:
        found["gen_ai.system_instructions"] = scrub(json.dumps(system))
    if response is not None and not request.embed:
        output = [
            {
                "role": "assistant",
                "parts": [{"type": "text", "content": response.text}],
                "finish_reason": response.finish_reason or "stop",
            }
        ]
        found["gen_ai.output.messages"] = scrub(json.dumps(output))
    return found
