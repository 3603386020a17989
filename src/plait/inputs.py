"""Reading a run's inputs: JSONL, CSV or plain text, from a file, a directory or stdin.

Inputs are produced by a generator, so a file of millions of lines streams: the
runtime pulls the next input only when a slot of its window frees up.  It pulls
on plait's event loop, so a producer piping into stdin more slowly than the run
consumes holds up the replies in flight while it is waited for: from a slow
producer, write a file first.

How a record becomes the arguments of ``forward`` (`map_record`, the one rule of
``plait run``, ``plait eval`` and ``plait train``):

* ``--field NAME`` (``--input-field NAME``): the record must be an object (a JSON
  object or a CSV row); its field ``NAME`` is the one argument.
* an object whose fields include every required parameter of ``forward``: the
  fields named like parameters are passed by name (every field, when ``forward``
  takes ``**kwargs``); the others are not passed, and are named once on stderr.
  So ``{"text": ..., "label": ...}`` gives ``forward(self, text)`` the text alone,
  never the label inside its prompt.
* otherwise, an object passed whole to a ``forward`` whose one parameter is
  annotated as a mapping (``dict``, ``Mapping``) or named ``record``, ``row``,
  ``example``, ``item`` or ``data``;
* any other object fits no parameter: refused, naming its fields and ``--field``
  (before the run when it is the first record, else as that input's error).
* anything else (a JSON string, number or list; a line of text; a document): the
  one argument.

The output echoes the record as read, whatever part of it ``forward`` received.
A record that cannot be used (bad JSON, a missing field) becomes that input's
error instead of stopping the run, like any other failure.  A CSV file whose
quoting is broken (a quoted field never closed swallows the rows after it) is
refused before anything runs, naming the line where that field starts.
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
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from plait._signature import shape_of

__all__ = [
    "FORMATS",
    "CallShape",
    "InputError",
    "InputSource",
    "Item",
    "Mapped",
    "Record",
    "count_inputs",
    "first_item",
    "map_record",
    "open_inputs",
    "read_records",
]

FORMATS = ("auto", "jsonl", "csv", "text", "document")

#: Characters ``errors="surrogateescape"`` makes of bytes that are not UTF-8.
_UNDECODABLE = re.compile("[\udc80-\udcff]")
#: The longest CSV cell read (the csv module's own default is 128 KiB).
_CSV_CELL_LIMIT = 64 * 1024 * 1024
#: Names of a lone ``forward`` parameter that takes a whole record.
WHOLE_RECORD_NAMES = frozenset({"record", "row", "example", "item", "data"})

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
    #: The problem is that the record fits no parameter of ``forward`` (refused
    #: before the run when the first record has it).
    unfit: bool = False


@dataclass(slots=True)
class Record:
    """One record as read: where it is, its value, and what the output echoes."""

    where: str
    value: Any
    problem: str | None = None
    raw: Any = None

    def __post_init__(self) -> None:
        if self.raw is None:
            self.raw = self.value


def _mapping_annotation(annotation: Any) -> bool:
    """Whether a parameter's annotation says it takes a mapping (a whole record)."""
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        head = annotation.replace("typing.", "").replace("collections.abc.", "")
        return head.split("[", 1)[0].strip() in {"dict", "Dict", "Mapping", "MutableMapping"}
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, Mapping)


@dataclass(frozen=True, slots=True)
class CallShape:
    """The parameters of ``forward``: which fields of a record it takes by name."""

    names: tuple[str, ...]
    required: frozenset[str]
    any_keywords: bool
    #: The lone parameter that takes a whole record (see `map_record`), if any.
    whole: str | None = None

    @classmethod
    def of(cls, forward: Callable[..., Any]) -> CallShape:
        shape = shape_of(forward)
        whole = None
        if len(shape.names) == 1 and not shape.var_keyword:
            (name,) = shape.names
            annotation = shape.signature.parameters[name].annotation
            if _mapping_annotation(annotation) or name in WHOLE_RECORD_NAMES:
                whole = name
        return cls(shape.names, shape.required, shape.var_keyword, whole)

    def signature(self) -> str:
        shown = [name if name in self.required else f"{name}=..." for name in self.names]
        if self.any_keywords:
            shown.append("**kwargs")
        return f"forward({', '.join(shown)})"


@dataclass(slots=True)
class Mapped:
    """What `map_record` made of a record: arguments, or the problem."""

    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Fields of the record ``forward`` does not receive (passed by name only).
    unused: tuple[str, ...] = ()
    problem: str | None = None
    unfit: bool = False


def map_record(
    record: Any,
    shape: CallShape | None,
    field_name: str | None,
    where: str,
    *,
    field_flag: str = "--field",
    skip: frozenset[str] = frozenset(),
    fallback_field: str | None = None,
) -> Mapped:
    """The arguments of ``forward`` for one record, by the rule the module docstring
    states; the one mapping of ``plait run``, ``eval`` and ``train``.

    ``skip`` holds fields that are not inputs (the target of an example);
    ``fallback_field`` is passed when no parameter is named by a field (``input``,
    the field ``plait train`` and ``plait eval`` read by default).
    """
    if field_name is not None:
        if not isinstance(record, dict):
            return Mapped(
                problem=f"{where} is not an object, so {field_flag} {field_name} does not "
                "apply to it"
            )
        if field_name not in record:
            fields = ", ".join(map(str, record)) or "none"
            return Mapped(problem=f"{where} has no field {field_name!r} (its fields: {fields})")
        return Mapped((record[field_name],))
    if not isinstance(record, dict) or (shape is None and fallback_field is None):
        return Mapped((record,))
    keys = [key for key in record if key not in skip]
    if shape is not None and all(isinstance(key, str) for key in keys):
        passed = keys if shape.any_keywords else [key for key in keys if key in shape.names]
        if passed and shape.required <= set(passed):
            unused = tuple(key for key in keys if key not in passed)
            return Mapped((), {key: record[key] for key in passed}, unused)
    if fallback_field is not None and fallback_field in record:
        return Mapped((record[fallback_field],))
    if shape is not None and shape.whole is not None:
        return Mapped(({key: record[key] for key in keys},))
    fields = ", ".join(map(str, keys)) or "none"
    if shape is None:
        return Mapped(
            problem=f"{where} has no {fallback_field!r} field (it has: {fields}); name the "
            f"input field ({field_flag} NAME)",
            unfit=True,
        )
    return Mapped(
        problem=f"{where} has the field(s) {fields}, which do not fit {shape.signature()}: "
        f"name the fields after its parameters, or give {field_flag} NAME to pass one field",
        unfit=True,
    )


class InputSource:
    """An opened input (the file is opened now, so a bad path fails before any work).

    A directory is a set of documents: each regular file in it (sorted by name,
    hidden ones skipped) is one input, its whole text; ``--format document`` makes
    a whole file (or stdin) one input.
    """

    def __init__(
        self,
        location: str,
        fmt: str = "auto",
        field_name: str | None = None,
        shape: CallShape | None = None,
        stdin: IO[str] | None = None,
        on_unused: Callable[[str], None] | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise InputError(f"unknown input format {fmt!r}; choose one of {', '.join(FORMATS)}")
        self.location = location
        self.field_name = field_name
        self.shape = shape
        self.on_unused = on_unused
        #: Where a note about the file goes (a CSV field spanning lines): the command's
        #: stderr voice when it gave one, else stderr.
        self.note: Callable[[str], None] = on_unused or _note_on_stderr
        self.path: Path | None = None
        self.files: list[Path] | None = None
        self._stream: IO[str] = io.StringIO()
        self._owned = False
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
            self._stream = stdin
        else:
            self.path = Path(location)
            self.name = location
            if self.path.is_dir():
                if fmt not in ("auto", "document"):
                    raise InputError(
                        f"input {location} is a directory: each file in it is one document "
                        f"(--format document), not {fmt}; give a file for --format {fmt}"
                    )
                try:
                    # Hidden files (.DS_Store, .gitignore, an editor's swap file) are
                    # not documents someone meant to run: skipped.
                    self.files = sorted(
                        p for p in self.path.iterdir() if p.is_file() and not p.name.startswith(".")
                    )
                except OSError as exc:
                    raise InputError(
                        f"cannot read input directory {location}: {exc.strerror}"
                    ) from None
                fmt = "document"
            else:
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
        if fmt == "csv" and self.path is not None and self.path.is_file():
            self._check_csv(self.path)

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

    def records(self) -> Iterator[Record]:
        """The records as read, before they meet ``forward``."""
        if self.files is not None:
            return self._directory(self.files)
        if self.format == "document":
            return self._document()
        if self.format == "csv":
            return self._csv(self.lines)
        if self.format == "jsonl":
            return self._jsonl()
        return self._text()

    def items(self) -> Iterator[Item]:
        for record in self.records():
            if record.problem is not None:
                yield Item(record.raw, problem=record.problem)
            else:
                yield self._arguments(record)

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

    def _text(self) -> Iterator[Record]:
        for number, line in enumerate(self.lines, start=1):
            text = line.rstrip("\r\n")
            if text.strip():
                where = f"{self.name} line {number}"
                yield self._checked(text.lstrip("\ufeff"), where)

    def _checked(self, text: str, where: str, raw: Any = None) -> Record:
        """A text record, or its problem when it held bytes that are not UTF-8."""
        problem = self._not_utf8(text, where)
        if problem is not None:
            shown = text.encode("utf-8", "surrogateescape").decode("latin-1")
            return Record(where, shown, problem, raw)
        return Record(where, text, raw=raw)

    def _document(self) -> Iterator[Record]:
        text = "".join(self.lines).lstrip("\ufeff")
        if text.strip():
            yield self._checked(text, self.name)

    def _directory(self, files: list[Path]) -> Iterator[Record]:
        for path in files:
            try:
                text = path.read_text(encoding="utf-8-sig", errors="surrogateescape")
            except OSError as exc:
                yield Record(str(path), str(path), f"cannot read {path}: {exc.strerror}")
                continue
            # The output echoes the file's path: the text is in the file already.
            yield self._checked(text, str(path), raw=str(path))

    def _jsonl(self) -> Iterator[Record]:
        for number, line in enumerate(self.lines, start=1):
            text = line.strip().lstrip("\ufeff")
            if not text:
                continue
            where = f"{self.name} line {number}"
            checked = self._checked(text, where)
            if checked.problem is not None:
                yield checked
                continue
            try:
                record = json.loads(text)
            except ValueError as exc:
                yield Record(where, text, f"{where} is not valid JSON ({exc})")
                continue
            yield Record(where, record)

    def _check_csv(self, path: Path) -> None:
        """Read the whole file once before the run: broken quoting is refused now,
        before any input is paid for, rather than after the rows before it ran."""
        rows = 0
        spans: list[tuple[int, int]] = []
        try:
            with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
                for _ in self._csv(fh, spans):
                    rows += 1
        except OSError as exc:
            raise InputError(f"cannot read input file {path}: {exc.strerror}") from None
        if spans:
            # Valid CSV, but a quote opened by mistake and closed rows later reads
            # the same way: say how the file was read, so the count can be checked.
            shown = ", ".join(f"{start}-{end}" for start, end in spans[:3])
            more = f" (and {len(spans) - 3} more)" if len(spans) > 3 else ""
            self.note(
                f"{self.name}: read as {rows} row(s); a quoted field spans lines {shown}{more}, "
                "so each of those is one row. If a quote was not meant to hold line breaks, "
                "fix the quoting"
            )

    def _csv(
        self, lines: Iterable[str], spans: list[tuple[int, int]] | None = None
    ) -> Iterator[Record]:
        """The rows; ``spans`` (if given) gets the lines of each row whose quoted
        field holds line breaks."""
        # Cells as long as documents are data too (the csv module stops at 128 KiB).
        csv.field_size_limit(max(csv.field_size_limit(), _CSV_CELL_LIMIT))
        taken: list[str] = []  # the lines of the row being read

        def tracked() -> Iterator[str]:
            for line in lines:
                taken.append(line)
                yield line

        # strict: a quote closed in the middle of a field is an error, not a merge.
        reader = csv.DictReader(tracked(), delimiter=self.delimiter, strict=True)
        rows = iter(reader)
        consumed = 0
        while True:
            consumed += len(taken)
            taken.clear()
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                raise InputError(self._csv_problem(exc, consumed, taken)) from None
            where = f"{self.name} line {reader.line_num}"
            breaks = sum(v.count("\n") for v in row.values() if isinstance(v, str))
            if breaks and spans is not None:
                spans.append((reader.line_num - breaks, reader.line_num))
            problem = self._not_utf8(json.dumps(row, ensure_ascii=False), where)
            if problem is not None:
                yield Record(where, {k: v for k, v in row.items() if k is not None}, problem)
                continue
            if None in row:
                extra = row.pop(None)
                yield Record(where, row, f"{where} has more values than the header ({extra!r})")
                continue
            if any(value is None for value in row.values()):
                yield Record(where, row, f"{where} has fewer values than the header")
                continue
            yield Record(where, dict(row))

    def _csv_problem(self, exc: csv.Error, before: int, lines: list[str]) -> str:
        """Name the line where the quoted field that broke the row starts."""
        opened: int | None = None
        inside = False
        for number, line in enumerate(lines, start=before + 1):
            if line.count('"') % 2:
                inside = not inside
                if inside:
                    opened = number
        if inside and opened is not None:
            return (
                f"{self.name} line {opened}: a quoted field starts here and its closing quote "
                f"is missing or misplaced ({exc}), so the rows after it would be read as part "
                'of it; fix the quoting (a quote inside a quoted field is written twice, "")'
                ", or convert the file to JSONL"
            )
        first = next(
            (n for n, line in enumerate(lines, start=before + 1) if line.strip()), before + 1
        )
        return (
            f"{self.name} line {first} cannot be read as CSV ({exc}); fix that row, or "
            "convert the file to JSONL"
        )

    def _arguments(self, record: Record) -> Item:
        mapped = map_record(record.value, self.shape, self.field_name, record.where or self.name)
        if mapped.problem is not None:
            return Item(record.raw, problem=mapped.problem, unfit=mapped.unfit)
        if mapped.unused and self.on_unused is not None:
            report, self.on_unused = self.on_unused, None  # once for the run, not per row
            report(
                f"{self.shape.signature() if self.shape else 'forward'} takes "
                f"{', '.join(mapped.kwargs)} by name; the field(s) {', '.join(mapped.unused)} "
                "are not passed to it (--field NAME passes one field)"
            )
        return Item(record.raw, mapped.args, mapped.kwargs)


def _note_on_stderr(message: str) -> None:
    print(f"plait: {message}", file=sys.stderr, flush=True)


def read_records(location: str) -> list[Record]:
    """Every record of a data file, read as ``plait run`` reads its inputs (format by
    suffix or sniffed, a UTF-8 BOM dropped, CSV quoting checked): the one reader."""
    source = InputSource(location)
    try:
        return list(source.records())
    finally:
        source.close()


def open_inputs(
    location: str,
    fmt: str = "auto",
    field_name: str | None = None,
    forward: Callable[..., Any] | None = None,
    on_unused: Callable[[str], None] | None = None,
) -> InputSource:
    shape = CallShape.of(forward) if forward is not None else None
    return InputSource(location, fmt, field_name, shape, on_unused=on_unused)


def first_item(source: InputSource) -> Item | None:
    for item in source.items():
        return item
    return None


def count_inputs(source: InputSource, done: Callable[[int], None]) -> None:
    """Count the records of a file on a thread of its own; ``done`` gets the count.

    Only a regular file can be counted ahead (stdin is read once); the count makes
    the progress display's total and ETA possible without holding up the run.
    """
    if source.files is not None:
        done(len(source.files))
        return
    path = source.path
    if path is None or not path.is_file():
        return
    if source.format == "document":
        done(1)
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
