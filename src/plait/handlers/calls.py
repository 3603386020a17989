"""`log_calls`: keep, in memory, what each LLM call of a run was asked and answered.

A traced pipeline knows which stage saw which input; this handler keeps that
knowledge after the run, per call: the module that made it (and its path), the
input it was given (the last user turn), the reply's text and payload, and the
calls it waited for.  `BootstrapFewShot` learns demonstrations from it (a stage's
own inputs and outputs in runs that scored well); a test or a notebook can use
it to see what each stage really did (see `log_calls`).

Only calls that succeeded are kept.  The log sees the request as the handlers
inside it left it: enter it outside an `override` to log what was really sent.

``log_calls(show=True)`` also prints one line per finished call (failed ones
included) to stderr as it finishes, or to the file given as ``show``:

```text
plait call summarize #0: 'The film opens on a…' -> 'A slow but rewarding…'
```
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, TextIO

from plait._secrets import scrub
from plait._text import as_text
from plait.effects import Handler, Message
from plait.handlers.llm import request_of
from plait.providers.base import LLMResponse

__all__ = ["CallLog", "CallRecord", "log_calls"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One finished LLM call, as a `CallLog` keeps it.

    Attributes:
        path: The module path the call ran under in its run.
        module: The `LLMInference` that made it (None for a functional call).
        input: Its input: the text of the last user turn.
        text: The reply as the assistant wrote it (JSON text for a structured reply).
        payload: The reply as the pipeline received it (the parsed object for a
            structured one).
        upstream: Node ids of the calls this one waited for (within the same input).
        node_id: The call's node in its input's graph.
        input_index: Which input of the batch the call served.
    """

    path: str
    module: Any
    input: str
    text: str
    payload: Any
    upstream: tuple[str, ...] = ()
    node_id: str | None = None
    input_index: int | None = None


class CallLog(Handler):
    """The calls seen since the log was entered, in the order they finished (see `log_calls`).

    Args:
        show: Also print one line per finished call: True for stderr, or a file.

    Attributes:
        calls: The `CallRecord` of each call that succeeded.
    """

    def __init__(self, show: bool | TextIO = False) -> None:
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()
        #: Where each finished call gets its line (None: nowhere); stderr is looked up at
        #: print time, so pytest's capture and redirected streams see the lines.
        self._show: bool | TextIO = show

    def __repr__(self) -> str:
        return f"CallLog({len(self.calls)} calls)"

    def postprocess_llm(self, msg: Message) -> None:
        """Keep the finished call (if it succeeded), and print its line when showing.

        Args:
            msg: The LLM call's message.
        """
        if self._show:
            self._print(msg)
        if msg.error is not None:
            return
        reply = msg.value
        if isinstance(reply, LLMResponse):
            text, payload = reply.text, reply.payload
        else:  # a handler's own answer (a mock's text or object)
            payload = getattr(reply, "payload", reply)
            text = as_text(payload)
        record = CallRecord(
            path=msg.name,
            module=msg.module,
            input=request_of(msg).prompt_text,
            text=text,
            payload=payload,
            upstream=tuple(msg.meta.get("upstream") or ()),
            node_id=msg.node_id,
            input_index=msg.input_index,
        )
        with self._lock:
            self.calls.append(record)

    def _print(self, msg: Message) -> None:
        """One line for a finished call: where, its input, and its reply or failure, each
        cut short and with credentials removed (the line goes to a terminal or a log)."""
        where = msg.name or "call"
        if msg.input_index is not None:
            where += f" #{msg.input_index}"
        asked = _short(request_of(msg).prompt_text)
        if msg.error is not None:
            answered = f"failed: {type(msg.error).__name__}: {_short(str(msg.error), 120)}"
        else:
            reply = msg.value
            if isinstance(reply, LLMResponse):
                text = reply.text
            else:
                text = as_text(getattr(reply, "payload", reply))
            answered = f"-> {_short(text)}"
        line = scrub(f"plait call {where}: {asked} {answered}")
        stream = sys.stderr if isinstance(self._show, bool) else self._show
        with self._lock:
            print(line, file=stream, flush=True)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_lock", None)
        state["_show"] = bool(state.get("_show"))  # a copy on a worker prints to its stderr
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def log_calls(show: bool | TextIO = False) -> CallLog:
    """Keep what each LLM call was asked and answered: a new, empty `CallLog`.

    Enter it around the runs to log.  Only calls that succeeded are kept, as the
    handlers inside the log left the request.

    Args:
        show: Also print one line per finished call (failed ones included): True
            for stderr, or a file.

    Returns:
        The log; its ``calls`` fill as calls finish.

    Examples:
        ```python
        import plait
        from plait.handlers import log_calls

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.").bind(resources=resources)

        with log_calls() as log:
            summarize.run_sync("A long text.")
        for call in log.calls:
            print(call.path, repr(call.input), "->", repr(call.text))
        ```
    """
    return CallLog(show)


def _short(text: str, limit: int = 60) -> str:
    """``text`` quoted on one line, cut to about ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return repr(flat)
