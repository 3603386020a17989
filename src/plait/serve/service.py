"""One pipeline serving many requests: one run, one set of limits, one handler stack.

Every request's inputs run on one long-lived `Run` of the pipeline (one `Engine`): its
run-wide ``max_concurrent`` holds for all requests together, its waiting calls are
served oldest input first, and every request's LLM calls go through the same
endpoints, whose limits (``max_concurrent``, requests and tokens per minute, 429
back-off) the whole process shares.  A request's inputs are numbered from 0 as its
rows are (what the handlers see), and each takes a place on the run as it arrives:
its calls' queue order and seeds, so inputs of concurrent requests never mix their
calls or seeds.

Background jobs (`plait.serve.jobs`) run each on a run of their own, since each is
a checkpointed batch whose inputs are numbered from 0 (what lets a restart resume
it); they share the run-wide limit, the endpoints' limits and the handlers with
everything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from plait.cli.outputs import error_record, json_default
from plait.demos import required_aliases
from plait.effects import Handler, current_run, run_scope
from plait.execution.engine import as_input_failure
from plait.execution.runtime import Run, count_row
from plait.execution.settings import resolve_options
from plait.module import Module, llm_aliases
from plait.options import inputs_in_flight
from plait.providers.base import ProviderError
from plait.resources.limits import PriorityLimiter
from plait.resources.manager import ResourceManager
from plait.serve.schema import Schemas, schemas_of
from plait.serve.strict import printable, problem
from plait.values import Value, error_value

__all__ = ["Arguments", "Service", "UnservableOutput"]

#: One input's ``(args, kwargs)`` for ``forward``.
Arguments = tuple[tuple[Any, ...], dict[str, Any]]


class UnservableOutput(TypeError):
    """The pipeline's output has no JSON form, so it cannot be sent as a reply."""


class Service:
    """The pipeline behind the HTTP endpoints, independent of any web framework."""

    def __init__(
        self,
        module: Module,
        resources: Any = None,
        *,
        handlers: Sequence[Handler] = (),
        max_concurrent: int | None = None,
        seed: int | None = None,
    ) -> None:
        self.module = module
        self.schemas: Schemas = schemas_of(module)
        bound_resources, bound_config = module._binding()
        self.resources = ResourceManager.coerce(
            resources if resources is not None else bound_resources
        )
        self.resources.check_aliases(required_aliases(module))
        self.handlers = tuple(handlers)
        options = {"resources": self.resources, "max_concurrent": max_concurrent, "seed": seed}
        self.opts = resolve_options(options, bound_config, None)
        # Requests are not resumable (a job is): no checkpoint for the shared run, and
        # the batch options a bind() may hold mean nothing here.
        self.opts.update(checkpoint_dir=None, workers=None, ray_address=None, backend=None)
        #: Inputs one request keeps running at once (as a batch's window).
        self.window = inputs_in_flight(self.opts)
        self._run: Run | None = None
        #: Each input's place on the shared run, as it arrives (`Engine.run_input`).
        self._order = itertools.count()
        #: Set once shutdown has begun: new work is refused, health says not ready.
        self.draining = False
        #: Inputs of requests (not jobs) running now.
        self.in_flight = 0

    # -- life ------------------------------------------------------------------------
    def start(self) -> Run:
        """Make the shared run (its seed drawn once, from the pipeline's `Rng` if any):
        at the app's startup, or at its first request when the app is mounted in
        another whose lifespan does not reach it."""
        if self._run is None:
            if self.draining:
                raise RuntimeError("the service has stopped")
            self._run = Run(self.module, self.opts, batch=True)
        return self._run

    def stop(self) -> None:
        self.draining = True
        if self._run is not None:
            self._run.close()
            self._run = None

    @property
    def ready(self) -> bool:
        return not self.draining

    @property
    def limiter(self) -> PriorityLimiter:
        """The run-wide limit (``max_concurrent``): every request's calls and every
        job's take a slot of it."""
        return self.start().engine.limiter

    def concurrency(self) -> dict[str, int]:
        """The run-wide limit now: its slots, the calls holding one (requests' and
        jobs') and those waiting for one."""
        if self._run is None:  # not started, or stopped: nothing runs
            return {"limit": int(self.opts["max_concurrent"]), "in_flight": 0, "waiting": 0}
        limiter = self._run.engine.limiter
        return {"limit": limiter.limit, "in_flight": limiter.held, "waiting": limiter.waiting}

    def endpoints(self) -> dict[str, dict[str, int]]:
        """Each alias's concurrency now: its limit, the calls holding a slot (this whole
        process's, jobs included) and those waiting for one."""
        shown = {}
        for alias in sorted(llm_aliases(self.module)):
            limiter = self.resources.endpoint(alias).limiter
            shown[alias] = {
                "limit": limiter.limit,
                "in_flight": limiter.held,
                "waiting": limiter.waiting,
            }
        return shown

    @contextlib.contextmanager
    def scope(self, request: str | None = None) -> Iterator[None]:
        """The handler stack every request and job runs in (entered per task: a
        handler keeps no per-entry state on itself, so sharing one is safe).

        With ``request`` (the route), the block is also a run of its own for the
        handlers that hook runs (`plait.effects.run_scope`): a request's calls make one
        trace under `plait.handlers.otel`, as a batch's do under ``plait run``, though
        every request shares the one engine.  A job is a run already (`Run.drive`).
        """
        with contextlib.ExitStack() as stack:
            for handler in self.handlers:
                stack.enter_context(handler)
            if request is not None:
                stack.enter_context(
                    run_scope(self.start().message(backend="serve", request=request))
                )
            yield

    # -- inputs ----------------------------------------------------------------------
    def arguments(self, body: BaseModel) -> Arguments:
        """A validated input as ``forward``'s arguments: the fields the request set
        (``forward``'s own defaults fill the rest), positional-only ones by position."""
        given = body.model_fields_set
        args = tuple(getattr(body, name) for name in self.schemas.positional if name in given)
        kwargs = {
            name: getattr(body, name)
            for name in type(body).model_fields
            if name in given and name not in self.schemas.positional
        }
        return args, kwargs

    async def one(self, args: tuple[Any, ...], kwargs: dict[str, Any], index: int = 0) -> Value:
        """Run one input (row ``index`` of its request) on the shared run; a failure
        inside the pipeline is its ERROR `Value`, never an exception (a cancellation of
        the request propagates)."""
        run = self.start()
        self.in_flight += 1
        try:
            value = await run.one(index, args, kwargs, next(self._order))
        except BaseException as exc:
            failure = as_input_failure(exc)
            if failure is None:
                raise
            value = error_value(failure, module_path=f"{type(self.module).__name__}.forward")
        finally:
            self.in_flight -= 1
        request = current_run()
        if request is not None:  # the rows a request's run delivered (`scope`)
            count_row(request, value.is_error)
        return value

    async def rows(self, inputs: Sequence[Arguments]) -> AsyncGenerator[tuple[int, Value]]:
        """``(position, value)`` of each input as it finishes, at most `window` running
        at once.  Closing the iterator early (a client that went away) cancels the
        inputs still running, and their LLM calls with them."""
        slots = asyncio.Semaphore(self.window)
        done: asyncio.Queue[tuple[int, Value]] = asyncio.Queue()

        async def run(position: int, arguments: Arguments) -> None:
            async with slots:
                value = await self.one(*arguments, position)
            done.put_nowait((position, value))

        tasks = [asyncio.create_task(run(i, arguments)) for i, arguments in enumerate(inputs)]
        try:
            for _ in tasks:
                yield await done.get()
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks)

    # -- replies ---------------------------------------------------------------------
    def row(self, position: int, value: Value) -> dict[str, Any]:
        """One input's row: ``{"index", "output"}``, or ``{"index", "error"}``; always
        strict JSON (`plait.serve.strict`).  An output with no strict JSON form (a NaN,
        a lone surrogate, an object that is not data) is that row's error, saying which
        value and why: one odd value never costs the reply its other rows."""
        if not value.is_error:
            try:
                output = jsonable(value.payload)
                found = problem(output, "output")
                if found is None:
                    return {"index": position, "output": output}
                why = f"{found}; return finite numbers and whole text"
            except Exception as exc:
                why = (
                    f"the output ({type(value.payload).__name__}) has no JSON form: "
                    f"{type(exc).__name__}: {exc}; return text, numbers, lists, dicts, "
                    "pydantic models or dataclasses of those"
                )
            value = error_value(
                UnservableOutput(why), module_path=f"{type(self.module).__name__} output"
            )
        return {"index": position, "error": printable(error_body(value))}


def jsonable(payload: Any) -> Any:
    """``payload`` as JSON data: pydantic models, dataclasses and sets included; what is
    code rather than data (a function, a lock) raises."""
    return to_jsonable_python(payload, fallback=json_default)


def error_body(value: Value) -> dict[str, Any]:
    """An ERROR `Value` as the reply's ``error`` object: its kind, cause (type, message,
    module) and traceback, all scrubbed of secrets where the value was made."""
    record = error_record(value)
    return {"kind": "ERROR", **record, "traceback": value.meta.get("traceback")}


def failure_status(value: Value) -> int:
    """The HTTP status of an invoke whose pipeline failed: 502 when an LLM endpoint
    behind it failed (after its retries: the gateway's fault, worth retrying later),
    500 when the pipeline's own code did."""
    return 502 if isinstance(value.payload, ProviderError) else 500
