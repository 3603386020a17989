"""The documentation site builds with no warning and works in a real browser.

The build is ``mkdocs build --strict`` as ``make docs`` runs it (a broken link, a page
missing from the navigation or a docstring mkdocstrings cannot read fails it). The
browser test serves that build on 127.0.0.1 and drives Debian's headless Chromium
through it as a reader would: every top-level tab and a page of each section, the search
box, and no console error or failed request anywhere.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cdp import CHROMIUM, BrowserError, Tab, open_tab

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"
SCREENSHOT_COPY = ROOT / "build" / "site-test" / "home.png"
"""A stable place for the home page's screenshot (``build/`` is ignored by git)."""

NEEDS_CHROMIUM = pytest.mark.skipif(
    not CHROMIUM.is_file(),
    reason=f"no {CHROMIUM}: the site's browser test needs Debian's Chromium "
    "(as root: apt-get install chromium; .ci/run installs it on CI)",
)

SEARCH_TERM = "budget"
SEARCH_PAGE = "how-to/budgets/"
SEARCH_TITLE = "Budgets"


@dataclass(frozen=True)
class Build:
    site: Path
    status: int
    log: str


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The site as ``make docs`` builds it, into a directory of this module's own."""
    site = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=600,
    )
    return Build(site, done.returncode, done.stdout + done.stderr)


def test_the_site_builds_strict_with_no_warning(built_site: Build) -> None:
    assert built_site.status == 0, built_site.log
    warnings = [line for line in built_site.log.splitlines() if "WARNING" in line]
    assert warnings == [], built_site.log
    for page in ("index.html", f"{SEARCH_PAGE}index.html", "search/search_index.json"):
        assert (built_site.site / page).is_file(), page


# -- the browser ---------------------------------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serving(directory: Path) -> Iterator[str]:
    """``directory`` served on a free loopback port; yields its root URL."""
    handler = functools.partial(_Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture()
def served(built_site: Build) -> Iterator[str]:
    """The built site on a free loopback port; yields its root URL."""
    if built_site.status != 0:
        pytest.fail("the site did not build (see test_the_site_builds_strict_with_no_warning)")
    with serving(built_site.site) as home:
        yield home


def _navigation() -> list[tuple[str, bool]]:
    """mkdocs.yml's top-level navigation: each tab's title and whether it is a section."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    entries: list[tuple[str, bool]] = []
    for entry in config["nav"]:
        ((title, value),) = entry.items()
        entries.append((title, isinstance(value, list)))
    return entries


TABS_JS = "[...document.querySelectorAll('.md-tabs__link')]"
ACTIVE_TAB_JS = (
    "document.querySelector('.md-tabs__item--active .md-tabs__link')?.textContent.trim()"
)
H1_JS = "document.querySelector('.md-content h1')?.textContent.replace('¶', '').trim()"
SIDEBAR_LINK_JS = """[...document.querySelectorAll('.md-sidebar--primary a.md-nav__link[href]')]
    .filter(a => a.offsetParent !== null && a.href.split('#')[0] !== location.href.split('#')[0])
    [0]"""
RESULT_LINKS_JS = (
    "[...document.querySelectorAll('.md-search-result__item a.md-search-result__link')]"
)
RESULTS_JS = f"{RESULT_LINKS_JS}.map(a => ({{path: a.pathname, text: a.textContent.trim()}}))"
"""Each search result's page (its path: the link adds ``?h=TERM`` to highlight it) and
text."""


async def _visit_every_tab(tab: Tab, home: str, visited: list[str]) -> None:
    """Click each top-level tab from the home page, then a page of its section."""
    for index, (title, is_section) in enumerate(_navigation()):
        await tab.goto(home)
        texts = await tab.evaluate(f"{TABS_JS}.map(a => a.textContent.trim())")
        assert texts == [name for name, _ in _navigation()], texts
        href = await tab.evaluate(f"{TABS_JS}[{index}].href")
        await tab.click(f"{TABS_JS}[{index}]", navigates=True)  # Home reloads the page
        assert tab.location == href, (title, tab.location, href)
        assert await tab.evaluate(ACTIVE_TAB_JS) == title
        assert await tab.evaluate(H1_JS), f"no title on {tab.location}"
        visited.append(tab.location)
        if not is_section:
            continue
        link = await tab.evaluate(f"({SIDEBAR_LINK_JS})?.href")
        assert link, f"the {title} section's sidebar lists no other page ({tab.location})"
        await tab.click(SIDEBAR_LINK_JS, navigates=True)
        assert tab.location == link
        assert await tab.evaluate(ACTIVE_TAB_JS) == title, f"{link} is not in {title}"
        assert await tab.evaluate(H1_JS), f"no title on {tab.location}"
        visited.append(tab.location)


async def _search(tab: Tab, home: str) -> list[dict[str, str]]:
    """Type the term into the search box, as a reader does, and wait for the page."""
    await tab.goto(home)
    await tab.click("document.querySelector('.md-search__input')", navigates=False)
    await tab.until(
        "the search box to take focus",
        lambda: tab.evaluate(
            "document.activeElement === document.querySelector('.md-search__input')"
        ),
    )
    await tab.type(SEARCH_TERM)
    wanted = "/" + SEARCH_PAGE

    async def found() -> list[dict[str, str]] | None:
        results: list[dict[str, str]] = await tab.evaluate(RESULTS_JS)
        return results if any(r["path"] == wanted for r in results) else None

    results: list[dict[str, str]] = await tab.until(f"a search result linking {wanted}", found)
    return results


async def _browse(home: str, profile: Path, log: Path, screenshot: Path) -> list[str]:
    visited: list[str] = []
    async with open_tab(home.rstrip("/"), profile, log) as tab:
        await tab.goto(home)
        assert await tab.evaluate("document.title"), "the home page has no title"
        await tab.screenshot(screenshot)
        await _visit_every_tab(tab, home, visited)
        results = await _search(tab, home)
        index = [r["path"] for r in results].index("/" + SEARCH_PAGE)
        assert SEARCH_TITLE in results[index]["text"], results
        await tab.click(f"{RESULT_LINKS_JS}[{index}]", navigates=True)
        assert tab.location.split("?")[0] == home + SEARCH_PAGE
        assert await tab.evaluate(H1_JS) == SEARCH_TITLE
        visited.append(tab.location)
        problems = [str(problem) for problem in tab.problems]
        assert problems == [], "\n".join(problems)
    return visited


@NEEDS_CHROMIUM
async def test_the_site_works_in_a_browser(
    served: str, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """Tabs, a page of each section and the search lead where they say, with no console
    error, no failed request and nothing fetched from outside the site."""
    screenshot = tmp_path / "home.png"
    log = tmp_path / "chromium.log"
    visited: list[str] = []
    failure = ""
    try:
        visited = await _browse(served, tmp_path / "profile", log, screenshot)
    except BrowserError as error:
        failure = f"{error}\nChromium's log: {log}"
    if failure:
        pytest.fail(failure, pytrace=False)
    SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(screenshot, SCREENSHOT_COPY)
    record_property("site_screenshot", f"{screenshot} (copied to {SCREENSHOT_COPY})")
    assert screenshot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    sections = sum(1 for _, is_section in _navigation() if is_section)
    assert len(visited) == len(_navigation()) + sections + 1, visited


BROKEN_PAGE = """<!doctype html>
<html><head><title>broken</title></head>
<body>
<h1>broken</h1>
<img src="missing.png">
<script>console.error("something broke")</script>
<script>undefinedFunction()</script>
</body></html>
"""


@NEEDS_CHROMIUM
async def test_the_browser_check_sees_console_errors_and_failed_requests(tmp_path: Path) -> None:
    """The browser test is honest: a page with a console error, an uncaught exception
    and a missing image is reported on each count."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "index.html").write_text(BROKEN_PAGE, encoding="utf-8")
    wanted = {"console error", "uncaught exception", "failed request"}
    with serving(tmp_path / "www") as home:
        async with open_tab(home.rstrip("/"), tmp_path / "profile", tmp_path / "log") as tab:
            await tab.goto(home)
            await tab.until(
                f"the page's problems ({', '.join(sorted(wanted))})",
                lambda: wanted <= {problem.kind for problem in tab.problems},
            )
    texts = "\n".join(str(p) for p in tab.problems)
    assert "something broke" in texts and "undefinedFunction" in texts
    assert f"404 {home}missing.png" in texts
