"""The README is a landing page that stays true: short, its links lead somewhere, and its
examples run (the page runner runs it as it runs every page of the site, see
``tests/test_pages.py``); examples/README.md names every example and data file; the
architecture page's handler counts a real run's calls."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_is_a_short_landing_page_whose_links_lead_somewhere() -> None:
    """What plait is, the two Quick start commands, one example and a feature list that
    links into the site: at most about 150 lines, and every relative link is a file."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "make demo" in text and "make test" in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links into the documentation"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert missing == []
    pages = {link for link in relative if link.startswith("docs/")}
    for section in ("get-started", "tutorials", "how-to", "concepts", "reference"):
        assert any(section in link for link in pages), section


def test_the_examples_readme_names_every_example_and_data_file() -> None:
    """Was stale: no `train_classifier.py`, "training gets its own example once the
    optimizer lands", and half the data files unexplained."""
    examples = ROOT / "examples"
    text = (examples / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in examples.glob("*.py") if not p.name.startswith("_"))
    data = sorted(p.name for p in (examples / "data").iterdir())
    assert scripts and data
    assert [name for name in scripts if f"| `{name}` |" not in text] == []
    assert [name for name in data if f"`data/{name}`" not in text] == []
    assert "once the optimizer lands" not in text


def test_the_architecture_documents_handler_example_counts_calls(tmp_path: Path) -> None:
    """docs/architecture.md's handler, as written, counts a real run's LLM calls."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    assert "class CountCalls(Handler)" in block
    script = tmp_path / "count.py"
    script.write_text(
        block
        + """
import plait
from plait.testing import FakeOpenAIServer

class Pair(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = plait.LLMInference("fast", system_prompt="A")
        self.b = plait.LLMInference("fast", system_prompt="B")

    def forward(self, text: str) -> object:
        return self.b(self.a(text))

with FakeOpenAIServer() as server:
    resources = plait.ResourceConfig(
        {"fast": {"provider": "openai", "model": "m", "base_url": server.base_url,
                  "api_key": "sk-test"}}
    )
    with CountCalls() as counts:
        Pair().bind(resources=resources).run_sync(["x", "y", "z"])
    print(sorted(counts.by_module.items()))
""",
        encoding="utf-8",
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[('a', 3), ('b', 3)]"
