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
import contextlib
import threading
from collections.abc import Callable, Coroutine
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeVar

from plait._digest import hex_digest
from plait.demos import embedding_alias, needs_ranking, required_aliases
from plait.effects import (
    Handler,
    Message,
    apply_stack,
    current_stack,
    find_interpreter,
    postprocess_stack,
    process_stack,
)
from plait.execution.calls import CallSite, NodeScope
from plait.execution.embeddings import PoolEmbeddings
from plait.parameter import release_snapshot, snapshot_values, use_snapshot
from plait.providers.base import LLMRequest
from plait.resources.limits import Priority, PriorityLimiter
from plait.resources.manager import ResourceManager
from plait.sampling import CallCounts, with_seed
from plait.tracing.graph import Graph, Node, resolve
from plait.tracing.tracer import Tracer, TracingError, module_paths, trace
from plait.values import ExecutionError, Value, ValueKind, error_value, kind_of

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["Engine", "ForwardAborted", "as_input_failure"]

T = TypeVar("T")


class ForwardAborted(RuntimeError):
    """A forward (or a handler) raised a BaseException that is not about the run: its
    input's failure, like any other exception (the original is ``__cause__``)."""


def as_input_failure(exc: BaseException) -> Exception | None:
    """What a BaseException raised by pipeline code means for its input, or None when it
    is about the run and must propagate.

    ``sys.exit()`` and a ``CancelledError`` the code raised itself (its task was not
    cancelled) fail that input only: let through, they would kill plait's event loop
    or leave the input's waiters pending forever.  A ``KeyboardInterrupt`` off the main
    thread is raised by code too (signals reach only the main thread); on it, it is
    Ctrl-C and stops the run.
    """
    if isinstance(exc, Exception):
        return exc
    if isinstance(exc, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            return None  # a real cancellation of the run
    elif isinstance(exc, KeyboardInterrupt):
        if threading.current_thread() is threading.main_thread():
            return None
    elif not isinstance(exc, SystemExit):
        return None
    detail = str(exc)
    failure = ForwardAborted(
        f"forward raised {type(exc).__name__}{': ' + detail if detail else ''} (plait makes "
        "it this input's failure; raise an ordinary exception to fail an input)"
    )
    failure.__cause__ = exc
    return failure


class _CallPriority(Priority):
    """The run's rank first (`Engine.rank`); then input order while a batch is being
    admitted, critical path first once it drains.  ``index`` is the call's input,
    ``order`` where that input queues among the engine's (`Engine.run_input`).

    A graph node's call gives its graph run and node instead of a ``height``: the
    height (`Graph.heights`) is worked out the first time a key needs it, which is
    only once the batch drains, and never for a call that finds a free slot.
    """

    __slots__ = ("_height", "_node", "_run", "engine", "index", "order")

    def __init__(
        self,
        engine: Engine,
        index: int,
        height: int | None,
        order: int | None = None,
        run: _GraphRun | None = None,
        node: int = 0,
    ) -> None:
        self.engine = engine
        self.index = index
        self._height = height
        self.order = index if order is None else order
        self._run = run
        self._node = node

    @property
    def height(self) -> int:
        """The longest chain of calls from this one to the end of its input's graph."""
        if self._height is None:
            assert self._run is not None
            self._height = self._run.height(self._node)
        return self._height

    def key(self) -> tuple[float, ...]:
        engine = self.engine
        return (engine.rank, -self.height if engine.draining else 0, self.order)


class Engine:
    def __init__(
        self,
        root: Module,
        resources: ResourceManager,
        max_concurrent: int,
        draining: bool = True,
        seed: int | None = None,
    ) -> None:
        self.root = root
        #: The run seed (`plait.sampling`): each LLM call sends a seed derived from it.
        self.seed = seed
        #: Seeded calls made so far per input (by its order), call site and request.
        self.site_calls: dict[int | None, CallCounts] = {}
        self.resources = resources
        self.paths = module_paths(root)
        self.params = list(root.parameters())
        self.limiter = PriorityLimiter(max_concurrent)
        #: False while a batch still has inputs to admit (see `_CallPriority`).
        self.draining = draining
        #: Where this run's calls queue for an endpoint's slots among other runs' in the
        #: process: a run of a higher rank waits behind every lower one (a served
        #: pipeline's background jobs behind its interactive requests, `plait.serve`).
        self.rank = 0
        #: Aliases this run has sent requests to; endpoints are built at the first send.
        self.aliases: set[str] = set()
        #: Whether an input of this run has been traced, and the `TracingError` of the
        #: run's first trace: a mistake in the pipeline's code rather than in one input,
        #: which a batch reports once, before anything is paid for (see `run_input`).
        self.traced = False
        self.code_error: TracingError | None = None
        resources.check_aliases(required_aliases(root))
        #: Each call site's prompt-cache key (`LLMRequest.cache_key`), by module path.
        self.cache_keys: dict[str, str] = {}
        #: Pool inputs embedded for demonstrations an embedding alias ranks.
        self.embeddings = PoolEmbeddings()

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
        self, index: int, args: tuple[Any, ...], kwargs: dict[str, Any], order: int | None = None
    ) -> tuple[Value, Graph | None, dict[int, Value]]:
        """Trace and execute one input; never raises for failures inside the pipeline.

        ``index`` is the input's place in its batch: what its calls' messages and
        checkpoint entries say.  ``order`` (the index by default) is its place among
        every input the engine is running, unique on it: what its calls' seeds derive
        from, where they queue and what its per-input state is kept under.  They differ
        on an engine that runs several batches at once, each numbered from 0 (a served
        pipeline's requests).

        Parameters are read as they are when the input starts: the whole input runs
        with those values even if an optimizer updates them meanwhile.
        """
        order = index if order is None else order
        token = use_snapshot(snapshot_values(self.params))
        try:
            try:
                graph = trace(self.root, args, kwargs, self.paths)
            except BaseException as exc:
                failure = as_input_failure(exc)
                if failure is None:
                    raise
                if isinstance(exc, TracingError) and not self.traced:
                    # The first input traced fails: the code is wrong (a batch driver
                    # stops the run with it); once one input traced, it is that input's.
                    self.code_error = exc
                failed = error_value(failure, module_path=f"{type(self.root).__name__}.forward")
                return failed, None, {}
            self.traced = True
            results = await self.execute(graph, index, "", order)
            return self.output_of(graph, results), graph, results
        finally:
            release_snapshot(token)
            self.site_calls.pop(order, None)

    def code_error_of(self) -> None:
        """Raise the `TracingError` of the run's first trace, if it failed."""
        if self.code_error is not None:
            raise self.code_error

    def output_of(self, graph: Graph, results: dict[int, Value]) -> Value:
        """The input's result: its output, or its first failure in the order the calls
        were written (not the order they failed in, which depends on timing), with
        every failure listed in ``meta["errors"]``."""
        failed = [
            (node_id, value)
            for node_id, value in results.items()
            if value.kind is ValueKind.ERROR and not value.meta.get("recovered")
        ]
        if failed:
            # Sorted only when something failed: an input that succeeded pays no sort.
            failures = [value for _, value in sorted(failed, key=itemgetter(0))]
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
    def execute(
        self, graph: Graph, index: int, prefix: str, order: int | None = None
    ) -> Coroutine[Any, Any, dict[int, Value]]:
        """Run every node of ``graph`` (of input ``index``, queued as ``order``: see
        `run_input`); returns each node's Value (errors included).

        The coroutine to await is the run's own (no frame here on the input's chain)."""
        return _GraphRun(self, graph, index, prefix, index if order is None else order).wait()

    async def _run_module(
        self,
        node: Node,
        module: Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        index: int,
        prefix: str,
        upstream: list[str],
        scope: str | None = None,
        order: int | None = None,
    ) -> Value:
        """A leaf module that is not an LLM call: its forward on real values, through the
        handlers, with module calls made inside it run on this run (`NodeScope`)."""
        msg = Message(
            type="module",
            name=node.path,
            fn=module.forward if module._has_async_forward() else self._leaf(module),
            args=args,
            kwargs=kwargs,
            module=module,
            node_id=prefix + node.key,
            input_index=index,
            meta={"upstream": upstream, "scope": scope},
        )
        with NodeScope(self, index, prefix + node.key + "/", order):
            payload = await apply_stack(msg)
        return Value(
            kind_of(payload), payload, ref=f"node:{node.id}", meta={"module_path": node.path}
        )

    def _call_llm(
        self,
        node: Node,
        module: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        priority: _CallPriority,
        prefix: str,
        upstream: Callable[[], list[str]],
        scope: str | None = None,
    ) -> Coroutine[Any, Any, Value]:
        """An `LLMInference` call: its request, on the one path every LLM call takes
        (`plait.execution.calls`), once per sample.  Returns the coroutine to await (for
        one sample, the call's own); ``upstream`` gives the ids of the calls it waited
        for, asked only when a handler sees the call."""
        prompt = args[0] if args else kwargs["prompt"]
        order = priority.order
        site = CallSite(
            node.path,
            self.resources,
            run=self,
            index=priority.index,
            node_id=prefix + node.key,
            priority=priority,
            run_seed=self.seed,
            counts=self.counts(order),
            scope=scope,
            order=order,
        )
        if module.demos is not None:
            demos = module.demos.current()
            alias = embedding_alias(demos)
            if alias is not None and needs_ranking(demos):
                return self._call_llm_ranked(node, module, prompt, demos, alias, site, upstream)
        return self._llm_requests(node, module, module.messages(prompt), site, upstream)

    async def _call_llm_ranked(
        self,
        node: Node,
        module: Any,
        prompt: Any,
        demos: Any,
        alias: str,
        site: CallSite,
        upstream: Callable[[], list[str]],
    ) -> Value:
        """`_call_llm` for a call whose demonstrations an embedding alias ranks: the
        pool's similarities to the input first (`plait.execution.embeddings`)."""
        text = module.input_text(prompt)
        similarity = await self.embeddings.similarities(site, alias, demos["pool"], text)
        return await self._llm_requests(
            node, module, module.messages(prompt, similarity), site, upstream
        )

    def _llm_requests(
        self,
        node: Node,
        module: Any,
        messages: list[dict[str, Any]],
        site: CallSite,
        upstream: Callable[[], list[str]],
    ) -> Coroutine[Any, Any, Value]:
        """The call's request(s) for ``messages``, once per sample, invoked at ``site``."""
        request = LLMRequest(
            alias=module.alias,
            messages=messages,
            temperature=module.temperature,
            max_tokens=module.max_tokens,
            response_format=module.response_format,
            # Only a call that answers with labels has a method to read.
            label_method=module.label_method if module.response_format is not None else None,
            validate=module.validate,
            max_reasks=module.max_reasks,
            max_tokens_per_call=module.max_tokens_per_call,
            # All but the input's own message are the site's (system prompt, demos).
            prefix_messages=len(messages) - 1,
            cache_key=self.cache_keys.get(node.path) or self._cache_key(node.path),
        )
        # One node: its samples differ by their seeds.
        n = module.n
        seeds = site.seeds(request, n)
        ref = f"node:{node.id}"
        if seeds is None and n == 1:  # the usual call: no list, no gathering
            return _invoke_call(module, site, request, upstream, ref)
        calls = [request] * n if seeds is None else [with_seed(request, s) for s in seeds]
        return _node_calls(node, module, site, calls, upstream, ref)

    def _cache_key(self, path: str) -> str:
        """The prompt-cache key of the call site at ``path``: the same for every input
        and every run of this pipeline, so the provider routes its calls to one cache."""
        root = type(self.root)
        key = self.cache_keys[path] = "plait-" + hex_digest(
            f"{root.__module__}.{root.__qualname__}:{path}", size=12
        )
        return key

    # -- what the run's call sites ask of it (`plait.execution.calls.RunCalls`) ---------
    def counts(self, order: int | None) -> CallCounts:
        """The calls the input queued as ``order`` (`run_input`) has made so far, per
        (call site, request): a graph node runs once, but code running on real values
        (an ``async def forward``, a functional call in a loop) may call from one site
        again and again."""
        sites = self.site_calls.get(order)
        if sites is None:
            sites = self.site_calls[order] = CallCounts()
        return sites

    def priority(self, index: int, height: int, order: int | None = None) -> Priority:
        return _CallPriority(self, index, height, order)

    # -- module calls made from code that runs on real values -------------------------
    async def call_module(
        self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A module call inside an ``async def forward``: traced and run on this engine."""
        return await self.run_recorded(trace(module, args, kwargs, self.paths))

    async def run_recorded(self, graph: Graph) -> Any:
        """Run calls recorded by code that had real values (an async forward, a leaf's
        sync forward, a backward) where that code runs: same limits and handlers."""
        scope = find_interpreter(NodeScope)
        if scope is not None:
            results = await self.execute(graph, scope.index, scope.prefix, scope.order)
        else:
            results = await self.execute(graph, 0, "eager/")
        value = self.output_of(graph, results)
        if value.kind is ValueKind.ERROR:
            raise ExecutionError(value)
        return value.payload

    def _leaf(self, module: Module) -> Callable[..., Any]:
        """A leaf's sync forward, run on real values with its module calls recorded.

        A module with no registered submodules is a leaf, yet its forward may still
        call modules (kept in a plain list or dict, say): those calls are traced
        and run here, so a sync forward never receives an un-awaited coroutine.
        """

        def forward(*args: Any, **kwargs: Any) -> Any:
            tracer = Tracer(self.paths, lift_parameters=False)
            with tracer:
                out = module.forward(*args, **kwargs)
            if not tracer.graph.nodes:
                return out
            tracer.graph.output = tracer.capture(out, set(), {})
            return self.run_recorded(tracer.graph)

        return forward


class _GraphRun:
    """One graph in flight: starts each node as soon as its last input is in.

    A node's own task completes it, so its dependents start in the same step of the
    loop; nothing here refers back to itself once the graph has finished, so a
    finished input is freed by reference counting rather than the cycle collector.
    """

    __slots__ = (
        "calls",
        "engine",
        "finished",
        "graph",
        "heights",
        "index",
        "order",
        "prefix",
        "remaining",
        "results",
        "tasks",
        "waiting",
    )

    def __init__(self, engine: Engine, graph: Graph, index: int, prefix: str, order: int) -> None:
        self.engine = engine
        self.graph = graph
        self.index = index
        self.order = order
        self.prefix = prefix
        self.results: dict[int, Value] = {}
        self.waiting = [len(node.deps) for node in graph.nodes]
        #: Each node's height, worked out when a waiting call's priority first needs one.
        self.heights: list[int] | None = None
        self.remaining = len(graph.nodes)
        self.tasks: set[asyncio.Task[None]] = set()
        self.finished: asyncio.Future[None] | None = None
        #: Composite calls between their enter and exit: message, stack, handlers seen.
        self.calls: dict[int, tuple[Message, tuple[Handler, ...], int]] = {}

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
        if node.scope is not None and results[node.scope].meta.get("skip_inside"):
            # A handler answered the composite call this node belongs to.
            self.complete(node, Value(ValueKind.OTHER, None, meta=dict(_SKIPPED)))
            return
        if node.kind == "exit":
            self.exit(node)
            return
        for dep in node.deps:
            upstream = results[dep]
            if upstream.kind is ValueKind.ERROR:
                self.complete(node, _short_circuit(node, upstream))
                return
        if node.kind == "op":
            self.complete(node, _apply_op(node, results))
            return
        if node.kind == "enter":
            self.enter(node)
            return
        self.tasks.add(asyncio.get_running_loop().create_task(self.run(node)))

    # -- composite calls: handlers process at enter, postprocess at exit ----------------
    def enter(self, node: Node) -> None:
        results = self.results
        try:
            args = tuple([resolve(a, results) for a in node.args])
            kwargs = {k: resolve(v, results) for k, v in node.kwargs.items()}
        except Exception as exc:
            self.complete(node, error_value(exc, module_path=node.path, ref=f"node:{node.id}"))
            return
        if node.handlers:
            # Blocks a forward entered around this call: its handlers see it from there.
            self._spawn(node, _within(node.handlers, self._enter_within(node, args, kwargs)))
            return
        stack = current_stack()
        if stack:
            stack = tuple([h for h in stack if type(h).sees("module")])
        if not stack:
            self.complete(node, Value(ValueKind.OTHER, (args, kwargs)))
            return
        self._spawn(node, self._process(node, self._call_message(node, args, kwargs), stack))

    async def _enter_within(
        self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Value:
        """`enter`, inside the blocks the node was recorded in."""
        stack = tuple([h for h in current_stack() if type(h).sees("module")])
        if not stack:
            return Value(ValueKind.OTHER, (args, kwargs))
        return await self._process(node, self._call_message(node, args, kwargs), stack)

    def _call_message(self, node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Message:
        """The ``"module"`` message of the composite call ``node`` enters."""
        return Message(
            type="module",
            name=node.path,
            args=args,
            kwargs=kwargs,
            module=node.module,
            node_id=self.prefix + node.key,
            input_index=self.index,
            meta={
                "composite": True,
                "upstream": self.upstream(node),
                "scope": self.scope(node),
            },
        )

    async def _process(self, node: Node, msg: Message, stack: tuple[Handler, ...]) -> Value:
        try:
            seen = await process_stack(msg, stack)
        except BaseException as exc:
            failure = as_input_failure(exc)
            if failure is None:
                raise
            return error_value(failure, module_path=node.path, ref=f"node:{node.id}")
        self.calls[node.id] = (msg, stack, seen)
        if msg.done:
            return Value(ValueKind.OTHER, None, meta={"skip_inside": True})
        return Value(ValueKind.OTHER, (msg.args, msg.kwargs))

    def exit(self, node: Node) -> None:
        assert node.pair is not None
        results = self.results
        failed = [results[d] for d in node.deps if results[d].kind is ValueKind.ERROR]
        call = self.calls.pop(node.pair, None)
        if call is None:
            if failed:
                self.complete(node, _short_circuit(node, failed[0]))
                return
            self.complete(node, _resolve_output(node, results))
            return
        work = self._postprocess(node, call, failed)
        self._spawn(node, _within(node.handlers, work) if node.handlers else work)

    async def _postprocess(
        self,
        node: Node,
        call: tuple[Message, tuple[Handler, ...], int],
        failed: list[Value],
    ) -> Value:
        msg, stack, seen = call
        if not msg.done:
            if failed:
                cause = failed[0].payload
                msg.error = cause if isinstance(cause, Exception) else ExecutionError(failed[0])
            else:
                output = _resolve_output(node, self.results)
                if output.kind is ValueKind.ERROR:
                    msg.error = output.payload
                else:
                    msg.value = output.payload
            msg.done = True
        try:
            payload = await postprocess_stack(msg, stack, seen)
        except BaseException as exc:
            if failed and exc is failed[0].payload:
                return _short_circuit(node, failed[0])
            failure = as_input_failure(exc)
            if failure is None:
                raise
            return error_value(failure, module_path=node.path, ref=f"node:{node.id}")
        for inner in range(node.pair + 1 if node.pair is not None else 0, node.id):
            value = self.results.get(inner)
            if value is not None and value.kind is ValueKind.ERROR:
                value.meta["recovered"] = True  # a handler answered for the failed call
        return Value(
            kind_of(payload), payload, ref=f"node:{node.id}", meta={"module_path": node.path}
        )

    def _spawn(self, node: Node, work: Coroutine[Any, Any, Value]) -> None:
        async def run() -> None:
            value = await work
            task = asyncio.current_task()
            if task is not None:
                self.tasks.discard(task)
            self.complete(node, value)

        self.tasks.add(asyncio.get_running_loop().create_task(run()))

    async def run(self, node: Node) -> None:
        """A module node, as a task of its own; what it raises is its failure.

        For an `LLMInference` with one sample the coroutine awaited here is the call
        itself (`CallSite.invoke`, which `Engine._call_llm` returns), so the task's
        await chain has no frame of the engine's in between: every frame of it is
        stepped again at each suspension of the call.
        """
        engine, results, prefix = self.engine, self.results, self.prefix
        module = node.module
        assert module is not None
        priority = _CallPriority(engine, self.index, None, self.order, self, node.id)
        try:
            if len(node.args) == 1:  # the usual leaf call: no comprehension (a frame)
                args: tuple[Any, ...] = (resolve(node.args[0], results),)
            else:
                args = tuple([resolve(a, results) for a in node.args])
            kwargs = {k: resolve(v, results) for k, v in node.kwargs.items()} if node.kwargs else {}
            if module._calls_llm:
                work = engine._call_llm(
                    node,
                    module,
                    args,
                    kwargs,
                    priority,
                    prefix,
                    lambda: self.upstream(node),
                    self.scope(node),
                )
            else:
                work = engine._run_module(
                    node,
                    module,
                    args,
                    kwargs,
                    self.index,
                    prefix,
                    self.upstream(node),
                    self.scope(node),
                    self.order,
                )
            # Blocks a forward entered around this call: entered again while it runs.
            value = await (_within(node.handlers, work) if node.handlers else work)
        except BaseException as exc:
            failure = as_input_failure(exc)
            if failure is None:
                raise
            value = error_value(failure, module_path=node.path, ref=f"node:{node.id}")
        task = asyncio.current_task()
        if task is not None:
            self.tasks.discard(task)
        self.complete(node, value)

    def height(self, node_id: int) -> int:
        """The height of node ``node_id`` (`Graph.heights`, worked out once per graph)."""
        heights = self.heights
        if heights is None:
            heights = self.heights = self.graph.heights()
        return heights[node_id]

    def upstream(self, node: Node) -> list[str]:
        """The node ids of the calls ``node`` waited for (for handlers: a profiler's
        critical path); worked out only when a handler is there to see them."""
        nodes, prefix = self.graph.nodes, self.prefix
        return [prefix + nodes[d].key for d in self.graph.call_deps(node.id)]

    def scope(self, node: Node) -> str | None:
        """The node id of the call ``node``'s call was made inside (for handlers that
        nest calls, as a trace does): the composite call it was recorded in, else the
        node whose code made this graph's calls; None for an input's outermost call."""
        if node.scope is not None:
            return self.prefix + self.graph.nodes[node.scope].key
        return self.prefix.rstrip("/") or None

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


_SKIPPED = {"skipped": True, "skip_inside": True}


async def _within(handlers: tuple[Handler, ...], work: Coroutine[Any, Any, T]) -> T:
    """``work`` inside the blocks of ``handlers`` (outermost first): the ``with`` blocks
    a forward entered around a node's recording, entered again around the node as it
    runs, in its own task (so they reach exactly the calls it makes, and never the
    nodes after it)."""
    with contextlib.ExitStack() as blocks:
        try:
            for handler in handlers:
                blocks.enter_context(handler)
        except BaseException:
            work.close()
            raise
        return await work


def _short_circuit(node: Node, cause: Value) -> Value:
    return error_value(cause.payload, module_path=node.path, ref=f"node:{node.id}", cause=cause)


def _resolve_output(node: Node, results: dict[int, Value]) -> Value:
    try:
        payload = resolve(node.args[0], results)
    except BaseException as exc:  # code of the user's (a __str__, a __getitem__)
        failure = as_input_failure(exc)
        if failure is None:
            raise
        return error_value(failure, module_path=node.path, ref=f"node:{node.id}")
    return Value(kind_of(payload), payload, ref=f"node:{node.id}")


def _apply_op(node: Node, results: dict[int, Value]) -> Value:
    try:
        args = [resolve(a, results) for a in node.args]
        kwargs = {k: resolve(v, results) for k, v in node.kwargs.items()}
        assert node.op is not None
        payload = node.op(*args, **kwargs)
    except BaseException as exc:  # code of the user's (a __str__, a __getitem__)
        failure = as_input_failure(exc)
        if failure is None:
            raise
        return error_value(failure, module_path=node.path, ref=f"node:{node.id}")
    return Value(kind_of(payload), payload, ref=f"node:{node.id}")


def _invoke_call(
    module: Any, site: CallSite, call: LLMRequest, upstream: Callable[[], list[str]], ref: str
) -> Coroutine[Any, Any, Value]:
    """One request of an `LLMInference` node invoked at ``site``, through its cascade
    when the module escalates."""
    if module.escalate_to:
        return site.cascade(
            call, module.escalate_to, module.accept, module=module, upstream=upstream, ref=ref
        )
    return site.invoke(call, module=module, upstream=upstream, ref=ref, output=True)


def _node_calls(
    node: Node,
    module: Any,
    site: CallSite,
    calls: list[LLMRequest],
    upstream: Callable[[], list[str]],
    ref: str,
) -> Coroutine[Any, Any, Value]:
    """An `LLMInference` node's ``calls`` (one per sample) invoked at ``site``
    (`_invoke_call`); what the node outputs for them."""
    if len(calls) == 1:
        return _invoke_call(module, site, calls[0], upstream, ref)

    async def all_samples() -> Value:
        outputs = await asyncio.gather(
            *(_invoke_call(module, site, call, upstream, ref) for call in calls)
        )
        return _samples_output(outputs, node, ref=ref)

    return all_samples()


def _samples_output(outputs: list[Value], node: Node, ref: str) -> Value:
    """The output of an ``n > 1`` call: the list of its samples, or the first failed
    sample's error (named as such: a partial list would hide a lost sample)."""
    for sample, value in enumerate(outputs):
        if value.kind is ValueKind.ERROR:
            value.meta["module_path"] = f"{node.path} (sample {sample + 1} of {len(outputs)})"
            return value
    from plait.providers.base import Usage

    usage = Usage()
    for value in outputs:
        used = value.meta.get("usage")
        if used is not None:
            usage.prompt_tokens += used.prompt_tokens
            usage.completion_tokens += used.completion_tokens
            usage.cache_read_tokens += used.cache_read_tokens
            usage.cache_write_tokens += used.cache_write_tokens
            usage.cache_write_1h_tokens += used.cache_write_1h_tokens
    meta = {"module_path": node.path, "usage": usage}
    return Value(ValueKind.STRUCTURED, [value.payload for value in outputs], ref=ref, meta=meta)
