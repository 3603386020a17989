"""Runs on Ray workers that survive what they meet (issue 20: points 1, 2, 6, 7, 20).

A local Ray is started once for the session (`ray_cluster`); each run starts its own
worker actors in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import budget, override
from plait.testing import FakeOpenAIServer

from .conftest import ROOT, make_resources
from .pipelines import Echo, echo, two_steps

pytestmark = pytest.mark.usefixtures("ray_cluster")

#: Enough inputs for each worker to hold several batches (of 16) at once, so they
#: finish in every order.
MANY = 160


def test_an_override_holds_for_every_row_on_workers(server: FakeOpenAIServer) -> None:
    resources = make_resources(server, model="cluster-override", max_concurrent=8)
    inputs = [f"o{i}" for i in range(MANY)]
    with override(temperature=0.0):
        out = Echo("fast").bind(resources=resources).run_sync(inputs, workers=2)
    assert out == [echo("fast", t) for t in inputs]
    bodies = [r["body"] for r in server.stats(bodies=True)["requests"]]
    assert len(bodies) == MANY and all(b["temperature"] == 0.0 for b in bodies)


def test_a_budget_that_is_not_reached_delivers_every_row_on_workers(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, model="cluster-roomy-budget", max_concurrent=8)
    inputs = [f"b{i}" for i in range(MANY)]
    with budget(max_calls=10 * MANY) as spent:
        out = Echo("fast").bind(resources=resources).run_sync(inputs, workers=2)
    assert out == [echo("fast", t) for t in inputs]
    assert spent.calls == MANY and server.stats()["requests_total"] == MANY


def test_plait_run_with_workers_and_a_profile_delivers_every_row(
    server: FakeOpenAIServer, ray_cluster: Any, tmp_path: Path
) -> None:
    data = tmp_path / "in.jsonl"
    docs = [f"doc {i}" for i in range(MANY)]
    data.write_text("".join(json.dumps({"doc": d}) + "\n" for d in docs))
    (tmp_path / "r.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key_env = "PLAIT_TEST_KEY"\nmax_concurrent = 8\n'
    )
    trace = tmp_path / "t.json"
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
            ray_cluster.get_runtime_context().gcs_address,
            "--profile",
            str(trace),
            "--preserve-order",
        ],
        cwd=ROOT,
        env=dict(os.environ, PLAIT_TEST_KEY="sk-test"),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r.get("output") for r in rows] == [two_steps(d) for d in docs]
    assert f"{MANY} input(s): {MANY} succeeded, 0 failed" in done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert len([e for e in events if e.get("ph") == "X" and e.get("cat") == "llm"]) == 2 * MANY


class LockFor5(plait.Module):
    """Echoes, but returns a lock (which Ray cannot pickle) for the input "5"."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo("fast")

    def forward(self, doc: str) -> Any:
        if doc == "5":
            return threading.Lock()
        return self.echo(doc)


def test_an_output_ray_cannot_pickle_fails_its_row_not_its_batch(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, model="cluster-lock-out", max_concurrent=8)
    inputs = [str(i) for i in range(40)]
    out = LockFor5().bind(resources=resources).run_sync(inputs, workers=2)
    bad = out[5]
    assert isinstance(bad, plait.Value) and bad.is_error
    assert bad.meta["error_type"] == "Unsendable"
    assert "lock" in bad.meta["message"] and "plain data" in bad.meta["message"]
    assert [o for i, o in enumerate(out) if i != 5] == [echo("fast", t) for t in inputs if t != "5"]


def test_an_input_ray_cannot_pickle_fails_its_row_not_the_run(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, model="cluster-lock-in", max_concurrent=8)
    inputs: list[Any] = [f"i{i}" for i in range(40)]
    inputs[3] = threading.Lock()
    out = Echo("fast").bind(resources=resources).run_sync(inputs, workers=2)
    bad = out[3]
    assert isinstance(bad, plait.Value) and bad.is_error
    assert bad.meta["error_type"] == "Unsendable"
    assert "input 3" in bad.meta["message"] and "argument 1 (a lock)" in bad.meta["message"]
    assert [o for i, o in enumerate(out) if i != 3] == [
        echo("fast", t) for i, t in enumerate(inputs) if i != 3
    ]
    assert server.stats()["requests_total"] == 39


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1:1"])
def test_a_ray_address_that_cannot_be_joined_is_one_line_and_exit_2(
    tmp_path: Path, address: str
) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"doc": "a"}) + "\n")
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
            "--workers",
            "2",
            "--ray-address",
            address,
        ],
        cwd=ROOT,
        env=dict(os.environ, PLAIT_RAY_CONNECT_TIMEOUT="1"),
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: Ray alone retried 127.0.0.1:1 for minutes
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("plait run: error: cannot join the Ray cluster at")
    assert repr(address) in lines[0] and "--ray-address" in lines[0]
    assert not (tmp_path / "out.jsonl").exists()  # refused before anything was written


def test_run_sync_with_an_address_that_cannot_be_joined_raises_cluster_unreachable(
    tmp_path: Path,
) -> None:
    # A process of its own: this one is already connected to the session's Ray.
    script = (
        "import plait\n"
        "from plait.ray.cluster import ClusterUnreachable\n"
        "from tests.pipelines import Echo\n"
        "for address in ('nonsense', '127.0.0.1:1'):\n"
        "    try:\n"
        "        Echo('fast').run_sync(['a'], workers=1, ray_address=address)\n"
        "    except ClusterUnreachable as exc:\n"
        "        print(type(exc).__name__, exc.address)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=dict(os.environ, PLAIT_RAY_CONNECT_TIMEOUT="1"),
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "ClusterUnreachable nonsense",
        "ClusterUnreachable 127.0.0.1:1",
    ]


_AFTER_SHUTDOWN = """
import json, sys
import ray
import plait
import plait.ray
from tests.pipelines import Echo

resources = plait.ResourceConfig(json.loads(sys.argv[1]))
def join():
    # The session's Ray, joined as a driver of its own: what a shutdown stops here is
    # this process's connection, as for a local Ray of its own (only slower to start).
    ray.init(address=sys.argv[2], namespace="plait", log_to_driver=False,
             configure_logging=False)
join()
{body}
"""


def _after_shutdown(
    server: FakeOpenAIServer, ray: Any, body: str
) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a process of its own that joined Ray (and may leave it)."""
    config = {
        "fast": {
            "provider": "openai",
            "model": "m",
            "base_url": server.base_url,
            "api_key": "sk-test",
        }
    }
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _AFTER_SHUTDOWN.format(body=body),
            json.dumps(config),
            ray.get_runtime_context().gcs_address,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard: before the fix, the run waited for a broker forever
    )


def test_building_a_ray_data_pipeline_leaves_the_driver_s_own_runs_alone(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    done = _after_shutdown(
        server,
        ray_cluster,
        "plait.ray.Pipeline(lambda: Echo('fast'), resources=resources)\n"
        "ray.shutdown()\n"
        "print(json.dumps(Echo('fast').bind(resources=resources).run_sync(['a', 'b'])))\n",
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [echo("fast", "a"), echo("fast", "b")]


def test_a_ray_data_pipeline_called_in_the_driver_leaves_the_driver_s_own_runs_alone(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    # Trying a map function locally: its batches lease from the broker, also while a
    # plain run goes on in another thread, and the driver's plain runs after it keep
    # their local limits: they neither fail once Ray is shut down nor start it again
    # (the user's own ray.init() afterwards works).
    done = _after_shutdown(
        server,
        ray_cluster,
        "from concurrent.futures import ThreadPoolExecutor\n"
        "pipeline = plait.ray.Pipeline(lambda: Echo('fast'), resources=resources)\n"
        "def plain(texts):\n"
        "    return Echo('fast').bind(resources=resources).run_sync(texts)\n"
        "with ThreadPoolExecutor(4) as pool:\n"
        "    batches = [pool.submit(pipeline, {'text': [t]}) for t in 'ab']\n"
        "    runs = [pool.submit(plain, [t]) for t in 'cd']\n"
        "    print(json.dumps([b.result().to_pylist() for b in batches]))\n"
        "    print(json.dumps([r.result() for r in runs]))\n"
        "ray.shutdown()\n"
        "fresh = plait.ResourceConfig(json.loads(sys.argv[1]))\n"
        "print(json.dumps(Echo('fast').bind(resources=fresh).run_sync(['e'])))\n"
        "print(json.dumps(ray.is_initialized()))\n"
        "join()\n"
        "print(json.dumps(Echo('fast').bind(resources=fresh).run_sync(['f'])))\n"
        "ray.shutdown()\n",
    )
    assert done.returncode == 0, done.stderr
    batches, runs, after, started, again = (
        json.loads(line) for line in done.stdout.splitlines()[-5:]
    )
    assert batches == [[{"text": t, "output": echo("fast", t), "error": None}] for t in "ab"]
    assert runs == [[echo("fast", "c")], [echo("fast", "d")]]
    assert after == [echo("fast", "e")]
    assert started is False
    assert again == [echo("fast", "f")]


def test_a_limit_whose_broker_is_gone_fails_the_call_with_a_clear_error(
    server: FakeOpenAIServer, ray_cluster: Any
) -> None:
    # The batch runs here, so this process leases its limits; then its Ray goes away.
    done = _after_shutdown(
        server,
        ray_cluster,
        "pipeline = plait.ray.Pipeline(lambda: Echo('fast'), resources=resources)\n"
        "print(json.dumps(pipeline({'text': ['a']}).to_pylist()))\n"
        "ray.shutdown()\n"
        "print(json.dumps(pipeline({'text': ['b']}).to_pylist()))\n",
    )
    assert done.returncode == 0, done.stderr
    first, second = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    assert first == [{"text": "a", "output": echo("fast", "a"), "error": None}]
    [row] = second
    assert row["output"] is None
    assert row["error"].startswith("BrokerUnreachable: the cluster's limit broker cannot be")
    assert "'m'" in row["error"]


def _token_accounting(ray: Any, chains: int, calls: int) -> tuple[dict[str, float], list[float]]:
    """``chains`` concurrent chains of ``calls`` calls on one real `LeasedGovernor`,
    against a broker actor of their own: each call estimated at 100 tokens, 10 used.

    Returns the broker's token accounting and, after each call, how far the worker's
    pool exceeded the tokens granted for the calls still waiting for theirs.
    """
    import asyncio

    from plait.ray.broker import LimitBroker
    from plait.ray.governor import LeasedGovernor
    from plait.resources.config import EndpointConfig

    actor = ray.remote(num_cpus=0)(LimitBroker).remote()
    # The actor's process is up before the governor's first report (whose answer it
    # waits for at most BROKER_TIMEOUT_S): on a loaded machine starting it can take
    # longer than that, and this test is about what is counted, not about start-up.
    ray.get(actor.status.remote(), timeout=600)
    config = EndpointConfig(
        model="m",
        base_url="http://127.0.0.1:9/v1",
        api_key="k",
        max_concurrent=chains,
        tokens_per_minute=600_000,  # no waiting: this is about what is counted
    )
    governor = LeasedGovernor(config, actor, "w-accounting")
    pools: list[float] = []

    async def chain() -> None:
        for _ in range(calls):
            await governor.limiter.acquire()
            try:
                await governor.admit(100)
                governor.settle(100, 10)
                # A grant for several waiting calls is in the pool until each takes its
                # share; anything beyond that would be tokens kept for later.
                pools.append(governor.token_pool - governor._tokens_waiting)
            finally:
                governor.limiter.release()

    async def main() -> dict[str, float]:
        await asyncio.gather(*(chain() for _ in range(chains)))
        await governor._next_grant()  # one more report: the last refunds reach the broker
        status = await actor.status.remote()
        return dict(status[governor.key]["tokens"])

    try:
        return asyncio.run(main()), pools
    finally:
        ray.kill(actor)


@pytest.mark.parametrize("chains", [1, 4, 16])
def test_a_worker_spends_only_tokens_granted_for_its_calls_and_returns_refunds(
    ray_cluster: Any, chains: int
) -> None:
    calls = 6
    tokens, pools = _token_accounting(ray_cluster, chains, calls)
    # Every call's estimate was granted by the broker when it was admitted: none was
    # paid from refunds the worker kept (which it could spend later, on top of the
    # grants other workers get meanwhile).
    assert tokens["granted"] == 100 * chains * calls
    assert len(pools) == chains * calls and all(extra <= 0 for extra in pools), pools
    # The unused 90 of each estimate went back to the broker.
    assert tokens["returned"] == 90 * chains * calls
    assert tokens["charged"] == 0


def test_ray_address_in_the_environment_is_the_cluster_a_run_joins(
    server: Any, ray_cluster: Any, tmp_path: Path
) -> None:
    """``RAY_ADDRESS``, as Ray's own tools read it, names the cluster ``--workers N``
    joins when no ``--ray-address`` is given (plait started a local Ray, which Ray
    refused beside that variable: exit 1 and its traceback); one that cannot be joined
    is the one-line refusal, naming the variable, before anything is written."""
    docs = ["a", "b", "c"]
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"doc": d}) + "\n" for d in docs))
    (tmp_path / "r.toml").write_text(
        f'[fast]\nprovider = "openai"\nmodel = "m"\nbase_url = "{server.base_url}"\n'
        'api_key = "sk-test"\n'
    )
    command = [
        sys.executable,
        "-m",
        "plait.cli",
        "run",
        f"{ROOT / 'tests' / 'pipelines.py'}:TwoSteps",
    ]
    command += ["--input", str(data), "--output", str(tmp_path / "out.jsonl")]
    command += ["--resources", str(tmp_path / "r.toml"), "--workers", "2", "-q"]
    address = ray_cluster.get_runtime_context().gcs_address
    joined = subprocess.run(
        command, cwd=ROOT, env=dict(os.environ, RAY_ADDRESS=address), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert joined.returncode == 0, joined.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["output"] for r in rows) == sorted(two_steps(d) for d in docs)

    (tmp_path / "out.jsonl").unlink()
    refused = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, RAY_ADDRESS="127.0.0.1:1", PLAIT_RAY_CONNECT_TIMEOUT="1"),
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "'127.0.0.1:1'" in lines[0] and "unset RAY_ADDRESS" in lines[0]
    assert not (tmp_path / "out.jsonl").exists()
