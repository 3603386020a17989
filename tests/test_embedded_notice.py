"""Saying when the embedded model is used (issue 20 point 15).

Without resources every alias runs on the embedded 135M model; the CLI says so once on
stderr with how to point the aliases elsewhere, and that a ``resources.toml`` in the
working directory was not read; the Python API logs one warning per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import plait

ROOT = Path(__file__).resolve().parent.parent


class Unused(plait.Module):
    """Names two aliases but makes no call, so no model is loaded or run."""

    def __init__(self) -> None:
        super().__init__()
        self.draft = plait.LLMInference("fast")
        self.judge = plait.LLMInference("smart")

    def forward(self, text: str) -> Any:
        return text


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (cwd / "in.jsonl").write_text('"x"\n')
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "plait.cli", "run", "tests.test_embedded_notice:Unused",
         "--input", "in.jsonl", "--output", "out.jsonl", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip


def test_plait_run_says_which_aliases_run_on_the_embedded_model(tmp_path: Path) -> None:
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "embedded local model" in line]
    assert len(lines) == 1, result.stderr
    assert "'fast', 'smart' run on the embedded local model" in lines[0]
    assert "--resources resources.toml" in lines[0]
    assert "NOT used" not in result.stderr


def test_a_resources_file_in_the_working_directory_is_named_as_not_used(tmp_path: Path) -> None:
    (tmp_path / "resources.toml").write_text(
        '[fast]\nprovider = "local"\n[smart]\nprovider = "local"\n'
    )
    result = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "./resources.toml was NOT used" in result.stderr
    assert "add --resources resources.toml to use it" in result.stderr
    given = _run(tmp_path, "--resources", "resources.toml", "--fresh")
    assert given.returncode == 0, given.stderr
    assert "embedded" not in given.stderr and "NOT used" not in given.stderr


def test_plait_eval_says_it_too(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text('{"text": "x", "label": "x"}\n')
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "plait.cli", "eval", "tests.test_embedded_notice:Unused",
         "--data", "data.jsonl", "--input-field", "text", "--target-field", "label",
         "--loss", "contains"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "plait eval: 'fast', 'smart' run on the embedded local model" in result.stderr


SCRIPT = """
from concurrent.futures import ThreadPoolExecutor
from plait.resources.manager import ResourceManager

with ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda m: m.endpoint("fast"), [ResourceManager() for _ in range(8)]))
ResourceManager().endpoint("smart")
"""


def test_the_python_api_warns_once_per_process_even_from_concurrent_threads() -> None:
    path = os.environ.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "embedded local model" in line]
    assert len(notes) == 1, result.stderr
    assert "alias 'fast'" in notes[0] and "ResourceConfig.load('resources.toml')" in notes[0]


RAY_SCRIPT = """
import sys

import plait


class Unused(plait.Module):
    def __init__(self) -> None:
        super().__init__()
        self.draft = plait.LLMInference("fast")
        self.judge = plait.LLMInference("smart")

    def forward(self, text):
        return text


print(Unused().run_sync(["a", "b"], workers=2, ray_address=sys.argv[1]))
"""


def test_the_python_api_on_ray_workers_warns_once_like_one_process(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """Issue 20 point 15: ``run_sync(..., workers=2)`` with no resources says, in the
    driver, that the aliases run on the embedded model (the workers leave it to it)."""
    script = tmp_path / "on_ray.py"
    script.write_text(RAY_SCRIPT, encoding="utf-8")
    address = ray_cluster.get_runtime_context().gcs_address
    result = subprocess.run(
        [sys.executable, str(script), address], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "['a', 'b']" in result.stdout
    notes = [line for line in result.stderr.splitlines() if "embedded local model" in line]
    assert len(notes) == 1, result.stderr
    assert "alias 'fast'" in notes[0]
    assert "ResourceConfig.load('resources.toml')" in notes[0]
