"""The suite-wide guard: a request carrying a tracing placeholder fails the test that sent it.

The guard lives in ``tests/conftest.py``; these tests run it for real, on a small generated
test file in a separate pytest process, and check which inner tests it fails and what it says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from plait.testing import FakeOpenAIServer, find_placeholder, take_placeholder_requests

from .conftest import PLACEHOLDER_GUARD_MESSAGE

CONFTEST = Path(__file__).with_name("conftest.py")
ROOT = CONFTEST.parent.parent
PATH = os.environ.get("PYTHONPATH", "")

# Written to a file and run by an inner pytest; every string in it is ASCII on purpose, the
# placeholder characters are spelled as escapes.
INNER_TESTS = r"""
import json
import urllib.request

import pytest

from plait.testing import FakeAnthropicServer, FakeOpenAIServer

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
PLACEHOLDER = "\ue000\x1f7:n0\ue001"


def chat(base_url, messages, **extra):
    body = json.dumps({"model": "m", "messages": messages, **extra}).encode()
    req = urllib.request.Request(
        base_url + "/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "Authorization": "Bearer k"},
    )
    with OPENER.open(req, timeout=30) as resp:
        assert resp.status == 200
        return json.loads(resp.read())["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def shared():
    with FakeOpenAIServer() as server:
        yield server


def test_clean_request_passes(shared):
    assert chat(shared.base_url, [{"role": "user", "content": "plain text"}]) == "plain text"


def test_raw_placeholder_to_a_server_stopped_inside_the_test():
    with FakeOpenAIServer() as server:
        chat(server.base_url, [{"role": "user", "content": "Summarize: " + PLACEHOLDER}])


def test_escaped_placeholder_in_system_prompt_survives_reset(shared):
    chat(
        shared.base_url,
        [
            {"role": "system", "content": "Be brief. \\ue000\\x1f3:p1\\ue001"},
            {"role": "user", "content": "hello"},
        ],
    )
    shared.reset()  # clears the statistics, must not clear the evidence


def test_old_style_traced_output_text(shared):
    chat(shared.base_url, [{"role": "user", "content": "Use <traced output of summarizer>"}])


def test_placeholder_outside_the_messages(shared):
    chat(
        shared.base_url,
        [{"role": "user", "content": "fine"}],
        metadata={"note": "x" + PLACEHOLDER},
    )


def test_anthropic_system_prompt():
    with FakeAnthropicServer() as server:
        body = json.dumps(
            {
                "model": "claude",
                "max_tokens": 50,
                "system": "Rules: " + PLACEHOLDER,
                "messages": [{"role": "user", "content": "hi"}],
            }
        ).encode()
        req = urllib.request.Request(
            server.base_url + "/v1/messages",
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "x-api-key": "k",
                "anthropic-version": "2023-06-01",
            },
        )
        with OPENER.open(req, timeout=30) as resp:
            assert resp.status == 200


def test_clean_request_after_a_failed_one_passes(shared):
    assert chat(shared.base_url, [{"role": "user", "content": "again"}]) == "again"
"""


def _run_inner(tmp_path: Path) -> dict[str, str | None]:
    """Run INNER_TESTS under the real conftest; each test's teardown error text, or None."""
    (tmp_path / "conftest.py").write_text(CONFTEST.read_text())
    (tmp_path / "test_inner.py").write_text(INNER_TESTS)
    report = tmp_path / "report.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={report}",
            "test_inner.py",
        ],
        cwd=tmp_path,
        # The conftest imports the project's own test helpers (``tests.page_runner``).
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), PATH]))},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.exists(), f"inner pytest did not run:\n{proc.stdout}\n{proc.stderr}"
    assert proc.returncode == 1, f"inner pytest should fail:\n{proc.stdout}\n{proc.stderr}"
    outcomes: dict[str, str | None] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failures = [el for el in case if el.tag in ("failure", "error")]
        outcomes[case.attrib["name"]] = (
            "\n".join(f"{el.attrib.get('message', '')}\n{el.text or ''}" for el in failures)
            if failures
            else None
        )
    return outcomes


def test_the_guard_fails_every_test_that_sent_a_placeholder_and_only_those(
    tmp_path: Path,
) -> None:
    outcomes = _run_inner(tmp_path)
    assert outcomes.get("test_clean_request_passes", "missing") is None
    assert outcomes.get("test_clean_request_after_a_failed_one_passes", "missing") is None
    # inner test -> (where the placeholder sat, the excerpt the message must quote)
    expected = {
        "test_raw_placeholder_to_a_server_stopped_inside_the_test": (
            "$.messages[0].content",
            r"«Summarize: \ue000\x1f7:n0\ue001»",
        ),
        "test_escaped_placeholder_in_system_prompt_survives_reset": (
            "$.messages[0].content",
            r"«Be brief. \ue000\x1f3:p1\ue001»",
        ),
        "test_old_style_traced_output_text": (
            "$.messages[0].content",
            "«Use <traced output of summarizer>»",
        ),
        "test_placeholder_outside_the_messages": ("$.metadata.note", r"«x\ue000\x1f7:n0\ue001»"),
        "test_anthropic_system_prompt": ("$.system", r"«Rules: \ue000\x1f7:n0\ue001»"),
    }
    for name, (where, excerpt) in expected.items():
        text = outcomes.get(name)
        assert text is not None, f"{name} should have failed, outcomes: {outcomes}"
        assert PLACEHOLDER_GUARD_MESSAGE in text, text
        assert f"at {where}: {excerpt}" in text, f"{name}: expected {where} {excerpt} in:\n{text}"
        assert "(1 request(s))" in text, text  # each hit is reported once, to its own test
    assert len(outcomes) == 7, outcomes


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (
            json.dumps({"messages": [{"content": "a \ue000\x1f1:n0\ue001"}]}),
            "$.messages[0].content",
        ),
        (
            json.dumps({"messages": [{"content": "a \ue000\x1f1:n0\ue001"}]}, ensure_ascii=False),
            "$.messages[0].content",
        ),
        (json.dumps({"system": "x \\ue000\\x1f1:n0\\ue001"}), "$.system"),
        (json.dumps({"system": "x \\uE001"}), "$.system"),
        (json.dumps({"k": "<traced output of a.b>"}), "$.k"),
        (json.dumps({"\ue000key": "v"}), "$ (key '\\ue000key')"),
        ("not json \ue001", "body"),
    ],
)
def test_find_placeholder_sees_every_form(body: str, where: str) -> None:
    found = find_placeholder(body.encode())
    assert found is not None and found["where"] == where


def test_find_placeholder_leaves_ordinary_text_alone() -> None:
    body = json.dumps({"messages": [{"content": "C:\\users\\e000 <traced> \u00e9 \\u1234"}]})
    assert find_placeholder(body) is None


def test_a_server_keeps_placeholder_requests_across_reset_and_hands_each_out_once() -> None:
    with FakeOpenAIServer() as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "q \ue000\x1f2:n1\ue001"}]}
        req = urllib.request.Request(
            f"{server.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=30) as resp:
            assert resp.status == 200
        server.reset()
        stats = server.stats()
        assert stats["placeholder_requests_total"] == 1
        [record] = stats["placeholder_requests"]
        assert record["model"] == "m" and record["where"] == "$.messages[0].content"
        assert server.placeholder_requests() == [record]
        # this test consumes what it provoked, so the guard around it stays quiet
        taken = take_placeholder_requests()
        assert [hit["excerpt"] for hit in taken] == [record["excerpt"]]
        assert take_placeholder_requests() == []
    assert server.placeholder_requests() == [record]  # still answerable after stop
    assert take_placeholder_requests() == []
