"""OpenTelemetry: `plait.handlers.otel` and ``plait run --otel`` (issue 25, point 1).

Every span and metric here travels as OTLP/HTTP protobuf to a real receiver this
module starts on 127.0.0.1 (`Receiver`: POST /v1/traces and /v1/metrics, decoded with
the opentelemetry-proto classes), from exporters the handler builds out of the
standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` variable; every LLM call goes to the fake
OpenAI server.  The handler flushes as its block ends, so what a run exported is at
the receiver when the run returns: no test waits for time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

import plait
from plait.effects import Handler, Message, current_run
from plait.handlers import otel
from plait.handlers.telemetry import SCHEMA_URL, SEMCONV_VERSION
from plait.testing import FakeOpenAIServer

from .conftest import ROOT, make_resources
from .pipelines import Echo, SummarizeAndAnalyze, Synthesizer

#: A key that the resources hold, so plait knows it is a secret and scrubs it.
SECRET = "sk-otel-secret-4b9d2c7e1f"
CLIENT = 3  # SpanKind.CLIENT in the OTLP protobuf
STATUS_ERROR = 2


class Receiver:
    """An OTLP/HTTP receiver: keeps every span and metric data point it is sent, and
    every raw body (to search for a secret in what really went over the wire)."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.spans: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        #: The path of every POST, in order (a refused one included).
        self.posts: list[str] = []
        #: Paths answered with this status instead of taken, as a backend that does
        #: not ingest that signal answers (Jaeger and Phoenix take no metrics).
        self.refuse: dict[str, int] = {}
        receiver = self

        class Handle(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.posts.append(self.path)
                    refused = receiver.refuse.get(self.path)
                if refused is not None:
                    self.send_response(refused)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/v1/traces":
                    receiver.take_traces(body)
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver.take_metrics(body)
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take_traces(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "name": span.name,
                            "kind": span.kind,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "attributes": _attributes(span.attributes),
                            "events": [(e.name, _attributes(e.attributes)) for e in span.events],
                            "status": span.status.code,
                            "resource": resource,
                            "schema_url": scope_spans.schema_url,
                        }
                    )
        with self.lock:
            self.bodies.append(body)
            self.spans.extend(found)
            self.lock.notify_all()

    def take_metrics(self, body: bytes) -> None:
        request = metrics_service_pb2.ExportMetricsServiceRequest()
        request.ParseFromString(body)
        found = []
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    for point in metric.histogram.data_points:
                        found.append(
                            {
                                "name": metric.name,
                                "unit": metric.unit,
                                "attributes": _attributes(point.attributes),
                                "count": point.count,
                                "sum": point.sum,
                            }
                        )
        with self.lock:
            self.bodies.append(body)
            self.metrics.extend(found)
            self.lock.notify_all()

    def reset(self) -> None:
        with self.lock:
            self.spans.clear()
            self.metrics.clear()
            self.bodies.clear()
            self.posts.clear()
            self.refuse.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            found[pair.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        elif kind is not None:
            found[pair.key] = getattr(value, kind)
    return found


@pytest.fixture(scope="module")
def receiver_process() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.stop()


@pytest.fixture()
def receiver(receiver_process: Receiver, monkeypatch: pytest.MonkeyPatch) -> Receiver:
    """The receiver, emptied, and the standard variables pointing the exporters at it."""
    receiver_process.reset()
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver_process.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "plait-tests")
    return receiver_process


def _by_id(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {span["span_id"]: span for span in spans}


def _parent(span: dict[str, Any], spans: list[dict[str, Any]]) -> dict[str, Any] | None:
    return _by_id(spans).get(span["parent"]) if span["parent"] else None


def _llm_spans(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in spans if s["kind"] == CLIENT]


# -- the tree ------------------------------------------------------------------------------
def test_a_run_is_one_trace_of_run_module_and_llm_spans_named_after_the_conventions(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    pipeline = Synthesizer().bind(resources=make_resources(server, ("fast", "smart")))
    with otel():
        outputs = pipeline.run_sync(["hello"])
    assert outputs[0].startswith("[syn]")

    spans = receiver.spans
    assert len({s["trace_id"] for s in spans}) == 1
    (run,) = [s for s in spans if s["parent"] is None]
    assert run["name"] == "run Synthesizer"
    assert run["attributes"]["plait.run.backend"] == "local"
    assert run["attributes"]["plait.run.inputs"] == 1
    assert run["attributes"]["plait.run.failed_inputs"] == 0
    assert run["resource"]["service.name"] == "plait-tests"
    assert run["schema_url"] == SCHEMA_URL and SEMCONV_VERSION in SCHEMA_URL

    # run > Synthesizer > analyzer > its three calls; run > Synthesizer > synthesizer.
    (root,) = [s for s in spans if _parent(s, spans) is run]
    assert root["name"] == "Synthesizer"
    assert root["attributes"]["plait.module.composite"] is True
    (analyzer,) = [s for s in spans if s["name"] == "analyzer"]
    assert _parent(analyzer, spans) is root
    llm = _llm_spans(spans)
    assert len(llm) == 4
    inside = {s["attributes"]["plait.module.path"]: _parent(s, spans) for s in llm}
    assert inside == {
        "analyzer.technical": analyzer,
        "analyzer.business": analyzer,
        "analyzer.user": analyzer,
        "synthesizer": root,
    }

    call = next(s for s in llm if s["attributes"]["plait.module.path"] == "synthesizer")
    attributes = call["attributes"]
    assert call["name"] == "chat m"
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "m"
    assert attributes["gen_ai.response.model"] == "m"
    assert attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["server.address"] == "127.0.0.1"
    assert attributes["server.port"] == int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    assert attributes["plait.alias"] == "smart"
    assert attributes["plait.input_index"] == 0
    assert attributes["plait.node_id"].endswith(":synthesizer")
    assert attributes["plait.attempts"] == 1
    assert "plait.retries" not in attributes  # none: left out, not said as zero
    assert attributes["plait.outcome"] == "ok"
    assert attributes["plait.queue_wait_s"] >= 0
    assert [name for name, _ in call["events"]].count("plait.request") == 1
    # Content is opt-in: none by default.
    assert not any("gen_ai.input.messages" in s["attributes"] for s in llm)


def test_seed_temperature_and_cost_are_on_the_call(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    resources = make_resources(
        server, ("fast",), input_price_per_mtok=1_000_000.0, output_price_per_mtok=0.0
    )
    call = Echo("t").bind(resources=resources, seed=7)
    with otel():
        call.run_sync(["a"])
    (span,) = _llm_spans(receiver.spans)
    attributes = span["attributes"]
    assert isinstance(attributes["gen_ai.request.seed"], int)
    assert attributes["plait.seed"] == attributes["gen_ai.request.seed"]
    assert attributes["gen_ai.request.temperature"] == 1.0
    # A dollar per prompt token at this price.
    assert attributes["plait.cost_usd"] == pytest.approx(attributes["gen_ai.usage.input_tokens"])


def test_a_span_says_the_call_as_sent_after_an_override_and_goes_to_a_provider_of_yours(
    server: FakeOpenAIServer,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from plait.handlers import override

    endpoint = {"provider": "openai", "base_url": server.base_url, "api_key": "sk-test"}
    resources = plait.ResourceConfig(
        {"fast": {**endpoint, "model": "small"}, "smart": {**endpoint, "model": "large"}}
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    # The override is outside: this handler processes the call before it is rewritten,
    # and its span still says what was sent.
    with override(alias="smart", max_tokens=9), otel(provider):
        Echo("t").bind(resources=resources).run_sync(["a"])
    (call,) = [s for s in spans.get_finished_spans() if s.name.startswith("chat")]
    assert call.name == "chat large"
    assert call.attributes is not None
    assert call.attributes["gen_ai.request.model"] == "large"
    assert call.attributes["plait.alias"] == "smart"
    assert call.attributes["gen_ai.request.max_tokens"] == 9


# -- failures -------------------------------------------------------------------------------
def test_a_failed_call_is_an_error_span_with_its_type_and_its_exception(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    server.configure(retry_after_s=0.0)
    pipeline = SummarizeAndAnalyze().bind(
        resources=make_resources(server, ("fast", "smart"), max_retries=1)
    )
    with otel():
        out = pipeline.run_sync(["fine", "[[status:429]] refused"])
    assert isinstance(out[0], str) and isinstance(out[1], plait.Value)

    spans = receiver.spans
    llm = _llm_spans(spans)
    failed = [s for s in llm if s["status"] == STATUS_ERROR]
    assert len(failed) == 1
    (call,) = failed
    assert call["attributes"]["error.type"] == "429"
    assert call["attributes"]["plait.outcome"] == "error"
    assert call["attributes"]["plait.attempts"] == 2
    assert call["attributes"]["plait.retries"] == 1
    assert call["attributes"]["plait.rate_limited"] == 2
    assert [n for n, _ in call["events"]].count("plait.backoff") == 1
    (exception,) = [a for n, a in call["events"] if n == "exception"]
    assert "429" in exception["exception.message"]
    # The failure reaches the module and the input it belongs to; the run ran on.
    assert call["attributes"]["plait.input_index"] == 1
    run = next(s for s in spans if s["parent"] is None)
    assert run["attributes"]["plait.run.failed_inputs"] == 1
    assert run["attributes"]["plait.run.inputs"] == 2
    assert run["status"] != STATUS_ERROR
    # The second input's analyzer never ran (its summarizer failed): no span for it.
    assert len(llm) == 3
    durations = [m for m in receiver.metrics if m["name"] == "gen_ai.client.operation.duration"]
    failed_points = [m for m in durations if m["attributes"].get("error.type") == "429"]
    assert sum(m["count"] for m in failed_points) == 1
    assert sum(m["count"] for m in durations) == 3


# -- content --------------------------------------------------------------------------------
@pytest.mark.parametrize("capture", [False, True])
def test_prompts_and_replies_only_when_asked_and_never_a_secret(
    server: FakeOpenAIServer, receiver: Receiver, capture: bool
) -> None:
    # The resources hold the key "sk-test", so plait knows it for a secret; the prompt
    # quotes it, and the fake server's reply echoes the prompt.
    prompt = "my key is sk-test, keep it"
    with otel(capture_content=capture):
        out = Echo("system words").bind(resources=make_resources(server)).run_sync([prompt])
    assert "sk-test" in out[0]  # the reply really holds it
    (span,) = _llm_spans(receiver.spans)
    attributes = span["attributes"]
    if capture:
        assert "system words" in attributes["gen_ai.system_instructions"]
        assert "keep it" in attributes["gen_ai.input.messages"]
        assert '"role": "user"' in attributes["gen_ai.input.messages"]
        assert "keep it" in attributes["gen_ai.output.messages"]
    else:
        for name in (
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.system_instructions",
        ):
            assert name not in attributes
    assert not any(b"sk-test" in body for body in receiver.bodies)


def test_a_key_an_endpoint_quotes_back_never_reaches_the_collector(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    server.configure(quote_key_in_401=True)
    resources = make_resources(server, ("fast",), api_key=SECRET)
    with otel(capture_content=True):
        out = Echo("t").bind(resources=resources).run_sync(["hello"])
    assert isinstance(out[0], plait.Value)
    (span,) = _llm_spans(receiver.spans)
    assert span["status"] == STATUS_ERROR
    assert span["attributes"]["error.type"] == "401"
    (exception,) = [a for n, a in span["events"] if n == "exception"]
    assert "401" in exception["exception.message"]
    assert not any(SECRET.encode() in body for body in receiver.bodies)


def test_the_exporters_header_values_are_secrets(
    server: FakeOpenAIServer, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plait._secrets import scrub

    key = "hdr-otel-key-9c1e77d0"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"x-team={key}")
    with otel():
        out = Echo("t").bind(resources=make_resources(server)).run_sync([f"say {key}"])
    assert key in out[0]  # the reply holds it; what plait writes does not
    assert key not in scrub(f"an error quoting {key}")
    assert not any(key.encode() in body for body in receiver.bodies)


# -- metrics --------------------------------------------------------------------------------
def test_token_usage_and_duration_metrics_follow_the_conventions(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    with otel():
        pipeline.run_sync(["one", "two", "three"])
    llm = _llm_spans(receiver.spans)
    assert len(llm) == 6
    tokens = [m for m in receiver.metrics if m["name"] == "gen_ai.client.token.usage"]
    durations = [m for m in receiver.metrics if m["name"] == "gen_ai.client.operation.duration"]
    assert {m["unit"] for m in tokens} == {"{token}"}
    assert {m["unit"] for m in durations} == {"s"}
    by_type = {
        kind: sum(m["sum"] for m in tokens if m["attributes"]["gen_ai.token.type"] == kind)
        for kind in ("input", "output")
    }
    assert by_type["input"] == sum(s["attributes"]["gen_ai.usage.input_tokens"] for s in llm)
    assert by_type["output"] == sum(s["attributes"]["gen_ai.usage.output_tokens"] for s in llm)
    assert sum(m["count"] for m in durations) == 6
    for point in durations:
        assert point["attributes"]["gen_ai.operation.name"] == "chat"
        assert point["attributes"]["gen_ai.provider.name"] == "openai"
        assert point["attributes"]["gen_ai.request.model"] == "m"


# -- one handler, several runs ----------------------------------------------------------------
def test_concurrent_runs_under_one_handler_each_get_their_own_trace(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))

    async def both() -> Any:
        return await asyncio.gather(pipeline(["a1", "a2"]), pipeline(["b1"]))

    with otel():
        first, second = asyncio.run(both())
    assert len(first) == 2 and len(second) == 1

    spans = receiver.spans
    runs = [s for s in spans if s["parent"] is None]
    assert len(runs) == 2
    assert len({r["trace_id"] for r in runs}) == 2
    for run in runs:
        mine = [s for s in spans if s["trace_id"] == run["trace_id"]]
        inputs = run["attributes"]["plait.run.inputs"]
        # Each input: its root call and two LLM calls, all in its run's trace.
        assert len(_llm_spans(mine)) == 2 * inputs
        texts = {s["attributes"]["plait.input_index"] for s in _llm_spans(mine)}
        assert texts == set(range(inputs))
        for span in mine:
            if span is not run:
                assert _parent(span, mine) is not None  # no span hangs outside its run
    assert sorted(r["attributes"]["plait.run.inputs"] for r in runs) == [1, 2]


def test_a_rerun_answered_by_its_checkpoint_says_so_and_makes_no_call_spans(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    with otel():
        first = pipeline.run_sync(["a", "b"], checkpoint_dir=tmp_path / "ck")
    assert len(_llm_spans(receiver.spans)) == 4
    receiver.reset()
    with otel():
        assert pipeline.run_sync(["a", "b"], checkpoint_dir=tmp_path / "ck") == first
    spans = receiver.spans
    assert _llm_spans(spans) == []
    (run,) = spans
    assert run["attributes"]["plait.run.inputs"] == 2
    assert run["attributes"]["plait.run.failed_inputs"] == 0


def test_a_run_started_inside_a_run_is_part_of_its_trace(
    server: FakeOpenAIServer, receiver: Receiver
) -> None:
    resources = make_resources(server, ("fast",))
    inner = Echo("in").bind(resources=resources)

    class Outer(plait.Module):
        async def forward(self, text: str) -> Any:
            return await plait.run(inner, [text, text + "!"])

    with otel():
        assert Outer().bind(resources=resources).run_sync(["x"]) == [["[in] x", "[in] x!"]]
    spans = receiver.spans
    assert len({s["trace_id"] for s in spans}) == 1
    (outer,) = [s for s in spans if s["name"] == "run Outer"]
    (nested,) = [s for s in spans if s["name"] == "run Echo"]
    assert outer["parent"] is None and nested["parent"] == outer["span_id"]
    assert nested["attributes"]["plait.run.inputs"] == 2
    assert [_parent(s, spans) for s in _llm_spans(spans)] == [nested, nested]


def test_a_run_is_a_message_only_hooks_named_for_it_see() -> None:
    seen: list[str] = []

    class Plain(Handler):
        def process(self, msg: Message) -> None:
            seen.append(msg.type)

    class Runs(Handler):
        def process_run(self, msg: Message) -> None:
            seen.append(f"run {msg.name} {current_run() is msg}")

        def postprocess_run(self, msg: Message) -> None:
            seen.append(f"end {msg.meta['backend']}")

    class Doubler(plait.Module):
        def forward(self, text: str) -> str:
            return text * 2

    with Plain(), Runs():
        assert Doubler().run_sync(["a", "b"], max_concurrent=2) == ["aa", "bb"]
    assert seen[0] == "run Doubler False"
    assert seen[-1] == "end local"
    assert "run" not in seen  # the plain hook saw the calls only
    assert seen.count("module") == 2


# -- the command ----------------------------------------------------------------------------
def _write_resources(path: Path, base_url: str) -> Path:
    lines = []
    for alias in ("fast", "smart"):
        lines += [
            f"[{alias}]",
            'provider = "openai"',
            'model = "m"',
            f'base_url = "{base_url}"',
            'api_key = "sk-test"',
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _cli(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "plait.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
    )


def test_plait_run_otel_exports_where_the_environment_says(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"alpha"\n"beta"\n')
    done = _cli(
        "run",
        "tests.pipelines:FanOutFanIn",
        "-i",
        inputs,
        "-o",
        tmp_path / "out.jsonl",
        "--resources",
        _write_resources(tmp_path / "resources.toml", server.base_url),
        "--otel",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_SERVICE_NAME": "cli-run"},
    )
    assert done.returncode == 0, done.stderr
    spans = receiver.spans
    (run,) = [s for s in spans if s["parent"] is None]
    assert run["name"] == "run FanOutFanIn"
    assert run["resource"]["service.name"] == "cli-run"
    assert run["attributes"]["plait.run.inputs"] == 2
    assert len(_llm_spans(spans)) == 6
    assert {s["trace_id"] for s in spans} == {run["trace_id"]}
    assert any(m["name"] == "gen_ai.client.token.usage" for m in receiver.metrics)
    assert not any(b"sk-test" in body for body in receiver.bodies)


def test_plait_eval_otel_exports_each_scored_example(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"input": "a", "target": "[T] a"}\n{"input": "b", "target": "no"}\n')
    done = _cli(
        "eval",
        "tests.cli_targets:Tagged",
        "--data",
        data,
        "--resources",
        _write_resources(tmp_path / "resources.toml", server.base_url),
        "--otel",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint},
    )
    assert done.returncode == 0, done.stderr
    llm = _llm_spans(receiver.spans)
    assert len(llm) == 2
    assert {s["attributes"]["plait.module.path"] for s in llm} == {"model.llm"}
    assert all(s["parent"] is not None for s in llm)  # inside their runs' spans
    assert any(m["name"] == "gen_ai.client.operation.duration" for m in receiver.metrics)


def test_plait_run_otel_without_the_extra_says_how_to_install_it(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    # A Python where the SDK cannot be imported, as after a plain `pip install plait`.
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoSDK:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.startswith('opentelemetry.sdk'):\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "        return None\n"
        "sys.meta_path.insert(0, _NoSDK())\n"
    )
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"alpha"\n')
    path = os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])
    done = _cli(
        "run",
        "tests.pipelines:FanOutFanIn",
        "-i",
        inputs,
        "-o",
        tmp_path / "out.jsonl",
        "--resources",
        _write_resources(tmp_path / "resources.toml", server.base_url),
        "--otel",
        env={"PYTHONPATH": path},
    )
    assert done.returncode == 2
    assert "pip install 'plait[otel]'" in done.stderr
    assert server.stats()["requests"] == []  # refused before anything ran


# -- the standard variables -----------------------------------------------------------------
def _run_otel(
    server: FakeOpenAIServer, tmp_path: Path, env: dict[str, str], *texts: str
) -> subprocess.CompletedProcess[str]:
    """`plait run ... --otel` of two inputs (or those given) under these variables."""
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(f'"{text}"\n' for text in texts or ("alpha", "beta")))
    return _cli(
        "run",
        "tests.pipelines:FanOutFanIn",
        "-i",
        inputs,
        "-o",
        tmp_path / "out.jsonl",
        "--resources",
        _write_resources(tmp_path / "resources.toml", server.base_url),
        "--otel",
        env=env,
    )


@pytest.mark.parametrize(
    ("variables", "spans", "metrics"),
    [
        ({"OTEL_METRICS_EXPORTER": "none"}, True, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "None"}, False, False),
        ({"OTEL_LOGS_EXPORTER": "none"}, True, True),
        ({"OTEL_SDK_DISABLED": "true"}, False, False),
    ],
)
def test_the_exporter_variables_say_which_signals_are_sent(
    server: FakeOpenAIServer,
    receiver: Receiver,
    tmp_path: Path,
    variables: dict[str, str],
    spans: bool,
    metrics: bool,
) -> None:
    done = _run_otel(
        server, tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **variables}
    )
    assert done.returncode == 0, done.stderr
    assert len(server.stats()["requests"]) == 6  # the run itself is the same
    assert ("/v1/traces" in receiver.posts) is spans
    assert ("/v1/metrics" in receiver.posts) is metrics
    assert (len(_llm_spans(receiver.spans)) == 6) is spans
    assert any(m["name"] == "gen_ai.client.token.usage" for m in receiver.metrics) is metrics


def test_console_exporters_write_to_stderr_beside_otlp(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    done = _run_otel(
        server,
        tmp_path,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_TRACES_EXPORTER": "console, otlp",
            "OTEL_METRICS_EXPORTER": "console",
        },
    )
    assert done.returncode == 0, done.stderr
    # Spans both ways; metrics on the console only; stdout is not used (it may carry
    # the outputs).
    assert len(_llm_spans(receiver.spans)) == 6
    assert "/v1/metrics" not in receiver.posts
    assert '"name": "run FanOutFanIn"' in done.stderr
    assert '"gen_ai.client.token.usage"' in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OTEL_METRICS_EXPORTER", "prometheus", "accepted values: otlp, console, none"),
        ("OTEL_TRACES_EXPORTER", "otlp,jaeger", "accepted values: otlp, console, none"),
        ("OTEL_LOGS_EXPORTER", "file", "accepted values: otlp, console, none"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "http/protobuf"),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "grpc", "opentelemetry-exporter-otlp-proto-grpc"),
        ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "yes", "true, false"),
    ],
)
def test_a_value_plait_cannot_honour_stops_the_command_before_anything_runs(
    server: FakeOpenAIServer,
    receiver: Receiver,
    tmp_path: Path,
    variable: str,
    value: str,
    says: str,
) -> None:
    done = _run_otel(
        server, tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, variable: value}
    )
    assert done.returncode == 2, done.stderr
    assert f"{variable}={value}" in done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert server.stats()["requests"] == []
    assert receiver.posts == []


@pytest.mark.parametrize("command", ["eval", "train", "serve"])
def test_every_command_with_otel_reads_the_variables_the_same_way(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path, command: str
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"input": "a", "target": "[T] a"}\n{"input": "b", "target": "no"}\n')
    resources = _write_resources(tmp_path / "resources.toml", server.base_url)
    arguments: dict[str, list[str | Path]] = {
        "eval": ["tests.cli_targets:Tagged", "--data", data],
        "train": ["tests.cli_targets:Tagged", "--data", data, "--out", tmp_path / "out"],
        "serve": ["tests/serve_targets.py:Answer", "--port", "0"],
    }
    done = _cli(
        command,
        *arguments[command],
        "--resources",
        resources,
        "--otel",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_METRICS_EXPORTER": "statsd"},
    )
    assert done.returncode == 2, done.stderr
    assert "OTEL_METRICS_EXPORTER=statsd" in done.stderr
    assert "accepted values: otlp, console, none" in done.stderr
    assert "Traceback" not in done.stderr
    assert server.stats()["requests"] == []


def test_per_signal_endpoints_and_resource_attributes_are_honoured(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: nothing may be sent there
    try:
        done = _run_otel(
            server,
            tmp_path,
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{dead.getsockname()[1]}",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.endpoint}/v1/traces",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{receiver.endpoint}/v1/metrics",
                "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes,stage=ci",
            },
        )
    finally:
        dead.close()
    assert done.returncode == 0, done.stderr
    assert "Failed to export" not in done.stderr
    (run,) = [s for s in receiver.spans if s["parent"] is None]
    # No OTEL_SERVICE_NAME: the service is the one OTEL_RESOURCE_ATTRIBUTES names.
    assert run["resource"]["service.name"] == "from-attributes"
    assert run["resource"]["stage"] == "ci"
    assert any(m["name"] == "gen_ai.client.token.usage" for m in receiver.metrics)


def test_a_traces_only_backend_is_told_once_in_plaits_words(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    """Jaeger and Phoenix answer the metrics POST with 405: the run says so once, in
    its own words, and the spans still arrive."""
    receiver.refuse["/v1/metrics"] = 405
    done = _run_otel(server, tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
    assert done.returncode == 0, done.stderr
    assert receiver.posts.count("/v1/metrics") == 1
    assert len(_llm_spans(receiver.spans)) == 6
    said = [line for line in done.stderr.splitlines() if "does not accept metrics" in line]
    assert said == [
        f"the OTLP endpoint {receiver.endpoint}/v1/metrics does not accept metrics (HTTP 405): "
        "plait stops sending them there; set OTEL_METRICS_EXPORTER=none to not send them at all"
    ]
    assert "Failed to export" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("signal", "other"), [("metrics", "traces"), ("traces", "metrics")])
def test_an_endpoint_that_refused_a_signal_is_not_sent_it_again(
    server: FakeOpenAIServer,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    signal: str,
    other: str,
) -> None:
    # A receiver of its own: the process remembers the endpoint that refused, and the
    # module's receiver must still be sent metrics by the tests after this one.
    refusing = Receiver()
    refusing.refuse[f"/v1/{signal}"] = 404
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", refusing.endpoint)
    pipeline = Echo("t").bind(resources=make_resources(server))
    try:
        with caplog.at_level("WARNING"):
            for _ in range(3):  # each block builds its providers afresh
                with otel():
                    pipeline.run_sync(["a"])
    finally:
        refusing.stop()
    assert refusing.posts.count(f"/v1/{signal}") == 1
    assert refusing.posts.count(f"/v1/{other}") == 3
    said = [r.getMessage() for r in caplog.records if "does not accept" in r.getMessage()]
    assert said == [
        f"the OTLP endpoint {refusing.endpoint}/v1/{signal} does not accept {signal} "
        f"(HTTP 404): plait stops sending them there; set OTEL_{signal.upper()}_EXPORTER=none "
        "to not send them at all"
    ]
    assert not any("Failed to export" in r.getMessage() for r in caplog.records)
    # The module's receiver, which takes metrics, is still sent them.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    with otel():
        pipeline.run_sync(["b"])
    assert len(_llm_spans(receiver.spans)) == 1
    assert any(m["name"] == "gen_ai.client.token.usage" for m in receiver.metrics)


@pytest.mark.parametrize("capture", ["true", None])
def test_the_genai_capture_variable_turns_content_on_from_the_command(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path, capture: str | None
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
    if capture is not None:
        env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = capture
    done = _run_otel(server, tmp_path, env, "my key is sk-test, keep it")
    assert done.returncode == 0, done.stderr
    llm = _llm_spans(receiver.spans)
    assert len(llm) == 3
    for span in llm:
        attributes = span["attributes"]
        if capture:
            assert "keep it" in attributes["gen_ai.input.messages"]
            assert "keep it" in attributes["gen_ai.output.messages"]
            assert "gen_ai.system_instructions" in attributes
        else:
            assert "gen_ai.input.messages" not in attributes
            assert "gen_ai.output.messages" not in attributes
    assert not any(b"sk-test" in body for body in receiver.bodies)


@pytest.mark.parametrize(
    ("variable", "argument", "captured"),
    [
        ("true", None, True),
        ("SPAN_ONLY", None, True),
        ("true", False, False),
        ("false", True, True),
    ],
)
def test_an_explicit_capture_content_argument_wins_over_the_variable(
    server: FakeOpenAIServer,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    argument: bool | None,
    captured: bool,
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", variable)
    handler = otel() if argument is None else otel(capture_content=argument)
    assert handler.capture_content is captured
    with handler:
        Echo("t").bind(resources=make_resources(server)).run_sync(["hello"])
    (span,) = _llm_spans(receiver.spans)
    assert ("gen_ai.input.messages" in span["attributes"]) is captured


# -- Ray ------------------------------------------------------------------------------------
def test_spans_made_on_ray_workers_join_the_drivers_trace(
    server: FakeOpenAIServer, receiver: Receiver, ray_cluster: Any
) -> None:
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    with otel():
        out = pipeline.run_sync([f"w{i}" for i in range(4)], workers=2)
    assert len(out) == 4 and all(isinstance(o, str) for o in out)

    spans = receiver.spans
    (run,) = [s for s in spans if s["parent"] is None]
    assert run["attributes"]["plait.run.backend"] == "ray"
    assert {s["trace_id"] for s in spans} == {run["trace_id"]}
    assert run["attributes"]["plait.run.inputs"] == 4
    shares = [s for s in spans if s["parent"] == run["span_id"]]
    assert shares and all(s["name"].startswith("run SummarizeAndAnalyze on ") for s in shares)
    llm = _llm_spans(spans)
    assert len(llm) == 8
    # Made and exported by the workers, not by the driver.
    driver = run["resource"]["service.instance.id"]
    assert all(s["resource"]["service.instance.id"] != driver for s in llm)
    assert sum(s["attributes"]["plait.run.inputs"] for s in shares) == 4


# -- plait serve ----------------------------------------------------------------------------
def test_plait_serve_otel_makes_each_request_a_trace_of_its_own(
    server: FakeOpenAIServer, receiver: Receiver, tmp_path: Path
) -> None:
    """Requests share one engine, yet each is a run for the handler: its own trace,
    a root span saying its route and rows, the module and LLM spans under it."""
    import aiohttp

    resources = tmp_path / "resources.toml"
    resources.write_text(
        f'[resources.fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    log = tmp_path / "serve.log"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
    with open(log, "w", encoding="utf-8") as err:
        command = ["serve", "tests/serve_targets.py:Answer", "--resources", str(resources)]
        proc = subprocess.Popen(
            [sys.executable, "-m", "plait.cli", *command, "--port", "0", "--otel"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=environ,
        )

    async def requests() -> list[Any]:
        while " on http://" not in log.read_text(encoding="utf-8"):
            assert proc.poll() is None, log.read_text(encoding="utf-8")
            await asyncio.sleep(0.01)
        line = next(x for x in log.read_text().splitlines() if " on http://" in x)
        url = "http://" + line.split(" on http://", 1)[1].strip()
        async with aiohttp.ClientSession() as session:
            while True:
                assert proc.poll() is None, log.read_text(encoding="utf-8")
                try:
                    async with session.get(f"{url}/health") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.01)

            async def post(route: str, body: Any) -> Any:
                async with session.post(f"{url}{route}", json=body) as response:
                    assert response.status == 200, await response.text()
                    return await response.json()

            return await asyncio.gather(
                post("/invoke", {"question": "a"}),
                post("/invoke", {"question": "b"}),
                post("/batch", {"inputs": [{"question": "c"}, {"question": "d"}]}),
            )

    try:
        replies = asyncio.run(requests())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text(encoding="utf-8")
    assert replies[0]["output"].endswith("plain: a")
    assert [row["output"][-1] for row in replies[2]["rows"]] == ["c", "d"]

    spans = receiver.spans  # flushed as the server's block ended, before it exited
    runs = [s for s in spans if s["parent"] is None]
    assert sorted(
        (s["attributes"]["plait.run.request"], s["attributes"]["plait.run.inputs"]) for s in runs
    ) == [("/batch", 2), ("/invoke", 1), ("/invoke", 1)]
    assert all(
        s["name"] == "run Answer" and s["attributes"]["plait.run.backend"] == "serve" for s in runs
    )
    assert len({s["trace_id"] for s in runs}) == 3
    llm = _llm_spans(spans)
    assert len(llm) == 4
    for call in llm:
        module = _parent(call, spans)
        assert module is not None and module["name"] == "Answer"
        root = _parent(module, spans)
        assert root is not None and root["parent"] is None
    by_trace = {s["trace_id"]: s for s in runs}
    assert sorted(by_trace[c["trace_id"]]["attributes"]["plait.run.inputs"] for c in llm) == [
        1,
        1,
        2,
        2,
    ]
    # Inputs are indexed as the reply's rows are: each request's from 0.
    assert (
        sorted(
            (
                by_trace[span["trace_id"]]["attributes"]["plait.run.request"],
                span["attributes"]["plait.input_index"],
            )
            for span in spans
            if span["parent"] is not None
        )
        == [("/batch", 0), ("/batch", 0), ("/batch", 1), ("/batch", 1)] + [("/invoke", 0)] * 4
    )
