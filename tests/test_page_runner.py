"""The documentation runner itself: it reads pages as the contract says, matches output
by its rules, runs what a page shows, and fails a page whose example is broken.

Pages here are small synthetic ones written to a temporary directory; the programs
they run are plain Python and bash (fast), except where the fake servers are the point.
"""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import PageServers, run_document
from tests.page_runner import (
    Document,
    ExampleFailed,
    PageError,
    Session,
    Source,
    api_modules,
    docstring_document,
    explain,
    first_mismatch,
    has_examples,
    load_page,
    matches,
    parse,
    port_problems,
    rendered_docstrings,
    session_commands,
    session_environment,
)

FENCE = "```"


def page(text: str, name: str = "docs/page.md") -> Document:
    return parse(textwrap.dedent(text), Source(name))


def run(document: Document, tmp_path: Path) -> Session:
    session = Session(document, tmp_path / "page", session_environment(os.environ), tmp_path / "r")
    session.run()
    return session


def failure(document: Document, tmp_path: Path) -> str:
    with pytest.raises(ExampleFailed) as caught:
        run(document, tmp_path)
    return str(caught.value)


# -- reading a page ------------------------------------------------------------------------


def test_fences_are_found_indented_with_tildes_and_long_backticks() -> None:
    document = page(
        """\
        # Title

        !!! note
            In an admonition:

            ````markdown
            ```python
            raise SystemExit("a fence shown inside a fence is not a block")
            ```
            ````

        === "A tab"

            ~~~{.python title="lib.py"}
            VALUE = 1
            ~~~

        ```python
        import lib
        ```
        """
    )
    assert [(b.line, b.language, b.title) for b in document.blocks] == [
        (6, "markdown", None),
        (14, "python", "lib.py"),
        (18, "python", None),
    ]
    assert (
        document.blocks[0].body
        == '```python\nraise SystemExit("a fence shown inside a fence is not a block")\n```\n'
    )
    assert document.blocks[1].body == "VALUE = 1\n"
    assert [s.kind for s in document.steps] == ["show", "write", "script"]


def test_directives_attach_to_the_block_right_after_them() -> None:
    document = page(
        """\
        <!-- run: exit=2 -->
        <!-- run: timeout=5 -->

        ```console
        $ false
        ```

        <!-- run: skip reason="needs a docker daemon" -->
        ```console
        $ docker run plait
        ```

        <!-- run: fake answer_like_demos=true latency_ms=50 -->
        <!-- run: env GREETING="hello there" OTHER=1 -->
        ```bash
        true
        ```
        """
    )
    first, skipped, last = (step.block.options for step in document.steps)
    assert (first.exit, first.timeout, first.skip) == (2, 5.0, None)
    assert skipped.skip == "needs a docker daemon"
    assert document.skips == [("docs/page.md:9", "needs a docker daemon")]
    assert last.fake == {"answer_like_demos": True, "latency_ms": 50}
    assert last.env == {"GREETING": "hello there", "OTHER": "1"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- run: skip -->\n```console\n$ x\n```\n", 'needs reason="..."'),
        ("<!-- run: quickly -->\n```console\n$ x\n```\n", "unknown directive word 'quickly'"),
        ("<!-- run: exit=two -->\n```console\n$ x\n```\n", "exit= expects a number"),
        ("<!-- run: background -->\n```console\n$ x\n```\n", 'ready="..." or ready-line="..."'),
        ("<!-- run: exit=2 -->\nSome text.\n\n```console\n$ x\n```\n", "right before the block"),
        ("text\n<!-- run: exit=2 -->\n", "with no block after it"),
        ("<!-- run skip\n", "one line"),
        ("```python\nprint(1)\n", "never closed"),
        ('```python title="my example"\nx = 1\n```\n', "is not a file name"),
        ('```python title="../outside.py"\nx = 1\n```\n', "is not a file name"),
        ('```text title="Output"\n1\n```\n', "right after the python block"),
        ("```bash\n$ plait run x.py\n```\n", "```console"),
        ("```console\nplait run x.py\n```\n", "starts with a `$ ` command"),
        (
            '<!-- run: interrupt after="x" -->\n```console\n$ a\n$ b\n```\n',
            "console block of one command",
        ),
        ("<!-- run: exit=2 -->\n```toml\na = 1\n```\n", "apply to a block that runs"),
    ],
)
def test_a_page_that_breaks_the_rules_is_refused_with_its_line(text: str, message: str) -> None:
    with pytest.raises(PageError) as caught:
        page(text)
    assert message in str(caught.value)
    assert str(caught.value).startswith("docs/page.md:")


def test_console_commands_continue_over_backslashes_and_own_the_lines_after_them() -> None:
    document = page(
        """\
        ```console
        $ plait run a.py \\
            --input x
        first
        ...

        $ touch done
        $ echo last
        last
        ```
        """
    )
    commands = session_commands(document.blocks[0])
    assert [(c.line, c.text, c.shown) for c in commands] == [
        (2, "plait run a.py \\\n    --input x", ["first", "..."]),
        (7, "touch done", None),
        (8, "echo last", ["last"]),
    ]


# -- matching output -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expected", "actual"),
    [
        (["a", "b"], "a\nb\n"),
        (["a  ", "b"], "a\nb   \n\n"),
        (["a", "...", "z"], "a\nb\nc\nz\n"),
        (["a", "...", "z"], "a\nz\n"),
        (["...", "z"], "z"),
        (["a", "  ...", "z"], "a\nb\nz"),
        (["took ... s (... calls)"], "took 1.5 s (3 calls)"),
        (["a", "..."], "a\nanything\nelse"),
        (["progress 100%"], "progress 10%\rprogress 100%"),
        (["red"], "\x1b[31mred\x1b[0m"),
        ([], ""),
    ],
)
def test_output_matches_by_the_contract(expected: list[str], actual: str) -> None:
    assert matches(expected, actual)


@pytest.mark.parametrize(
    ("expected", "actual", "bad"),
    [
        (["a", "b"], "a\nc\n", 1),
        (["a"], "a\nmore\n", 1),
        (["a", "...", "z"], "a\nb\n", 2),
        (["took ... s"], "took 1.5 s\nextra", 1),
        (["x...y"], "x\ny", 0),
        (["  indented"], "indented", 0),
    ],
)
def test_output_that_differs_is_found_where_it_differs(
    expected: list[str], actual: str, bad: int
) -> None:
    assert first_mismatch(expected, actual) == bad
    assert not matches(expected, actual)


def test_a_mismatch_is_explained_with_a_diff() -> None:
    message = explain(["total: 3", "done"], "total: 4\ndone\n")
    assert "expected line 1 ('total: 3') has no match" in message
    assert "-total: 3" in message and "+total: 4" in message


# -- running a page ------------------------------------------------------------------------

PASSING = f"""\
# A page whose every kind of block runs

{FENCE}python title="greet.py"
def greet(name: str) -> str:
    return f"hello {{name}}"
{FENCE}

A script imports the file written before it:

{FENCE}python
import greet

print(greet.greet("page"))
print("a line", flush=True)
{FENCE}

It prints:

{FENCE}text title="Output"
hello page
...
{FENCE}

{FENCE}console
$ python -c 'import greet; print(greet.greet("shell"))'
hello shell
$ python -c 'import sys; print("to stderr", file=sys.stderr); print("to stdout")'
to stderr
to stdout
$ ls *.py
greet.py
$ echo "many"; seq 1 50
many
...
50
$ touch made-by-a-command
{FENCE}

<!-- run: exit=3 -->
{FENCE}console
$ python -c 'raise SystemExit(3)'
{FENCE}

{FENCE}console
$ echo "status $?"
status 3
$ export CARRIED=over && mkdir -p work && cd work
{FENCE}

<!-- run: env SET_BY_PAGE="a value" -->
{FENCE}bash
test "$CARRIED" = over
test "$SET_BY_PAGE" = "a value"
test "$(basename "$PWD")" = work
echo "from bash" > ../bash.txt
{FENCE}

{FENCE}python
import os
from pathlib import Path

print(Path.cwd().name, os.environ["CARRIED"], Path("../bash.txt").read_text().strip())
{FENCE}

{FENCE}text title="Output"
work over from bash
{FENCE}

{FENCE}json
{{"shown": "not run"}}
{FENCE}
"""


def test_a_page_that_runs_as_written_passes(tmp_path: Path) -> None:
    session = run(page(PASSING), tmp_path)
    directory = tmp_path / "page"
    assert (
        directory / "greet.py"
    ).read_text() == 'def greet(name: str) -> str:\n    return f"hello {name}"\n'
    assert (directory / "made-by-a-command").is_file()
    assert (directory / "bash.txt").read_text() == "from bash\n"
    assert session.cwd == (directory / "work").resolve()


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        # The Output shown is not what the script prints.
        ("hello page\n...", "hello reader\n...", "docs/page.md:19: the Output shown is not"),
        # A console command's output differs.
        ("hello shell", "hello you", "docs/page.md:25: `$ python -c"),
        # A script that raises.
        ('print(greet.greet("page"))', "greet.nowhere()", "docs/page.md:10: python block"),
        # An exit status other than the one the page states.
        ("raise SystemExit(3)", "raise SystemExit(4)", "exited with 4, expected 3"),
        # A bash block whose middle command fails.
        ('test "$CARRIED" = over', 'test "$CARRIED" = under', "docs/page.md:51: bash block"),
        # Output the page does not show at the end.
        ("many\n...\n50", "many\n...\n49", "the output goes on after the last expected line"),
    ],
)
def test_a_broken_example_fails_its_page_naming_where(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    """The runner is honest: each of these one-line breakages of the passing page fails."""
    assert old in PASSING
    text = failure(page(PASSING.replace(old, new, 1)), tmp_path)
    assert message in text, text


def test_a_failure_shows_the_command_the_expected_lines_and_what_came(tmp_path: Path) -> None:
    text = failure(page(PASSING.replace("hello shell", "hello you", 1)), tmp_path)
    assert "`$ python -c 'import greet; print(greet.greet(\"shell\"))'`" in text
    assert "-hello you" in text and "+hello shell" in text


def test_a_skipped_block_is_not_run_and_is_listed(tmp_path: Path) -> None:
    document = page(
        """\
        <!-- run: skip reason="shows a paid endpoint" -->
        ```python
        raise SystemExit("never run")
        ```

        ```text title="Output"
        skipped with its block
        ```
        """
    )
    run(document, tmp_path)
    assert document.skips == [("docs/page.md:2", "shows a paid endpoint")]


def test_a_block_over_its_time_limit_fails(tmp_path: Path) -> None:
    document = page(
        """\
        <!-- run: timeout=1 -->
        ```console
        $ echo started; sleep 60
        ```
        """
    )
    text = failure(document, tmp_path)
    assert "docs/page.md:3: `$ echo started; sleep 60` did not finish in time" in text
    assert "started" in text


def test_an_interrupted_command_gets_ctrl_c_after_the_text_and_exits_130(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "try:\n"
        "    print('working on 1 of 9', flush=True)\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped: resume with the same command', flush=True)\n"
        "    sys.exit(130)\n"
    )
    (tmp_path / "page").mkdir()
    (tmp_path / "page" / "long.py").write_text(script)
    document = page(
        """\
        <!-- run: interrupt after="working on" -->
        ```console
        $ python long.py
        working on 1 of 9
        stopped: resume with the same command
        ```
        """
    )
    run(document, tmp_path)


def test_an_interrupt_whose_text_never_comes_fails(tmp_path: Path) -> None:
    document = page(
        """\
        <!-- run: interrupt after="never printed" -->
        ```console
        $ echo something else
        ```
        """
    )
    assert "never printed 'never printed'" in failure(document, tmp_path)


def _free_port() -> int:
    """A free port below the ephemeral range (so a connection to it once the server is
    gone cannot meet itself) and outside the pages' own range."""
    for port in range(19000, 20000):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 19000-19999")


def _refuses(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_a_background_server_is_ready_before_the_next_block_and_stopped_after(
    tmp_path: Path,
) -> None:
    port = _free_port()
    document = page(
        f"""\
        <!-- run: background ready="http://127.0.0.1:{port}/" -->
        ```console
        $ python -m http.server {port} --bind 127.0.0.1
        ...
        ```

        <!-- run: background ready-line="waiting" -->
        ```bash
        echo waiting; exec sleep 600
        ```

        ```console
        $ python -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:{port}/").status)'
        200
        ```
        """
    )
    session = Session(document, tmp_path / "page", session_environment(os.environ), tmp_path / "r")
    session.run()
    assert session.background == []
    assert _refuses(port)


def test_a_background_command_that_dies_fails_its_block(tmp_path: Path) -> None:
    document = page(
        """\
        <!-- run: background ready-line="never" -->
        ```console
        $ echo crashed; exit 1
        ```
        """
    )
    text = failure(document, tmp_path)
    assert "docs/page.md:2: the background command ended (status 1) before it was ready" in text
    assert "crashed" in text


def test_the_session_talks_to_the_fake_servers_and_run_fake_configures_them(
    page_servers: PageServers, tmp_path: Path
) -> None:
    """An alias with no base_url reaches the fake OpenAI server through OPENAI_BASE_URL
    and its key through OPENAI_API_KEY, as the pages promise; `run: fake` settings hold
    for the rest of the page and the next page starts from the defaults."""
    openai, _ = page_servers
    document = page(
        """\
        ```python
        import plait

        resources = plait.ResourceConfig(
            {
                "fast": {
                    "provider": "openai",
                    "model": "gpt-4o-mini",
                    "api_key_env": "OPENAI_API_KEY",
                }
            }
        )
        brief = plait.LLMInference("fast", system_prompt="Be brief")
        print(brief.run_sync("hello", resources=resources))
        ```

        ```text title="Output"
        [Be brief] hello
        ```

        <!-- run: fake latency_ms=7 -->
        ```console
        $ python -c 'print("configured")'
        configured
        ```
        """
    )
    run_document(document, tmp_path / "first", page_servers)
    assert openai.configure()["latency_ms"] == 7
    assert len(openai.stats()["requests"]) == 1
    run_document(page("text\n"), tmp_path / "second", page_servers)
    assert openai.configure()["latency_ms"] == 0
    assert openai.stats()["requests"] == []


def test_ports_must_be_in_range_and_each_pages_own(tmp_path: Path) -> None:
    def serving(port: int, name: str) -> Document:
        return page(
            f"""\
            <!-- run: background ready="http://127.0.0.1:{port}/health" -->
            ```console
            $ plait serve review.py:Review --port {port}
            ```
            """,
            name,
        )

    assert port_problems([serving(18001, "a.md"), serving(18002, "b.md")]) == []
    problems = port_problems(
        [serving(18001, "a.md"), serving(18001, "b.md"), serving(8080, "c.md")]
    )
    assert problems == [
        "c.md:2: port 8080 is outside 18000-18999, the range kept for the pages' background "
        "servers",
        "port 18001 is used by more than one page: a.md:2, b.md:2",
    ]


def test_load_page_names_the_page_by_its_path_in_the_repository(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("```python\nraise SystemExit(1)\n```\n")
    document = load_page(tmp_path / "docs" / "x.md", tmp_path)
    assert document.source.at(1) == "docs/x.md:1"


# -- docstrings ----------------------------------------------------------------------------

SYNTHETIC_MODULE = '''\
"""A module made up for the test."""

__all__ = ["Greeter", "shout", "BROKEN_BUT_NOT_A_FUNCTION"]

BROKEN_BUT_NOT_A_FUNCTION = 3


def shout(text: str) -> str:
    """Shout ``text``.

    Examples:
        ```python
        from synthetic_docs import shout

        print(shout("hi"))
        ```

        ```text title="Output"
        HI!
        ```
    """
    return text.upper() + "!"


class Greeter:
    """Greets people.

    Examples:
        >>> from synthetic_docs import Greeter
        >>> Greeter().greet("you")
        'hello you'
    """

    def greet(self, name: str) -> str:
        """Greet ``name``.

        Examples:
            >>> from synthetic_docs import Greeter
            >>> Greeter().greet("x")
            'hello WRONG'
        """
        return f"hello {name}"

    def _private(self) -> None:
        """Not rendered, so not run.

        ```python
        raise SystemExit("a private method's example ran")
        ```
        """


def hidden() -> None:
    """Not in __all__, so not run.

    ```python
    raise SystemExit("a name outside __all__ ran")
    ```
    """
'''


def test_docstring_examples_of_public_names_are_collected_and_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    (tmp_path / "src").mkdir()
    module_file = tmp_path / "src" / "synthetic_docs.py"
    module_file.write_text(SYNTHETIC_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "src"))
    module = importlib.import_module("synthetic_docs")
    items = list(rendered_docstrings(module, ["synthetic_docs"], importlib.import_module))
    assert [item.qualname for item in items] == [
        "synthetic_docs.Greeter",
        "synthetic_docs.Greeter.greet",
        "synthetic_docs.shout",
    ]
    documents = [docstring_document(item, tmp_path) for item in items]
    assert all(has_examples(d) for d in documents)
    greeter, greet, shout = documents
    assert [s.kind for s in shout.steps] == ["script"]
    assert shout.steps[0].output is not None
    assert greeter.source.at(1) == "src/synthetic_docs.py:26 (docstring of synthetic_docs.Greeter)"

    env = session_environment(os.environ, {"PYTHONPATH": str(tmp_path / "src")})
    for name, document in (("greeter", greeter), ("shout", shout)):
        Session(document, tmp_path / name, dict(env), tmp_path / f"{name}-r").run()
    with pytest.raises(ExampleFailed) as caught:
        Session(greet, tmp_path / "greet", dict(env), tmp_path / "greet-r").run()
    text = str(caught.value)
    assert "src/synthetic_docs.py:38 (docstring of synthetic_docs.Greeter.greet)" in text
    assert "line 39" in text and "'hello WRONG'" in text and "'hello x'" in text


def test_a_name_exported_by_two_documented_modules_runs_in_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib

    package = tmp_path / "synthpkg"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("from synthpkg.inner import thing\n__all__ = ['thing']\n")
    (package / "inner" / "__init__.py").write_text(
        "from synthpkg.inner.impl import thing\n__all__ = ['thing']\n"
    )
    (package / "inner" / "impl.py").write_text('def thing() -> None:\n    """Doc."""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    documented = ["synthpkg", "synthpkg.inner"]
    load = importlib.import_module
    top, inner = (load(name) for name in documented)
    assert [i.qualname for i in rendered_docstrings(top, documented, load)] == []
    assert [i.qualname for i in rendered_docstrings(inner, documented, load)] == [
        "synthpkg.inner.thing"
    ]


def test_the_api_pages_name_the_modules_to_collect(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# `pkg.b`\n\n::: pkg.b\n    options:\n      x: 1\n")
    (tmp_path / "a.md").write_text("# `pkg`\n\n::: pkg\n")
    assert api_modules(tmp_path) == ["pkg", "pkg.b"]


def test_the_session_environment_drops_a_developers_settings() -> None:
    env = session_environment(
        {
            "PATH": "/usr/bin",
            "OPENAI_API_KEY": "sk-real",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector",
            "https_proxy": "http://proxy",
            "PLAIT_LOCAL_LOG": "1",
            "HOME": "/home/x",
        },
        {"OPENAI_API_KEY": "sk-test"},
    )
    assert env["OPENAI_API_KEY"] == "sk-test"
    assert env["HOME"] == "/home/x"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "https_proxy", "PLAIT_LOCAL_LOG"):
        assert name not in env
