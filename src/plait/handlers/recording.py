"""Record a run's LLM calls once, then replay them offline: tests without an endpoint.

A pipeline's own tests should not need a server, a key or a network, and should
give the same answer every time.  `record` runs the pipeline for real once and
writes every reply to a JSON Lines file (commit it next to the tests); `replay`
answers every call from that file, so the default action (the network call)
never runs, and a call the file does not hold is an error naming the module and
the prompt, because an unrecorded call means the pipeline changed and the
recording should be made again, not that the test should quietly go online.

Each record is one ``write`` on an ``O_APPEND`` descriptor, so a recording cut
short by a crash holds whole records; the first line names the format, so a
wrong file is reported as such instead of as a missing call.

Replay matches a call on its full `request_key` first; when the endpoint it
leads to differs from the recording's (a CI job whose resources point nowhere,
or no resources at all), it falls back to what the pipeline's code decides:
alias, messages, sampling settings, schema and extra fields.  The key is taken
from the request as it reaches the handler, so record and replay from the same
place in the handler stack.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Self

from plait._jsonl import json_line, whole_lines
from plait.effects import Handler, Message
from plait.handlers.llm import (
    answer,
    request_key,
    request_of,
    response_from_json,
    response_to_json,
)
from plait.providers.base import LLMResponse

__all__ = [
    "NotRecordedError",
    "Recorder",
    "RecordingError",
    "Replayer",
    "record",
    "replay",
]

FORMAT = "plait-recording"
VERSION = 1

#: How much of a prompt records and errors quote.
EXCERPT_CHARS = 120


class RecordingError(RuntimeError):
    """The recording file cannot be written or read (missing, damaged, another format).

    The message says why and how to record it again.
    """


class NotRecordedError(LookupError):
    """Replay met a call the recording does not hold: the pipeline changed since.

    The message names the module and the prompt, and says how to record again.
    """


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """The start of ``text`` on one line, marked when cut, for records and errors.

    Args:
        text: The text.
        limit: The most characters to keep.

    Returns:
        The excerpt.
    """
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _header() -> bytes:
    return json_line({"format": FORMAT, "version": VERSION, "created": time.time()})


class Recorder(Handler):
    """Writes every successful LLM call of the runs inside it to a JSON Lines file.

    A recording is never wiped by accident: calls are added to an existing file
    (replay matches on the request, so older records of calls that changed are
    simply never asked for); ``append=False`` starts the file afresh.  Calls a
    checkpoint answers are recorded too, and a checkpointed input that finished
    earlier is run again from the checkpoint's records (nothing is sent) so that
    its calls reach the recording: a replay reproduces the whole run.  Made by
    `record`.

    Args:
        path: The JSON Lines file.
        append: Add to an existing recording (False starts the file afresh).
    """

    #: The runtime runs inputs a checkpoint finished through their calls while this
    #: handler is active, instead of answering them with the stored output.
    sees_every_call = True

    def __init__(self, path: str | os.PathLike[str], *, append: bool = True) -> None:
        self.path = Path(path)
        self.append = append
        self.calls = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._depth = 0
        self._started = False
        self._pending_key = f"record.pending.{id(self):x}"

    def __repr__(self) -> str:
        return f"Recorder({str(self.path)!r}, calls={self.calls})"

    def __enter__(self) -> Self:
        with self._lock:
            if self._fd is None:
                self._fd = self._open()
            self._depth += 1
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def process_llm(self, msg: Message) -> None:
        """Note the call's key, as a replayer in the same place will see it.

        Args:
            msg: The LLM call's message.
        """
        # The key is taken here, before handlers outside this one rewrite the request,
        # because that is what a replayer in the same place will see.
        request = request_of(msg)
        msg.meta[self._pending_key] = {
            "key": request_key(msg),
            "fingerprint": request.fingerprint(),
            "module": msg.name,
            "alias": request.alias,
            "prompt": excerpt(request.prompt_text),
        }

    def postprocess_llm(self, msg: Message) -> None:
        """Write the call's reply to the recording, if the call succeeded.

        Args:
            msg: The LLM call's message.

        Raises:
            RecordingError: When the call finished after the recorder's block closed.
        """
        record = msg.meta.pop(self._pending_key, None)
        if record is None or msg.error is not None or not isinstance(msg.value, LLMResponse):
            return
        record["reply"] = response_to_json(msg.value)
        data = json_line(record)
        with self._lock:
            if self._fd is None:
                raise RecordingError(
                    f"a call finished after its recorder for {self.path} was closed; keep "
                    "the `with record(...)` block open until the run is over"
                )
            os.write(self._fd, data)
            self.calls += 1

    def _open(self) -> int:
        fresh = not self._started and not self.append
        # Checked at the first opening only: a recorder entered inside a forward is
        # entered again around each call made in its block, and reopens the file per call.
        first = not self._started
        if first and self.append and self.path.exists() and self.path.stat().st_size > 0:
            _check_header(self.path)
            whole_lines(self.path)  # cut a torn last line before appending after it
        # O_APPEND keeps each record whole and in one piece whatever else writes the file.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if fresh else 0)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, flags, 0o644)
        except OSError as exc:
            raise RecordingError(f"cannot write the recording {self.path}: {exc}") from None
        if os.fstat(fd).st_size == 0:
            os.write(fd, _header())
        self._started = True
        return fd


def _check_header(path: Path) -> None:
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(
            f"{path} is not a plait recording (its first line does not name the format "
            f"{FORMAT!r}); record into a new file"
        )
    if header.get("version") != VERSION:
        raise RecordingError(
            f"{path} was written by recording format version {header.get('version')!r}; this "
            f"plait reads version {VERSION}: record it again"
        )


class Replayer(Handler):
    """Answers every LLM call from a recording; the endpoint is never contacted.

    The file is read when the replayer is first entered (or by `load`).  When a
    request was recorded more than once with different replies (sampling at a
    temperature above zero), the first recorded reply is the one replayed, so a
    replay gives the same result every time.  Made by `replay`.

    Args:
        path: The recording.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.replayed = 0
        self._by_key: dict[str, dict[str, Any]] = {}
        self._by_fingerprint: dict[str, dict[str, Any]] = {}
        self._per_module: dict[str, int] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Replayer({str(self.path)!r}, replayed={self.replayed})"

    def __enter__(self) -> Self:
        self.load()
        return super().__enter__()

    def __len__(self) -> int:
        """How many distinct requests the recording can answer."""
        self.load()
        return len(self._by_key)

    def load(self) -> Replayer:
        """Read the recording (once; entering the replayer does it too).

        Returns:
            This replayer.

        Raises:
            RecordingError: When the recording is missing, damaged or of another format.
        """
        with self._lock:
            if not self._loaded:
                self._read()
                self._loaded = True
        return self

    def process_llm(self, msg: Message) -> None:
        """Answer the call with its recorded reply.

        Args:
            msg: The LLM call's message.

        Raises:
            NotRecordedError: When the recording holds no reply for this call.
        """
        if msg.done:
            return
        request = request_of(msg)
        stored = self._by_key.get(request_key(msg))
        if stored is None:
            stored = self._by_fingerprint.get(request.fingerprint())
        if stored is None:
            raise NotRecordedError(self._missing(msg))
        answer(msg, response_from_json(stored, request))
        msg.meta["replay"] = "hit"
        with self._lock:
            self.replayed += 1

    def _missing(self, msg: Message) -> str:
        prompt = excerpt(request_of(msg).prompt_text)
        others = self._per_module.get(msg.name, 0)
        hint = (
            f"; the recording holds {others} call(s) from {msg.name}, none with this prompt "
            "and these settings"
            if others
            else f"; the recording holds no call from {msg.name}"
        )
        return (
            f"{msg.name}: no recorded reply in {self.path} for the prompt {prompt!r}{hint}. "
            f"Re-record: run the pipeline once under plait.handlers.record({str(self.path)!r})"
        )

    def _read(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raise RecordingError(
                f"no recording at {self.path}; make one by running the pipeline under "
                f"plait.handlers.record({str(self.path)!r})"
            ) from None
        except OSError as exc:
            raise RecordingError(f"cannot read the recording {self.path}: {exc}") from None
        lines = raw.splitlines()
        if not lines:
            raise RecordingError(f"{self.path} is empty, not a plait recording; record it again")
        _check_header(self.path)
        for number, line in enumerate(lines[1:], start=2):
            try:
                record = json.loads(line)
                key, fingerprint = str(record["key"]), str(record["fingerprint"])
                reply = record["reply"]
                if not isinstance(reply, dict) or not isinstance(reply.get("text"), str):
                    raise ValueError("the reply has no text")
            except (ValueError, KeyError, TypeError) as exc:
                raise RecordingError(
                    f"{self.path} line {number} is corrupt ({exc}); record it again"
                ) from None
            self._by_key.setdefault(key, reply)
            self._by_fingerprint.setdefault(fingerprint, reply)
            module = str(record.get("module", ""))
            self._per_module[module] = self._per_module.get(module, 0) + 1


def record(path: str | os.PathLike[str], *, append: bool = True) -> Recorder:
    """Record every LLM call of the runs inside the block to ``path`` (JSON Lines).

    Run a pipeline for real once under ``record``, commit the file next to its
    tests, and the tests run offline under `replay`.  Calls are added to an
    existing recording; API keys are never written.

    Args:
        path: The JSON Lines file (created, with its folder, if missing).
        append: Add to an existing recording (False starts the file afresh).

    Returns:
        The `Recorder` handler: enter it with ``with``.

    Examples:
        ```python
        import plait
        from plait.handlers import record, replay

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.")

        with record("calls.jsonl"):
            live = summarize.run_sync("A long text.", resources=resources)

        with replay("calls.jsonl"):  # no endpoint, no key: answered from the file
            print(summarize.run_sync("A long text.") == live)
        ```
    """
    return Recorder(path, append=append)


def replay(path: str | os.PathLike[str]) -> Replayer:
    """Answer every LLM call inside the block from the recording at ``path``, offline.

    A call the recording does not hold is an error (`NotRecordedError`) naming the
    module and the prompt: the pipeline changed, so record again rather than go
    online.  See `record` for an example.

    Args:
        path: A file `record` wrote.

    Returns:
        The `Replayer` handler: enter it with ``with``.
    """
    return Replayer(path)
