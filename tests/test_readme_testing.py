"""The README's "Testing without endpoints" example runs as written (issue 20, friction)."""

from __future__ import annotations

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
