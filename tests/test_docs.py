"""The docs say what plait does: README examples run as written, and examples/README.md
names every example and data file (issue 20, friction)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_fake_server_example_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Testing without endpoints\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "FakeOpenAIServer" in block and "base_url" in block
    # A process of its own, as a user would run it: the block starts and stops its server.
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_readme_batch_api_example_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Cutting cost\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'backend="batch"' in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "batched" / "batches.jsonl").is_file()


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


def test_the_readme_embedded_model_settings_are_valid_and_run(tmp_path: Path) -> None:
    import tomllib

    import plait

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### The embedded model\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```toml\n", 1)[1].split("```", 1)[0]
    settings = tomllib.loads(block)["resources"]["fast"]
    settings.pop("model_path")  # an example path: the packaged model stands in for it
    resources = plait.ResourceConfig({"fast": settings})
    assert resources["fast"].provider == "local" and resources["fast"].max_concurrent == 4
    answer = plait.LLMInference("fast", max_tokens=4).run_sync("Say hi.", resources=resources)
    assert isinstance(answer, str) and answer.strip()


def test_the_readme_labels_example_prints_labels(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### Answers that are labels\n", 1)[1].split("\n### ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "knn_demos" in block and "Literal[" in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    printed = ast.literal_eval(result.stdout.strip().splitlines()[-1])  # two labels
    labels = {"billing", "shipping", "technical", "account"}
    assert len(printed) == 2 and set(printed) <= labels


def test_the_readme_learned_limits_example_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Limits learned from the provider\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "rpm_limit" in block and "limits" in block
    result = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "'reported': 300" in result.stdout
