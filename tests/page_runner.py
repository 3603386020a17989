"""Run the examples of a documentation page (or of a docstring) as a reader would.

The rules are the documentation contract's: a page runs in a fresh directory of its own,
its fenced blocks in order; a ```` ```python ```` block is a complete script run in a
process of its own, a block titled with a file name is written to that file, a
```` ```console ```` block is a shell session whose shown output is compared with what
its commands print, a ```` ```bash ```` block is a script, a ```` ```text title="Output" ````
block after a python block is that script's expected output, and an HTML comment
``<!-- run: ... -->`` right before a block changes how it runs (skip, exit status,
background, interrupt, fake server settings, timeout, environment).

One parser and one runner serve both the pages under ``docs/`` and the docstrings of
the public API (whose ``>>>`` lines run as doctests), so a rule means the same wherever
an example is written. Nothing here imports plait: the runner only starts processes,
as a reader's terminal would.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final

DEFAULT_TIMEOUT_S: Final = 120.0
"""A block's time limit unless ``<!-- run: timeout=N -->`` says otherwise."""

STOP_TIMEOUT_S: Final = 10.0
"""How long a background process gets to stop on SIGTERM before it is killed."""

SHOWN_LINES: Final = 120
"""How many lines of a command's output a failure message shows (its end)."""

PYTHON_LANGUAGES: Final = frozenset({"python", "py"})
SHELL_LANGUAGES: Final = frozenset({"bash", "sh", "shell"})
SESSION_LANGUAGES: Final = frozenset({"console"})
OUTPUT_TITLE: Final = "Output"

# -- the page's structure ------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_DIRECTIVE = re.compile(r"^\s*<!--\s*run:(?P<body>.*?)-->\s*$")
_DIRECTIVE_LIKE = re.compile(r"^\s*<!--\s*run\b")
_ATTRIBUTE = re.compile(
    r"""(?P<key>[A-Za-z_][\w-]*)=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)'|(?P<bare>\S+))"""
)
_FILE_TITLE = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.(?:/|$))[\w.\-/]+$")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


class PageError(Exception):
    """A page (or docstring) breaks the contract's rules: the message names where."""


class ExampleFailed(AssertionError):
    """An example did not do what its page shows: the message names where and why."""


@dataclass(frozen=True)
class Source:
    """Where a document's text comes from, to name a line of it in messages."""

    path: str
    first_line: int = 1
    """The line of ``path`` that is the document's line 1 (a docstring's offset)."""
    what: str = ""
    """What the document is, when the path alone does not say (a docstring's owner)."""

    def at(self, line: int) -> str:
        where = f"{self.path}:{self.first_line + line - 1}"
        return f"{where} ({self.what})" if self.what else where


@dataclass
class Options:
    """What the directives right before a block say about running it."""

    skip: str | None = None
    exit: int | None = None
    background: bool = False
    ready_url: str | None = None
    ready_line: str | None = None
    interrupt_after: str | None = None
    timeout: float | None = None
    fake: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    lines: list[int] = field(default_factory=list)
    """The lines of the directives, for messages."""

    @property
    def changes_running(self) -> bool:
        """Whether the options say anything about running the block itself."""
        return (
            self.exit is not None
            or self.background
            or self.interrupt_after is not None
            or self.timeout is not None
        )


@dataclass(frozen=True)
class Block:
    """A fenced block (or, in a docstring, a run of ``>>>`` lines) and its directives."""

    line: int
    """The line of its opening fence (or first ``>>>`` line) in its document."""
    language: str
    attributes: Mapping[str, str]
    body: str
    options: Options

    @property
    def title(self) -> str | None:
        return self.attributes.get("title")

    @property
    def body_line(self) -> int:
        """The document line of the body's first line."""
        return self.line if self.language == "doctest" else self.line + 1


@dataclass(frozen=True)
class Command:
    """One ``$ `` command of a console block and the output shown after it."""

    line: int
    text: str
    shown: list[str] | None
    """The lines shown after it; None when none are (its output is not compared)."""


@dataclass(frozen=True)
class Step:
    """What the runner does with one block."""

    kind: str
    """``script`` (python), ``shell`` (bash), ``session`` (console), ``doctest``,
    ``write`` (a titled block) or ``skip``."""
    block: Block
    output: Block | None = None
    """For a script: the ``Output`` block shown after it."""


@dataclass(frozen=True)
class Document:
    """A page or a docstring: its text parsed into the steps it asks for."""

    source: Source
    blocks: list[Block]
    steps: list[Step]

    @property
    def skips(self) -> list[tuple[str, str]]:
        """Each skipped block's place and the reason given."""
        return [
            (self.source.at(s.block.line), s.block.options.skip or "")
            for s in self.steps
            if s.kind == "skip"
        ]


def parse_info(info: str) -> tuple[str, dict[str, str]]:
    """A fence's info string as its language and its ``key="value"`` attributes.

    Accepts ``python title="a.py"`` and the attribute-list spelling
    ``{.python title="a.py"}``.
    """
    text = info.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    attributes = {
        m["key"]: next(v for v in (m["dq"], m["sq"], m["bare"]) if v is not None)
        for m in _ATTRIBUTE.finditer(text)
    }
    rest = _ATTRIBUTE.sub("", text).split()
    language = rest[0].lstrip(".").lower() if rest else ""
    return language, attributes


def parse_directive(body: str, where: str) -> Options:
    """One ``<!-- run: ... -->`` comment's words as options (raises PageError if wrong)."""
    try:
        words = shlex.split(body)
    except ValueError as error:
        raise PageError(f"{where}: cannot read the directive ({error})") from None
    options = Options()
    if not words:
        raise PageError(f"{where}: an empty <!-- run: --> directive")
    head, rest = words[0], words[1:]
    if head in ("fake", "env"):
        if not rest:
            raise PageError(f"{where}: `run: {head}` needs NAME=value settings after it")
        for word in rest:
            name, sep, value = word.partition("=")
            if not sep or not name:
                raise PageError(f"{where}: `run: {head}` expects NAME=value, got {word!r}")
            if head == "fake":
                options.fake[name] = _typed(value)
            else:
                options.env[name] = value
        return options
    flags = {"skip", "background", "interrupt"}
    keys = {"reason", "exit", "ready", "ready-line", "after", "timeout"}
    given: dict[str, str] = {}
    seen: set[str] = set()
    for word in words:
        name, sep, value = word.partition("=")
        if not sep and name in flags:
            seen.add(name)
        elif sep and name in keys:
            given[name] = value
        else:
            known = ", ".join(sorted(flags | {f"{k}=" for k in keys} | {"fake", "env"}))
            raise PageError(f"{where}: unknown directive word {word!r} (known: {known})")
    _check_pairs(seen, given, where)
    if "skip" in seen:
        options.skip = given["reason"]
    if "exit" in given:
        options.exit = _number(given["exit"], "exit", where, int)
    if "timeout" in given:
        options.timeout = _number(given["timeout"], "timeout", where, float)
    if "background" in seen:
        options.background = True
        options.ready_url = given.get("ready")
        options.ready_line = given.get("ready-line")
    if "interrupt" in seen:
        options.interrupt_after = given["after"]
    return options


def _check_pairs(flags: set[str], given: Mapping[str, str], where: str) -> None:
    """Each flag has the value it needs, and no value comes without its flag."""
    needs = {"skip": ("reason",), "interrupt": ("after",), "background": ("ready", "ready-line")}
    for flag, keys in needs.items():
        if flag in flags and not any(given.get(k) for k in keys):
            wanted = " or ".join(f'{k}="..."' for k in keys)
            raise PageError(f"{where}: `run: {flag}` needs {wanted}")
        for key in keys:
            if key in given and flag not in flags:
                raise PageError(f"{where}: {key}= belongs with `run: {flag}`")
    if "skip" in flags and len(flags) > 1:
        raise PageError(f"{where}: a skipped block cannot also be {sorted(flags - {'skip'})}")
    if {"background", "interrupt"} <= flags:
        raise PageError(f"{where}: a block is either run in the background or interrupted")


def _number(text: str, name: str, where: str, kind: Callable[[str], Any]) -> Any:
    try:
        return kind(text)
    except ValueError:
        raise PageError(f"{where}: {name}= expects a number, got {text!r}") from None


def _typed(text: str) -> Any:
    """A fake-server setting's value: a bool, a number, JSON, or else the text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _merge(into: Options, new: Options, where: str) -> None:
    """Directives stacked before one block add up; saying one thing twice is an error."""
    for name in ("skip", "exit", "ready_url", "ready_line", "interrupt_after", "timeout"):
        value = getattr(new, name)
        if value is not None:
            if getattr(into, name) is not None:
                raise PageError(f"{where}: {name.replace('_', '-')} given twice for one block")
            setattr(into, name, value)
    into.background = into.background or new.background
    into.fake.update(new.fake)
    into.env.update(new.env)
    into.lines.extend(new.lines)


def _dedent(line: str, indent: str) -> str:
    """``line`` without the fence's indentation (fewer leading spaces: all of them)."""
    if line.startswith(indent):
        return line[len(indent) :]
    return line.lstrip(" \t")


def parse(text: str, source: Source, *, doctests: bool = False) -> Document:
    """Parse a document into its blocks and the steps they ask for.

    Fences may be indented (inside an admonition or a content tab), use ``~~~`` or
    four and more backticks (a block that shows a fence); a closing fence is the same
    character, at least as long, alone on its line. With ``doctests`` (docstrings),
    each run of ``>>>`` lines outside the fences is a block of language ``doctest``.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    pending: Options | None = None
    pending_line = 0
    index = 0
    while index < len(lines):
        line = lines[index]
        number = index + 1
        directive = _DIRECTIVE.match(line)
        if directive:
            where = source.at(number)
            options = parse_directive(directive["body"], where)
            options.lines.append(number)
            if pending is None:
                pending, pending_line = Options(), number
            _merge(pending, options, where)
            index += 1
            continue
        if _DIRECTIVE_LIKE.match(line):
            raise PageError(
                f"{source.at(number)}: a run directive is one line, `<!-- run: WORDS -->`"
            )
        opening = _FENCE_OPEN.match(line)
        is_fence = opening is not None and not (
            opening["fence"].startswith("`") and "`" in opening["info"]
        )
        if opening is not None and is_fence:
            fence, indent = opening["fence"], opening["indent"]
            body: list[str] = []
            index += 1
            while index < len(lines):
                closing = lines[index].strip()
                if closing.startswith(fence[0] * len(fence)) and set(closing) == {fence[0]}:
                    break
                body.append(_dedent(lines[index], indent))
                index += 1
            else:
                raise PageError(f"{source.at(number)}: this fence is never closed")
            language, attributes = parse_info(opening["info"])
            blocks.append(
                Block(number, language, attributes, "\n".join(body) + "\n", pending or Options())
            )
            pending = None
            index += 1
            continue
        if doctests and line.lstrip().startswith(">>>"):
            chunk: list[str] = []
            indent = line[: len(line) - len(line.lstrip())]
            while index < len(lines) and lines[index].strip():
                chunk.append(_dedent(lines[index], indent))
                index += 1
            _add_doctest(
                blocks, Block(number, "doctest", {}, "\n".join(chunk) + "\n", pending or Options())
            )
            pending = None
            continue
        if pending is not None and line.strip():
            raise PageError(
                f"{source.at(pending_line)}: a run directive must be right before the block "
                f"it is about (found text at line {source.first_line + index} first)"
            )
        index += 1
    if pending is not None:
        raise PageError(f"{source.at(pending_line)}: a run directive with no block after it")
    return Document(source, blocks, _steps(blocks, source))


def _add_doctest(blocks: list[Block], chunk: Block) -> None:
    """A docstring's ``>>>`` chunks share one doctest session, as doctest runs them: a
    chunk after another (prose between them, no fenced block) joins it, its lines kept
    in place."""
    last = blocks[-1] if blocks else None
    if last is None or last.language != "doctest" or chunk.options.lines:
        blocks.append(chunk)
        return
    gap = chunk.line - last.line - len(last.body.splitlines())
    body = last.body + "\n" * gap + chunk.body
    blocks[-1] = Block(last.line, "doctest", {}, body, last.options)


def _steps(blocks: Sequence[Block], source: Source) -> list[Step]:
    """What to do with each block, checked against the rules before anything runs."""
    steps: list[Step] = []
    for block in blocks:
        where = source.at(block.line)
        options = block.options
        title = block.title
        if title == OUTPUT_TITLE:
            previous = steps[-1] if steps else None
            if _skipped_script(previous):
                assert previous is not None
                steps[-1] = Step("skip", previous.block, block)
                continue
            if previous is None or previous.kind != "script" or previous.output is not None:
                raise PageError(
                    f"{where}: an Output block must come right after the python block whose "
                    "output it shows (the next fenced block after it)"
                )
            if options.changes_running or options.skip:
                raise PageError(f"{where}: directives go before the python block, not its Output")
            steps[-1] = Step("script", previous.block, block)
            continue
        if options.skip is not None:
            steps.append(Step("skip", block))
            continue
        if title is not None:
            if not _FILE_TITLE.match(title):
                raise PageError(
                    f"{where}: title={title!r} is not a file name; a titled block is written "
                    f'to that file (use title="{OUTPUT_TITLE}" for a python block\'s output)'
                )
            kind = "write"
        elif block.language in PYTHON_LANGUAGES:
            kind = "script"
        elif block.language in SHELL_LANGUAGES:
            kind = "shell"
            _check_shell(block, where)
        elif block.language in SESSION_LANGUAGES:
            kind = "session"
        elif block.language == "doctest":
            kind = "doctest"
        else:
            kind = "show"
        if options.changes_running and kind in ("write", "show"):
            raise PageError(f"{where}: run directives apply to a block that runs, not {kind!r}")
        _check_modes(kind, block, where)
        steps.append(Step(kind, block))
    return steps


def _skipped_script(step: Step | None) -> bool:
    """Whether ``step`` is a skipped python script (its Output block is skipped with it)."""
    return (
        step is not None
        and step.kind == "skip"
        and step.output is None
        and step.block.language in PYTHON_LANGUAGES
        and step.block.title is None
    )


def _check_shell(block: Block, where: str) -> None:
    """A bash block shows no prompt: a ``$ `` line means a console session was meant."""
    if any(line.startswith("$ ") for line in block.body.splitlines()):
        raise PageError(
            f"{where}: a bash block holds commands only; a block with `$ ` prompts and "
            "their output is a ```console block"
        )


def _check_modes(kind: str, block: Block, where: str) -> None:
    options = block.options
    one_command = kind == "session" and len(session_commands(block, where)) == 1
    if options.interrupt_after is not None and not one_command:
        raise PageError(f"{where}: `run: interrupt` is for a console block of one command")
    if options.background and not (one_command or kind in ("shell", "script")):
        raise PageError(
            f"{where}: `run: background` is for a console block of one command, a bash or a "
            "python block"
        )


def session_commands(block: Block, where: str = "") -> list[Command]:
    """A console block's ``$ `` commands, each with the output lines shown after it."""
    commands: list[Command] = []
    lines = block.body.splitlines()
    index = 0
    while index < len(lines) and not lines[index].strip():
        index += 1
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ ") and line.rstrip() != "$":
            raise PageError(
                f"{where or block.line}: a console block starts with a `$ ` command "
                f"(found {line!r})"
            )
        number = block.body_line + index
        text = line[2:]
        while text.endswith("\\") and index + 1 < len(lines):
            index += 1
            text += "\n" + lines[index]
        index += 1
        shown: list[str] = []
        while index < len(lines) and not lines[index].startswith("$ "):
            shown.append(lines[index])
            index += 1
        while shown and not shown[-1].strip():
            shown.pop()
        if not text.strip():
            raise PageError(f"{where}: an empty `$ ` command at line {number}")
        commands.append(Command(number, text, shown or None))
    return commands


# -- output matching -----------------------------------------------------------------------


def _clean(text: str) -> list[str]:
    """Output as a terminal would show it, for comparison: no colour codes, a line
    rewritten with ``\\r`` shows its last version, trailing spaces and blank lines go."""
    lines = [
        _ANSI.sub("", line).split("\r")[-1].rstrip()
        for line in text.replace("\r\n", "\n").split("\n")
    ]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _line_pattern(expected: str) -> re.Pattern[str]:
    return re.compile(".*?".join(re.escape(part) for part in expected.split("...")) + r"\Z")


def is_ellipsis(line: str) -> bool:
    """A line of only ``...`` (indentation aside) stands for any number of lines."""
    return line.strip() == "..."


def first_mismatch(expected: Sequence[str], actual: str) -> int | None:
    """The index of the first expected line that cannot be matched, or None on a match
    (``len(expected)`` when every line matched but the output goes on).

    Rules: trailing spaces ignored; a line ``...`` matches any number of lines (zero
    included); ``...`` inside a line matches any text on that line.
    """
    wanted = [line.rstrip() for line in expected]
    while wanted and not wanted[-1]:
        wanted.pop()
    got = _clean(actual)
    reach = {0}
    for index, line in enumerate(wanted):
        if is_ellipsis(line):
            reach = set(range(min(reach), len(got) + 1))
            continue
        pattern = _line_pattern(line)
        reach = {j + 1 for j in reach if j < len(got) and pattern.match(got[j])}
        if not reach:
            return index
    return None if len(got) in reach else len(wanted)


def matches(expected: Sequence[str], actual: str) -> bool:
    return first_mismatch(expected, actual) is None


def explain(expected: Sequence[str], actual: str) -> str:
    """What a failure message shows: the expected lines, what came, and their diff."""
    got = _clean(actual)
    bad = first_mismatch(expected, actual)
    if bad is None:
        return "(the output matches)"
    hint = (
        f"expected line {bad + 1} ({expected[bad]!r}) has no match"
        if bad < len(expected)
        else "the output goes on after the last expected line (end with a `...` line?)"
    )
    diff = difflib.unified_diff(
        [line.rstrip() for line in expected], got, "shown on the page", "printed", lineterm="", n=2
    )
    return f"{hint}\n" + "\n".join(_tail(list(diff)))


def _tail(lines: list[str], limit: int = SHOWN_LINES) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [f"[... {len(lines) - limit} lines before ...]", *lines[-limit:]]


# -- processes -----------------------------------------------------------------------------


@dataclass
class Finished:
    """A process that ended: its exit status as a shell reports it, and its output."""

    status: int
    output: str
    """stdout and stderr together in the order written (only stdout if ``errors`` kept
    them apart)."""
    errors: str = ""
    timed_out: bool = False


class _Reader(threading.Thread):
    """Drains one pipe into a buffer, so the process never blocks on a full pipe."""

    def __init__(self, stream: Any, changed: threading.Condition) -> None:
        super().__init__(daemon=True)
        self.stream = stream
        self.data = bytearray()
        self.changed = changed

    def run(self) -> None:
        fd = self.stream.fileno()
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            with self.changed:
                self.data.extend(chunk)
                self.changed.notify_all()
        self.stream.close()

    def text(self) -> str:
        with self.changed:
            return self.data.decode("utf-8", errors="replace")


def shell_status(returncode: int) -> int:
    """A returncode as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    merge: bool = True,
    interrupt_after: str | None = None,
) -> Finished:
    """Run ``argv`` in a process group of its own and wait for it.

    With ``interrupt_after``, the group gets SIGINT (what Ctrl-C sends) once that text
    appears in the output. On timeout the group is killed. Anything the command left
    running in its group once it ended is stopped, so no pipe stays open.
    """
    changed = threading.Condition()
    proc = subprocess.Popen(
        list(argv),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        start_new_session=True,
    )
    readers = [_Reader(proc.stdout, changed)]
    if not merge:
        readers.append(_Reader(proc.stderr, changed))
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        if interrupt_after is not None:
            _interrupt_when(proc, readers[0], interrupt_after, changed, deadline)
        proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid, signal.SIGKILL)
        proc.wait()
        stop_group(proc.pid)
        for reader in readers:
            reader.join(timeout=STOP_TIMEOUT_S)
    return Finished(
        shell_status(proc.returncode),
        readers[0].text(),
        readers[1].text() if len(readers) > 1 else "",
        timed_out,
    )


def _interrupt_when(
    proc: subprocess.Popen[bytes],
    reader: _Reader,
    text: str,
    changed: threading.Condition,
    deadline: float,
) -> None:
    """Send SIGINT to the process group once ``text`` is in its output, on a line the
    process has finished writing (a reader presses Ctrl-C after seeing it, never in the
    middle of the write)."""
    wanted = text.encode()
    with changed:
        while not _on_a_finished_line(reader.data, wanted):
            if proc.poll() is not None or time.monotonic() > deadline:
                return
            changed.wait(timeout=0.1)
    _kill_group(proc.pid, signal.SIGINT)


def _on_a_finished_line(data: bytearray, wanted: bytes) -> bool:
    at = data.find(wanted)
    return at >= 0 and b"\n" in data[at + len(wanted) :]


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (zombies, whose ports and
    pipes are closed, do not count)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def stop_group(pgid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop every process of group ``pgid``: SIGTERM, then SIGKILL for what is still
    there after ``timeout``; returns once none runs (a server's port is free again)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _kill_group(pgid, sig)
        deadline = time.monotonic() + timeout
        while group_alive(pgid):
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        else:
            return


# -- the session ---------------------------------------------------------------------------

_SHELL_WRAPPER: Final = """\
(exit {status})
. {command}
__page_status=$?
{{ pwd -P > {state}/cwd; env -0 > {state}/env; }} 2>/dev/null
exit $__page_status
"""
"""Runs one command as a step of the page's shell session: ``$?`` is the previous
command's status, and the working directory and exported variables it leaves are saved
for the next command (each command is a process of its own, so a timeout or a Ctrl-C
ends only it)."""

_SHELL_OWN: Final = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})


@dataclass
class Background:
    """A process started by ``run: background``, stopped when the page ends."""

    block: Block
    where: str
    proc: subprocess.Popen[bytes]
    log: Path
    shown: list[str] | None


@dataclass
class Session:
    """One document's run: its directory, environment and background processes.

    ``configure_fake`` applies ``run: fake`` settings (the fake OpenAI server's
    ``configure``); None where no fake server serves the session.
    """

    document: Document
    directory: Path
    env: dict[str, str]
    private: Path
    """The runner's own files (shell state, background logs), outside the page's
    directory so that the page's ``ls`` sees only what the page made."""
    configure_fake: Callable[..., Any] | None = None
    cwd: Path = field(init=False)
    status: int = 0
    background: list[Background] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cwd = self.directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.private.mkdir(parents=True, exist_ok=True)

    def run(self) -> None:
        """Run every step in order; stop background processes at the end."""
        try:
            for step in self.document.steps:
                self._apply_settings(step.block)
                if step.kind not in ("skip", "show"):
                    self._run_step(step)
        finally:
            problems = self._stop_background()
        if problems:
            raise ExampleFailed("\n\n".join(problems))

    def where(self, line: int) -> str:
        return self.document.source.at(line)

    def _apply_settings(self, block: Block) -> None:
        options = block.options
        self.env.update(options.env)
        if options.fake:
            if self.configure_fake is None:
                raise ExampleFailed(f"{self.where(block.line)}: `run: fake` needs a fake server")
            try:
                self.configure_fake(**options.fake)
            except ValueError as error:
                raise ExampleFailed(f"{self.where(block.line)}: {error}") from None

    def _timeout(self, block: Block) -> float:
        return block.options.timeout or DEFAULT_TIMEOUT_S

    def _run_step(self, step: Step) -> None:
        block = step.block
        if step.kind == "write":
            self._write(block)
        elif block.options.background:
            self._start_background(step)
        elif step.kind == "script":
            self._script(block, step.output)
        elif step.kind == "shell":
            self._shell_block(block)
        elif step.kind == "session":
            self._console(block)
        elif step.kind == "doctest":
            self._doctest(block)

    # -- the kinds of block ----------------------------------------------------------------

    def _write(self, block: Block) -> None:
        assert block.title is not None
        path = self.cwd / block.title
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.body, encoding="utf-8")

    def _script_file(self, block: Block, suffix: str = ".py", before: str = "") -> Path:
        """The block saved beside the page's files, hidden (``.page-L12.py``), so that
        ``python FILE`` imports those files as a reader's copy would."""
        path = self.cwd / f".page-L{self.document.source.first_line + block.line - 1}{suffix}"
        path.write_text(before + block.body, encoding="utf-8")
        return path

    def _script(self, block: Block, output: Block | None) -> None:
        script = self._script_file(block)
        done = run_process(
            [sys.executable, script.name],
            cwd=self.cwd,
            env=self.env,
            timeout=self._timeout(block),
            merge=False,
        )
        what = f"python block (run as `python {script.name}`)"
        self._check_status(block.line, what, done, block.options.exit or 0)
        if output is not None:
            shown = output.body.splitlines()
            if not matches(shown, done.output):
                raise ExampleFailed(
                    f"{self.where(output.line)}: the Output shown is not what the python block "
                    f"at line {block.line} printed\n{explain(shown, done.output)}"
                    + _stderr_note(done.errors)
                )

    def _doctest(self, block: Block) -> None:
        # Blank lines first, so that doctest's "line N" is the line in the source file.
        pad = self.document.source.first_line + block.line - 2
        text = self._script_file(block, ".txt", "\n" * pad)
        done = run_process(
            [sys.executable, "-m", "doctest", "-o", "ELLIPSIS", text.name],
            cwd=self.cwd,
            env=self.env,
            timeout=self._timeout(block),
        )
        if done.status != 0 or done.timed_out:
            raise ExampleFailed(
                f"{self.where(block.line)}: a >>> example fails (doctest's line numbers are "
                f"the source file's)\n{_shown_output(done.output)}"
            )

    def _shell_block(self, block: Block) -> None:
        done = self._shell("set -e\n" + block.body, self._timeout(block))
        self._check_status(block.line, "bash block", done, block.options.exit or 0)

    def _console(self, block: Block) -> None:
        deadline = time.monotonic() + self._timeout(block)
        expected_status = block.options.exit
        interrupt = block.options.interrupt_after
        if interrupt is not None and expected_status is None:
            expected_status = 130
        for command in session_commands(block, self.where(block.line)):
            left = deadline - time.monotonic()
            done = self._shell(command.text, max(left, 0.1), interrupt)
            what = f"`$ {command.text}`"
            if interrupt is not None and interrupt not in done.output:
                raise ExampleFailed(
                    f"{self.where(command.line)}: {what} never printed {interrupt!r}, the text "
                    f"to interrupt it after\n{_shown_output(done.output)}"
                )
            self._check_status(command.line, what, done, expected_status or 0)
            if command.shown is not None and not matches(command.shown, done.output):
                raise ExampleFailed(
                    f"{self.where(command.line)}: {what} printed what the page does not show\n"
                    + explain(command.shown, done.output)
                )

    def _check_status(self, line: int, what: str, done: Finished, expected: int) -> None:
        if done.timed_out:
            raise ExampleFailed(
                f"{self.where(line)}: {what} did not finish in time (raise the limit with "
                f"<!-- run: timeout=SECONDS -->)\n{_shown_output(done.output)}"
                + _stderr_note(done.errors)
            )
        if done.status != expected:
            raise ExampleFailed(
                f"{self.where(line)}: {what} exited with {done.status}, expected {expected}\n"
                f"{_shown_output(done.output)}" + _stderr_note(done.errors)
            )

    # -- the shell session -----------------------------------------------------------------

    def _shell(self, text: str, timeout: float, interrupt_after: str | None = None) -> Finished:
        """Run ``text`` as the page's next shell command, carrying ``cd`` and ``export``
        over to the commands after it (a reader's terminal is one shell)."""
        state = self.private / "shell"
        state.mkdir(exist_ok=True)
        command = state / "command.sh"
        command.write_text(text + "\n", encoding="utf-8")
        for name in ("cwd", "env"):
            (state / name).unlink(missing_ok=True)
        wrapper = _SHELL_WRAPPER.format(
            status=self.status, command=shlex.quote(str(command)), state=shlex.quote(str(state))
        )
        done = run_process(
            ["bash", "-c", wrapper],
            cwd=self.cwd,
            env=self.env,
            timeout=timeout,
            interrupt_after=interrupt_after,
        )
        self.status = done.status
        self._adopt_shell_state(state)
        return done

    def _adopt_shell_state(self, state: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            cwd = Path((state / "cwd").read_text(encoding="utf-8").strip())
            if cwd.is_dir():
                self.cwd = cwd
        with contextlib.suppress(FileNotFoundError):
            pairs = (state / "env").read_bytes().decode("utf-8", "replace").split("\0")
            now = dict(p.split("=", 1) for p in pairs if "=" in p)
            for name in set(self.env) - set(now) - _SHELL_OWN:
                del self.env[name]
            for name, value in now.items():
                if name not in _SHELL_OWN:
                    self.env[name] = value

    # -- background processes --------------------------------------------------------------

    def _start_background(self, step: Step) -> None:
        block = step.block
        where = self.where(block.line)
        shown: list[str] | None = None
        if step.kind == "session":
            (command,) = session_commands(block, where)
            text, shown = command.text, command.shown
        elif step.kind == "script":
            text = f"exec {shlex.quote(sys.executable)} {self._script_file(block).name}"
        else:
            text = block.body
        started = self.private / f"background-L{block.line}.sh"
        started.write_text(text + "\n", encoding="utf-8")
        log = self.private / f"background-L{block.line}.log"
        with open(log, "wb") as sink:
            proc = subprocess.Popen(
                ["bash", started],
                cwd=self.cwd,
                env=dict(self.env),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append(Background(block, where, proc, log, shown))
        self._wait_ready(self.background[-1], self._timeout(block))

    def _wait_ready(self, job: Background, timeout: float) -> None:
        """Wait until the ready URL answers 200 or the ready line is printed.

        The process itself says when it is ready, so this polls that state (each try a
        short wait); the timeout only turns a process that never gets there into a
        failure.
        """
        options = job.block.options
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            if options.ready_line is not None:
                if options.ready_line in job.log.read_text(encoding="utf-8", errors="replace"):
                    return
            elif options.ready_url is not None and _answers_200(opener, options.ready_url):
                return
            if job.proc.poll() is not None:
                raise ExampleFailed(
                    f"{job.where}: the background command ended (status "
                    f"{shell_status(job.proc.returncode)}) before it was ready\n"
                    + _shown_output(job.log.read_text(encoding="utf-8", errors="replace"))
                )
            if time.monotonic() > deadline:
                wanted = options.ready_line or options.ready_url
                raise ExampleFailed(
                    f"{job.where}: the background command was not ready ({wanted!r}) within "
                    f"{timeout:g} s\n"
                    + _shown_output(job.log.read_text(encoding="utf-8", errors="replace"))
                )
            time.sleep(0.05)

    def _stop_background(self) -> list[str]:
        """Stop every background process (SIGTERM to its group, then SIGKILL) and
        compare what each printed with the lines its block shows (their start)."""
        problems: list[str] = []
        for job in reversed(self.background):
            stop_group(job.proc.pid)
            job.proc.wait()
            printed = job.log.read_text(encoding="utf-8", errors="replace")
            if job.shown is not None and not matches([*job.shown, "..."], printed):
                problems.append(
                    f"{job.where}: the background command printed what the page does not show "
                    f"(its first lines)\n{explain([*job.shown, '...'], printed)}"
                )
        self.background.clear()
        return problems


def _answers_200(opener: urllib.request.OpenerDirector, url: str) -> bool:
    try:
        with opener.open(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _shown_output(text: str) -> str:
    lines = _clean(text)
    if not lines:
        return "(it printed nothing)"
    return "it printed:\n" + "\n".join("    " + line for line in _tail(lines))


def _stderr_note(errors: str) -> str:
    lines = _clean(errors)
    if not lines:
        return ""
    return "\nstderr:\n" + "\n".join("    " + line for line in _tail(lines))


# -- the environment -----------------------------------------------------------------------

_DROPPED_PREFIXES: Final = ("OPENAI_", "ANTHROPIC_", "OTEL_", "PLAIT_")


def session_environment(
    base: Mapping[str, str], extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a page runs in: the caller's, without settings that would change
    what a page does (a developer's own keys, endpoints, proxies, OTel exporters,
    plait's own variables), with the venv's ``bin`` first on ``PATH`` and ``extra``
    (the fake servers' URLs and keys) on top."""
    env = {
        name: value
        for name, value in base.items()
        if not name.startswith(_DROPPED_PREFIXES)
        and not name.lower().endswith("_proxy")
        and name not in ("BASH_ENV", "ENV", "PYTHONSTARTUP", "COLUMNS", "LINES")
    }
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [venv_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)]
    )
    env["COLUMNS"] = "80"
    # A terminal shows a Python program's stdout line by line, in order with its stderr;
    # through a pipe stdout would come in blocks (at exit), after the stderr lines.
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


# -- docstrings ----------------------------------------------------------------------------

_API_DIRECTIVE = re.compile(r"^\s*:::\s+(?P<module>[\w.]+)\s*$")


def api_modules(api_pages: Path) -> list[str]:
    """The modules the API reference renders (each ``::: module`` line of its pages)."""
    found: list[str] = []
    for page in sorted(api_pages.glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            match = _API_DIRECTIVE.match(line)
            if match and match["module"] not in found:
                found.append(match["module"])
    return found


def public_names(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        raise PageError(f"{module.__name__} has no __all__: its public names are not declared")
    return list(names)


def _exports(module: ModuleType, obj: object) -> bool:
    return any(getattr(module, name, None) is obj for name in public_names(module))


def owner(
    obj: object, module: ModuleType, documented: Sequence[str], load: Callable[[str], ModuleType]
) -> str:
    """The documented module whose test runs ``obj``'s examples, so a name re-exported
    by several modules runs once: the documented module nearest to where ``obj`` is
    defined that exports it, else ``module``."""
    defined = getattr(obj, "__module__", None) or module.__name__
    parts = defined.split(".")
    for size in range(len(parts), 0, -1):
        candidate = ".".join(parts[:size])
        if candidate in documented and _exports(load(candidate), obj):
            return candidate
    return module.__name__


@dataclass(frozen=True)
class Documented:
    """A public object whose docstring mkdocstrings renders."""

    qualname: str
    obj: Any
    doc: str


def rendered_docstrings(
    module: ModuleType, documented: Sequence[str], load: Callable[[str], ModuleType]
) -> Iterator[Documented]:
    """Each docstring the API reference shows for ``module``: its public names (those in
    ``__all__``) it owns, and the public methods and properties of its public classes
    (``__init__`` too, merged into the class's page)."""
    for name in public_names(module):
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if owner(obj, module, documented, load) != module.__name__:
            continue
        qualname = f"{module.__name__}.{name}"
        if obj.__doc__:
            yield Documented(qualname, obj, obj.__doc__)
        if inspect.isclass(obj):
            yield from _members(obj, qualname)


def _members(cls: type, qualname: str) -> Iterator[Documented]:
    for name, member in vars(cls).items():
        if name.startswith("_") and name != "__init__":
            continue
        target = member
        if isinstance(member, (staticmethod, classmethod)):
            target = member.__func__
        elif isinstance(member, property):
            target = member.fget
        if target is None or not (inspect.isfunction(target) or inspect.ismethod(target)):
            continue
        doc = target.__doc__
        if doc:
            yield Documented(f"{qualname}.{name}", target, doc)


def docstring_source(item: Documented, root: Path) -> Source:
    """Where ``item``'s docstring starts in its file, for messages."""
    target = inspect.unwrap(item.obj)
    try:
        path = Path(inspect.getsourcefile(target) or "?")
        lines, start = inspect.getsourcelines(target)
    except (OSError, TypeError):
        return Source(item.qualname, 1, "docstring")
    offset = next((i for i, line in enumerate(lines) if '"""' in line or "'''" in line), 0)
    raw = item.doc.expandtabs().split("\n")
    leading = 0
    while leading < len(raw) and not raw[leading].strip():
        leading += 1
    with contextlib.suppress(ValueError):
        path = path.relative_to(root)
    return Source(str(path), start + offset + leading, f"docstring of {item.qualname}")


def docstring_document(item: Documented, root: Path) -> Document:
    """``item``'s docstring parsed like a page, its ``>>>`` lines as doctest blocks."""
    return parse(inspect.cleandoc(item.doc), docstring_source(item, root), doctests=True)


def has_examples(document: Document) -> bool:
    return any(step.kind not in ("show",) for step in document.steps)


# -- pages ---------------------------------------------------------------------------------

PORT_RANGE: Final = range(18000, 19000)
"""Where a page's background servers listen (each page its own ports)."""

_PORT_IN_COMMAND = re.compile(
    r"(?:--port[= ]+|(?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\]):)(?P<port>\d+)"
)


def load_page(path: Path, root: Path) -> Document:
    """A page of the site, parsed (raises PageError where it breaks the rules)."""
    return parse(path.read_text(encoding="utf-8"), Source(path.relative_to(root).as_posix()))


def background_ports(document: Document) -> dict[int, str]:
    """The ports a document's background commands use (its ready URLs' and those its
    commands name), each with the place that uses it."""
    ports: dict[int, str] = {}
    for step in document.steps:
        options = step.block.options
        if not options.background or step.kind == "skip":
            continue
        where = document.source.at(step.block.line)
        if options.ready_url:
            port = urllib.parse.urlsplit(options.ready_url).port
            if port is not None:
                ports[port] = where
        for match in _PORT_IN_COMMAND.finditer(step.block.body):
            ports[int(match["port"])] = where
    return ports


def port_problems(documents: Sequence[Document]) -> list[str]:
    """Ports outside the pages' range, ready URLs off loopback, and ports two pages use."""
    problems: list[str] = []
    users: dict[int, list[str]] = {}
    for document in documents:
        for step in document.steps:
            url = step.block.options.ready_url
            host = urllib.parse.urlsplit(url).hostname if url else None
            if host is not None and host not in ("127.0.0.1", "localhost", "::1"):
                where = document.source.at(step.block.line)
                problems.append(f"{where}: the ready URL {url} is not on this machine")
        for port, where in background_ports(document).items():
            users.setdefault(port, []).append(where)
            if port not in PORT_RANGE:
                problems.append(
                    f"{where}: port {port} is outside {PORT_RANGE.start}-{PORT_RANGE.stop - 1}, "
                    "the range kept for the pages' background servers"
                )
    for port, places in sorted(users.items()):
        pages = {place.split(":", 1)[0] for place in places}
        if len(pages) > 1:
            problems.append(f"port {port} is used by more than one page: {', '.join(places)}")
    return problems
