"""Writing a run's results: one JSON line per input, flushed as each one completes.

A line is ``{"index": i, "input": ..., "output": ...}`` or, for a failed input,
``{"index": i, "input": ..., "error": {"type": ..., "message": ..., "module_path": ...}}``.

JSON object keys are text, so a dict with other keys is written with them as text
(``{1: "a"}`` as ``{"1": "a"}``).  When that would make two keys one (``{1: "a",
"1": "b"}``), the dict is written as the list of its pairs under ``"$dict"``,
``{"$dict": [[1, "a"], ["1", "b"]]}``, the form plait's checkpoints use, so
neither value is lost.

An output that cannot be written at all (a pydantic model holding a function, an
object whose ``str()`` raises) becomes that input's error row, of type
``UnwritableOutput``: every input still ends as exactly one row, and the run goes on.
So does an output that is code rather than data (a function, lambda, method,
class, Python module, plait Module, generator or coroutine, anywhere in the output): its text
would be ``"<function ...>"``, a row that looks like a success and holds nothing.

The file is rewritten from the start on every run.  A resumed run still delivers
every input (the finished ones straight from the checkpoint, at no cost), so the
file always ends up with each index exactly once, and no line of an earlier,
interrupted run can be left behind or duplicated.  A run refused once the file
is open (an input that differs from the checkpoint's) puts back what it held.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import IO, Any

from plait._locks import hold
from plait.not_data import NOT_DATA, why_not_data
from plait.values import Value, error_value

__all__ = ["OutputWriter", "UnwritableOutput", "error_record", "json_default"]


class UnwritableOutput(TypeError):
    """An output the writer could not turn into JSON: that input's error row."""


#: What ``str()`` shows of an object that has no text of its own: its memory address.
_ADDRESS = re.compile(r" (object )?at 0x[0-9a-fA-F]+>")


def json_default(obj: Any) -> Any:
    """JSON for what pipelines return besides plain data: models, dataclasses, sets."""
    if isinstance(obj, NOT_DATA):
        raise TypeError(why_not_data(obj))
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    if isinstance(obj, Value):
        return obj.payload
    text = str(obj)
    if _ADDRESS.search(text):  # a lock, a socket, a plain object: only its address to show
        raise TypeError(
            f"it holds a {type(obj).__name__} whose only text is its place in memory "
            f"({text}), which is not data"
        )
    return text


def _plain(obj: Any, depth: int = 0) -> Any:
    """Data JSON accepts as it is: string keys, lists for tuples, text past a sane depth."""
    if depth > 100:
        return repr(obj)
    if isinstance(obj, dict):
        return {
            key if isinstance(key, str) else str(key): _plain(value, depth + 1)
            for key, value in obj.items()
        }
    if isinstance(obj, list | tuple):
        return [_plain(item, depth + 1) for item in obj]
    return obj


def _key_text(key: Any) -> str:
    """The text a key becomes as a JSON object key (here, or in `_plain`)."""
    if isinstance(key, str):
        return key
    if key is True or key is False or key is None:
        return json.dumps(key)
    if isinstance(key, int | float):
        return json.dumps(key)
    return str(key)


def _distinct_keys(obj: Any, depth: int = 0) -> Any:
    """``obj`` with every dict whose keys would collide as JSON text written as
    ``{"$dict": [[key, value], ...]}``; ``obj`` itself when no dict needs it."""
    if depth > 100:
        return obj
    if isinstance(obj, dict):
        items = [(key, _distinct_keys(value, depth + 1)) for key, value in obj.items()]
        if not all(type(key) is str for key in obj) and len({_key_text(k) for k in obj}) < len(obj):
            return {"$dict": [[key, value] for key, value in items]}
        if all(new is old for (_, new), old in zip(items, obj.values(), strict=True)):
            return obj
        return dict(items)
    if isinstance(obj, list | tuple):
        items = [_distinct_keys(item, depth + 1) for item in obj]
        if all(new is old for new, old in zip(items, obj, strict=True)):
            return obj
        return items
    return obj


def _reason(exc: BaseException) -> str:
    try:
        text = " ".join(str(exc).split())
    except Exception:  # an exception whose own str() fails
        return "(no message)"
    return text if len(text) <= 200 else text[:197] + "..."


def error_record(value: Value) -> dict[str, Any]:
    meta = value.meta
    payload = value.payload
    return {
        "type": meta.get("error_type") or type(payload).__name__,
        "message": meta.get("message") if "message" in meta else str(payload),
        "module_path": meta.get("module_path"),
    }


class OutputWriter:
    """Writes result lines to a file or stdout, each as it is given.

    The order is the backend's: with ``--preserve-order`` every backend hands the rows
    over in input order (`plait.execution.backends.RowBackend`).
    """

    def __init__(self, location: str) -> None:
        self.location = location
        self._existed = False
        self._previous: Path | None = None
        self.path: Path | None = None
        if location == "-":
            self._stream: IO[str] = sys.stdout
            self._owned = False
        else:
            self.path = Path(location)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            existed = self.path.exists()
            # Locked before it is emptied: a second run writing the same file is refused
            # (raises plait._locks.Busy) instead of truncating the first one's rows.
            fd = hold(self.path, record_pid=False)
            try:
                self._existed = existed
                self._previous = _keep_previous(self.path, fd)
                os.ftruncate(fd, 0)
            except BaseException:
                os.close(fd)
                raise
            self._stream = open(fd, "w", encoding="utf-8")  # noqa: SIM115 (closed in close())
            self._owned = True
        self.written = 0

    def write(self, index: int, raw: Any, value: Value) -> Value:
        """Write the row of one input; returns the value written, which is an error
        (`UnwritableOutput`) when the output had no JSON form."""
        try:
            line = self._line(index, raw, value)
        except Exception as exc:  # any failure of user code: __str__, a dump
            value = error_value(
                UnwritableOutput(
                    f"the output ({type(value.payload).__name__}) has no JSON form, so it "
                    f"cannot be written: {type(exc).__name__}: {_reason(exc)}; return text, "
                    "numbers, lists, dicts, pydantic models or dataclasses of those"
                ),
                module_path=value.meta.get("module_path"),
            )
            line = self._line(index, raw, value)
        self._emit(line)
        return value

    def _line(self, index: int, raw: Any, value: Value) -> str:
        record: dict[str, Any] = {"index": index, "input": raw}
        if value.is_error:
            record["error"] = error_record(value)
        else:
            record["output"] = _distinct_keys(value.payload)
        try:
            line = json.dumps(record, ensure_ascii=False, default=json_default)
        except (TypeError, ValueError):  # e.g. a dict keyed by tuples, or a cycle
            line = json.dumps(_plain(record), ensure_ascii=False, default=json_default)
        try:
            line.encode()
        except UnicodeEncodeError:  # a lone surrogate: only JSON's \u escapes can carry it
            line = json.dumps(json.loads(line))
        return line

    def _emit(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()
        self.written += 1

    def close(self) -> None:
        if self._owned:
            self._stream.close()
            if self._previous is not None:
                with contextlib.suppress(OSError):
                    self._previous.unlink()
                self._previous = None
        else:
            try:
                self._stream.flush()
            except BrokenPipeError:
                silence_stdout()

    def discard(self) -> None:
        """The run was refused after the file was opened (an input that differs from
        the checkpoint's, code that cannot be traced): put back what the file held, so
        a refused re-run never costs the rows a finished run paid for."""
        if not self._owned:
            self.close()
            return
        self._stream.close()
        assert self.path is not None
        if self._previous is not None:
            os.replace(self._previous, self.path)
            self._previous = None
        elif not self._existed:
            with contextlib.suppress(OSError):
                self.path.unlink()


def _keep_previous(path: Path, fd: int) -> Path | None:
    """A copy of what the output file holds before it is emptied (None when it is
    empty), beside it, so that `OutputWriter.discard` can restore it."""
    if os.fstat(fd).st_size == 0:
        return None
    kept = path.with_name(f".{path.name}.previous")
    try:
        shutil.copyfile(path, kept)
    except OSError:  # a folder that takes no new file: the run goes on without the copy
        return None
    return kept


def silence_stdout() -> None:
    """The reader of stdout went away (``| head``): drop what is left instead of a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
