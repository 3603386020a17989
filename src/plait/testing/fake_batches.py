"""The OpenAI Batch API of the fake OpenAI server: input files, batches and their lifecycle.

:class:`plait.testing.fake_openai.FakeOpenAIApp` mounts these routes beside
``/v1/chat/completions``; every one of them asks for the same bearer key.

* ``POST /v1/files`` (multipart/form-data: ``purpose=batch`` and a ``file`` named ``*.jsonl``)
  stores a batch input file and answers OpenAI's File object. Each line is one request:
  ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``, the custom ids
  unique in the file, every body naming the same model, at most ``batch_max_requests`` lines
  and ``batch_max_bytes`` bytes. A file larger than that is refused at once (400). The line
  checks answer a 400 naming the first bad line as well while ``batch_validate_on_upload`` is
  on (the default); with it off the upload is accepted, as OpenAI's is, and the batch made from
  it ends ``failed`` with one ``errors.data`` entry per bad line (``code``, ``message``,
  ``param``, ``line``), which is how the real API reports them.
* ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``; a batch's
  output and error files are files too (purpose ``batch_output``).
* ``POST /v1/batches`` ``{"input_file_id", "endpoint": "/v1/chat/completions",
  "completion_window": "24h", "metadata"}`` answers the Batch object; ``GET /v1/batches/{id}``;
  ``GET /v1/batches?limit=&after=`` lists them newest first; ``POST /v1/batches/{id}/cancel``.

A batch goes ``validating`` -> ``in_progress`` -> ``finalizing`` -> ``completed`` within
``batch_turnaround_s`` (a fifth validating, three fifths in progress, a fifth finalizing),
driven by an asyncio task. Its lines are answered in order, each by the reply logic of the
online route (:meth:`FakeOpenAIApp.answer_line`): the same body gets the same text, seeds and
directives included, and the same ``usage``. The online-only faults (``rate_*``, latency) do
not apply to batch lines; each batch draws from its own random stream, seeded by the server's
seed and the batch's place in creation order since the last ``/_reset``, so a batch's outcome
does not depend on other traffic.

Where each line ends up, as OpenAI does it (``id`` and ``custom_id`` on every line):

* a 200 reply goes to the output file: ``"response": {"status_code": 200, "request_id",
  "body"}, "error": null``;
* any other reply (a ``[[status:NNN]]`` directive, a body the online route would refuse with
  400) goes to the error file in the same shape, with its status code and error body;
* a line never executed goes to the error file with ``"response": null`` and
  ``"error": {"code", "message"}``: ``server_error`` for the ``batch_item_fail_rate`` faults
  (a retryable failure), ``batch_cancelled`` when the batch was cancelled first,
  ``batch_expired`` when it expired first.

An output or error file exists only when it has a line (``output_file_id`` /
``error_file_id`` are null otherwise). ``request_counts.completed`` counts the 200s and
``failed`` the error file's lines, so the two add up to ``total`` once the batch has ended.

Faults and controls, all set through ``POST /_config`` and read when a batch is created:

* ``batch_item_fail_rate``: the fraction of lines that fail with ``server_error``;
* ``batch_expire``: the batch ends ``expired`` after its turnaround; the first
  ``batch_expire_fraction`` of its lines are answered (output file), the rest are
  ``batch_expired`` (error file), as OpenAI hands back the work an expired batch did;
* ``batch_fail_validation``: the batch ends ``failed`` after validating, with
  ``errors.data`` holding one ``token_limit_exceeded`` error (OpenAI's usual reason to
  refuse a well-formed batch);
* ``batch_create_gate``, ``batch_content_gate``: gate names; a ``POST /v1/batches`` parks at
  the first after the batch is created, before it answers (a client killed there never
  learns the batch's id), and a ``GET /v1/files/{id}/content`` at the second before it
  answers (a client killed while downloading results).
* ``batch_gate``: a gate name; each batch parks at that gate as it enters ``in_progress`` until
  ``POST /_gate {"open": NAME}``. A line whose last user message carries ``[[gate:NAME]]`` (or
  matches ``gate_texts``) parks its batch at that line in the same way, the lines before it
  answered. Parked batches count in ``/_gate``'s ``parked``, so a test waits for that state.

``POST /v1/batches/{id}/cancel`` moves a validating, in-progress or finalizing batch to
``cancelling`` (a parked batch leaves its gate), then ``cancelled``: lines answered stay in the
output file, the others go to the error file as ``batch_cancelled``. Cancelling a batch that is
cancelling or cancelled answers it unchanged; one that has ended otherwise is a 409.

``GET /_batches`` tells what the store saw since the last ``/_reset`` (which also forgets every
file and batch): ``batches_created``, ``files_uploaded`` (input files), ``batch_requests_total``
(lines in created batches), ``batch_lines_answered`` (lines that reached the reply logic, which
the online ``requests_total`` never counts), ``batches`` (one record per batch in creation
order: ``id``, ``seq``, ``status``, ``requests``, ``input_bytes``, ``input_file_id``,
``metadata``, ``request_counts``), ``custom_ids`` (each custom id submitted in a created batch
and how many times) and ``api_calls`` (calls per route, refused ones included).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from aiohttp import BodyPartReader, web

from plait.testing import BATCH_CONFIG_DEFAULTS

__all__ = ["ENDPOINT", "BatchHost", "BatchSettings", "BatchStore", "parse_input"]

#: The one endpoint the fake's batches take.
ENDPOINT: Final = "/v1/chat/completions"
COMPLETION_WINDOW: Final = "24h"
_WINDOW_S: Final = 24 * 3600
_METADATA_PAIRS: Final = 16
_METADATA_KEY_CHARS: Final = 64
_METADATA_VALUE_CHARS: Final = 512
_LIST_LIMIT: Final = 20
_LIST_LIMIT_MAX: Final = 100
#: How many line errors a failed batch lists in ``errors.data``.
_MAX_BATCH_ERRORS: Final = 100
#: Lines answered between two yields to the event loop, so a big batch never stalls the server.
_LINES_PER_YIELD: Final = 500
_PURPOSE_CHARS: Final = 64
# Shares of the turnaround spent in each phase.
_VALIDATING: Final = 0.2
_IN_PROGRESS: Final = 0.6
_FINALIZING: Final = 0.2

_ITEM_FAILURE: Final = {
    "code": "server_error",
    "message": "The server had an error while processing this request (injected by the fake "
    "server); it may be retried.",
}
_NOT_EXECUTED: Final = {
    "cancelled": {
        "code": "batch_cancelled",
        "message": "This request was not executed because the batch was cancelled.",
    },
    "expired": {
        "code": "batch_expired",
        "message": "This request could not be executed before the completion window expired.",
    },
}
_TOKEN_LIMIT: Final = {
    "code": "token_limit_exceeded",
    "message": "Enqueued token limit reached for this model in your organization (injected by "
    "the fake server). Wait for some in-progress batches to complete, then try again.",
    "param": None,
    "line": None,
}


class BatchHost(Protocol):
    """What the batch store needs from the chat-completions server it belongs to."""

    def refusal(self, request: web.Request) -> web.Response | None:
        """The 401 for a request without the right key, or None when it may pass."""

    def error_response(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> web.Response:
        """An error response in OpenAI's shape."""

    def check_placeholders(self, raw: bytes, endpoint: str, model: str | None) -> None:
        """Record ``raw`` if it holds a tracing placeholder."""

    def seed(self) -> int:
        """The server's current seed."""

    async def answer_line(
        self, body: Any, rng: random.Random, interrupt: asyncio.Event
    ) -> tuple[int, dict[str, Any]] | None:
        """The online route's answer to ``body`` (None if ``interrupt`` came first)."""

    async def park(self, name: str, interrupt: asyncio.Event | None = None) -> bool:
        """Wait at gate ``name``: True once it opens, False if ``interrupt`` came first."""


# -- settings -----------------------------------------------------------------------------------


class BatchSettings:
    """The ``batch_*`` keys of ``POST /_config`` (defaults: `BATCH_CONFIG_DEFAULTS`)."""

    _RATES: Final = ("batch_item_fail_rate", "batch_expire_fraction")
    _COUNTS: Final = ("batch_max_requests", "batch_max_bytes")
    _FLAGS: Final = ("batch_expire", "batch_fail_validation", "batch_validate_on_upload")

    def __init__(self) -> None:
        defaults = BATCH_CONFIG_DEFAULTS
        self.batch_turnaround_s = float(defaults["batch_turnaround_s"])
        self.batch_max_requests = int(defaults["batch_max_requests"])
        self.batch_max_bytes = int(defaults["batch_max_bytes"])
        self.batch_item_fail_rate = float(defaults["batch_item_fail_rate"])
        self.batch_expire = bool(defaults["batch_expire"])
        self.batch_expire_fraction = float(defaults["batch_expire_fraction"])
        self.batch_fail_validation = bool(defaults["batch_fail_validation"])
        gate = defaults["batch_gate"]
        self.batch_gate: str | None = None if gate is None else str(gate)
        self.batch_create_gate: str | None = defaults["batch_create_gate"]
        self.batch_content_gate: str | None = defaults["batch_content_gate"]
        self.batch_validate_on_upload = bool(defaults["batch_validate_on_upload"])

    @staticmethod
    def names() -> tuple[str, ...]:
        return tuple(BATCH_CONFIG_DEFAULTS)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.names()}

    def check(self, key: str, value: Any) -> Any:
        """The value to store for ``key``; ValueError when it is not acceptable."""
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if key == "batch_turnaround_s":
            if not is_number or not 0.0 <= value < math.inf:
                raise ValueError(f"{key} must be a finite non-negative number")
            return float(value)
        if key in self._COUNTS:
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{key} must be a positive integer")
            return value
        if key in self._RATES:
            if not is_number or not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be a fraction between 0 and 1")
            return float(value)
        if key in self._FLAGS:
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
            return value
        if key in ("batch_gate", "batch_create_gate", "batch_content_gate"):
            if value is None:
                return None
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{key} is a gate's name or null")
            return value.strip()
        raise ValueError(f"unknown config key {key!r}")


# -- input files --------------------------------------------------------------------------------


class _Line:
    """One request of an input file."""

    __slots__ = ("body", "custom_id", "number")

    def __init__(self, number: int, custom_id: str, body: dict[str, Any]) -> None:
        self.number = number
        self.custom_id = custom_id
        self.body = body


def _line_error(
    code: str, message: str, line: int | None, param: str | None = None
) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def parse_input(
    data: bytes,
    max_requests: int,
    on_line: Callable[[bytes, str | None], None] | None = None,
) -> tuple[list[_Line], list[dict[str, Any]]]:
    """The requests of a batch input file, and its errors in ``errors.data``'s shape.

    Lines are numbered from 1; a final newline ends the last line rather than adding an
    empty one. ``on_line`` sees every non-empty line with its body's model, if any.
    """
    raw_lines = data.split(b"\n")
    if raw_lines[-1] == b"":
        raw_lines.pop()
    if not raw_lines:
        return [], [_line_error("empty_file", "The input file has no requests.", None)]
    lines: list[_Line] = []
    errors: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    model: str | None = None
    for number, raw in enumerate(raw_lines, 1):
        if number > max_requests:
            message = (
                f"The input file has {len(raw_lines)} requests; a batch takes at most "
                f"{max_requests}."
            )
            errors.append(_line_error("too_many_tasks", message, number))
            break
        raw = raw.removesuffix(b"\r")
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        body = parsed.get("body") if isinstance(parsed, dict) else None
        line_model = body.get("model") if isinstance(body, dict) else None
        line_model = line_model if isinstance(line_model, str) else None
        if on_line is not None and raw.strip():
            on_line(raw, line_model)
        if not isinstance(parsed, dict):
            message = "This line is not parseable as valid JSON (one JSON object per line)."
            errors.append(_line_error("invalid_json_line", message, number))
            continue
        error = _check_request(parsed, number, seen)
        if error is None and line_model is not None:
            if model is None:
                model = line_model
            elif line_model != model:
                message = (
                    f"The model {line_model!r} differs from the model of the file's earlier "
                    f"lines ({model!r}); a batch uses a single model."
                )
                error = _line_error("model_mismatch", message, number, "body.model")
        if error is not None:
            errors.append(error)
            continue
        custom_id = parsed["custom_id"]
        seen[custom_id] = number
        lines.append(_Line(number, custom_id, parsed["body"]))
    return lines, errors


def _check_request(
    parsed: dict[str, Any], number: int, seen: dict[str, int]
) -> dict[str, Any] | None:
    for field in ("custom_id", "method", "url", "body"):
        if field not in parsed:
            message = f"Missing required parameter: {field!r}."
            return _line_error("missing_required_parameter", message, number, field)
    custom_id = parsed["custom_id"]
    if not isinstance(custom_id, str) or not custom_id:
        return _line_error(
            "invalid_value", "custom_id must be a non-empty string.", number, "custom_id"
        )
    if custom_id in seen:
        message = (
            f"The custom_id {custom_id!r} is also used on line {seen[custom_id]}; custom_id "
            "values must be unique within a batch."
        )
        return _line_error("duplicate_custom_id", message, number, "custom_id")
    if parsed["method"] != "POST":
        message = f"Invalid method {parsed['method']!r}; batch requests use 'POST'."
        return _line_error("invalid_value", message, number, "method")
    if parsed["url"] != ENDPOINT:
        message = f"The url {parsed['url']!r} does not match the batch's endpoint {ENDPOINT!r}."
        return _line_error("url_mismatch", message, number, "url")
    if not isinstance(parsed["body"], dict):
        return _line_error("invalid_value", "body must be a JSON object.", number, "body")
    return None


class _File:
    __slots__ = ("created_at", "data", "errors", "filename", "id", "lines", "purpose")

    def __init__(
        self,
        filename: str,
        purpose: str,
        data: bytes,
        lines: list[_Line] | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        self.id = _new_id("file-")
        self.filename = filename
        self.purpose = purpose
        self.data = data
        self.created_at = int(time.time())
        self.lines = lines or []
        self.errors = errors or []

    def as_object(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "expires_at": None,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


def _new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


# -- batches ------------------------------------------------------------------------------------


class _Batch:
    """One batch: what it was created with, where it is, and each line's result so far."""

    def __init__(
        self,
        seq: int,
        file: _File,
        metadata: dict[str, str] | None,
        settings: BatchSettings,
        seed: int,
    ) -> None:
        self.id = _new_id("batch_")
        self.seq = seq
        self.input_file_id = file.id
        self.input_bytes = len(file.data)
        self.lines = file.lines
        self.file_errors = file.errors
        self.metadata = metadata
        self.created_at = int(time.time())
        self.status = "validating"
        self.times: dict[str, int] = {}
        self.output_file_id: str | None = None
        self.error_file_id: str | None = None
        self.errors: list[dict[str, Any]] | None = None
        #: Per line: the line of the output (True) or error (False) file it produced.
        self.results: list[tuple[bool, dict[str, Any]] | None] = [None] * len(self.lines)
        self.total = 0
        self.completed = 0
        self.failed = 0
        self.cancel = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        # The settings in force at creation: later /_config changes leave this batch alone.
        self.turnaround_s = settings.batch_turnaround_s
        self.item_fail_rate = settings.batch_item_fail_rate
        self.expire = settings.batch_expire
        self.expire_fraction = settings.batch_expire_fraction
        self.fail_validation = settings.batch_fail_validation
        self.gate = settings.batch_gate
        self.rng = random.Random(f"plait-fake-batch:{seed}:{seq}")

    def stamp(self, status: str) -> None:
        self.status = status
        self.times[f"{status}_at"] = int(time.time())

    def record(self, index: int, ok: bool, line: dict[str, Any]) -> None:
        self.results[index] = (ok, line)
        if ok:
            self.completed += 1
        else:
            self.failed += 1

    def as_object(self) -> dict[str, Any]:
        times = self.times
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": ENDPOINT,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": COMPLETION_WINDOW,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": times.get("in_progress_at"),
            "expires_at": self.created_at + _WINDOW_S,
            "finalizing_at": times.get("finalizing_at"),
            "completed_at": times.get("completed_at"),
            "failed_at": times.get("failed_at"),
            "expired_at": times.get("expired_at"),
            "cancelling_at": times.get("cancelling_at"),
            "cancelled_at": times.get("cancelled_at"),
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": self.metadata,
        }

    def as_record(self) -> dict[str, Any]:
        """The batch as ``GET /_batches`` lists it."""
        return {
            "id": self.id,
            "seq": self.seq,
            "status": self.status,
            "requests": len(self.lines),
            "input_bytes": self.input_bytes,
            "input_file_id": self.input_file_id,
            "metadata": self.metadata,
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
        }


def _result_line(
    custom_id: str, response: dict[str, Any] | None, error: dict[str, Any] | None
) -> dict[str, Any]:
    return {
        "id": _new_id("batch_req_"),
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }


def _json(payload: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(payload).encode(), content_type="application/json"
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BatchStore:
    """The files and batches of one server, their lifecycle tasks and their statistics."""

    def __init__(self, host: BatchHost, settings: BatchSettings) -> None:
        self._host = host
        self.settings = settings
        self._files: dict[str, _File] = {}
        #: Batches in creation order.
        self._batches: dict[str, _Batch] = {}
        self._clear_stats()

    def _clear_stats(self) -> None:
        self.files_uploaded = 0
        self.requests_submitted = 0
        self.lines_answered = 0
        self.custom_ids: dict[str, int] = {}
        self.api_calls: dict[str, int] = {}

    def add_routes(self, app: web.Application) -> None:
        routes: list[tuple[str, str, Handler]] = [
            ("POST", "/v1/files", self.upload_file),
            ("GET", "/v1/files/{file_id}", self.get_file),
            ("GET", "/v1/files/{file_id}/content", self.file_content),
            ("DELETE", "/v1/files/{file_id}", self.delete_file),
            ("POST", "/v1/batches", self.create_batch),
            ("GET", "/v1/batches", self.list_batches),
            ("GET", "/v1/batches/{batch_id}", self.get_batch),
            ("POST", "/v1/batches/{batch_id}/cancel", self.cancel_batch),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, path, self._guarded(f"{method} {path}", handler))
        app.router.add_get("/_batches", self.stats)

    def _guarded(self, label: str, handler: Handler) -> Handler:
        """``handler`` behind the key check, counted in ``api_calls``."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            self.api_calls[label] = self.api_calls.get(label, 0) + 1
            refused = self._host.refusal(request)
            if refused is not None:
                return refused
            return await handler(request)

        return guarded

    # -- control ------------------------------------------------------------------------------

    async def stats(self, request: web.Request) -> web.Response:
        return _json(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        return {
            "batches_created": len(self._batches),
            "files_uploaded": self.files_uploaded,
            "batch_requests_total": self.requests_submitted,
            "batch_lines_answered": self.lines_answered,
            "batches": [batch.as_record() for batch in self._batches.values()],
            "custom_ids": dict(self.custom_ids),
            "api_calls": dict(self.api_calls),
        }

    def reset(self) -> None:
        """Forget every file and batch (stopping their tasks) and the statistics."""
        for batch in self._batches.values():
            if batch.task is not None:
                batch.task.cancel()
        self._files.clear()
        self._batches.clear()
        self._clear_stats()

    # -- files --------------------------------------------------------------------------------

    async def upload_file(self, request: web.Request) -> web.StreamResponse:
        host = self._host
        if request.content_type != "multipart/form-data":
            return host.error_response(
                400, "Expected a multipart/form-data body with the fields 'purpose' and 'file'."
            )
        limit = self.settings.batch_max_bytes
        purpose: str | None = None
        filename = ""
        data: bytes | None = None
        try:
            reader = await request.multipart()
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "purpose":
                    text = await _read_part(part, _PURPOSE_CHARS)
                    purpose = "" if text is None else text.decode("utf-8", errors="replace")
                elif part.name == "file":
                    filename = part.filename or ""
                    data = await _read_part(part, limit)
                    if data is None:
                        message = f"The file is larger than {limit} bytes, the batch input limit."
                        return host.error_response(400, message, param="file")
                else:
                    await part.release()
        except ValueError as err:
            return host.error_response(400, f"Malformed multipart body: {err}")
        if purpose is None:
            return host.error_response(
                400, "Missing required parameter: 'purpose'.", param="purpose"
            )
        if purpose != "batch":
            message = f"The fake server stores files with purpose 'batch' only, not {purpose!r}."
            return host.error_response(400, message, param="purpose")
        if data is None:
            return host.error_response(400, "Missing required parameter: 'file'.", param="file")
        if not filename.endswith(".jsonl"):
            return host.error_response(
                400, "Invalid file format for Batch API. Must be .jsonl", param="file"
            )

        def check(raw: bytes, model: str | None) -> None:
            host.check_placeholders(raw, request.path, model)

        lines, errors = parse_input(data, self.settings.batch_max_requests, check)
        if errors and self.settings.batch_validate_on_upload:
            first = errors[0]
            where = f"Line {first['line']}: " if first["line"] is not None else ""
            return host.error_response(
                400, where + first["message"], param=first["param"], code=first["code"]
            )
        file = _File(filename, "batch", data, lines, errors)
        self._files[file.id] = file
        self.files_uploaded += 1
        return _json(file.as_object())

    def _file(self, request: web.Request) -> _File | web.Response:
        file_id = request.match_info["file_id"]
        file = self._files.get(file_id)
        if file is None:
            return self._host.error_response(404, f"No such File object: {file_id}", param="id")
        return file

    async def get_file(self, request: web.Request) -> web.StreamResponse:
        file = self._file(request)
        return file if isinstance(file, web.Response) else _json(file.as_object())

    async def file_content(self, request: web.Request) -> web.StreamResponse:
        file = self._file(request)
        if isinstance(file, web.Response):
            return file
        if self.settings.batch_content_gate is not None:
            await self._host.park(self.settings.batch_content_gate)
        return web.Response(body=file.data, content_type="application/octet-stream")

    async def delete_file(self, request: web.Request) -> web.StreamResponse:
        file = self._file(request)
        if isinstance(file, web.Response):
            return file
        del self._files[file.id]
        return _json({"id": file.id, "object": "file", "deleted": True})

    # -- batches ------------------------------------------------------------------------------

    async def create_batch(self, request: web.Request) -> web.StreamResponse:
        host = self._host
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return host.error_response(400, "The request body must be a JSON object.")
        for field in ("input_file_id", "endpoint", "completion_window"):
            if field not in body:
                return host.error_response(
                    400, f"Missing required parameter: {field!r}.", param=field
                )
        endpoint = body["endpoint"]
        if endpoint != ENDPOINT:
            message = (
                f"Invalid value: {endpoint!r}. The fake server's batches support {ENDPOINT!r} only."
            )
            return host.error_response(400, message, param="endpoint")
        window = body["completion_window"]
        if window != COMPLETION_WINDOW:
            message = f"Invalid value: {window!r}. Supported values are: {COMPLETION_WINDOW!r}."
            return host.error_response(400, message, param="completion_window")
        metadata = body.get("metadata")
        problem = _metadata_problem(metadata)
        if problem is not None:
            return host.error_response(400, problem, param="metadata")
        file_id = body["input_file_id"]
        file = self._files.get(file_id) if isinstance(file_id, str) else None
        if file is None:
            return host.error_response(
                404, f"No such File object: {file_id}", param="input_file_id"
            )
        if file.purpose != "batch":
            message = f"The file {file.id} has purpose {file.purpose!r}; a batch needs 'batch'."
            return host.error_response(400, message, param="input_file_id")

        batch = _Batch(len(self._batches) + 1, file, metadata, self.settings, host.seed())
        self._batches[batch.id] = batch
        self.requests_submitted += len(batch.lines)
        for line in batch.lines:
            self.custom_ids[line.custom_id] = self.custom_ids.get(line.custom_id, 0) + 1
        batch.task = asyncio.create_task(self._run(batch))
        if self.settings.batch_create_gate is not None:
            await self._host.park(self.settings.batch_create_gate)
        return _json(batch.as_object())

    def _batch(self, request: web.Request) -> _Batch | web.Response:
        batch_id = request.match_info["batch_id"]
        batch = self._batches.get(batch_id)
        if batch is None:
            return self._host.error_response(
                404, f"No such Batch object: {batch_id}", param="batch_id"
            )
        return batch

    async def get_batch(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request)
        return batch if isinstance(batch, web.Response) else _json(batch.as_object())

    async def list_batches(self, request: web.Request) -> web.StreamResponse:
        host = self._host
        limit_text = request.query.get("limit", str(_LIST_LIMIT))
        try:
            limit = int(limit_text)
        except ValueError:
            limit = 0
        if not 1 <= limit <= _LIST_LIMIT_MAX:
            message = (
                f"Invalid 'limit': {limit_text!r}; it must be between 1 and {_LIST_LIMIT_MAX}."
            )
            return host.error_response(400, message, param="limit")
        newest_first = list(reversed(self._batches.values()))
        after = request.query.get("after")
        if after is not None:
            positions = [i for i, batch in enumerate(newest_first) if batch.id == after]
            if not positions:
                return host.error_response(
                    400, f"Invalid 'after': no batch {after!r}.", param="after"
                )
            newest_first = newest_first[positions[0] + 1 :]
        page = newest_first[:limit]
        return _json(
            {
                "object": "list",
                "data": [batch.as_object() for batch in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(newest_first) > limit,
            }
        )

    async def cancel_batch(self, request: web.Request) -> web.StreamResponse:
        batch = self._batch(request)
        if isinstance(batch, web.Response):
            return batch
        if batch.status in ("validating", "in_progress", "finalizing"):
            batch.stamp("cancelling")
            batch.cancel.set()
        elif batch.status not in ("cancelling", "cancelled"):
            return self._host.error_response(
                409, f"Cannot cancel a batch with status {batch.status!r}.", code=None
            )
        return _json(batch.as_object())

    # -- lifecycle ----------------------------------------------------------------------------

    async def _run(self, batch: _Batch) -> None:
        try:
            await self._lifecycle(batch)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must show, not leave the batch validating for ever
            print(f"fake OpenAI server: batch {batch.id} crashed", file=sys.stderr, flush=True)
            traceback.print_exc(file=sys.stderr)
            batch.errors = [
                _line_error("server_error", "The fake server's batch task crashed.", None)
            ]
            batch.stamp("failed")

    async def _lifecycle(self, batch: _Batch) -> None:
        if await self._work(batch) is None:
            await asyncio.sleep(batch.turnaround_s * _FINALIZING)  # cancelling takes a moment
            self._finish(batch, "cancelled")

    async def _work(self, batch: _Batch) -> bool | None:
        """Take ``batch`` from validating to its end; None when it was cancelled first, which
        leaves the ending to the caller."""
        turnaround = batch.turnaround_s
        if await _pause(batch, turnaround * _VALIDATING):
            return None
        if batch.file_errors or batch.fail_validation:
            batch.errors = batch.file_errors[:_MAX_BATCH_ERRORS] or [dict(_TOKEN_LIMIT)]
            batch.stamp("failed")
            return False

        batch.total = len(batch.lines)
        batch.stamp("in_progress")
        if batch.gate is not None and not await self._host.park(batch.gate, batch.cancel):
            return None
        if await _pause(batch, turnaround * _IN_PROGRESS):
            return None
        answered = len(batch.lines)
        if batch.expire:
            answered = round(batch.expire_fraction * len(batch.lines))
        if not await self._answer(batch, answered):
            return None
        if not batch.expire:
            batch.stamp("finalizing")
        if await _pause(batch, turnaround * _FINALIZING):
            return None
        self._finish(batch, "expired" if batch.expire else "completed")
        return True

    async def _answer(self, batch: _Batch, count: int) -> bool:
        """Answer the batch's first ``count`` lines in order; False once it is cancelled."""
        rng, host = batch.rng, self._host
        for index, line in enumerate(batch.lines[:count]):
            if batch.cancel.is_set():
                return False
            if index and not index % _LINES_PER_YIELD:
                await asyncio.sleep(0)
            # One draw per line whatever its fate keeps the stream aligned with the lines.
            if rng.random() < batch.item_fail_rate:
                batch.record(index, False, _result_line(line.custom_id, None, dict(_ITEM_FAILURE)))
                continue
            answer = await host.answer_line(line.body, rng, batch.cancel)
            if answer is None:
                return False
            self.lines_answered += 1
            status, payload = answer
            response = {"status_code": status, "request_id": secrets.token_hex(16), "body": payload}
            batch.record(index, status == 200, _result_line(line.custom_id, response, None))
        return True

    def _finish(self, batch: _Batch, status: str) -> None:
        """End ``batch`` with ``status``, writing its output and error files."""
        output: list[bytes] = []
        errors: list[bytes] = []
        for index, line in enumerate(batch.lines):
            result = batch.results[index]
            if result is None:
                error = dict(_NOT_EXECUTED[status])
                result = (False, _result_line(line.custom_id, None, error))
                batch.record(index, *result)
            ok, record = result
            (output if ok else errors).append(json.dumps(record).encode() + b"\n")
        batch.total = len(batch.lines)
        if output:
            batch.output_file_id = self._store_output(batch, "output", output)
        if errors:
            batch.error_file_id = self._store_output(batch, "error", errors)
        batch.stamp(status)

    def _store_output(self, batch: _Batch, kind: str, lines: list[bytes]) -> str:
        file = _File(f"{batch.id}_{kind}.jsonl", "batch_output", b"".join(lines))
        self._files[file.id] = file
        return file.id


async def _pause(batch: _Batch, seconds: float) -> bool:
    """Wait ``seconds`` unless the batch is cancelled first; True if it was."""
    if batch.cancel.is_set():
        return True
    try:
        await asyncio.wait_for(batch.cancel.wait(), seconds)
    except TimeoutError:
        return False
    return True


async def _read_part(part: BodyPartReader, limit: int) -> bytes | None:
    """A form part's bytes, or None when it has more than ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await part.read_chunk(1 << 16):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _metadata_problem(metadata: Any) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "metadata must be an object of string values."
    if len(metadata) > _METADATA_PAIRS:
        return f"metadata takes at most {_METADATA_PAIRS} pairs."
    for key, value in metadata.items():
        if len(key) > _METADATA_KEY_CHARS:
            return f"metadata keys have at most {_METADATA_KEY_CHARS} characters."
        if not isinstance(value, str) or len(value) > _METADATA_VALUE_CHARS:
            return f"metadata values are strings of at most {_METADATA_VALUE_CHARS} characters."
    return None
