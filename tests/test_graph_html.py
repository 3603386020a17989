"""``plait graph --html`` works offline (issue 20, friction): the graph is inline SVG laid
out by plait, with no script and nothing to fetch (the page used Mermaid from a CDN)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from plait.testing import FakeOpenAIServer

from .conftest import plait_cli


def _boxes(drawing: ET.Element) -> dict[str, tuple[float, float, float, float, str]]:
    boxes = {}
    for group in drawing.iter("g"):
        rect, texts = group.find("rect"), group.findall("text")
        assert rect is not None and texts
        x, y = float(rect.get("x", "")), float(rect.get("y", ""))
        w, h = float(rect.get("width", "")), float(rect.get("height", ""))
        boxes[group.get("id", "")] = (x, y, w, h, texts[0].text or "")
    return boxes


@pytest.mark.parametrize(
    ("target", "calls"),
    [
        ("tests.pipelines:FanOutFanIn", {"left", "right", "combine"}),
        ("examples/extract_and_compare.py:ExtractAndCompare", {"praise", "complaints", "compare"}),
    ],
)
def test_the_html_page_draws_the_graph_without_a_network(
    server: FakeOpenAIServer, tmp_path: Path, target: str, calls: set[str]
) -> None:
    page = tmp_path / "graph.html"
    done = plait_cli("graph", target, "--input", "a sample", "--html", page)
    assert done.returncode == 0, done.stderr
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html and not re.search(r"""(src|href)=["']?https?:""", html)
    assert "cdn" not in html.lower()
    drawing = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + len("</svg>")])
    boxes = _boxes(drawing)
    names = {label for *_, label in boxes.values()}
    assert calls | {"input", "output"} <= names
    # No two boxes overlap.
    placed = list(boxes.values())
    for i, (x, y, w, h, a) in enumerate(placed):
        for x2, y2, w2, h2, b in placed[i + 1 :]:
            apart = x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y
            assert apart, (a, b)
    # One arrow per edge of the DOT, each pointing down the page from its source's box.
    dot = done.stdout.partition("digraph plait {")[2]
    edges = re.findall(r"^  (\w+) -> (\w+);$", dot, re.M)
    paths = [p for p in drawing.iter("path") if p.get("class") == "edge"]
    assert len(paths) == len(edges) > 0
    for path in paths:
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d", ""))]
        assert numbers[-1] > numbers[1]  # ends lower than it starts
    top = {key: box[1] for key, box in boxes.items()}
    for source, sink in edges:
        assert top[source] < top[sink], (source, sink)
    assert server.stats()["requests_total"] == 0  # traced, never called
