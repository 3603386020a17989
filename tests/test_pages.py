"""Every example of the documentation site runs as its page shows it.

Each page under ``docs/`` is a test of its own (its path is the test's id): its blocks
run in order in a fresh directory, against the fake OpenAI and Anthropic servers, by the
rules of the documentation contract that ``tests/page_runner.py`` implements. The
docstrings of the public API (the modules the reference renders) run the same way, a
test per module. A failure names the page (or source file) and line, the command, and
what was expected against what came.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PageServers, run_document
from tests.page_runner import (
    Document,
    ExampleFailed,
    PageError,
    api_modules,
    docstring_document,
    has_examples,
    load_page,
    port_problems,
    rendered_docstrings,
)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(path.relative_to(ROOT).as_posix() for path in DOCS.rglob("*.md"))
API_MODULES = api_modules(DOCS / "reference" / "api")

SKIP_CAP = 10
"""How many blocks the whole site may leave unrun (``<!-- run: skip reason=... -->``):
only what cannot run here, such as a docker command or a paid endpoint's key."""


def _failure_of(run: Callable[..., object], *args: object) -> str:
    """What ``run(*args)`` found wrong with an example ("" if nothing), so the test
    fails with that message alone (not inside the runner's traceback)."""
    try:
        run(*args)
    except (ExampleFailed, PageError) as error:
        return str(error)
    return ""


def _page(path: str) -> Document:
    failure = _failure_of(load_page, ROOT / path, ROOT)
    if failure:
        pytest.fail(failure, pytrace=False)
    return load_page(ROOT / path, ROOT)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_runs_as_written(
    page: str,
    page_servers: PageServers,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    document = _page(page)
    for where, reason in document.skips:
        record_property("skipped_block", f"{where}: {reason}")
    failure = _failure_of(run_document, document, tmp_path, page_servers)
    if failure:
        pytest.fail(failure, pytrace=False)


@pytest.mark.parametrize("module_name", API_MODULES)
def test_the_docstring_examples_run(
    module_name: str,
    page_servers: PageServers,
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    """Each docstring the reference renders for the module, a session of its own; a
    name re-exported by several documented modules runs in one of them."""
    module = importlib.import_module(module_name)
    failures: list[str] = []
    for item in rendered_docstrings(module, API_MODULES, importlib.import_module):
        try:
            document = docstring_document(item, ROOT)
            if not has_examples(document):
                continue
            for where, reason in document.skips:
                record_property("skipped_block", f"{where}: {reason}")
            run_document(document, tmp_path / re.sub(r"\W", "_", item.qualname), page_servers)
        except (ExampleFailed, PageError) as error:
            failures.append(str(error))
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)


def _all_documents() -> list[Document]:
    documents: list[Document] = []
    for page in PAGES:
        try:
            documents.append(load_page(ROOT / page, ROOT))
        except PageError:
            continue  # its own test says what is wrong
    for module_name in API_MODULES:
        module = importlib.import_module(module_name)
        for item in rendered_docstrings(module, API_MODULES, importlib.import_module):
            try:
                documents.append(docstring_document(item, ROOT))
            except PageError:
                continue
    return documents


def test_skipped_blocks_are_few_and_each_says_why() -> None:
    """The site may leave at most SKIP_CAP blocks unrun; every one is listed here (and in
    the suite's closing summary) with its reason."""
    skips = [skip for document in _all_documents() for skip in document.skips]
    for where, reason in skips:
        print(f"skipped: {where}: {reason}")
    assert all(reason.strip() for _, reason in skips), skips
    assert len(skips) <= SKIP_CAP, (
        f"{len(skips)} blocks are skipped, at most {SKIP_CAP} may be: make them run\n"
        + "\n".join(f"  {where}: {reason}" for where, reason in skips)
    )


def test_background_servers_use_ports_of_their_own_page() -> None:
    """Pages' background commands listen in 18000-18999, on loopback, and no two pages
    share a port (the pages run one after another, but a stopped server's port must not
    be what a later page waits for)."""
    problems = port_problems([load_page(ROOT / page, ROOT) for page in PAGES if _parses(page)])
    assert not problems, "\n".join(problems)


def _parses(page: str) -> bool:
    try:
        load_page(ROOT / page, ROOT)
    except PageError:
        return False
    return True
