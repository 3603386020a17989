"""Values that cannot travel, streams and addresses on Ray (issue 20, points 2 and 7).

A value is sent when it pickles on one side *and* is rebuilt on the other: one that
fails either way is its own input's error row, never its batch's or the run's.
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
from plait.testing import FakeOpenAIServer

from .conftest import ROOT, make_resources
from .pipelines import Echo, echo

pytestmark = pytest.mark.usefixtures("ray_cluster")


class Throttled(Exception):
    """Pickles as ``Throttled(str(self))``, which its two-argument ``__init__`` refuses:
    it can be sent, but never rebuilt on the other side."""

    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code, self.detail = code, detail


class WarnFor5(plait.Module):
    """Echoes, but input "5" gets a dict holding an exception that cannot be rebuilt."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo("fast")

    async def forward(self, doc: str) -> Any:
        answer = await self.echo(doc)
        if doc == "5":
            return {"answer": answer, "warning": Throttled(429, "slow down")}
        return answer


def test_an_output_that_cannot_be_rebuilt_fails_its_row_not_its_batch(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    resources = make_resources(server, model="cluster-unrebuildable-out", max_concurrent=8)
    inputs = [str(i) for i in range(40)]
    pipeline = WarnFor5().bind(resources=resources, checkpoint_dir=str(tmp_path / "ck"))
    for _ in range(2):  # and again on the resume: the same one row, nothing repaid
        out = pipeline.run_sync(inputs, workers=2)
        bad = out[5]
        assert isinstance(bad, plait.Value) and bad.is_error
        assert bad.meta["error_type"] == "Unsendable"
        message = bad.meta["message"]
        assert "input 5 (a dict)" in message and "Throttled" in message
        assert "cannot be rebuilt" in message and "plain data" in message
        assert [o for i, o in enumerate(out) if i != 5] == [
            echo("fast", t) for t in inputs if t != "5"
        ]
        assert server.stats()["requests_total"] == 40


def test_an_input_that_cannot_be_rebuilt_fails_its_row_not_its_batch(
    server: FakeOpenAIServer,
) -> None:
    resources = make_resources(server, model="cluster-unrebuildable-in", max_concurrent=8)
    inputs: list[Any] = [f"i{i}" for i in range(40)]
    inputs[7] = Throttled(429, "slow down")
    out = Echo("fast").bind(resources=resources).run_sync(inputs, workers=2)
    bad = out[7]
    assert isinstance(bad, plait.Value) and bad.is_error
    assert bad.meta["error_type"] == "Unsendable"
    assert "input 7" in bad.meta["message"] and "argument 1 (a Throttled)" in bad.meta["message"]
    assert "cannot be rebuilt" in bad.meta["message"]
    assert [o for i, o in enumerate(out) if i != 7] == [
        echo("fast", t) for i, t in enumerate(inputs) if i != 7
    ]
    assert server.stats()["requests_total"] == 39


class LockFor5(plait.Module):
    """Echoes, but returns a lock (which cannot be pickled) for input "x 5"."""

    def __init__(self) -> None:
        super().__init__()
        self.echo = Echo("fast")

    async def forward(self, text: str) -> Any:
        answer = await self.echo(text)
        if text == "x 5":
            return threading.Lock()
        return answer


def test_a_ray_data_row_whose_output_cannot_be_stored_is_that_row_s_error(
    ray_cluster: Any, server: FakeOpenAIServer
) -> None:
    import plait.ray

    resources = make_resources(server, model="data-lock-out", max_concurrent=8)
    texts = [f"x {i}" for i in range(10)]
    table = plait.ray.Pipeline(LockFor5, resources=resources, input_column="text")({"text": texts})
    errors = table.column("error").to_pylist()
    outputs = table.column("output").to_pylist()
    assert errors[5] is not None and errors[5].startswith("Unsendable: ")
    assert "a lock" in errors[5] and "plain data" in errors[5]
    assert outputs[5] is None
    assert [e for i, e in enumerate(errors) if i != 5] == [None] * 9
    assert [o for i, o in enumerate(outputs) if i != 5] == [
        echo("fast", t) for t in texts if t != "x 5"
    ]


def test_a_ray_data_job_with_an_output_that_cannot_be_stored_delivers_every_row(
    ray_cluster: Any, server: FakeOpenAIServer
) -> None:
    import plait.ray

    context = ray_cluster.data.DataContext.get_current()
    bars, context.enable_progress_bars = context.enable_progress_bars, False
    try:
        resources = make_resources(server, model="data-lock-job", max_concurrent=8)
        texts = [f"x {i}" for i in range(20)]
        ds = ray_cluster.data.from_items([{"text": t} for t in texts])
        rows = ds.map_batches(
            plait.ray.Pipeline,
            fn_constructor_args=(LockFor5,),
            fn_constructor_kwargs={"resources": resources, "input_column": "text"},
            concurrency=1,
            num_cpus=0.5,
            batch_size=10,
        ).take_all()
    finally:
        context.enable_progress_bars = bars
    by_text = {row["text"]: row for row in rows}
    assert set(by_text) == set(texts)
    assert by_text["x 5"]["output"] is None and "Unsendable" in by_text["x 5"]["error"]
    for text in texts:
        if text != "x 5":
            assert by_text[text]["error"] is None
            assert by_text[text]["output"] == echo("fast", text)


@pytest.mark.parametrize("options", [{"workers": 2}, {"ray_address": "auto"}])
def test_streaming_on_workers_is_refused_not_ignored(
    server: FakeOpenAIServer, options: dict[str, Any]
) -> None:
    resources = make_resources(server, model="stream-workers")
    pipeline = Echo("fast").bind(resources=resources)
    with pytest.raises(ValueError, match="streaming a batch on Ray workers is not supported"):
        pipeline.stream(["a", "b"], **options)
    assert server.stats()["requests_total"] == 0


def _cli(tmp_path: Path, command: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plait.cli", command, *extra, "--ray-address", ""],
        cwd=ROOT,
        env=dict(os.environ, PLAIT_RAY_CONNECT_TIMEOUT="1"),
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard
    )


def test_an_empty_ray_address_is_refused_before_plait_run_writes_anything(
    tmp_path: Path,
) -> None:
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"doc": "a"}) + "\n")
    out = tmp_path / "out.jsonl"
    target = f"{ROOT / 'tests' / 'pipelines.py'}:TwoSteps"
    done = _cli(tmp_path, "run", target, "--input", str(data), "--output", str(out))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("plait run: error: cannot join the Ray cluster at ''")
    assert "the address is empty" in lines[0]
    assert not out.exists() and not Path(str(out) + ".checkpoint").exists()


def test_an_empty_ray_address_is_refused_before_plait_train_writes_anything(
    tmp_path: Path,
) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"text": "a", "label": "a"}) + "\n")
    out = tmp_path / "trained"
    target = f"{ROOT / 'tests' / 'pipelines.py'}:TwoSteps"
    done = _cli(tmp_path, "train", target, "--data", str(data), "--out", str(out))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "cannot join the Ray cluster at ''" in lines[0]
    assert not out.exists()


def test_specs_made_at_once_from_many_threads_all_send_the_pipeline_by_value() -> None:
    """Two passes of a training run make their specs from two threads at once. The
    module sent by value was once taken out of cloudpickle's registry by the first to
    finish, and the second failed ("not registered for pickle by value") or pickled the
    pipeline by reference, which a worker cannot import."""
    from ray import cloudpickle

    from plait.execution.settings import resolve_options
    from plait.ray.spec import make_spec
    from plait.resources.manager import ResourceManager

    opts = resolve_options({}, {}, None)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        try:
            for _ in range(5):
                spec = make_spec(Echo("x"), ResourceManager.coerce(None), opts)
                # The class itself, rebuilt on the worker (by reference: just its name).
                assert b"_make_skeleton_class" in spec.module_bytes
        except BaseException as exc:  # reported below, with the thread's own traceback
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often, as on a busy machine
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert cloudpickle.list_registry_pickle_by_value() == set()  # all taken out again
