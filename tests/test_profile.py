"""profile(): the trace must open in Perfetto, and the summary must tell the truth about structure.

Durations depend on the machine, so nothing here asserts one: the server's
latency directives and limits only create the shapes (retries, queues,
dependency chains) that the profile is then checked to show.
"""

from __future__ import annotations

import contextvars
import io
import itertools
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

import plait
from plait.handlers import Handler, Message
from plait.handlers.llm import answer
from plait.handlers.profiling import Profiler, profile
from plait.providers.base import LLMResponse, Usage
from plait.testing import FakeOpenAIServer
from tests.conftest import make_resources
from tests.pipelines import (
    DeepPipeline,
    Echo,
    FanOutFanIn,
    MultiPerspective,
    SummarizeAndAnalyze,
    echo,
)

# -- a Trace Event Format validator ------------------------------------------------------------

#: Metadata events this profiler may emit, with the argument each one must carry.
_METADATA_ARGS = {
    "process_name": ("name", str),
    "process_sort_index": ("sort_index", int),
    "thread_name": ("name", str),
    "thread_sort_index": ("sort_index", int),
}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def validate_trace(doc: Any) -> list[dict[str, Any]]:
    """Check ``doc`` against the Trace Event Format (JSON object form); returns its events.

    Every event has the fields its phase requires; times are finite numbers >= 0; every
    track with complete events is named; and complete events on one (pid, tid) nest:
    any two are disjoint or one contains the other, which is what viewers need to
    draw them as a stack.
    """
    assert json.loads(json.dumps(doc)) == doc, "the trace must survive a JSON round trip"
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    assert doc.get("displayTimeUnit") in ("ms", "ns")
    events: list[dict[str, Any]] = doc["traceEvents"]
    named_processes: set[int] = set()
    named_threads: set[tuple[int, int]] = set()
    tracks: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
    for event in events:
        assert isinstance(event, dict), event
        assert isinstance(event.get("name"), str) and event["name"], event
        assert isinstance(event.get("pid"), int), event
        assert "cat" not in event or isinstance(event["cat"], str), event
        assert "args" not in event or isinstance(event["args"], dict), event
        phase = event.get("ph")
        if phase == "M":
            assert event["name"] in _METADATA_ARGS, event
            key, kind = _METADATA_ARGS[event["name"]]
            assert isinstance(event["args"].get(key), kind), event
            if event["name"].startswith("thread_"):
                assert isinstance(event.get("tid"), int), event
            if event["name"] == "process_name":
                named_processes.add(event["pid"])
            if event["name"] == "thread_name":
                named_threads.add((event["pid"], event["tid"]))
        elif phase == "X":
            assert isinstance(event.get("tid"), int), event
            for time_field in ("ts", "dur"):
                assert _number(event.get(time_field)), event
                assert event[time_field] >= 0, event
            track = (event["pid"], event["tid"])
            tracks.setdefault(track, []).append(
                (event["ts"], event["ts"] + event["dur"], event["name"])
            )
        elif phase == "i":  # an instant: a thread-scoped moment on a named track
            assert isinstance(event.get("tid"), int) and event.get("s") == "t", event
            assert _number(event.get("ts")) and event["ts"] >= 0, event
            assert event["pid"] in named_processes, f"pid {event['pid']} has no process_name"
        else:
            pytest.fail(f"unexpected phase {phase!r} in {event}")
    for (pid, tid), spans in tracks.items():
        assert pid in named_processes, f"pid {pid} has no process_name"
        assert (pid, tid) in named_threads, f"track {(pid, tid)} has no thread_name"
        for i, (a_start, a_end, a_name) in enumerate(spans):
            for b_start, b_end, b_name in spans[i + 1 :]:
                disjoint = a_end <= b_start or b_end <= a_start
                nested = (a_start <= b_start and b_end <= a_end) or (
                    b_start <= a_start and a_end <= b_end
                )
                assert disjoint or nested, (
                    f"{a_name} [{a_start}, {a_end}] and {b_name} [{b_start}, {b_end}] "
                    f"overlap on track {(pid, tid)} without nesting"
                )
    return events


def test_the_validator_rejects_spans_that_overlap_without_nesting() -> None:
    named = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "p"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "t"}},
    ]
    good = [
        {"name": "a", "ph": "X", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"name": "b", "ph": "X", "ts": 2, "dur": 3, "pid": 1, "tid": 1},
        {"name": "c", "ph": "X", "ts": 10, "dur": 5, "pid": 1, "tid": 1},
    ]
    validate_trace({"traceEvents": named + good, "displayTimeUnit": "ms"})
    crossing = {"name": "d", "ph": "X", "ts": 8, "dur": 4, "pid": 1, "tid": 1}
    with pytest.raises(AssertionError, match="without nesting"):
        validate_trace({"traceEvents": [*named, *good, crossing], "displayTimeUnit": "ms"})
    with pytest.raises(AssertionError):
        validate_trace({"traceEvents": [*named, {**good[0], "dur": -1}], "displayTimeUnit": "ms"})
    with pytest.raises(AssertionError, match="no thread_name"):
        validate_trace({"traceEvents": [named[0], good[0]], "displayTimeUnit": "ms"})


# -- reading a trace -----------------------------------------------------------------------------


def calls_of(events: list[dict[str, Any]], cat: str = "llm") -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and e.get("cat") == cat]


def phases_of(call: dict[str, Any], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The phase spans drawn inside ``call`` (same track, same node, inside its span)."""
    end = call["ts"] + call["dur"]
    return sorted(
        (
            e
            for e in events
            if e["ph"] == "X"
            and e is not call
            and e.get("cat") not in ("llm", "module")
            and (e["pid"], e["tid"]) == (call["pid"], call["tid"])
            and e["args"]["node_id"] == call["args"]["node_id"]
            and e["args"]["input_index"] == call["args"]["input_index"]
            and call["ts"] <= e["ts"]
            and e["ts"] + e["dur"] <= end
        ),
        key=lambda e: e["ts"],
    )


def track_names(events: list[dict[str, Any]]) -> dict[tuple[int, int], str]:
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    return {
        (e["pid"], e["tid"]): f"{processes[e['pid']]} / {e['args']['name']}"
        for e in events
        if e["name"] == "thread_name"
    }


# -- the trace -----------------------------------------------------------------------------------


def test_each_alias_gets_its_own_named_track_and_the_file_is_written_on_exit(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = make_resources(server, ("fast", "smart"))
    target = tmp_path / "trace.json"
    with profile(target) as prof:
        out = SummarizeAndAnalyze().bind(resources=resources).run_sync(["one", "two"])
    assert out == ["[ana] [sum] one", "[ana] [sum] two"]

    events = validate_trace(json.loads(target.read_text()))
    assert prof.trace() == json.loads(target.read_text())
    names = track_names(events)
    calls = calls_of(events)
    assert len(calls) == 4
    for call in calls:
        alias = call["args"]["alias"]
        assert names[(call["pid"], call["tid"])].startswith(f"llm {alias} / {alias} lane")
        assert call["args"]["outcome"] == "ok"
        assert {p["name"] for p in phases_of(call, events)} >= {"request"}
    by_alias = {(c["name"], c["args"]["alias"]) for c in calls}
    assert by_alias == {("summarizer", "fast"), ("analyzer", "smart")}
    fast_pid = {c["pid"] for c in calls if c["args"]["alias"] == "fast"}
    smart_pid = {c["pid"] for c in calls if c["args"]["alias"] == "smart"}
    assert len(fast_pid) == len(smart_pid) == 1 and fast_pid != smart_pid

    # An explicit write gives the same document.
    again = prof.write(tmp_path / "again.json")
    assert json.loads(again.read_text()) == json.loads(target.read_text())


def test_concurrent_calls_on_one_alias_go_to_separate_lanes(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    pipeline = MultiPerspective().bind(resources=resources)
    with profile() as prof, ThreadPoolExecutor(1) as pool:
        # the run's thread sees the profiler: handlers live in the context
        done = pool.submit(contextvars.copy_context().run, pipeline.run_sync, "[[gate:g]]x")
        try:
            server.wait_parked("g", 3)  # all three calls are in flight together
        finally:
            server.open_gate("g")
        done.result(timeout=120)
    events = validate_trace(prof.trace())
    calls = calls_of(events)
    assert len(calls) == 3
    assert len({(c["pid"], c["tid"]) for c in calls}) == 3
    assert len({c["pid"] for c in calls}) == 1


def test_retries_show_each_attempt_and_the_backoff_between(server: FakeOpenAIServer) -> None:
    server.configure(rate_429=0.3, retry_after_s=0.01, seed=1)
    resources = make_resources(server, ("fast",), max_retries=10)
    with profile() as prof:
        out = Echo("r").bind(resources=resources).run_sync([f"q{i}" for i in range(16)])
    assert out == [f"[r] q{i}" for i in range(16)]

    events = validate_trace(prof.trace())
    retried = []
    for call in calls_of(events):
        requests = [p for p in phases_of(call, events) if p["cat"] == "request"]
        if len(requests) > 1:
            retried.append((call, requests))
        assert [r["args"]["attempt"] for r in requests] == list(range(1, len(requests) + 1))
        # Every attempt but the last failed, and the last one is the reply.
        assert [r["name"] for r in requests[:-1]] == ["request failed"] * (len(requests) - 1)
        assert requests[-1]["name"] == "request" and requests[-1]["args"]["status"] == "ok"
    assert retried, "seed 1 with rate_429=0.3 rejects some of 16 first attempts"
    for call, requests in retried:
        phases = phases_of(call, events)
        failed = requests[0]
        assert failed["args"]["status"] == "error" and "429" in failed["args"]["error"]
        assert failed.get("cname") == "bad"
        backoffs = [p for p in phases if p["cat"] == "backoff"]
        assert [b["args"]["attempt"] for b in backoffs] == list(range(1, len(requests)))
        # Each backoff lies between the attempt it follows and the next one.
        for n, backoff in enumerate(backoffs):
            assert requests[n]["ts"] + requests[n]["dur"] <= backoff["ts"]
            assert backoff["ts"] + backoff["dur"] <= requests[n + 1]["ts"]

    stats = prof.summary().aliases["fast"]
    total_retries = sum(len(requests) - 1 for _, requests in retried)
    assert stats.calls == 16 and stats.errors == 0
    assert stats.retries == stats.failed_attempts == total_retries
    assert stats.attempts == 16 + total_retries
    assert stats.backoff_s > 0


@pytest.mark.parametrize("limit", ["endpoint", "run"])
def test_waiting_for_a_slot_shows_as_a_queue_span(server: FakeOpenAIServer, limit: str) -> None:
    if limit == "endpoint":
        pipeline = MultiPerspective().bind(resources=make_resources(server, max_concurrent=1))
    else:
        pipeline = MultiPerspective().bind(resources=make_resources(server), max_concurrent=1)
    with profile() as prof:
        pipeline.run_sync("[[latency_ms:20]]x")
    events = validate_trace(prof.trace())
    queued = [
        p
        for call in calls_of(events)
        for p in phases_of(call, events)
        if p["name"] == {"endpoint": "queue (endpoint)", "run": "queue (run limit)"}[limit]
    ]
    # One slot, three calls that each hold it for a server round trip: two of them wait.
    assert len(queued) >= 2
    assert all(p["cat"] == "queue" for p in queued)
    assert prof.summary().aliases["fast"].queue_s > 0


def test_failures_and_answered_calls_are_marked(server: FakeOpenAIServer) -> None:
    class Canned(Handler):
        def process(self, msg: Message) -> None:
            if msg.type == "llm" and msg.name == "right":
                msg.meta["mock"] = True
                answer(msg, LLMResponse("canned", None, Usage(0, 0), "m", "stop"))

    pipeline = FanOutFanIn().bind(resources=make_resources(server))
    with profile() as prof, Canned():
        ok = pipeline.run_sync("fine")
        with pytest.raises(plait.ExecutionError, match="left failed"):
            pipeline.run_sync("[[status:400]]bad")
    assert ok == "[C] [L] fine | canned"

    events = validate_trace(prof.trace())
    outcomes = sorted((c["name"], c["args"]["outcome"]) for c in calls_of(events))
    # The second run's left call fails; the combine never runs, so it is never recorded.
    assert outcomes == [
        ("combine", "ok"),
        ("left", "error"),
        ("left", "ok"),
        ("right", "mocked"),
        ("right", "mocked"),
    ]
    error_call = next(c for c in calls_of(events) if c["args"]["outcome"] == "error")
    assert error_call.get("cname") == "terrible" and "400" in error_call["args"]["error"]
    mocked = [c for c in calls_of(events) if c["args"]["outcome"] == "mocked"]
    assert all(phases_of(c, events) == [] for c in mocked)
    stats = prof.summary().aliases["fast"]
    assert (stats.calls, stats.errors, stats.answered) == (5, 1, 2)


# -- the summary ---------------------------------------------------------------------------------


def path_names(prof: Profiler) -> list[str]:
    return [link.node.name for link in prof.summary().critical_path]


def test_the_critical_path_of_a_deep_pipeline_follows_its_dependency_chain(
    resources: plait.ResourceConfig,
) -> None:
    with profile() as prof:
        DeepPipeline().bind(resources=resources).run_sync("[[latency_ms:5]]deep")
    names = path_names(prof)
    # stage3 reads only stage2's "user" perspective, so that is the link between them;
    # which of stage3's three parallel analyses finished last is up to the scheduler.
    assert names[:3] == ["stage1.summarizer", "stage1.analyzer", "stage2.user"]
    assert names[3] in {
        "stage3.analyzer.technical",
        "stage3.analyzer.business",
        "stage3.analyzer.user",
    }
    assert names[4:] == ["stage3.synthesizer"]

    summary = prof.summary()
    assert summary.calls == 9
    links = summary.critical_path
    assert sum(link.contributed_s for link in links) == pytest.approx(summary.wall_s)
    assert all(link.waited_s >= 0 for link in links)
    for earlier, later in itertools.pairwise(links):
        assert earlier.node.end_s <= later.node.start_s
    assert set(summary.aliases) == {"fast", "smart"}
    assert summary.aliases["smart"].calls == 2 and summary.aliases["fast"].calls == 7


def test_the_critical_path_stays_within_the_input_that_finished_last(
    resources: plait.ResourceConfig,
) -> None:
    with profile() as prof:
        FanOutFanIn().bind(resources=resources).run_sync(["a", "b", "c"])
    links = prof.summary().critical_path
    assert [link.node.name for link in links][1:] == ["combine"]
    assert links[0].node.name in {"left", "right"}
    assert len({link.node.input_index for link in links}) == 1
    last = max(prof.summary(top=100).slowest, key=lambda n: n.end_s)
    assert (links[-1].node.node_id, links[-1].node.input_index) == (
        last.node_id,
        last.input_index,
    )


def test_calls_inside_an_async_forward_are_chained_in_program_order(
    resources: plait.ResourceConfig,
) -> None:
    class Chain(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.second = Echo("1"), Echo("2", alias="smart")

        async def forward(self, text: str) -> Any:
            return await self.second(await self.first(text))

    class Outer(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pre, self.chain = Echo("pre"), Chain()

        def forward(self, text: str) -> Any:
            return self.chain(self.pre(text))

    with profile() as prof:
        assert Outer().bind(resources=resources).run_sync("x") == "[2] [1] [pre] x"
    assert path_names(prof) == ["pre", "chain.first", "chain.second"]
    events = validate_trace(prof.trace())
    (module_call,) = calls_of(events, "module")
    assert module_call["name"] == "chain"
    assert track_names(events)[(module_call["pid"], module_call["tid"])].startswith("module calls")


def test_the_slowest_calls_come_first_with_their_place_in_the_batch(
    server: FakeOpenAIServer, resources: plait.ResourceConfig
) -> None:
    class OpenWhenOthersAreBack(Handler):
        """Opens the gate once the client has both other replies: input 0's call then
        started first (inputs start in order) and ends last, so it is the longest."""

        def __init__(self) -> None:
            self.back = 0

        def postprocess(self, msg: Message) -> None:
            if msg.type == "llm" and msg.input_index != 0:
                self.back += 1
                if self.back == 2:
                    server.open_gate("g")

    with profile() as prof, OpenWhenOthersAreBack():
        Echo("s").bind(resources=resources).run_sync(["[[gate:g]]b", "a", "c"])
    slowest = prof.summary(top=2).slowest
    assert len(slowest) == 2
    assert slowest[0].duration_s >= slowest[1].duration_s  # sorted
    assert (slowest[0].name, slowest[0].input_index, slowest[0].node_id) == ("Echo", 0, "0:Echo")


def test_the_table_renders(resources: plait.ResourceConfig) -> None:
    with profile() as prof:
        DeepPipeline().bind(resources=resources).run_sync("t")
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(prof.table(top=3))
    text = buffer.getvalue()
    for expected in ("Endpoints", "Slowest calls", "Critical path", "fast", "smart"):
        assert expected in text
    assert "stage3.synthesizer" in text
    data = prof.summary().to_dict()
    assert json.loads(json.dumps(data)) == data


def test_an_empty_profile_is_still_a_valid_trace(tmp_path: Path) -> None:
    with profile(tmp_path / "empty.json") as prof:
        pass
    validate_trace(json.loads((tmp_path / "empty.json").read_text()))
    summary = prof.summary()
    assert (summary.wall_s, summary.calls, summary.critical_path) == (0.0, 0, [])
    Console(file=io.StringIO()).print(prof.table())


def restored_events(trace: Path) -> list[dict[str, Any]]:
    return [e for e in validate_trace(json.loads(trace.read_text())) if e.get("ph") == "i"]


def test_a_rerun_from_the_checkpoint_draws_the_outputs_it_restored(
    server: FakeOpenAIServer, resources: plait.ResourceConfig, tmp_path: Path
) -> None:
    pipeline = FanOutFanIn().bind(resources=resources, checkpoint_dir=tmp_path / "ckpt")
    inputs = [f"doc {i}" for i in range(5)]
    with profile(tmp_path / "first.json"):
        first = pipeline.run_sync(inputs[:3])
    assert len(restored_events(tmp_path / "first.json")) == 0
    server.reset()
    with profile(tmp_path / "second.json") as prof:
        again = pipeline.run_sync(inputs)
    assert again[:3] == first
    assert again[3:] == [echo("C", f"{echo('L', t)} | {echo('R', t)}") for t in inputs[3:]]
    assert server.stats()["requests_total"] == 6  # inputs 3 and 4 only, 3 calls each
    events = validate_trace(json.loads((tmp_path / "second.json").read_text()))
    restored = [e for e in events if e.get("ph") == "i"]
    assert sorted(e["args"]["input_index"] for e in restored) == [0, 1, 2]
    assert all(e["cat"] == "checkpoint" and e["args"]["calls"] == 0 for e in restored)
    track = {e["pid"] for e in restored}
    (label,) = [e["args"]["name"] for e in events if e["name"] == "process_name"
                and e["pid"] in track]  # fmt: skip
    assert label == (
        "checkpoint: 3 output(s) restored, 0 calls sent; the 9 earlier call(s) that made "
        "them drawn from its log"
    )
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "llm"]
    assert {e["args"]["input_index"] for e in calls} == {3, 4} and prof.restored == 3


def test_rerunning_a_finished_plait_run_keeps_a_trace_of_where_its_outputs_came_from(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    from tests.conftest import plait_cli

    resources = tmp_path / "resources.toml"
    resources.write_text(
        "".join(
            f'[{alias}]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
            'api_key = "sk-test"\n'
            for alias in ("fast", "smart")
        )
    )
    inputs, out, trace = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "trace.json"
    inputs.write_text("".join(f'"doc {i}"\n' for i in range(4)))
    command = ("run", "tests.pipelines:FanOutFanIn", "-i", inputs, "-o", out,
               "--resources", resources, "--profile", trace, "-q")  # fmt: skip
    assert plait_cli(*command).returncode == 0
    first = validate_trace(json.loads(trace.read_text()))
    assert len([e for e in first if e.get("cat") == "llm" and e.get("ph") == "X"]) == 12
    server.reset()
    rerun = plait_cli(*command)
    assert rerun.returncode == 0, rerun.stderr
    assert server.stats()["requests_total"] == 0
    second = validate_trace(json.loads(trace.read_text()))
    assert second  # never an empty trace in place of a full one
    restored = [e for e in second if e.get("ph") == "i"]
    assert sorted(e["args"]["input_index"] for e in restored) == [0, 1, 2, 3]
    assert "checkpoint: 4 output(s) restored, 0 calls sent; the 12 earlier" in json.dumps(second)
