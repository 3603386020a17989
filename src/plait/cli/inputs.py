"""Reading a run's inputs: JSONL, CSV or plain text, from a file or stdin, one at a time.

Inputs are produced by a generator, so a file of millions of lines streams: the
runtime pulls the next input only when a slot of its window frees up.  It pulls
on plait's event loop, so a producer piping into stdin more slowly than the run
consumes holds up the replies in flight while it is waited for: from a slow
producer, write a file first.

How a record becomes the arguments of ``forward``:

* ``--field NAME``: the record must be an object (a JSON object or a CSV row);
  its field ``NAME`` is the one argument.
* a JSON object or CSV row otherwise: passed as keyword arguments when its keys
  fit ``forward``'s parameters (every key names a parameter, or ``forward`` takes
  ``**kwargs``, and every required parameter is present); else the whole object
  is the one argument.
* anything else (a JSON string, number or list; a line of text): the one argument.

The output echoes the record as read, whatever part of it ``forward`` received.
A record that cannot be used (bad JSON, a missing field) becomes that input's
error instead of stopping the run, like any other failure.
"""

from __future__ import annotations

import contextlib
import csv
import inspect
import io
import itertools
import json
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "FORMATS",
    "CallShape",
    "InputError",
    "InputSource",
    "Item",
    "count_inputs",
    "first_item",
    "open_inputs",
]

FORMATS = ("auto", "jsonl", "csv", "text")

#: Characters ``errors="surrogateescape"`` makes of bytes that are not UTF-8.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
#: The longest CSV cell read (the csv module's own default is 128 KiB).
_CSV_CELL_LIMIT = 64 * 1024 * 1024

_BY_SUFFIX = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "csv",
    ".txt": "text",
}


class InputError(ValueError):
    """One input record that cannot be turned into arguments; the message says why."""


@dataclass(slots=True)
class Item:
    """One input: what the output echoes, and what ``forward`` is called with."""

    raw: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class CallShape:
    """Which keyword arguments ``forward`` takes, to decide when an object is spread."""

    names: frozenset[str]
    required: frozenset[str]
    any_keywords: bool

    @classmethod
    def of(cls, forward: Callable[..., Any]) -> CallShape:
        names: set[str] = set()
        required: set[str] = set()
        any_keywords = False
        for param in inspect.signature(forward).parameters.values():
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                any_keywords = True
            elif param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):
                continue
            else:
                names.add(param.name)
                if param.default is inspect.Parameter.empty:
                    required.add(param.name)
        return cls(frozenset(names), frozenset(required), any_keywords)

    def fits(self, record: dict[Any, Any]) -> bool:
        if not record or not all(isinstance(key, str) for key in record):
            return False
        keys = set(record)
        if not self.required <= keys:
            return False
        return self.any_keywords or keys <= self.names


class InputSource:
    """An opened input (the file is opened now, so a bad path fails before any work)."""

    def __init__(
        self,
        location: str,
        fmt: str = "auto",
        field_name: str | None = None,
        shape: CallShape | None = None,
        stdin: IO[str] | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise InputError(f"unknown input format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.location = location
        self.field_name = field_name
        self.shape = shape
        self.path: Path | None = None
        if location == "-":
            self.name = "stdin"
            if stdin is None:
                stdin = sys.stdin
                if stdin is None or getattr(stdin, "closed", False):
                    raise InputError(
                        "stdin is closed, so there are no inputs to read: give --input FILE, "
                        "or pipe the inputs in (--input -)"
                    )
                # Inputs are data, not terminal text: UTF-8 whatever the locale says, and
                # bytes that are not UTF-8 become that record's error, not a crash.
                if isinstance(stdin, io.TextIOWrapper):
                    with contextlib.suppress(ValueError, OSError):
                        stdin.reconfigure(encoding="utf-8", errors="surrogateescape")
            self._stream: IO[str] = stdin
            self._owned = False
        else:
            self.path = Path(location)
            self.name = location
            if self.path.is_dir():
                raise InputError(f"input {location} is a directory; give a file (or - for stdin)")
            try:
                self._stream = open(  # noqa: SIM115 (closed in close())
                    self.path, encoding="utf-8-sig", errors="surrogateescape", newline=""
                )
            except OSError as exc:
                raise InputError(f"cannot read input file {location}: {exc.strerror}") from None
            self._owned = True
            if fmt == "auto":
                fmt = _BY_SUFFIX.get(self.path.suffix.lower(), "auto")
        self.delimiter = "\t" if self.path is not None and self.path.suffix == ".tsv" else ","
        self.lines: Iterator[str] = iter(self._stream)
        if fmt == "auto":
            fmt = self._sniff()
        self.format = fmt

    def _sniff(self) -> str:
        """JSONL when the first non-blank line is a JSON object, array or string; else text.

        CSV is never guessed (a line of text often has commas): say ``--format csv``.
        """
        peeked: list[str] = []
        guess = "text"
        for line in self.lines:
            peeked.append(line)
            text = line.strip().lstrip("\ufeff")
            if not text:
                continue
            if text[0] in '{["':
                try:
                    json.loads(text)
                    guess = "jsonl"
                except ValueError:
                    pass
            break
        self.lines = itertools.chain(peeked, self.lines)
        return guess

    def close(self) -> None:
        if self._owned:
            self._stream.close()

    def items(self) -> Iterator[Item]:
        if self.format == "csv":
            return self._csv()
        if self.format == "jsonl":
            return self._jsonl()
        return self._text()

    # -- the formats -----------------------------------------------------------------------
    def _not_utf8(self, text: str, where: str) -> str | None:
        """A problem naming the place, when ``text`` held bytes that are not UTF-8."""
        bad = _UNDECODABLE.search(text)
        if bad is None:
            return None
        byte = ord(bad.group()) - 0xDC00
        return (
            f"{where} is not UTF-8 (byte 0x{byte:02x} at character {bad.start() + 1}); "
            f"re-encode {self.name} as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
        )

    def _text(self) -> Iterator[Item]:
        for number, line in enumerate(self.lines, start=1):
            text = line.rstrip("\r\n")
            if text.strip():
                problem = self._not_utf8(text, f"{self.name} line {number}")
                if problem is not None:
                    yield Item(
                        text.encode("utf-8", "surrogateescape").decode("latin-1"), problem=problem
                    )
                    continue
                yield self._arguments(text.lstrip("\ufeff"), "")

    def _jsonl(self) -> Iterator[Item]:
        for number, line in enumerate(self.lines, start=1):
            text = line.strip().lstrip("\ufeff")
            if not text:
                continue
            problem = self._not_utf8(text, f"{self.name} line {number}")
            if problem is not None:
                yield Item(
                    text.encode("utf-8", "surrogateescape").decode("latin-1"), problem=problem
                )
                continue
            try:
                record = json.loads(text)
            except ValueError as exc:
                yield Item(text, problem=f"{self.name} line {number} is not valid JSON ({exc})")
                continue
            yield self._arguments(record, f"{self.name} line {number}")

    def _csv(self) -> Iterator[Item]:
        # Cells as long as documents are data too (the csv module stops at 128 KiB).
        csv.field_size_limit(max(csv.field_size_limit(), _CSV_CELL_LIMIT))
        reader = csv.DictReader(self.lines, delimiter=self.delimiter)
        rows = iter(reader)
        while True:
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                raise InputError(
                    f"{self.name} line {reader.line_num} cannot be read as CSV ({exc}); fix "
                    "that row, or convert the file to JSONL"
                ) from None
            where = f"{self.name} line {reader.line_num}"
            problem = self._not_utf8(json.dumps(row, ensure_ascii=False), where)
            if problem is not None:
                yield Item({k: v for k, v in row.items() if k is not None}, problem=problem)
                continue
            if None in row:
                extra = row.pop(None)
                yield Item(row, problem=f"{where} has more values than the header ({extra!r})")
                continue
            if any(value is None for value in row.values()):
                yield Item(row, problem=f"{where} has fewer values than the header")
                continue
            yield self._arguments(dict(row), where)

    def _arguments(self, record: Any, where: str) -> Item:
        if self.field_name is not None:
            if not isinstance(record, dict):
                return Item(
                    record,
                    problem=f"{where or self.name} is not an object, so --field "
                    f"{self.field_name} does not apply to it",
                )
            if self.field_name not in record:
                fields = ", ".join(map(str, record)) or "none"
                return Item(
                    record,
                    problem=f"{where} has no field {self.field_name!r} (its fields: {fields})",
                )
            return Item(record, (record[self.field_name],))
        if isinstance(record, dict) and self.shape is not None and self.shape.fits(record):
            return Item(record, (), dict(record))
        return Item(record, (record,))


def open_inputs(
    location: str,
    fmt: str = "auto",
    field_name: str | None = None,
    forward: Callable[..., Any] | None = None,
) -> InputSource:
    shape = CallShape.of(forward) if forward is not None else None
    return InputSource(location, fmt, field_name, shape)


def first_item(source: InputSource) -> Item | None:
    for item in source.items():
        return item
    return None


def count_inputs(source: InputSource, done: Callable[[int], None]) -> None:
    """Count the records of a file on a thread of its own; ``done`` gets the count.

    Only a regular file can be counted ahead (stdin is read once); the count makes
    the progress display's total and ETA possible without holding up the run.
    """
    path = source.path
    if path is None or not path.is_file():
        return

    def work() -> None:
        try:
            if source.format == "csv":  # quoted fields may span lines: let csv find the rows
                with open(path, encoding="utf-8-sig", newline="") as fh:
                    rows: Iterable[Any] = csv.reader(fh, delimiter=source.delimiter)
                    count = max(0, sum(1 for row in rows if row) - 1)
            else:
                with open(path, "rb") as raw:
                    count = sum(1 for line in raw if line.strip())
        except (OSError, UnicodeDecodeError, csv.Error):
            return
        done(count)

    threading.Thread(target=work, name="plait-count-inputs", daemon=True).start()
