"""`plait.ray.Pipeline` under Ray Data: real actors, the loopback server, one broker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

import plait
from plait.testing import FakeOpenAIServer

from .conftest import make_resources
from .pipelines import Echo, FanOutFanIn, echo

pytest.importorskip("ray.data")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import plait.ray  # noqa: E402  (after the skip: it needs Ray)


@pytest.fixture(scope="module")
def ray(ray_cluster: Any) -> Iterator[Any]:
    context = ray_cluster.data.DataContext.get_current()
    bars = context.enable_progress_bars
    context.enable_progress_bars = False
    yield ray_cluster
    context.enable_progress_bars = bars


def expected_fan(text: str) -> str:
    return echo("C", f"{echo('L', text)} | {echo('R', text)}")


def _pipeline(ds: Any, target: Any, resources: Any, **options: Any) -> Any:
    batch = {k: options.pop(k) for k in ("batch_size", "batch_format") if k in options}
    return ds.map_batches(
        plait.ray.Pipeline,
        fn_constructor_args=(target,),
        fn_constructor_kwargs={"resources": resources, "input_column": "text", **options},
        concurrency=2,
        batch_size=batch.get("batch_size", 4),
        batch_format=batch.get("batch_format", "default"),
    )


def _by_text(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {row["text"]: row for row in rows}
    assert len(found) == len(rows)
    return found


@pytest.mark.parametrize("batch_format", ["default", "pandas"])
def test_every_row_gets_what_run_sync_gives_and_a_failed_row_its_error(
    ray: Any, server: FakeOpenAIServer, batch_format: str
) -> None:
    resources = make_resources(server, max_concurrent=8)
    texts = [f"doc {i}" for i in range(18)]
    failing = "doc [[status:400]]"
    local = FanOutFanIn().bind(resources=resources).run_sync(texts)
    ds = ray.data.from_items([{"text": t, "n": i} for i, t in enumerate([*texts, failing])])
    rows = _by_text(_pipeline(ds, FanOutFanIn, resources, batch_format=batch_format).take_all())
    assert set(rows) == {*texts, failing}
    for text, expected in zip(texts, local, strict=True):
        assert rows[text]["output"] == expected == expected_fan(text)
        assert rows[text]["error"] is None
    assert [rows[t]["n"] for t in texts] == list(range(18))  # the other columns stay
    bad = rows[failing]
    assert bad["output"] is None
    assert bad["error"].startswith("ProviderError: ") and "400" in bad["error"]


class Card(pydantic.BaseModel):
    title: str
    tags: list[str]


class Carded(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.card = plait.LLMInference(alias="fast", response_format=Card)
        self.echo = Echo("e")

    def forward(self, text: str) -> Any:
        card = self.card(text)
        return {"card": card, "pair": (self.echo(text), "k"), "cards": [card]}


def test_structured_outputs_come_out_as_plain_arrow_structs(
    ray: Any, server: FakeOpenAIServer
) -> None:
    resources = make_resources(server)
    ds = ray.data.from_items([{"text": f"t{i}"} for i in range(6)])
    out = _pipeline(ds, Carded, resources).materialize()
    schema = out.schema().base_schema
    assert pa.types.is_struct(schema.field("output").type)
    assert schema.field("error").type == pa.string()
    card = Carded().bind(resources=resources).run_sync("t0")["card"].model_dump()
    rows = _by_text(out.take_all())
    assert rows["t0"]["output"] == {"card": card, "pair": ["[e] t0", "k"], "cards": [card]}
    assert all(rows[f"t{i}"]["output"]["pair"] == [f"[e] t{i}", "k"] for i in range(6))


def test_max_concurrent_holds_across_the_datasets_actors(
    ray: Any, server: FakeOpenAIServer
) -> None:
    server.configure(latency_ms=30)
    resources = make_resources(server, max_concurrent=3)
    ds = ray.data.from_items([{"text": f"doc {i}"} for i in range(24)])
    rows = _by_text(_pipeline(ds, FanOutFanIn, resources, batch_size=6).take_all())
    assert all(rows[t]["output"] == expected_fan(t) for t in rows) and len(rows) == 24
    stats = server.stats()
    assert stats["requests_total"] == 72
    assert stats["max_in_flight"] == 3  # the limit was reached, never passed


def _write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_jsonl_to_parquet_round_trip(ray: Any, server: FakeOpenAIServer, tmp_path: Path) -> None:
    resources = make_resources(server)
    # The first batch fails as a whole: with output_type, its files still read as one table.
    texts = ["a [[status:400]]", "b [[status:400]]", *(f"doc {i}" for i in range(8))]
    ds = ray.data.read_json(str(_write_jsonl(tmp_path / "docs.jsonl", texts)))
    out = tmp_path / "out"
    _pipeline(ds, FanOutFanIn, resources, batch_size=2, output_type=pa.string()).write_parquet(
        str(out)
    )
    table = pq.read_table(out)
    assert table.schema.field("output").type == pa.string()
    assert table.schema.field("error").type == pa.string()
    assert table.column_names == ["text", "output", "error"]
    rows = _by_text(table.to_pylist())
    assert set(rows) == set(texts)
    for text in texts[2:]:
        assert (rows[text]["output"], rows[text]["error"]) == (expected_fan(text), None)
    for text in texts[:2]:
        assert rows[text]["output"] is None and "HTTP 400" in rows[text]["error"]
