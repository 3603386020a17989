"""The providers `plait.handlers.otel` builds when it is given none, from the standard
OpenTelemetry environment variables, and the content switch of the GenAI conventions.

What the SDK's own classes already read is left to them: the OTLP/HTTP exporters read
``OTEL_EXPORTER_OTLP_[SIGNAL_]ENDPOINT``, ``..._HEADERS``, ``..._TIMEOUT``,
``..._COMPRESSION`` and the certificate variables, `Resource.create` reads
``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``, the batch span processor and the
periodic metric reader read their ``OTEL_BSP_*`` and ``OTEL_METRIC_EXPORT_*`` settings.
What a program that builds its own providers must decide is decided here:

* ``OTEL_SDK_DISABLED=true``: no exporter at all (no-op providers);
* ``OTEL_TRACES_EXPORTER``, ``OTEL_METRICS_EXPORTER``: ``otlp`` (the default), ``console``
  (JSON on stderr: a command's stdout may carry its outputs), ``none``, or a comma list;
  ``OTEL_LOGS_EXPORTER`` is checked the same way, though plait sends no log records;
* ``OTEL_EXPORTER_OTLP_[SIGNAL_]PROTOCOL``: ``http/protobuf`` (the default), or ``grpc``
  when the gRPC exporter is installed;
* ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``: record prompts and replies.

A value plait cannot honour is a `TelemetrySettingsError` naming the variable and the
values it accepts, raised as the handler is made, before anything runs.

An OTLP/HTTP endpoint that answers a signal's POST with 404 or 405 does not take that
signal (Jaeger and Arize Phoenix take traces only): plait says so once, in one line of
its own, instead of the SDK's error on every export, and sends that endpoint the signal
no more for the rest of the process.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from plait._secrets import scrub
from plait._version import __version__

__all__ = [
    "CAPTURE_VARIABLE",
    "ExportSettings",
    "TelemetrySettingsError",
    "build_resource",
    "capture_content_from",
    "export_settings",
    "meter_provider",
    "tracer_provider",
]

_log = logging.getLogger("plait")

#: The GenAI instrumentations' switch for recording prompts and replies.
CAPTURE_VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: Its values (case does not matter): ``true``/``false``, and the GenAI utilities' modes,
#: of which those that put content on spans turn it on (plait records it on spans only).
_CAPTURE = {
    "true": True,
    "span_only": True,
    "span_and_event": True,
    "false": False,
    "no_content": False,
    "event_only": False,
    "": False,
}
_EXPORTER_VARIABLES = {
    "traces": "OTEL_TRACES_EXPORTER",
    "metrics": "OTEL_METRICS_EXPORTER",
    "logs": "OTEL_LOGS_EXPORTER",
}
_EXPORTERS = ("otlp", "console", "none")
_PROTOCOLS = ("http/protobuf", "grpc")
#: The module of the OTLP/gRPC exporters (``pip install opentelemetry-exporter-otlp-proto-grpc``).
_GRPC = "opentelemetry.exporter.otlp.proto.grpc"
#: What an endpoint that does not take a signal answers its POST with.
_REFUSING = frozenset({404, 405})


class TelemetrySettingsError(ValueError):
    """An ``OTEL_*`` variable holds a value plait cannot honour; the message names the
    variable, its value and what it accepts."""


@dataclass(frozen=True, slots=True)
class ExportSettings:
    """Where the providers built from the environment send each signal."""

    #: ``OTEL_SDK_DISABLED=true``: nothing is exported.
    disabled: bool
    #: The exporters of each signal, each named once (empty: the signal is not sent).
    traces: tuple[str, ...]
    metrics: tuple[str, ...]
    #: The OTLP protocol of each signal (``http/protobuf`` or ``grpc``).
    traces_protocol: str
    metrics_protocol: str


def export_settings(environ: Mapping[str, str]) -> ExportSettings:
    """What the ``OTEL_*`` variables in ``environ`` ask of the providers.

    Args:
        environ: The variables (``os.environ``, or a copy of its ``OTEL_*`` part).

    Returns:
        The exporters and protocol of each signal, and whether the SDK is disabled.

    Raises:
        TelemetrySettingsError: An exporter or protocol plait cannot use.
    """
    names = {
        signal: _exporter_names(environ, variable)
        for signal, variable in _EXPORTER_VARIABLES.items()
    }
    return ExportSettings(
        disabled=environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true",
        traces=names["traces"],
        metrics=names["metrics"],
        traces_protocol=_protocol(environ, "TRACES") if "otlp" in names["traces"] else "",
        metrics_protocol=_protocol(environ, "METRICS") if "otlp" in names["metrics"] else "",
    )


def capture_content_from(environ: Mapping[str, str]) -> bool:
    """Whether ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for prompts and
    replies on the spans (unset: no).

    Raises:
        TelemetrySettingsError: A value that is none of the accepted ones.
    """
    value = environ.get(CAPTURE_VARIABLE, "")
    found = _CAPTURE.get(value.strip().lower())
    if found is None:
        raise TelemetrySettingsError(
            f"{CAPTURE_VARIABLE}={value} is not understood; accepted values: true, false "
            "(or SPAN_ONLY, SPAN_AND_EVENT, EVENT_ONLY, NO_CONTENT; plait records content "
            "on spans only)"
        )
    return found


def _exporter_names(environ: Mapping[str, str], variable: str) -> tuple[str, ...]:
    value = environ.get(variable, "")
    names = [name.strip().lower() for name in value.split(",") if name.strip()] or ["otlp"]
    unknown = [name for name in names if name not in _EXPORTERS]
    if unknown:
        raise TelemetrySettingsError(
            f"{variable}={value}: plait cannot export to {', '.join(unknown)}; accepted "
            f"values: {', '.join(_EXPORTERS)} (or a comma list of otlp and console)"
        )
    if "none" in names:
        if len(set(names)) > 1:
            raise TelemetrySettingsError(
                f"{variable}={value}: none means no exporter and cannot be listed with "
                "others; accepted values: otlp, console, none (or a comma list of otlp "
                "and console)"
            )
        return ()
    return tuple(dict.fromkeys(names))


def _protocol(environ: Mapping[str, str], signal: str) -> str:
    """The signal's OTLP protocol; ``grpc`` only with its exporter installed."""
    variable = f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"
    if not environ.get(variable, "").strip():
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
    value = environ.get(variable, "").strip()
    protocol = value.lower() or "http/protobuf"
    if protocol not in _PROTOCOLS:
        raise TelemetrySettingsError(
            f"{variable}={value}: the OpenTelemetry Python exporters do not send OTLP as "
            f"{value}; accepted values: {', '.join(_PROTOCOLS)}"
        )
    if protocol == "grpc" and not _installed(_GRPC):
        raise TelemetrySettingsError(
            f"{variable}={value} needs the OTLP/gRPC exporter: pip install "
            "opentelemetry-exporter-otlp-proto-grpc (or set http/protobuf and the "
            "collector's HTTP port, 4318)"
        )
    return protocol


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def build_resource(service_name: str | None) -> Resource:
    """Who sends the telemetry: this process as the instance and plait as the distro,
    under what ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` say (they win),
    and ``service_name`` (else "plait") when neither names the service."""
    attributes: dict[str, Any] = {
        "service.name": service_name or "plait",
        "service.instance.id": f"{socket.gethostname()}:{os.getpid()}",
        "telemetry.distro.name": "plait",
        "telemetry.distro.version": __version__,
    }
    attributes.update(OTELResourceDetector().detect().attributes)
    return Resource.create(attributes)


def tracer_provider(settings: ExportSettings, resource: Resource) -> Any:
    """A tracer provider with a batch processor per exporter the settings name, or a
    no-op one when none is (or the SDK is disabled)."""
    if settings.disabled or not settings.traces:
        return trace.NoOpTracerProvider()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for name in settings.traces:
        provider.add_span_processor(BatchSpanProcessor(_span_exporter(name, settings)))
    return provider


def meter_provider(settings: ExportSettings, resource: Resource) -> Any:
    """`tracer_provider`'s counterpart for the metrics: a periodic reader per exporter."""
    if settings.disabled or not settings.metrics:
        return metrics.NoOpMeterProvider()
    readers = [
        PeriodicExportingMetricReader(_metric_exporter(name, settings)) for name in settings.metrics
    ]
    return MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False)


def _span_exporter(name: str, settings: ExportSettings) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter(out=sys.stderr)
    if settings.traces_protocol == "grpc":
        grpc: Any = importlib.import_module(f"{_GRPC}.trace_exporter")
        return grpc.OTLPSpanExporter()  # type: ignore[no-any-return]
    return _SpanExporter()


def _metric_exporter(name: str, settings: ExportSettings) -> MetricExporter:
    if name == "console":
        return ConsoleMetricExporter(out=sys.stderr)
    if settings.metrics_protocol == "grpc":
        grpc: Any = importlib.import_module(f"{_GRPC}.metric_exporter")
        return grpc.OTLPMetricExporter()  # type: ignore[no-any-return]
    return _MetricExporter()


# -- an endpoint that does not take a signal ----------------------------------------------------
#: The endpoints that refused a signal in this process (a later block sends them nothing).
_refused: set[str] = set()
_refused_lock = threading.Lock()
#: Set on the exporting thread by a refusal, until the SDK's own error about it is dropped.
_quiet = threading.local()


class _Refusal:
    """One OTLP/HTTP exporter's watch on its endpoint's answers: the first 404 or 405
    is said once, in plait's words, and the exporter sends nothing after it."""

    def __init__(self, signal: str) -> None:
        self.signal = signal
        self.endpoint = ""
        self.refused = False

    def session(self) -> Any:
        """A `requests` session that tells this watch each answer, or None (the SDK's
        own) when a credential provider is to make the exporter's session."""
        if any(
            name.startswith("OTEL_PYTHON_EXPORTER_OTLP_HTTP_")
            and name.endswith("CREDENTIAL_PROVIDER")
            and value
            for name, value in os.environ.items()
        ):
            return None
        requests: Any = importlib.import_module("requests")
        session = requests.Session()
        session.hooks["response"].append(self._answered)
        return session

    def watch(self, endpoint: str) -> None:
        """The endpoint this exporter sends to: one that refused before is sent nothing."""
        self.endpoint = endpoint
        with _refused_lock:
            self.refused = endpoint in _refused

    def _answered(self, response: Any, *args: Any, **kwargs: Any) -> None:
        status = int(response.status_code)
        _quiet.pending = status in _REFUSING
        if status not in _REFUSING:
            return
        self.refused = True
        endpoint = self.endpoint or str(response.url)
        with _refused_lock:
            if endpoint in _refused:
                return
            _refused.add(endpoint)
        variable = _EXPORTER_VARIABLES[self.signal]
        _log.warning(
            "the OTLP endpoint %s does not accept %s (HTTP %d): plait stops sending them "
            "there; set %s=none to not send them at all",
            _shown(endpoint),
            self.signal,
            status,
            variable,
        )


def _shown(url: str) -> str:
    """The endpoint as it may be printed: no user, password or query (which may hold a
    key), and scrubbed of every known secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return scrub(f"{parts.scheme}://{host}{port}{parts.path}")


class _SpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter, stopped by its endpoint's refusal."""

    def __init__(self) -> None:
        self._plait_refusal = _Refusal("traces")
        super().__init__(session=self._plait_refusal.session())
        self._plait_refusal.watch(str(getattr(self, "_endpoint", "")))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._plait_refusal.refused:
            return SpanExportResult.FAILURE
        return super().export(spans)


class _MetricExporter(OTLPMetricExporter):
    """The SDK's OTLP/HTTP metric exporter, stopped by its endpoint's refusal."""

    def __init__(self) -> None:
        self._plait_refusal = _Refusal("metrics")
        super().__init__(session=self._plait_refusal.session())
        self._plait_refusal.watch(str(getattr(self, "_endpoint", "")))

    def export(self, metrics_data: MetricsData, *args: Any, **kwargs: Any) -> MetricExportResult:
        if self._plait_refusal.refused:
            return MetricExportResult.FAILURE
        return super().export(metrics_data, *args, **kwargs)


class _QuietRefusals(logging.Filter):
    """Drops the SDK's own error about an export plait has just said was refused."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and getattr(_quiet, "pending", False):
            _quiet.pending = False
            return False
        return True


for _exporter in (OTLPSpanExporter, OTLPMetricExporter):
    logging.getLogger(_exporter.__module__).addFilter(_QuietRefusals())
