"""Every script in examples/ runs, as a user would run it, and prints what it should.

Each script runs in its own process against the loopback fake server (its
replies are deterministic echoes, ``[system prompt] user message``), so the
checks below can say exactly what each pattern must print.  One more test runs
the quick-start pipeline on the real embedded model, the examples' default.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import plait
from plait.testing import FakeOpenAIServer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REVIEWS = EXAMPLES / "data" / "reviews.jsonl"


def reply(system: str, user: str, max_tokens: int) -> str:
    """The fake server's reply: an echo of ``user`` under ``system``, cut at ``max_tokens``.

    The fake counts a token per four characters, so a reply that would run past
    ``max_tokens`` stops after ``4 * max_tokens`` characters, as a real one would.
    """
    return f"[{system}] {user}"[: 4 * max_tokens]


def constant(example: str, name: str) -> Any:
    """A module-level constant of an example, read without importing (running) it."""
    tree = ast.parse((EXAMPLES / f"{example}.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"examples/{example}.py defines no constant {name}")


def run_example(name: str, server: FakeOpenAIServer) -> str:
    """Run ``python examples/NAME.py`` as a user would, pointed at ``server``; its stdout."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PLAIT_EXAMPLES_")  # the developer's own endpoint, if any
    }
    env["PLAIT_EXAMPLES_BASE_URL"] = server.base_url
    env["PLAIT_EXAMPLES_API_KEY"] = "sk-test"
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"examples/{name}.py failed:\n{proc.stderr}"
    assert proc.stderr == "", proc.stderr
    return proc.stdout


# -- what each example must print ---------------------------------------------------------
SUMMARIZE, THEME = "Summarize the text in one sentence.", "Name the main theme of this summary."
PERSPECTIVES = {
    "technical": "Analyze from a technical perspective.",
    "business": "Analyze from a business perspective.",
    "user": "Analyze from a user's perspective.",
}
SYNTHESIZE = "Synthesize these perspectives into one short report."


def check_sequential(out: str) -> None:
    summary = reply(SUMMARIZE, constant("sequential", "DOCUMENT"), 48)
    assert out == reply(THEME, summary, 48) + "\n"


def analyses(text: str) -> dict[str, str]:
    return {name: reply(prompt, text, 48) for name, prompt in PERSPECTIVES.items()}


def synthesis(text: str) -> str:
    combined = "\n\n".join(
        f"## {name.title()} perspective\n{analysis}" for name, analysis in analyses(text).items()
    )
    return reply(SYNTHESIZE, combined, 160)


def check_fan_out(out: str) -> None:
    expected = analyses(constant("fan_out", "DOCUMENT"))
    assert out == "".join(f"{name}: {analysis}\n" for name, analysis in expected.items())


def check_fan_in(out: str) -> None:
    document = constant("fan_out", "DOCUMENT")
    assert out == synthesis(document) + "\n"
    # The report holds every branch's reply: the synthesis waited for all three.
    for analysis in analyses(document).values():
        assert analysis in out


def check_nested(out: str) -> None:
    calls = (
        "stage1.summarizer, stage1.analyzer, stage2.technical, stage2.business, stage2.user, "
        "stage3.analyzer.technical, stage3.analyzer.business, stage3.analyzer.user, "
        "stage3.synthesizer"
    )
    stage1 = reply(THEME, reply(SUMMARIZE, constant("fan_out", "DOCUMENT"), 48), 48)
    stage2 = analyses(stage1)
    assert out == f"9 LLM calls in one graph: {calls}\n{synthesis(stage2['user'])}\n"


def check_parameterized(out: str) -> None:
    request = constant("parameterized", "REQUEST")
    before, after = "Answer in one short sentence.", "Answer with a numbered list of three tips."
    description = "The assistant's core behaviour and tone; stable but improvable."
    # No system prompt: the fake echoes the user message alone.
    assert out == (
        f"parameter instructions: {before!r} ({description})\n"
        f"before: {before}\n\nUser: {request}\n"
        f"state: {{'instructions': {after!r}}}\n"
        f"after: {after}\n\nUser: {request}\n"
    )


def check_structured_output(out: str) -> None:
    # The fake answers a JSON schema with its smallest instance; the script printed the
    # repr of the validated pydantic object (it also asserts the type itself).
    assert out.splitlines() == ["ReviewSummary(product='x', sentiment='positive')"] * 2


def check_streaming(out: str) -> None:
    questions = constant("streaming", "QUESTIONS")
    lines = out.splitlines()
    expected = {
        f"[{index}] {question} -> {reply('Answer in a few words.', question, 16)}"
        for index, question in enumerate(questions)
    }
    # Every input exactly once, in whatever order they finished.
    assert len(lines) == len(questions)
    assert set(lines) == expected


def check_run_and_settings(out: str) -> None:
    lines = out.splitlines()
    winners = [line.split(" -> ")[1].split("/")[0] for line in lines]
    assert winners == ["settings", "inner", "run", "bound", "call"]
    question = constant("run_and_settings", "QUESTION")
    assert all(line.endswith(f"({question!r})") for line in lines)


def check_extract_and_compare(out: str) -> None:
    reviews = [json.loads(line) for line in REVIEWS.read_text(encoding="utf-8").splitlines()]
    outputs = [json.loads(line) for line in out.splitlines()]
    assert len(outputs) == len(reviews)
    reader = "You read product reviews. Answer in one short phrase."
    advisor = "You are a concise shopping advisor. Answer in one sentence."
    for review, output in zip(reviews, outputs, strict=True):
        praise = reply(reader, f"Review: {review}\n\nWhat does the reviewer like?", 64)
        complaints = reply(reader, f"Review: {review}\n\nWhat does the reviewer dislike?", 64)
        question = f"Likes: {praise}\nDislikes: {complaints}\n\nIs the product worth buying?"
        verdict = reply(advisor, question, 64)
        assert output == {"praise": praise, "complaints": complaints, "verdict": verdict}


def check_train_classifier(out: str) -> None:
    # Against the echoing fake server no reply names a label, so every score is 0.0 and
    # every step keeps its (no worse) update; the echoed optimizer prompt becomes the new
    # system prompt.  What matters here: three steps ran, validated and reported.
    lines = out.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split(":")[0] for line in steps] == ["step 1/3", "step 2/3", "step 3/3"]
    assert all("validation 0.00" in line for line in steps)
    assert "prompt before: 'Classify the review.'" in lines
    assert any(line.startswith("prompt after:") for line in lines)
    assert "validation before: 0.00" in lines and "validation after:  0.00" in lines
    assert lines[-1].startswith("(3 steps in ")  # its duration is not checked


def check_summarize_long(out: str) -> None:
    from plait.sequences import chunk_text
    from plait.sequences.modules import COMBINE_INSTRUCTION, MAP_INSTRUCTION, REFINE_INSTRUCTION

    document = (EXAMPLES / "data" / "long_document.txt").read_text(encoding="utf-8")
    chunks = chunk_text(document, 500, 80)
    summary = "(nothing yet)"
    for chunk in chunks:  # one call per chunk, each on the summary so far
        summary = reply(
            REFINE_INSTRUCTION, f"Summary so far:\n{summary}\n\nNext part:\n{chunk}", 96
        )
    answers = [reply(MAP_INSTRUCTION, chunk, 96) for chunk in chunks]
    while len(answers) > 1:  # combined three at a time
        groups = [answers[i : i + 3] for i in range(0, len(answers), 3)]
        answers = [
            g[0]
            if len(g) == 1
            else reply(
                COMBINE_INSTRUCTION, "\n\n".join(f"Part {n}:\n{a}" for n, a in enumerate(g, 1)), 96
            )
            for g in groups
        ]
    assert out.splitlines() == [
        f"{len(document)} characters in {len(chunks)} chunks",
        f"refine: {' '.join(summary.split())}",
        f"map-reduce: {' '.join(answers[0].split())}",
    ]


#: Every check_NAME above, by NAME: the example scripts this file knows how to check.
CHECKS: dict[str, Callable[[str], None]] = {
    name.removeprefix("check_"): check
    for name, check in dict(globals()).items()
    if name.startswith("check_")
}


def test_every_example_is_checked() -> None:
    scripts = {path.stem for path in EXAMPLES.glob("*.py") if not path.stem.startswith("_")}
    assert scripts == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_runs_against_an_openai_compatible_endpoint(
    name: str, server: FakeOpenAIServer
) -> None:
    CHECKS[name](run_example(name, server))


def test_the_sample_dataset_is_a_few_short_strings() -> None:
    lines = REVIEWS.read_text(encoding="utf-8").splitlines()
    assert 8 <= len(lines) <= 12
    for line in lines:
        review = json.loads(line)
        assert isinstance(review, str) and 0 < len(review) < 200


def load_example(name: str) -> Any:
    """Import an example from its path alone, without examples/ on ``sys.path``.

    The quick-start class must load that way: it may not lean on the examples' helper.
    """
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_quick_start_pipeline_runs_on_the_embedded_model() -> None:
    # No resources anywhere: both aliases mean the local model, as in the README.
    pipeline = load_example("extract_and_compare").ExtractAndCompare(max_tokens=6)
    reviews = [json.loads(line) for line in REVIEWS.read_text(encoding="utf-8").splitlines()]
    outputs = pipeline.run_sync(reviews[:2])
    assert len(outputs) == 2
    for output in outputs:
        assert set(output) == {"praise", "complaints", "verdict"}
        assert all(isinstance(text, str) and text.strip() for text in output.values()), output
    usage = plait.usage()
    assert usage["fast"]["provider"] == "local"
    assert usage["smart"]["provider"] == "local"
