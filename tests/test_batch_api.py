"""Whole pipelines through the providers' batch APIs (`backend="batch"`, issue 22).

Against plait's fake servers over real HTTP: the fake OpenAI server's Batch API
(files and batches) and the fake Anthropic server's Message Batches, each answering
a batched request with the reply its online route gives the same request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import budget, cache, profile, record, replay
from plait.resources.config import ConfigurationError
from plait.sequences import Refine
from plait.testing import FakeAnthropicServer, FakeOpenAIServer

from .pipelines import FanOutFanIn

ANTHROPIC_KEY = "sk-ant-batch-test"
ROOT = Path(__file__).resolve().parent.parent
#: Short waits so the fakes' batches, and plait's polls of them, take milliseconds.
QUICK = {"batch_idle_s": 0.05, "batch_poll_s": 0.05, "batch_poll_max_s": 0.2}


#: A developer's own Anthropic settings and proxies kept out of the SDK's way.
pytestmark = pytest.mark.usefixtures("anthropic_environment")


@pytest.fixture(scope="module")
def anthropic_process() -> Iterator[FakeAnthropicServer]:
    with FakeAnthropicServer(api_key=ANTHROPIC_KEY) as server:
        yield server
    assert ANTHROPIC_KEY not in server.stderr_output()


class Fake:
    """One fake server's batch API, seen the same way whichever provider it fakes."""

    def __init__(self, server: FakeOpenAIServer | FakeAnthropicServer) -> None:
        self.server = server
        self.openai = isinstance(server, FakeOpenAIServer)

    def reset(self) -> None:
        self.server.reset()
        self.server.configure(batch_turnaround_s=0.05)

    def settings(self, **extra: Any) -> dict[str, Any]:
        if self.openai:
            wire = {"provider": "openai", "model": "m", "api_key": "sk-test"}
        else:
            wire = {"provider": "anthropic", "model": "claude-test", "api_key": ANTHROPIC_KEY}
        return {**wire, "base_url": self.server.base_url, **QUICK, **extra}

    def resources(self, **extra: Any) -> plait.ResourceConfig:
        return plait.ResourceConfig({"fast": self.settings(**extra)})

    def stats(self) -> dict[str, Any]:
        return self.server.batches()

    def batched(self) -> int:
        """Requests received in batches."""
        stats = self.stats()
        return int(stats["batch_requests_total" if self.openai else "requests_total"])

    def batch_count(self) -> int:
        stats = self.stats()
        return int(stats["batches_created" if self.openai else "batches_total"])

    def batch_sizes(self) -> list[int]:
        batches = self.stats()["batches"]
        found = batches if self.openai else batches.values()
        return [int(batch["requests"]) for batch in found]

    def online(self) -> int:
        stats = self.server.stats()
        return int(stats["requests_total"]) if self.openai else len(stats["requests"])

    def submitted_once(self) -> bool:
        counts = self.stats()["custom_ids"]
        return bool(counts) and max(counts.values()) == 1

    def expired(self) -> int:
        """Requests that came back expired."""
        stats = self.stats()
        if self.openai:
            return sum(int(b["request_counts"]["failed"]) for b in stats["batches"])
        return int(stats["result_counts"].get("expired", 0))

    def expire(self, unanswered: float) -> None:
        """Every batch expires with this share of its requests unanswered."""
        if isinstance(self.server, FakeOpenAIServer):
            self.server.configure(batch_expire=True, batch_expire_fraction=1 - unanswered)
        else:
            self.server.configure(batch_expire=True, batch_expire_fraction=unanswered)

    def hold(self) -> None:
        """Keep every batch from ending until `release`."""
        if isinstance(self.server, FakeOpenAIServer):
            self.server.close_gate("held")
            self.server.configure(batch_gate="held")
        else:
            self.server.close_batch_gate()

    def downloads(self) -> int:
        """Result downloads (one per batch when all its requests succeeded)."""
        stats = self.stats()
        if self.openai:
            return int(stats["api_calls"].get("GET /v1/files/{file_id}/content", 0))
        return int(stats["calls"].get("results", 0))

    def hold_route(self, route: str, held: bool = True) -> None:
        """Hold (or let go) batch creations (``create``) or result downloads
        (``results``) before they answer."""
        if isinstance(self.server, FakeOpenAIServer):
            key = {"create": "batch_create_gate", "results": "batch_content_gate"}[route]
            if held:
                self.server.close_gate(f"hold-{route}")
                self.server.configure(**{key: f"hold-{route}"})
            else:
                self.server.configure(**{key: None})
                self.server.open_gate(f"hold-{route}")
        else:
            self.server.configure(**{f"batch_{route}_gate_open": not held})

    def held(self, route: str) -> int:
        if isinstance(self.server, FakeOpenAIServer):
            return self.server.parked(f"hold-{route}")
        return int(self.stats()["held"].get(route, 0))

    def release(self) -> None:
        if isinstance(self.server, FakeOpenAIServer):
            self.server.open_gate("held")
        else:
            self.server.open_batch_gate()


@pytest.fixture(params=["openai", "anthropic"])
def fake(request: pytest.FixtureRequest) -> Fake:
    name = "server" if request.param == "openai" else "anthropic_process"
    found = Fake(request.getfixturevalue(name))
    found.reset()
    plait.reset_usage()
    return found


class Wide(plait.Module):
    """Four parallel calls, then one that combines them."""

    def __init__(self) -> None:
        super().__init__()
        self.parts = plait.ModuleList(
            plait.LLMInference("fast", system_prompt=f"Aspect {i}.") for i in range(4)
        )
        self.combine = plait.LLMInference("fast", system_prompt="Combine.")

    def forward(self, doc: str) -> Any:
        return self.combine(" + ".join(str(part(doc)) for part in self.parts))


def refine() -> plait.Module:
    """A Refine chain: one call per chunk, each on the answer so far (three stages)."""
    return Refine("fast", chunk_size=40, overlap=0)


@pytest.mark.parametrize(
    ("fake", "pipeline"),
    [
        ("openai", FanOutFanIn),
        ("anthropic", FanOutFanIn),
        ("openai", Wide),
        ("anthropic", refine),
    ],
    indirect=["fake"],
)
def test_a_multi_stage_pipeline_runs_through_batches_with_its_online_outputs(
    fake: Fake, pipeline: Callable[[], plait.Module]
) -> None:
    module = pipeline().bind(resources=fake.resources())
    docs = [f"document {i}: " + "a sentence of the body. " * 4 for i in range(8)]
    online = module.run_sync(docs)
    calls = fake.online()
    fake.reset()
    plait.reset_usage()

    batched = module.run_sync(docs, backend="batch")

    assert batched == online
    assert fake.batched() == calls and fake.online() == 0  # every call, in batches
    assert fake.submitted_once()
    # The first stage's calls go out before the second's exist: at least two batches.
    assert fake.batch_count() >= 2
    row = plait.usage()["fast"]
    assert row["batch_requests"] == calls and row["batches"] == fake.batch_count()


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_stage_goes_as_one_batch_once_it_stops_growing(fake: Fake) -> None:
    # Half a second without a new call ends a stage; tracing six inputs takes far less.
    module = FanOutFanIn().bind(resources=fake.resources(batch_idle_s=0.5))
    module.run_sync([f"document {i}" for i in range(6)], backend="batch")
    assert fake.batch_sizes() == [12, 6]


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_batches_stay_within_the_request_limit(fake: Fake) -> None:
    module = FanOutFanIn().bind(resources=fake.resources(batch_max_requests=5))
    docs = [f"document {i}" for i in range(7)]
    expected = FanOutFanIn().bind(resources=fake.resources()).run_sync(docs)
    fake.reset()
    assert module.run_sync(docs, backend="batch") == expected
    assert max(fake.batch_sizes()) <= 5
    assert fake.batched() == 21 and fake.submitted_once()


def test_expired_requests_go_again_alone_and_end_as_errors_past_the_retry_limit(
    fake: Fake,
) -> None:
    module = plait.LLMInference("fast").bind(
        resources=fake.resources(max_retries=2, batch_idle_s=0.3)
    )
    module.train()  # rows as Values, errors included
    docs = [f"question {i}" for i in range(5)]
    expected = [row.payload for row in module.run_sync(docs)]
    fake.reset()
    # Part of every batch expires unanswered: only those requests go again, each in a
    # later batch under an id of its own.
    fake.expire(0.4)
    rows = module.run_sync(docs, backend="batch")
    failed = sum(row.kind is plait.ValueKind.ERROR for row in rows)
    # Each expiry is followed by another request, except the last of one that gave up.
    assert fake.batched() == len(docs) + fake.expired() - failed and fake.expired() >= 2
    assert fake.submitted_once()
    for row, want in zip(rows, expected, strict=True):
        assert row.payload == want or (
            row.kind is plait.ValueKind.ERROR and "expired" in str(row.payload)
        )

    # When every batch expires, each request is tried 1 + max_retries times, then is
    # its input's error.
    fake.reset()
    fake.expire(1.0)
    rows = module.run_sync(docs, backend="batch")
    assert all(row.kind is plait.ValueKind.ERROR for row in rows)
    assert all("expired" in str(row.payload) and "gave up" in str(row.payload) for row in rows)
    assert fake.batched() == 3 * len(docs) and fake.submitted_once()


# Handlers, limits and records are the run's, whatever the wire: one provider.
@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_cache_hit_never_goes_into_a_batch_and_replay_answers_batch_made_calls(
    fake: Fake, tmp_path: Path
) -> None:
    module = FanOutFanIn().bind(resources=fake.resources())
    docs = [f"document {i}" for i in range(3)]
    with cache(tmp_path / "cache"), record(tmp_path / "calls.jsonl"):
        first = module.run_sync(docs, backend="batch")
    assert fake.batched() == 9
    with cache(tmp_path / "cache"):
        again = module.run_sync(docs, backend="batch")
    assert again == first and fake.batched() == 9
    with replay(tmp_path / "calls.jsonl"):
        assert module.run_sync(docs, backend="batch") == first
    assert fake.batched() == 9


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_budget_counts_batch_calls_at_the_batch_price_and_submits_nothing_past_it(
    fake: Fake,
) -> None:
    prices = {"input_price_per_mtok": 1000.0, "output_price_per_mtok": 1000.0}
    module = plait.LLMInference("fast").bind(resources=fake.resources(**prices))
    docs = [f"question {i}" for i in range(3)]
    with budget(max_cost=100.0) as spent:
        module.run_sync(docs, backend="batch")
    row = plait.usage()["fast"]
    tokens = row["prompt_tokens"] + row["completion_tokens"]
    assert spent.cost == pytest.approx(tokens * 1000.0 / 1e6 * 0.5)
    assert row["cost_usd"] == pytest.approx(spent.cost)

    fake.reset()
    module.train()
    with budget(max_calls=2):
        rows = module.run_sync([f"other {i}" for i in range(5)], backend="batch")
    assert sum(row.kind is plait.ValueKind.ERROR for row in rows) == 3
    assert fake.batched() == 2


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_batch_run_refuses_what_cannot_be_batched_before_any_call(
    fake: Fake, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigurationError, match="needs resources"):
        FanOutFanIn().run_sync(["x"], backend="batch")
    local = plait.ResourceConfig({"fast": {"provider": "local"}})
    with pytest.raises(ConfigurationError, match=r"provider 'local'.*no batch API"):
        FanOutFanIn().bind(resources=local).run_sync(["x"], backend="batch")
    module = FanOutFanIn().bind(resources=fake.resources())
    with pytest.raises(ValueError, match="cannot stream"):
        asyncio.run(anext(aiter(module.stream(["x"], backend="batch"))))
    with caplog.at_level(logging.WARNING, logger="plait"):
        module.run_sync(["x"], backend="batch")
    assert "cannot resume" in caplog.text
    assert fake.online() == 0


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_checkpointed_batch_run_records_its_batches_and_status_shows_them(
    fake: Fake, tmp_path: Path
) -> None:
    module = FanOutFanIn().bind(resources=fake.resources())
    docs = [f"document {i}" for i in range(4)]
    first = module.run_sync(docs, backend="batch", checkpoint_dir=tmp_path / "ckpt")
    shown = _status(tmp_path / "ckpt")
    assert shown["finished_inputs"] == 4
    batches = shown["batch_api"]
    assert batches["calls"] == {"pending": 0, "succeeded": 12, "failed": 0}
    assert batches["batches"]["ended"] == fake.batch_count()
    assert batches["unfinished"] == []
    # Run again: every output comes from the checkpoint, no batch is made.
    made = fake.batch_count()
    again = module.run_sync(docs, backend="batch", checkpoint_dir=tmp_path / "ckpt")
    assert again == first and fake.batch_count() == made


# -- killed and resumed -------------------------------------------------------------------
def _status(checkpoint: Path) -> dict[str, Any]:
    """What ``plait status CHECKPOINT --json`` shows."""
    shown = subprocess.run(
        [sys.executable, "-m", "plait.cli", "status", str(checkpoint), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found: dict[str, Any] = json.loads(shown.stdout)
    return found


def _prepare_run(tmp_path: Path, fake: Fake, count: int) -> tuple[list[str], list[Any]]:
    """The ``plait run --batch-api`` command over ``count`` documents, and the outputs
    the same pipeline gives online (the fake is reset after)."""
    docs = [f"document {i}" for i in range(count)]
    expected = FanOutFanIn().bind(resources=fake.resources()).run_sync(docs)
    fake.reset()
    return _write_run_files(tmp_path, fake, count), expected


def _resume_and_check(command: list[str], tmp_path: Path, fake: Fake, expected: list[Any]) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["output"] for row in sorted(rows, key=lambda r: r["index"])] == expected
    assert len(rows) == len(expected)  # each input exactly once
    assert fake.batched() == 3 * len(expected) and fake.submitted_once()


def _killed(command: list[str], until: Any, what: str) -> None:
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(until, what)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()


def _write_run_files(tmp_path: Path, fake: Fake, count: int) -> list[str]:
    lines = ["[fast]", *(f"{k} = {json.dumps(v)}" for k, v in fake.settings().items())]
    (tmp_path / "resources.toml").write_text("\n".join(lines) + "\n")
    (tmp_path / "in.jsonl").write_text(
        "".join(json.dumps(f"document {i}") + "\n" for i in range(count))
    )
    return [
        sys.executable, "-m", "plait.cli", "run", "tests/pipelines.py:FanOutFanIn",
        "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
        "--resources", str(tmp_path / "resources.toml"), "--batch-api", "-q",
    ]  # fmt: skip


def _wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling the fake's state, not a synchronisation by time


# Killed and resumed: the paths are the same on both providers (only the wire calls
# differ, which the tests above cover on both), so one provider keeps the suite's time.
# What differs is how a run killed while submitting finds its batch: OpenAI keeps
# plait's token in the batch's metadata, Anthropic keeps none (see the test of
# AnthropicBatchAPI.find below).
@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_run_killed_while_its_batch_is_pending_resumes_without_paying_again(
    fake: Fake, tmp_path: Path
) -> None:
    command, expected = _prepare_run(tmp_path, fake, 6)
    fake.hold()
    _killed(command, lambda: fake.batched() == 2 * 6, "the first stage's batch")
    fake.release()
    _resume_and_check(command, tmp_path, fake, expected)


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_run_killed_while_submitting_finds_its_batch_instead_of_submitting_it_again(
    fake: Fake, tmp_path: Path
) -> None:
    command, expected = _prepare_run(tmp_path, fake, 5)
    count = 5
    # The first stage's batch is held in processing; once it is in, creations are held
    # after the batch is made: the second stage's submission reaches the provider, and
    # the run is killed before it learns the batch's id.
    fake.hold()
    run = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(lambda: fake.batched() == 2 * count, "the first stage's batch")
        fake.hold_route("create")
        fake.release()
        _wait_for(lambda: fake.held("create") == 1, "the second stage's submission")
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    fake.hold_route("create", held=False)

    # No request twice: the resumed run found the batch whose creation it never heard
    # back from (calls not yet in any batch at the kill go in a new one).  Each batch's
    # results were downloaded once: the first stage's, downloaded before the kill, came
    # from the checkpoint.
    _resume_and_check(command, tmp_path, fake, expected)
    assert fake.downloads() == fake.batch_count()


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_run_killed_while_downloading_results_downloads_them_again_and_pays_nothing(
    fake: Fake, tmp_path: Path
) -> None:
    command, expected = _prepare_run(tmp_path, fake, 5)
    fake.hold_route("results")
    _killed(command, lambda: fake.held("results") == 1, "the first results download")
    fake.hold_route("results", held=False)
    status = _status(tmp_path / "out.jsonl.checkpoint")
    assert status["finished_inputs"] == 0 and status["batch_api"]["calls"]["pending"] == 10
    assert len(status["batch_api"]["unfinished"]) == fake.batch_count()

    _resume_and_check(command, tmp_path, fake, expected)
    assert fake.downloads() == fake.batch_count() + 1  # the interrupted one twice


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_profile_draws_each_batch_with_the_calls_it_answered(fake: Fake) -> None:
    module = FanOutFanIn().bind(resources=fake.resources())
    with profile() as prof:
        module.run_sync([f"document {i}" for i in range(4)], backend="batch")
    events = prof.trace()["traceEvents"]
    batches = [e for e in events if e.get("cat") == "batch" and e.get("ph") == "X"]
    per_batch = [e for e in batches if "calls" in e["args"]]  # the "batches" track
    assert len(per_batch) == fake.batch_count()
    assert sum(e["args"]["calls"] for e in per_batch) == 12
    inside = [e for e in batches if e["name"].startswith("in batch ")]
    assert len(inside) == 12  # each call shows the batch that answered it
    ids = {e["args"]["batch_id"] for e in per_batch}
    assert {e["args"]["batch"] for e in inside} == ids


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_a_batch_the_provider_fails_whole_makes_each_of_its_inputs_an_error_row(
    fake: Fake,
) -> None:
    assert isinstance(fake.server, FakeOpenAIServer)
    # The organisation's queue of batches is full (OpenAI's token_limit_exceeded): worth
    # submitting again later, up to max_retries, then each input's error.
    fake.server.configure(batch_fail_validation=True)
    module = plait.LLMInference("fast").bind(
        resources=fake.resources(max_retries=1, max_retry_after_s=0.05)
    )
    module.train()
    rows = module.run_sync(["one", "two"], backend="batch")
    assert all(row.kind is plait.ValueKind.ERROR for row in rows)
    assert all("the batch failed: Enqueued token limit" in str(row.payload) for row in rows)
    assert fake.batch_count() == 2 and fake.submitted_once()


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_fresh_names_the_batches_it_leaves_pending_at_the_provider(
    fake: Fake, tmp_path: Path
) -> None:
    command, expected = _prepare_run(tmp_path, fake, 4)
    fake.hold()
    _killed(command, lambda: fake.batched() == 8, "the first stage's batch")
    pending = _status(tmp_path / "out.jsonl.checkpoint")["batch_api"]["unfinished"]
    assert pending and len(pending) == fake.batch_count()
    fake.release()
    done = subprocess.run(
        [*command, "--fresh"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "still pending at the provider" in done.stderr
    assert all(batch_id in done.stderr for batch_id in pending)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [row["output"] for row in sorted(rows, key=lambda r: r["index"])] == expected


def test_anthropic_finds_a_batch_by_its_size_and_time_since_it_keeps_no_metadata(
    anthropic_process: FakeAnthropicServer,
) -> None:
    """What a run killed while submitting to Anthropic asks: is there a batch of my
    size, created since I recorded my intent? (The custom ids in its results confirm
    it; a call whose id is not among them is submitted again.)"""
    from plait.providers.anthropic_batch import AnthropicBatchAPI
    from plait.providers.base import LLMRequest

    fake = Fake(anthropic_process)
    fake.reset()
    api = AnthropicBatchAPI(plait.EndpointConfig(**fake.settings()))
    request = LLMRequest("fast", [{"role": "user", "content": "hello"}])

    async def scenario() -> tuple[str, str | None, str | None, str | None]:
        since = time.time() - 1
        lines = [api.line(f"p{i}", request) for i in range(3)]
        made = await api.submit(lines, "token")
        return (
            made,
            await api.find("token", since, 3),
            await api.find("token", since, 4),  # another size: not ours
            await api.find("token", time.time() + 60, 3),  # made before our intent
        )

    made, found, other_size, too_old = asyncio.run(scenario())
    assert found == made and other_size is None and too_old is None


def test_results_the_wire_code_cannot_read_fail_their_calls_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """A provider whose results file holds a line that is not an object: the calls of
    that batch come back as errors naming it (they once waited forever)."""
    from aiohttp import web

    async def upload(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "file-in", "object": "file"})

    async def create(request: web.Request) -> web.Response:
        return web.json_response({"id": "batch_x", "status": "validating"})

    async def status(request: web.Request) -> web.Response:
        return web.json_response(
            {"id": "batch_x", "status": "completed", "output_file_id": "file-out"}
        )

    async def content(request: web.Request) -> web.Response:
        return web.Response(body=b"[1, 2]\n")

    async def scenario() -> list[Any]:
        app = web.Application()
        app.router.add_post("/v1/files", upload)
        app.router.add_post("/v1/batches", create)
        app.router.add_get("/v1/batches/batch_x", status)
        app.router.add_get("/v1/files/file-out/content", content)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            settings = {"provider": "openai", "model": "m", "api_key": "k", **QUICK}
            settings["base_url"] = f"http://127.0.0.1:{port}/v1"
            module = plait.LLMInference("fast").bind(
                resources=plait.ResourceConfig({"fast": settings})
            )
            module.train()
            return list(await module(["one", "two"], backend="batch"))
        finally:
            await runner.cleanup()

    rows = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert all(row.kind is plait.ValueKind.ERROR for row in rows)
    assert all("results could not be read (AttributeError" in str(row.payload) for row in rows)


@pytest.mark.parametrize("fake", ["openai"], indirect=True)
def test_embeddings_for_ranked_demonstrations_go_online_while_the_calls_are_batched(
    fake: Fake,
) -> None:
    pool = [("the parcel did not come", "shipping"), ("my card was charged", "billing")]
    config = plait.ResourceConfig({"fast": fake.settings(), "embedder": fake.settings()})
    module = plait.LLMInference(
        "fast", "Classify.", demos=plait.knn_demos(k=1, pool=pool, embed="embedder")
    ).bind(resources=config)
    docs = ["package late", "refund my card", "delivery missing"]
    online = module.run_sync(docs)
    fake.reset()
    batched = module.run_sync(docs, backend="batch")
    assert batched == online
    assert fake.batched() == 3  # the three chat calls, in batches
    embedded = [r["body"]["input"] for r in fake.server.stats(bodies=True)["requests"]]
    assert sorted(map(tuple, embedded)) == sorted(
        [tuple(t for t, _ in pool), *((d,) for d in docs)]
    )
