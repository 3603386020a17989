"""The HTTP API of a served pipeline, on FastAPI (Starlette underneath).

FastAPI because it turns the pydantic models `plait.serve.schema` makes from
``forward`` into request validation (a 422 naming the field) and the OpenAPI schema;
Starlette's `StreamingResponse` carries the server-sent events of ``/stream``.
"""

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from fastapi import Body, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException

from plait.effects import Handler
from plait.module import Module
from plait.serve.jobs import RUNNING, JobStore, UnknownJob
from plait.serve.schema import Failure, JobStatus, Problem
from plait.serve.service import Arguments, Service, failure_status
from plait.serve.strict import printable

T = TypeVar("T")

__all__ = ["app"]


def app(
    pipeline: Module,
    resources: Any = None,
    *,
    jobs_dir: str | os.PathLike[str] | None = None,
    handlers: Sequence[Handler] = (),
    max_concurrent: int | None = None,
    seed: int | None = None,
) -> FastAPI:
    """The ASGI app serving ``pipeline``: mount it in your own server, or run it with
    any ASGI server (``uvicorn.run(plait.serve.app(p))``); ``plait serve`` does that.

    ``resources`` defaults to what the pipeline is bound to; ``handlers`` are entered
    around every request's and job's work; ``max_concurrent`` caps the LLM calls in
    flight for all requests together; ``jobs_dir`` enables the ``/jobs`` endpoints,
    each job a checkpoint directory under it (a server restarted on the same
    directory resumes the jobs left unfinished).
    """
    service = Service(
        pipeline, resources, handlers=handlers, max_concurrent=max_concurrent, seed=seed
    )
    jobs = JobStore(jobs_dir, service) if jobs_dir is not None else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.start()
        if jobs is not None:
            jobs.start()  # each job enters the handlers itself
        try:
            yield
        finally:
            service.draining = True
            if jobs is not None:
                await jobs.stop()
            service.stop()
            from plait.providers.http import close_session

            await close_session()

    name = type(pipeline).__name__
    doc = (type(pipeline).__doc__ or "").strip()
    api = FastAPI(
        title=f"plait: {name}",
        description=doc or f"The {name} pipeline, served by plait.",
        lifespan=lifespan,
    )
    api.state.service = service
    api.state.jobs = jobs
    schemas = service.schemas
    Input, Output, Batch, Rows = schemas.input, schemas.output, schemas.batch, schemas.rows

    @api.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        """422 with FastAPI's list of problems plus one line that names each field and
        what it expected, and what an input is."""
        problems = []
        for error in exc.errors():
            if error.get("type") == "json_invalid":
                reason = (error.get("ctx") or {}).get("error", "")
                at = error.get("loc", ("body", "?"))[-1]
                problems.append(f"the body is not JSON ({reason} at character {at})")
                continue
            where = ".".join(str(part) for part in error.get("loc", ())[1:]) or "the body"
            problems.append(f"{where}: {error.get('msg')}")
        message = (
            f"the request does not fit {name}: {'; '.join(problems)} (an input is an object "
            f"with {_fields(Input)})"
        )
        # The problems may quote what was refused (a NaN, a lone surrogate): as text.
        body = {"detail": jsonable_encoder(exc.errors()), "message": message}
        return JSONResponse(printable(body), 422)

    @api.exception_handler(HTTPException)
    async def unreadable_body(request: Request, exc: HTTPException) -> Response:
        """FastAPI's 400 for a body it could not parse, saying why (too deep, a number
        too long); other HTTP errors as FastAPI answers them."""
        cause = exc.__cause__
        if exc.status_code != 400 or cause is None:
            return await http_exception_handler(request, exc)
        if isinstance(cause, RecursionError):
            why = "it nests deeper than can be read; send flatter data"
        elif isinstance(cause, ValueError) and "digits" in str(cause):
            why = "it holds a number with more digits than are read; send it as a string"
        else:
            why = f"{type(cause).__name__}: {cause}"
        return JSONResponse({"detail": printable(f"the body could not be read: {why}")}, 400)

    def refused() -> JSONResponse | None:
        if service.ready:
            return None
        return JSONResponse({"detail": "the server is shutting down; retry on another"}, 503)

    @api.get("/health", responses={503: {"model": Problem}})
    async def health() -> JSONResponse:
        """Liveness (any answer) and readiness (200: taking requests; 503: starting or
        shutting down)."""
        body = {
            "live": True,
            "ready": service.ready,
            "pipeline": name,
            "in_flight": service.in_flight,
            "jobs_running": 0 if jobs is None else sum(1 for j in jobs.jobs.values() if j.task),
            "max_concurrent": service.concurrency(),
            "endpoints": service.endpoints(),
        }
        return JSONResponse(body, 200 if service.ready else 503)

    @api.post(
        "/invoke",
        response_model=Output,
        responses={
            500: {"model": Failure, "description": "the pipeline's code failed"},
            502: {"model": Failure, "description": "an LLM endpoint behind it failed"},
            503: {"model": Problem},
        },
    )
    async def invoke(request: Request, body: Input = Body(...)) -> Any:  # type: ignore[valid-type]  # noqa: B008
        """One input (forward's parameters, by name) -> its output."""
        if (no := refused()) is not None:
            return no
        with service.scope("/invoke"):
            value = await _unless_gone(request, service.one(*service.arguments(body)))
        if value is None:
            return _gone()
        row = service.row(0, value)
        if "error" in row:
            return JSONResponse({"error": row["error"]}, failure_status(value))
        return JSONResponse({"output": row["output"]})

    @api.post("/batch", response_model=Rows, responses={503: {"model": Problem}})
    async def batch(request: Request, body: Batch = Body(...)) -> Any:  # type: ignore[valid-type]  # noqa: B008
        """Many inputs -> one row each, in input order; a failed input's row holds its
        error, the others are unaffected.  A client that leaves cancels what is still
        running, and its LLM calls."""
        if (no := refused()) is not None:
            return no
        inputs = _arguments(service, body)

        async def collect() -> dict[int, dict[str, Any]]:
            rows: dict[int, dict[str, Any]] = {}
            results = service.rows(inputs)
            try:
                async for position, value in results:
                    rows[position] = service.row(position, value)
            finally:
                await results.aclose()  # cancels what is still running
            return rows

        with service.scope("/batch"):
            rows = await _unless_gone(request, collect())
        if rows is None:
            return _gone()
        return JSONResponse({"rows": [rows[i] for i in range(len(inputs))]})

    @api.post(
        "/stream",
        responses={
            200: {
                "content": {"text/event-stream": {}},
                "description": "a `row` event per input as it finishes (the row of /batch), "
                "then one `summary` event: total, done, failed",
            },
            503: {"model": Problem},
        },
    )
    async def stream(body: Batch = Body(...)) -> Any:  # type: ignore[valid-type]  # noqa: B008
        """Many inputs -> server-sent events, one per input as it finishes, then a
        summary.  A client that disconnects cancels its remaining inputs."""
        if (no := refused()) is not None:
            return no
        inputs = _arguments(service, body)

        async def events() -> AsyncIterator[str]:
            done = failed = 0
            with service.scope("/stream"):
                results = service.rows(inputs)
                try:
                    async for position, value in results:
                        row = service.row(position, value)
                        if "error" in row:
                            failed += 1
                        else:
                            done += 1
                        yield _event("row", row)
                finally:
                    await results.aclose()  # cancels what is still running
            yield _event("summary", {"total": len(inputs), "done": done, "failed": failed})

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    if jobs is not None:
        _job_routes(api, jobs, Batch, schemas.result, refused)
    else:

        @api.api_route(
            "/jobs{rest:path}", methods=["GET", "POST", "DELETE"], include_in_schema=False
        )
        async def no_jobs(rest: str) -> JSONResponse:
            return JSONResponse(
                {
                    "detail": "this server keeps no jobs: start it with --jobs-dir DIR (plait "
                    "serve), or pass jobs_dir= to plait.serve.app"
                },
                404,
            )

    return api


def _job_routes(api: FastAPI, jobs: JobStore, Batch: Any, Result: Any, refused: Any) -> None:
    def unknown(exc: UnknownJob) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, 404)

    missing: dict[int | str, dict[str, Any]] = {404: {"model": Problem}}

    @api.post(
        "/jobs", status_code=202, response_model=JobStatus, responses={503: {"model": Problem}}
    )
    async def submit(body: Batch = Body(...)) -> Any:  # noqa: B008
        """Many inputs -> a job id at once; the job runs in the background, on a
        checkpoint, and survives a restart of the server."""
        if (no := refused()) is not None:
            return no
        raw = [item.model_dump(mode="json", exclude_unset=True) for item in body.inputs]
        job = jobs.submit(raw)
        return JSONResponse(job.status(), 202, headers={"Location": f"/jobs/{job.id}"})

    @api.get("/jobs", response_model=list[JobStatus])
    async def listing() -> Any:
        jobs.start()
        return JSONResponse([job.status() for job in jobs.jobs.values()])

    @api.get("/jobs/{job_id}", response_model=JobStatus, responses=missing)
    async def status(job_id: str) -> Any:
        """A job's state and counts: done, failed, pending."""
        try:
            return JSONResponse(jobs.get(job_id).status())
        except UnknownJob as exc:
            return unknown(exc)

    @api.get(
        "/jobs/{job_id}/result",
        response_model=Result,
        responses={**missing, 409: {"model": Problem, "description": "still running"}},
    )
    async def result(job_id: str) -> Any:
        """An ended job's state and rows, in input order (as /batch gives them): every
        input's once it is done, those that finished (and were paid for) once it is
        cancelled or has failed."""
        try:
            job = jobs.get(job_id)
        except UnknownJob as exc:
            return unknown(exc)
        if job.state == RUNNING:
            counts = job.status()["counts"]
            return JSONResponse(
                {
                    "detail": f"job {job_id} is running ({counts['done']} done, "
                    f"{counts['failed']} failed, {counts['pending']} pending): its result "
                    "exists once it has ended; poll GET /jobs/" + job_id
                },
                409,
            )
        ended: dict[str, Any] = {"state": job.state, "rows": job.results()}
        if job.error is not None:
            ended["error"] = job.error
        return JSONResponse(ended)

    @api.delete("/jobs/{job_id}", response_model=JobStatus, responses=missing)
    async def cancel(job_id: str) -> Any:
        """Cancel a running job (its status says ``cancelled``); a job that has ended
        is deleted, with its directory."""
        try:
            job = jobs.get(job_id)
            if job.state == "running":
                return JSONResponse((await jobs.cancel(job_id)).status())
            jobs.delete(job_id)
        except UnknownJob as exc:
            return unknown(exc)
        return JSONResponse({**job.status(), "deleted": True})


async def _unless_gone(request: Request, work: Awaitable[T]) -> T | None:
    """``work``'s result, or None if the client closes its connection first: then
    ``work`` is cancelled (a request's inputs, and their LLM calls, with it), as a
    stream is when its client leaves."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request cancelled (a shutdown's grace over): both go
        task.cancel()
        gone.cancel()
        await asyncio.wait({task, gone})
        raise
    gone.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def _disconnected(request: Request) -> None:
    """Return once the client has closed its connection (the body is read already:
    what the server receives next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _gone() -> Response:
    """The reply to a client that has left (nobody reads it; the access log shows 499,
    a client that closed its request, as other servers log it)."""
    return Response(status_code=499)


def _arguments(service: Service, body: Any) -> list[Arguments]:
    return [service.arguments(item) for item in body.inputs]


def _fields(model: Any) -> str:
    """``question (string, required), style (string)``: an input's fields, for messages."""
    schema = model.model_json_schema()
    required = set(schema.get("required", ()))
    shown = []
    for field, spec in schema.get("properties", {}).items():
        kind = spec.get("type") or spec.get("$ref", "").rpartition("/")[2] or "any"
        shown.append(f"{field} ({kind}{', required' if field in required else ''})")
    return ", ".join(shown)


def _event(kind: str, data: Any) -> str:
    """One server-sent event (``data`` is one line of JSON)."""
    return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"
