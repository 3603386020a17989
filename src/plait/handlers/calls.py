"""`log_calls`: keep, in memory, what each LLM call of a run was asked and answered.

A traced pipeline knows which stage saw which input; this handler keeps that
knowledge after the run, per call: the module that made it (and its path), the
input it was given (the last user turn), the reply's text and payload, and the
calls it waited for.  `BootstrapFewShot` learns demonstrations from it (a stage's
own inputs and outputs in runs that scored well); a test or a notebook can use
it to see what each stage really did::

    with log_calls() as log:
        pipeline.run_sync(question)
    for call in log.calls:
        print(call.path, call.input, "->", call.text)

Only calls that succeeded are kept.  The log sees the request as the handlers
inside it left it: enter it outside an `override` to log what was really sent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from plait.handlers.llm import request_of
from plait.handlers.stack import Handler, Message
from plait.providers.base import LLMResponse
from plait.tracing.graph import as_text

__all__ = ["CallLog", "CallRecord", "log_calls"]


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One finished LLM call."""

    #: The module path the call ran under in its run (``msg.name``).
    path: str
    #: The `LLMInference` that made it (None for a functional call).
    module: Any
    #: Its input: the text of the last user turn.
    input: str
    #: The reply as the assistant wrote it (JSON text for a structured reply).
    text: str
    #: The reply as the pipeline received it (the parsed object for a structured one).
    payload: Any
    #: Node ids of the calls this one waited for (within the same input).
    upstream: tuple[str, ...] = ()
    node_id: str | None = None
    input_index: int | None = None


class CallLog(Handler):
    """The calls seen since the log was entered, in the order they finished."""

    sees_composite_calls = False

    def __init__(self) -> None:
        self.calls: list[CallRecord] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CallLog({len(self.calls)} calls)"

    def postprocess(self, msg: Message) -> None:
        if msg.type != "llm" or msg.error is not None:
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

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def log_calls() -> CallLog:
    """A new, empty `CallLog`; enter it around the runs to log."""
    return CallLog()
