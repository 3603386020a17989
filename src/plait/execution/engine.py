"""The engine: runs traced graphs so that every node starts the moment its inputs exist.

One `Engine` serves one call (a single input or a whole batch).  Each input is
traced into its own graph; nodes are started by completion callbacks (no task
waits on another), LLM calls become ``"llm"`` messages on the handler stack, and
their default action takes a slot from the endpoint's process-wide limiter and
the run-wide limiter before it sends the request.  Waiters are served by input
index, so the oldest inputs finish first and the window of inputs moves on; once
the batch has no more inputs to admit, they are served tallest-first (longest
chain of calls still ahead), which keeps the final wave from being stretched by
a dependency chain.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from plait.handlers.stack import Message, apply_stack
from plait.providers.base import LLMRequest, LLMResponse
from plait.resources.endpoint import CallTiming
from plait.resources.limits import Priority, PriorityLimiter
from plait.resources.manager import ResourceManager
from plait.tracing.graph import Graph, Node, as_text, resolve
from plait.tracing.tracer import module_paths, trace
from plait.values import ExecutionError, Value, ValueKind, error_value, kind_of

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["Engine", "current_engine"]

#: The engine whose node is running here: module calls made inside an
#: ``async def forward`` go through it (same limits, same handlers).
current_engine: contextvars.ContextVar[Engine | None] = contextvars.ContextVar(
    "plait_engine", default=None
)
_current_node: contextvars.ContextVar[tuple[int, str] | None] = contextvars.ContextVar(
    "plait_node", default=None
)


class _CallPriority(Priority):
    """Input order while a batch is being admitted; critical path first once it drains."""

    __slots__ = ("engine", "height", "index")

    def __init__(self, engine: Engine, index: int, height: int) -> None:
        self.engine = engine
        self.index = index
        self.height = height

    def key(self) -> tuple[float, ...]:
        return (-self.height if self.engine.draining else 0, self.index)


class Engine:
    def __init__(
        self, root: Module, resources: ResourceManager, max_concurrent: int, draining: bool = True
    ) -> None:
        self.root = root
        self.resources = resources
        self.paths = module_paths(root)
        self.limiter = PriorityLimiter(max_concurrent)
        #: False while a batch still has inputs to admit (see `_CallPriority`).
        self.draining = draining
        self.aliases = {m.alias for m in root.modules() if m._calls_llm}  # type: ignore[attr-defined]
        resources.check_aliases(self.aliases)

    def start_draining(self) -> None:
        """The batch has no inputs left to admit: re-rank waiting calls tallest-first."""
        if self.draining:
            return
        self.draining = True
        self.limiter.reorder()
        for alias in self.aliases:
            self.resources.endpoint(alias).limiter.reorder()

    # -- one input -------------------------------------------------------------------
    async def run_input(
        self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Value, Graph | None, dict[int, Value]]:
        """Trace and execute one input; never raises for failures inside the pipeline."""
        try:
            graph = trace(self.root, args, kwargs, self.paths)
        except Exception as exc:
            return error_value(exc, module_path=f"{type(self.root).__name__}.forward"), None, {}
        results = await self.execute(graph, index, "")
        return self.output_of(graph, results), graph, results

    def output_of(self, graph: Graph, results: dict[int, Value]) -> Value:
        failures = [v for v in results.values() if v.kind is ValueKind.ERROR]
        if failures:
            original = [v for v in failures if not v.meta.get("short_circuited")] or failures
            first = original[0]
            meta = dict(first.meta)
            meta["errors"] = [
                {k: v.meta.get(k) for k in ("module_path", "error_type", "message")}
                for v in original
            ]
            return Value(ValueKind.ERROR, first.payload, ref=first.ref, meta=meta)
        try:
            payload = resolve(graph.output, results)
        except Exception as exc:
            return error_value(exc, module_path=f"{type(self.root).__name__} output")
        return Value(kind_of(payload), payload)

    # -- a graph ---------------------------------------------------------------------
    async def execute(self, graph: Graph, index: int, prefix: str) -> dict[int, Value]:
        """Run every node of ``graph``; returns each node's Value (errors included)."""
        run = _GraphRun(self, graph, index, prefix)
        return await run.wait()

    async def _run_node(
        self,
        node: Node,
        results: dict[int, Value],
        priority: _CallPriority,
        prefix: str,
        upstream: list[str],
    ) -> Value:
        index = priority.index
        module = node.module
        assert module is not None
        try:
            args = tuple(resolve(a, results) for a in node.args)
            kwargs = {k: resolve(v, results) for k, v in node.kwargs.items()}
            if module._calls_llm:
                return await self._run_llm(node, module, args, kwargs, priority, prefix, upstream)
            token = _current_node.set((index, prefix + node.key + "/"))
            try:
                msg = Message(
                    type="module",
                    name=node.path,
                    fn=module.forward,
                    args=args,
                    kwargs=kwargs,
                    module=module,
                    node_id=prefix + node.key,
                    input_index=index,
                    meta={"upstream": upstream},
                )
                engine_token = current_engine.set(self)
                try:
                    payload = await apply_stack(msg)
                finally:
                    current_engine.reset(engine_token)
            finally:
                _current_node.reset(token)
            return Value(
                kind_of(payload), payload, ref=f"node:{node.id}", meta={"module_path": node.path}
            )
        except Exception as exc:
            return error_value(exc, module_path=node.path, ref=f"node:{node.id}")

    async def _run_llm(
        self,
        node: Node,
        module: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        priority: _CallPriority,
        prefix: str,
        upstream: list[str],
    ) -> Value:
        prompt = args[0] if args else kwargs["prompt"]
        messages: list[dict[str, Any]] = []
        system = module.system_prompt
        if system is not None:
            messages.append({"role": "system", "content": as_text(system.value)})
        messages.append({"role": "user", "content": as_text(prompt)})
        request = LLMRequest(
            alias=module.alias,
            messages=messages,
            temperature=module.temperature,
            max_tokens=module.max_tokens,
            response_format=module.response_format,
        )

        timing = CallTiming()

        def send(request: LLMRequest) -> Coroutine[Any, Any, LLMResponse]:
            return self._send(request, priority, timing)

        msg = Message(
            type="llm",
            name=node.path,
            fn=send,
            kwargs={"request": request},
            module=module,
            node_id=prefix + node.key,
            input_index=priority.index,
            # For handlers: where each alias leads, where this call's time went, and the
            # calls it waited for (node ids), which is what a profiler's critical path needs.
            meta={"resources": self.resources, "timing": timing, "upstream": upstream},
        )
        reply = await apply_stack(msg)
        meta: dict[str, Any] = {"module_path": node.path}
        if isinstance(reply, LLMResponse):
            meta["usage"] = reply.usage
            payload = reply.payload
            kind = ValueKind.STRUCTURED if reply.parsed is not None else ValueKind.TEXT
        else:
            payload = reply.payload if isinstance(reply, Value) else reply
            kind = kind_of(payload)
        return Value(kind, payload, ref=f"node:{node.id}", meta=meta)

    async def _send(
        self, request: LLMRequest, priority: _CallPriority, timing: CallTiming
    ) -> LLMResponse:
        queued = time.monotonic()
        await self.limiter.acquire(priority)
        try:
            timing.add("queue", queued, time.monotonic(), limit="run")
            endpoint = self.resources.endpoint(request.alias)
            return await endpoint.complete(request, priority, timing)
        finally:
            self.limiter.release()

    # -- module calls made inside an async forward -------------------------------------
    async def call_module(
        self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        where = _current_node.get()
        index, prefix = where if where is not None else (0, "eager/")
        graph = trace(module, args, kwargs, self.paths)
        results = await self.execute(graph, index, prefix)
        value = self.output_of(graph, results)
        if value.kind is ValueKind.ERROR:
            raise ExecutionError(value)
        return value.payload


class _GraphRun:
    """One graph in flight: starts each node as soon as its last input is in.

    A node's own task completes it, so its dependents start in the same step of the
    loop; nothing here refers back to itself once the graph has finished, so a
    finished input is freed by reference counting rather than the cycle collector.
    """

    __slots__ = (
        "engine",
        "finished",
        "graph",
        "heights",
        "index",
        "prefix",
        "remaining",
        "results",
        "tasks",
        "waiting",
    )

    def __init__(self, engine: Engine, graph: Graph, index: int, prefix: str) -> None:
        self.engine = engine
        self.graph = graph
        self.index = index
        self.prefix = prefix
        self.results: dict[int, Value] = {}
        self.waiting = [len(node.deps) for node in graph.nodes]
        self.heights = graph.heights()
        self.remaining = len(graph.nodes)
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished: asyncio.Future[None] | None = None

    async def wait(self) -> dict[int, Value]:
        if self.remaining:
            self.finished = asyncio.get_running_loop().create_future()
            for node in self.graph.nodes:
                if not node.deps:
                    self.start(node)
            try:
                await self.finished
            except asyncio.CancelledError:
                for task in self.tasks:
                    task.cancel()
                raise
            finally:
                self.finished = None
        return self.results

    def start(self, node: Node) -> None:
        results = self.results
        for dep in node.deps:
            upstream = results[dep]
            if upstream.kind is ValueKind.ERROR:
                failed = error_value(
                    upstream.payload, module_path=node.path, ref=f"node:{node.id}", cause=upstream
                )
                self.complete(node, failed)
                return
        if node.kind == "op":
            self.complete(node, _apply_op(node, results))
            return
        self.tasks.add(asyncio.get_running_loop().create_task(self.run(node)))

    async def run(self, node: Node) -> None:
        priority = _CallPriority(self.engine, self.index, self.heights[node.id])
        upstream = [self.prefix + self.graph.nodes[d].key for d in self.graph.call_deps(node.id)]
        value = await self.engine._run_node(node, self.results, priority, self.prefix, upstream)
        task = asyncio.current_task()
        if task is not None:
            self.tasks.discard(task)
        self.complete(node, value)

    def complete(self, node: Node, value: Value) -> None:
        self.results[node.id] = value
        self.remaining -= 1
        waiting, nodes = self.waiting, self.graph.nodes
        for dependent in node.dependents:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                self.start(nodes[dependent])
        if self.remaining == 0 and self.finished is not None and not self.finished.done():
            self.finished.set_result(None)


def _apply_op(node: Node, results: dict[int, Value]) -> Value:
    try:
        args = [resolve(a, results) for a in node.args]
        kwargs = {k: resolve(v, results) for k, v in node.kwargs.items()}
        assert node.op is not None
        payload = node.op(*args, **kwargs)
    except Exception as exc:
        return error_value(exc, module_path=node.path, ref=f"node:{node.id}")
    return Value(kind_of(payload), payload, ref=f"node:{node.id}")
