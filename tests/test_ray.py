"""One pipeline on several Ray worker processes: same results, limits held cluster-wide,
faults survived, handlers meaning what they mean in one process (issue 12).

A local Ray is started once for the session (`ray_cluster`); every run starts its own
worker actors in it, as `plait run --workers N` does in a Ray it starts itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import budget, cache, profile
from plait.handlers.budgeting import BudgetExceeded
from plait.testing import FakeOpenAIServer

from .conftest import ROOT, make_resources, process_alive
from .pipelines import Echo, FanOutFanIn, Tagged, TwoSteps, echo, two_steps

pytestmark = pytest.mark.usefixtures("ray_cluster")


def expected(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def _keys_of_first_calls(server: FakeOpenAIServer) -> dict[str, int]:
    """How often each first-step request (system prompt "A") completed at the server."""
    counts: dict[str, int] = {}
    for record in server.stats()["requests"]:
        if record["system"] == "A" and record["status"] == 200:
            counts[record["key"]] = counts.get(record["key"], 0) + 1
    return counts


def _wait_for_second_calls(server: FakeOpenAIServer, count: int, timeout: float = 60.0) -> None:
    """Return once ``count`` second-step requests (system prompt "B") have completed."""
    deadline = time.monotonic() + timeout
    while True:
        done = sum(
            1 for r in server.stats()["requests"] if r["system"] == "B" and r["status"] == 200
        )
        if done >= count:
            return
        assert time.monotonic() < deadline, f"only {done} of {count} second calls completed"
        time.sleep(0.01)


def _worker_processes(checkpoint: Path) -> list[int]:
    """Pids of this run's workers: each logs its calls to ``workers/<name>-<pid>-<id>.jsonl``
    in the run's checkpoint directory."""
    return sorted(int(log.name.split("-")[1]) for log in (checkpoint / "workers").glob("*.jsonl"))


def test_a_batch_on_workers_gives_the_one_process_results_in_order(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, ("fast", "smart"), max_concurrent=8)
    inputs = [f"doc {i}" for i in range(60)]
    pipeline = FanOutFanIn().bind(resources=resources)
    plait.reset_usage()
    assert pipeline.run_sync(inputs, workers=3) == [expected(t) for t in inputs]
    assert server.stats()["requests_total"] == 180
    assert plait.usage()["fast"]["requests"] == 180  # every worker's counters, added up


def test_usage_counts_each_deployment_s_calls_across_workers() -> None:
    """An alias with two deployments, run on two workers: `usage()` in the driver
    adds up how many calls each deployment answered in every worker."""
    with FakeOpenAIServer() as east, FakeOpenAIServer() as west:
        deployments = [{"base_url": east.base_url}, {"base_url": west.base_url}]
        fast = {"model": "m", "api_key": "sk-test", "deployments": deployments}
        resources = plait.ResourceConfig({"fast": fast})
        inputs = [f"doc {i}" for i in range(40)]
        plait.reset_usage()
        rows = Echo("fast").bind(resources=resources).run_sync(inputs, workers=2)
        assert rows == [echo("fast", t) for t in inputs]
        answered = {
            label: server.stats()["requests_total"]
            for label, server in (("east", east), ("west", west))
        }
        by_deployment = plait.usage()["fast"]["deployments"]
    assert sum(by_deployment.values()) == 40 == sum(answered.values())
    assert sorted(by_deployment.values()) == sorted(answered.values())


def test_max_concurrent_holds_across_four_workers(server: FakeOpenAIServer) -> None:
    """Four workers share one alias's limit of 8: all 8 slots get used (every request
    parks at a gate until 8 wait there, a state, not a timing) and never a ninth."""
    server.configure(gate_texts={"q": "c8"})  # every request parks until the gate opens
    resources = make_resources(server, model="cluster-c8", max_concurrent=8)
    inputs = [f"q{i}" for i in range(160)]
    result: dict[str, Any] = {}

    def run() -> None:
        result["out"] = Echo("fast").bind(resources=resources).run_sync(inputs, workers=4)

    thread = threading.Thread(target=run)
    thread.start()
    server.wait_parked("c8", 8)  # the whole limit is in use, spread over the workers
    server.open_gate("c8")
    thread.join(timeout=300)
    assert not thread.is_alive()
    assert result["out"] == [echo("fast", t) for t in inputs]
    stats = server.stats()
    assert stats["requests_total"] == 160
    assert stats["max_in_flight"] == 8  # the limit, and all of it: never more, and used


def test_requests_per_minute_hold_across_four_workers(server: FakeOpenAIServer) -> None:
    rpm = 1200  # 20 a second, a burst of one second's worth
    rate = burst = rpm / 60
    resources = make_resources(
        server, model="cluster-rpm", max_concurrent=8, requests_per_minute=rpm
    )
    out = Echo("fast").bind(resources=resources).run_sync([f"r{i}" for i in range(70)], workers=4)
    assert len(out) == 70 and all(isinstance(o, str) for o in out)
    records = server.stats()["requests"]
    arrivals = sorted(r["t_start"] for r in records)
    assert len(arrivals) == 70
    assert server.stats()["max_in_flight"] <= 8
    # Every window, by the server's own clock: between the i-th and j-th arrival no more
    # than burst + rate * (t_j - t_i) requests (the +1 absorbs float rounding).  The
    # 60-second window of the limit, scaled down to the 3.5 s this takes.
    for i, t_i in enumerate(arrivals):
        for j in range(i, len(arrivals)):
            assert j - i + 1 <= burst + rate * (arrivals[j] - t_i) + 1, (i, j)


def test_passes_at_once_take_workers_of_their_own_from_a_pool_and_later_ones_reuse_them() -> None:
    """A `WorkerPool` (a training run's passes) hands each pass running at the same
    time a set of workers of its own, loaded with its own pipeline; a pass after them
    reloads idle workers instead of starting processes; closing the pool stops them."""
    import asyncio

    from plait.execution.settings import resolve_options
    from plait.ray.runner import WorkerPool, run_distributed
    from plait.ray.spec import make_spec
    from plait.resources.manager import ResourceManager

    pool = WorkerPool()
    opts = resolve_options({}, {}, None)

    def one_pass(tag: str) -> list[str]:
        rows: dict[int, str] = {}
        spec = make_spec(Tagged(tag), ResourceManager.coerce(None), opts)
        run_distributed(
            spec, [f"{tag}{i}" for i in range(6)], lambda text: ((text,), {}),
            lambda index, item, value: rows.__setitem__(index, value.payload),
            workers=2, pool=pool,
        )  # fmt: skip
        return [rows[i] for i in range(6)]

    async def two_at_once() -> list[list[str]]:
        return list(await asyncio.gather(*(asyncio.to_thread(one_pass, t) for t in "AB")))

    def pids(rows: list[str]) -> set[str]:
        return {row.rsplit(":", 1)[1] for row in rows}

    try:
        a, b = asyncio.run(two_at_once())
        assert [row.rsplit(":", 1)[0] for row in a] == [f"A:A{i}" for i in range(6)]
        assert [row.rsplit(":", 1)[0] for row in b] == [f"B:B{i}" for i in range(6)]
        assert not pids(a) & pids(b)  # never one worker for both pipelines at once
        c = one_pass("C")
        assert [row.rsplit(":", 1)[0] for row in c] == [f"C:C{i}" for i in range(6)]
        assert pids(c) <= pids(a) | pids(b)  # reloaded, not started
    finally:
        pool.close()
    started = {int(pid) for pid in pids(a) | pids(b)}
    deadline = time.monotonic() + 60
    while any(process_alive(pid) for pid in started):  # stopped with the pool (Ray reaps them)
        assert time.monotonic() < deadline, f"workers {started} outlived their pool"
        time.sleep(0.05)


def test_a_killed_worker_s_inputs_rerun_elsewhere_without_paying_twice(
    server: FakeOpenAIServer, ray_cluster: Any, tmp_path: Path
) -> None:
    resources = make_resources(server, model="cluster-kill", max_concurrent=16)
    inputs = [f"doc {i}" for i in range(20)] + [f"hold {i}" for i in range(6)]
    pipeline = TwoSteps().bind(resources=resources)
    result: dict[str, Any] = {}

    def run() -> None:
        result["out"] = pipeline.run_sync(inputs, workers=2, checkpoint_dir=tmp_path)

    thread = threading.Thread(target=run)
    thread.start()
    server.wait_parked("hold", 6)  # every held input's first call has completed
    # ... and every other input has finished: at the kill, the only calls in flight are
    # the parked ones, so every completed first call is in a worker's log (a call whose
    # reply was on its way when the worker died is paid again, rightly).
    _wait_for_second_calls(server, 20)
    workers = _worker_processes(tmp_path)
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    server.open_gate("hold")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert result["out"] == [two_steps(t) for t in inputs]  # every output, once, in order
    # No first call was paid twice: the dead worker's were answered from its log.
    assert set(_keys_of_first_calls(server).values()) == {1}
    assert len(_keys_of_first_calls(server)) == len(inputs)


def test_a_killed_driver_resumes_from_its_checkpoint(
    server: FakeOpenAIServer, ray_cluster: Any, tmp_path: Path
) -> None:
    data = tmp_path / "in.jsonl"
    docs = [f"doc {i}" for i in range(12)] + [f"hold {i}" for i in range(4)]
    data.write_text("".join(json.dumps({"doc": d}) + "\n" for d in docs))
    (tmp_path / "r.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "cluster-driver"\nbase_url = "{server.base_url}"\n'
        'api_key_env = "PLAIT_TEST_KEY"\nmax_concurrent = 8\n'
    )
    target = f"{ROOT / 'tests' / 'pipelines.py'}:TwoSteps"
    address = ray_cluster.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "plait.cli", "run", target, "--input", str(data)]
    command += ["--output", str(tmp_path / "out.jsonl"), "--resources", str(tmp_path / "r.toml")]
    command += ["--workers", "2", "--ray-address", address, "-q"]
    env = dict(os.environ, PLAIT_TEST_KEY="sk-test")
    first = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    server.wait_parked("hold", 4)
    _wait_for_second_calls(server, 12)  # nothing in flight at the kill but the parked calls
    first.kill()  # SIGKILL: the driver dies; Ray ends the workers it owned
    first.wait()
    paid_before = _keys_of_first_calls(server)
    server.open_gate("hold")
    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(len(docs)))  # each exactly once
    assert {r["index"]: r["output"] for r in rows} == {i: two_steps(d) for i, d in enumerate(docs)}
    # Calls completed before the kill were not sent again.
    assert len(paid_before) == len(docs)
    assert set(_keys_of_first_calls(server).values()) == {1}


def test_a_worker_that_cannot_reach_its_endpoint_gives_error_rows(tmp_path: Path) -> None:
    resources = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "m",
                "base_url": "http://127.0.0.1:9/v1",  # discard port: refused
                "api_key": "sk-test",
                "max_retries": 0,
            }
        }
    )
    out = Echo("fast").bind(resources=resources).run_sync(["a", "b", "c"], workers=2)
    assert len(out) == 3
    for value in out:
        assert isinstance(value, plait.Value) and value.is_error
        assert value.meta["error_type"] and value.meta["traceback"]


def test_a_budget_is_one_hard_limit_across_workers(server: FakeOpenAIServer) -> None:
    resources = make_resources(server, model="cluster-budget", max_concurrent=4)
    with budget(max_calls=10) as spent:
        out = (
            Echo("fast").bind(resources=resources).run_sync([f"b{i}" for i in range(30)], workers=3)
        )
    assert server.stats()["requests_total"] == 10
    ok = [o for o in out if isinstance(o, str)]
    refused = [o for o in out if isinstance(o, plait.Value)]
    assert len(ok) == 10 and len(refused) == 20
    assert all(v.meta["error_type"] == BudgetExceeded.__name__ for v in refused)
    assert spent.calls == 10 and spent.refused == 20


@pytest.mark.parametrize("limit", ["max_tokens", "max_cost"])
def test_tokens_and_cost_budgets_are_hard_limits_across_workers(
    server: FakeOpenAIServer, limit: str
) -> None:
    prices = {"input_price_per_mtok": 1000.0, "output_price_per_mtok": 3000.0}
    resources = make_resources(server, model=f"cluster-{limit}", max_concurrent=8, **prices)
    assert Echo("t").bind(resources=resources).run_sync("q00") == echo("t", "q00")
    (record,) = server.stats()["requests"]
    server.reset()
    tokens = record["prompt_tokens"] + record["completion_tokens"]
    cost = (record["prompt_tokens"] * 1000.0 + record["completion_tokens"] * 3000.0) / 1e6
    # 5 calls' worth, less a little: each request reserves its estimate in the broker's
    # ledger when admitted (estimates are above what a call spends), so the cluster
    # sends exactly 5, however the 32 calls are spread over the workers (a batch of 16
    # on each: both workers admit requests at once).
    spent = (
        budget(max_tokens=5 * tokens - 1) if limit == "max_tokens" else budget(max_cost=4.5 * cost)
    )
    inputs = [f"q{i:02d}" for i in range(32)]
    with spent:
        out = Echo("t").bind(resources=resources).run_sync(inputs, workers=2)
    assert server.stats()["requests_total"] == 5
    ok = [o for o in out if isinstance(o, str)]
    refused = [o for o in out if isinstance(o, plait.Value)]
    assert len(ok) == 5 and len(refused) == 27
    assert {v.meta["error_type"] for v in refused} == {BudgetExceeded.__name__}
    assert all(f"of {limit}=" in v.meta["message"] for v in refused)
    assert spent.calls == 5 and spent.refused == 27
    assert spent.tokens == 5 * tokens and spent.cost == pytest.approx(5 * cost)


def test_profile_draws_one_trace_with_a_process_per_worker(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = make_resources(server, model="cluster-profile")
    path = tmp_path / "trace.json"
    with profile(path):
        FanOutFanIn().bind(resources=resources).run_sync([f"p{i}" for i in range(20)], workers=2)
    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert len(processes) == 2 and all(p.startswith("worker w") for p in processes)
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "llm"]
    assert len(calls) == 60


def test_a_rerun_on_workers_draws_the_outputs_the_checkpoint_restored(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = make_resources(server, model="cluster-restored")
    pipeline = Echo("fast").bind(resources=resources)
    inputs = [f"r{i}" for i in range(6)]
    pipeline.run_sync(inputs[:4], workers=2, checkpoint_dir=tmp_path / "ckpt")
    server.reset()
    path = tmp_path / "trace.json"
    with profile(path):
        out = pipeline.run_sync(inputs, workers=2, checkpoint_dir=tmp_path / "ckpt")
    assert out == [echo("fast", t) for t in inputs]
    assert server.stats()["requests_total"] == 2
    events = json.loads(path.read_text())["traceEvents"]
    restored = [e for e in events if e.get("cat") == "checkpoint" and e.get("ph") == "i"]
    assert sorted(e["args"]["input_index"] for e in restored) == [0, 1, 2, 3]
    # The calls the workers made for them, from the workers' logs, drawn beside them.
    drawn = [e for e in events if e.get("cat") == "checkpoint" and e.get("ph") == "X"]
    assert sorted(e["args"]["input_index"] for e in drawn) == [0, 1, 2, 3]
    calls = [e for e in events if e.get("ph") == "X" and e.get("cat") == "llm"]
    assert sorted(e["args"]["input_index"] for e in calls) == [4, 5]


def test_a_key_an_endpoint_quotes_reaches_no_row_or_trace_from_workers(
    server: FakeOpenAIServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "sk-CANARY-quoted-to-a-worker-77"
    monkeypatch.setenv("PLAIT_TEST_QUOTED_KEY", key)
    server.configure(quote_key_in_401=True)
    resources = plait.ResourceConfig(
        {
            "fast": {
                "provider": "openai",
                "model": "cluster-quoted",
                "base_url": server.base_url,
                "api_key_env": "PLAIT_TEST_QUOTED_KEY",
                "max_retries": 0,
            }
        }
    )
    path = tmp_path / "trace.json"
    with profile(path):
        out = Echo("fast").bind(resources=resources).run_sync(["a", "b"], workers=2)
    assert server.stats()["status_counts"] == {"401": 2}
    assert all(isinstance(v, plait.Value) and "401" in v.meta["message"] for v in out)
    shown = [json.dumps({k: str(v) for k, v in row.meta.items()}) for row in out]
    shown += [str(row.payload) for row in out] + [path.read_text()]
    assert "401" in shown[-1] and not any(key in text for text in shown)


def test_a_cache_is_shared_by_the_workers_of_one_machine(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = make_resources(server, model="cluster-cache")
    inputs = [f"c{i}" for i in range(30)]
    with cache(tmp_path / "cache.sqlite"):
        first = FanOutFanIn().bind(resources=resources).run_sync(inputs, workers=2)
    assert server.stats()["requests_total"] == 90
    server.reset()
    with cache(tmp_path / "cache.sqlite"):
        again = FanOutFanIn().bind(resources=resources).run_sync(inputs, workers=2)
    assert again == first
    assert server.stats()["requests_total"] == 0


def test_plait_run_with_workers_writes_every_row_once(
    server: FakeOpenAIServer, ray_cluster: Any, tmp_path: Path
) -> None:
    data = tmp_path / "in.jsonl"
    docs = [f"doc {i}" for i in range(40)]
    data.write_text("".join(json.dumps({"doc": d}) + "\n" for d in docs))
    (tmp_path / "r.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key_env = "PLAIT_TEST_KEY"\n'
    )
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plait.cli",
            "run",
            f"{ROOT / 'tests' / 'pipelines.py'}:TwoSteps",
            "--input",
            str(data),
            "--output",
            str(tmp_path / "out.jsonl"),
            "--resources",
            str(tmp_path / "r.toml"),
            "--workers",
            "2",
            "--ray-address",
            address,
            "--preserve-order",
        ],
        cwd=ROOT,
        env=dict(os.environ, PLAIT_TEST_KEY="sk-test"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(40))  # in input order, each once
    assert [r["output"] for r in rows] == [two_steps(d) for d in docs]
    assert "40 input(s): 40 succeeded, 0 failed" in done.stderr
    # the usage table adds up every worker's calls: 40 inputs x 2 calls
    assert re.search(r"│ fast\s+│[^│]+│\s+80 │", done.stderr), done.stderr


def test_other_handlers_run_in_every_worker(server: FakeOpenAIServer, tmp_path: Path) -> None:
    from plait.handlers import override, record, replay

    resources = make_resources(server, model="cluster-handlers")
    inputs = [f"h{i}" for i in range(12)]
    with override(temperature=0.25), record(tmp_path / "calls.jsonl") as recorder:
        first = FanOutFanIn().bind(resources=resources).run_sync(inputs, workers=2)
    bodies = [r["body"] for r in server.stats(bodies=True)["requests"]]
    assert len(bodies) == 36 and all(b["temperature"] == 0.25 for b in bodies)
    assert recorder.calls == 36  # every worker's calls, in one recording
    server.reset()
    with replay(tmp_path / "calls.jsonl"):
        again = FanOutFanIn().bind(resources=resources).run_sync(inputs, workers=2)
    assert again == first
    assert server.stats()["requests_total"] == 0


class _Unpicklable(plait.handlers.Handler):
    def __init__(self) -> None:
        self.lock = threading.Lock()


def test_a_handler_that_cannot_reach_the_workers_is_refused_before_the_run(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, model="cluster-refused")
    with _Unpicklable(), pytest.raises(TypeError, match="_Unpicklable is active but cannot"):
        Echo("fast").bind(resources=resources).run_sync(["a"], workers=2)
    assert server.stats()["requests_total"] == 0


class Fragile(plait.Module):
    """Echoes, but "exit" raises SystemExit in forward and "crash" kills its process."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo("fast")

    def forward(self, doc: str) -> Any:
        if doc == "exit":
            sys.exit(3)
        if doc == "crash":
            os._exit(1)  # as a segfault in native code would: no exception, no cleanup
        return self.echo(doc)


def test_an_input_that_kills_its_workers_becomes_its_error_row(server: FakeOpenAIServer) -> None:
    from plait.ray.runner import MAX_LOSSES, WorkerDied

    resources = make_resources(server, model="cluster-fragile")
    inputs = ["a", "exit", "b", "crash", "c"]
    out = Fragile().bind(resources=resources).run_sync(inputs, workers=2)
    assert out[0] == echo("fast", "a") and out[2] == echo("fast", "b")
    assert out[4] == echo("fast", "c")
    assert isinstance(out[1], plait.Value) and "SystemExit" in out[1].meta["message"]
    crashed = out[3]
    assert isinstance(crashed, plait.Value) and crashed.meta["error_type"] == WorkerDied.__name__
    assert f"died {MAX_LOSSES} times" in crashed.meta["message"]


def test_a_seeded_batch_on_workers_draws_the_same_seeds_as_one_process(
    server: FakeOpenAIServer,
) -> None:
    from .test_sampling import Drawn

    resources = make_resources(server, max_concurrent=8)
    inputs = [f"item {i} [[sample:1000000]]" for i in range(12)]
    here = Drawn().bind(resources=resources).run_sync(inputs)
    pipeline = Drawn().bind(resources=resources)
    assert pipeline.run_sync(inputs, workers=2) == here  # the Rng's draw, made by the driver
    assert pipeline.rng.counter.value == 1
    seeded = pipeline.run_sync(inputs, seed=5)
    assert pipeline.run_sync(inputs, seed=5, workers=2) == seeded != here


def test_the_drivers_checkpoint_log_is_not_sent_to_the_workers(tmp_path: Path) -> None:
    """A trainer's call log is a `CheckpointHandler` on the driver's stack.  Shipped to
    the workers, it carried the driver's raw file descriptor, and a worker wrote log
    records into whatever that number was there (CI: an HTTP connection to the model,
    answered with "400 Invalid method").  Workers log to their own files instead."""
    from plait.execution.checkpoint import Checkpoint, CheckpointHandler
    from plait.ray.handlers import distribute

    checkpoint = Checkpoint(tmp_path / "calls", "p").open()
    try:
        parts = distribute((CheckpointHandler(checkpoint),))
        shipped = [type(spec).__name__ for spec in parts.specs]
        assert shipped == ["_UsageSpec"]
    finally:
        checkpoint.close()


def test_rows_on_workers_come_in_input_order_when_asked(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    """``preserve_order`` holds on Ray as in this process: the first input is held at a
    gate until every other input's call has completed at the server, and still its row
    is handed over first (the backend holds the others, not the caller)."""
    from plait.execution.backends import backend
    from plait.execution.settings import resolve_options

    server.configure(gate_texts={"first": "order"})
    resources = make_resources(server, model="cluster-order", max_concurrent=8)
    texts = ["first", *(f"then {i}" for i in range(39))]  # more than one batch of 16
    module = Echo("fast")
    opts = resolve_options({"workers": 2, "preserve_order": True}, {}, resources)
    delivered: list[tuple[int, Any]] = []

    def prepare(item: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return (item,), {}

    def deliver(index: int, item: Any, value: plait.Value) -> None:
        delivered.append((index, value.payload))

    where = backend("ray")
    thread = threading.Thread(
        target=where.deliver_rows,  # type: ignore[attr-defined]
        args=(module, opts["resources"], texts, prepare, deliver, opts),
    )
    thread.start()
    server.wait_parked("order", 1)
    deadline = time.monotonic() + 60
    while sum(1 for r in server.stats()["requests"] if r["status"] == 200) < len(texts) - 1:
        assert time.monotonic() < deadline, "the other inputs' calls never completed"
        time.sleep(0.01)
    assert delivered == []  # every later row is done, and waits for the first
    server.open_gate("order")
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert delivered == [(i, echo("fast", text)) for i, text in enumerate(texts)]


def test_rows_held_for_input_order_are_never_dropped_without_a_word() -> None:
    """The Ray backend's reorder buffer hands rows on in input order, and a run that
    ends with rows still held (waiting for one that never came) is an error, not a
    shorter output."""
    from plait.ray.backend import _InputOrder

    got: list[int] = []
    ordered = _InputOrder(lambda index, item, value: got.append(index))
    for index in (2, 0, 3, 1):
        ordered(index, f"in {index}", plait.Value(plait.ValueKind.TEXT, "x"))
    assert got == [0, 1, 2, 3]
    ordered.finish()  # nothing held

    gap = _InputOrder(lambda index, item, value: got.append(index))
    gap(1, "in 1", plait.Value(plait.ValueKind.TEXT, "x"))
    gap(2, "in 2", plait.Value(plait.ValueKind.TEXT, "x"))
    with pytest.raises(RuntimeError, match=r"without a row for input 0, so the 2 row"):
        gap.finish()


def test_relative_paths_hold_on_a_cluster_whose_workers_run_elsewhere(
    server: FakeOpenAIServer, ray_cluster: Any, tmp_path: Path
) -> None:
    """Workers of a cluster the run joins have their own working directory: the
    paths the user typed relative to theirs still name the run's files there."""
    work = tmp_path / "project"
    work.mkdir()
    docs = [f"doc {i}" for i in range(6)]
    (work / "in.jsonl").write_text("".join(json.dumps({"doc": d}) + "\n" for d in docs))
    (work / "r.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "cluster-relative"\nbase_url = "{server.base_url}"\n'
        'api_key_env = "PLAIT_TEST_KEY"\nmax_concurrent = 8\n'
    )
    target = f"{ROOT / 'tests' / 'pipelines.py'}:TwoSteps"
    address = ray_cluster.get_runtime_context().gcs_address
    command = [sys.executable, "-m", "plait.cli", "run", target, "--input", "in.jsonl"]
    command += ["--output", "out.jsonl", "--resources", "r.toml", "--checkpoint", "ckpt"]
    command += ["--workers", "2", "--ray-address", address, "-q"]
    env = dict(os.environ, PLAIT_TEST_KEY="sk-test")
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (work / "out.jsonl").read_text().splitlines()]
    assert {r["index"]: r["output"] for r in rows} == {i: two_steps(d) for i, d in enumerate(docs)}
    assert (work / "ckpt").is_dir()


def test_a_breaker_one_worker_opened_is_open_for_the_next_workers(
    server: FakeOpenAIServer,
) -> None:
    """A run's workers find the primary failing and open its breaker through the broker;
    the next run's workers (new processes, breakers of their own) skip it from their
    first call."""
    with FakeOpenAIServer() as primary:
        primary.configure(rate_500=1.0)
        smart = {
            "model": "p",
            "base_url": primary.base_url,
            "api_key": "sk-test",
            "max_retries": 0,
            "max_concurrent": 1,
            "breaker_failures": 2,
            "breaker_cooldown_s": 3600,
            "fallbacks": ["backup"],
        }
        backup = {"model": "b", "base_url": server.base_url, "api_key": "sk-test"}
        resources = plait.ResourceConfig({"smart": smart, "backup": backup})
        llm = plait.LLMInference("smart", "S.").bind(resources=resources)
        first = [f"a{i}" for i in range(20)]
        assert llm.run_sync(first, workers=2) == [f"[S.] {t}" for t in first]
        paid = primary.stats()["requests_total"]
        assert 2 <= paid <= 4  # two failures in a row open it, in one worker or both
        again = [f"b{i}" for i in range(20)]
        assert llm.run_sync(again, workers=2) == [f"[S.] {t}" for t in again]
        assert primary.stats()["requests_total"] == paid
