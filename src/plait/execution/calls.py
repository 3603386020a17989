"""The one path of an LLM call: where it runs, its seed, its message, its default action.

Every LLM call plait makes takes this path, whatever made it: an `LLMInference` node
of a traced graph, `plait.functional` inside an ``async def forward`` or outside any
run, a backward pass, a Ray worker.  A `CallSite` says where the call runs (a node of
the current run, or on its own) and derives what is a function of the call alone:

* its seed (`CallSite.seeds`): from the run seed, the site, the input's position and
  the request, counted per (site, request) so timing never shifts one;
* its ``"llm"`` `Message` (`CallSite.invoke`), which every handler sees (cache and
  checkpoint keys are the request's fingerprint, seed included);
* its default action (`CallSite.send`): a slot of the run's limiter when the call
  belongs to a run, then the endpoint (its own limits, rate governor and retries).

`NodeScope` is the interpreter an engine enters while a node's code runs on real
values: a module called there runs as part of the same run, and a functional call
made there is that node's.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from plait._text import as_text
from plait.effects import Interpreter, Message, apply_stack, current_stack, find_interpreter
from plait.providers.base import LLMRequest, LLMResponse
from plait.resources.endpoint import UNSEEN_TIMING, CallTiming
from plait.sampling import CallCounts, call_seed, with_seed
from plait.values import Value, ValueKind, error_value, kind_of

if TYPE_CHECKING:
    from plait.resources.limits import Priority, PriorityLimiter
    from plait.resources.manager import ResourceManager

__all__ = [
    "RAW_REPLY",
    "CallSite",
    "NodeScope",
    "RunCalls",
    "as_response",
    "manager_for",
    "module_output",
]

#: Where `CallSite.invoke` keeps a reply a handler gave in some other form than an
#: `LLMResponse`.
RAW_REPLY = "raw_reply"


class RunCalls(Protocol):
    """What a call site asks of the run it belongs to (`plait.execution.engine.Engine`)."""

    seed: int | None
    resources: ResourceManager
    limiter: PriorityLimiter
    aliases: set[str]
    paths: dict[int, str]
    root: Any

    def counts(self, order: int | None) -> CallCounts: ...

    def priority(self, index: int, height: int, order: int | None = None) -> Priority: ...

    async def call_module(
        self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...


class NodeScope(Interpreter):
    """The interpreter inside a node whose code runs on real values (an ``async def
    forward``, a backward, a leaf's module calls): a module called here runs on the
    same run, under the same limits and handlers, as part of input ``index`` (queued
    as ``order``, the index by default: `plait.execution.engine.Engine.run_input`)."""

    awaits_calls = True

    def __init__(self, run: RunCalls, index: int, prefix: str, order: int | None = None) -> None:
        self.run = run
        self.index = index
        self.order = index if order is None else order
        #: The node-id prefix of the calls made here ("", or "<node key>/" nested).
        self.prefix = prefix

    def call_module(self, msg: Message) -> Any:
        return self.run.call_module(msg.module, msg.args, msg.kwargs)


class CallSite:
    """Where one LLM call runs, and everything derived from that.

    In a run (``run`` given) the call is part of input ``index`` at node
    ``node_id``: it waits for a slot of the run's limiter and counts its seeds in the
    run, derived from the input's ``order`` (its index, unless the engine runs several
    batches at once: `plait.execution.engine.Engine.run_input`).  On its own (no run)
    it goes straight to the endpoint, and takes its seed from the
    ``ExecutionSettings(seed=...)`` block it is made in, if any.
    """

    __slots__ = (
        "counts",
        "index",
        "name",
        "node_id",
        "order",
        "priority",
        "resources",
        "run",
        "run_seed",
        "scope",
    )

    def __init__(
        self,
        name: str,
        resources: ResourceManager,
        *,
        run: RunCalls | None = None,
        index: int | None = None,
        node_id: str | None = None,
        priority: Priority | None = None,
        run_seed: int | None = None,
        counts: CallCounts | None = None,
        scope: str | None = None,
        order: int | None = None,
    ) -> None:
        self.name = name
        #: The node id of the call this one is made inside (see `_GraphRun.scope`).
        self.scope = scope
        self.resources = resources
        self.run = run
        self.index = index
        self.order = index if order is None else order
        self.node_id = node_id
        self.priority = priority
        self.run_seed = run_seed
        self.counts = counts

    @classmethod
    def here(cls, resources: Any, name: str | None, fallback: str) -> CallSite:
        """The site of a functional call made where the caller is: the node of the
        run whose code is running (named like that module's children), or on its own
        (on ``resources``, else the enclosing `ExecutionSettings`' resources)."""
        scope = find_interpreter(NodeScope)
        if scope is None:
            from plait.execution.settings import get_execution_settings

            settings = get_execution_settings()
            if resources is None and settings is not None:
                resources = settings.resources
            seeded = settings is not None and settings.seed is not None
            return cls(
                name or fallback,
                manager_for(resources),
                run_seed=settings.seed if seeded and settings is not None else None,
                counts=settings.calls if seeded and settings is not None else None,
            )
        run, index, prefix = scope.run, scope.index, scope.prefix
        enclosing = _path_of(prefix)
        # Named like the module's own children: "agent.vote", or "vote" in the root
        # (whose path is its class name and whose children's paths are unprefixed).
        root = run.paths.get(id(run.root))
        if enclosing and name and enclosing != root:
            site_name = f"{enclosing}.{name}"
        else:
            site_name = name or enclosing or fallback
        manager = run.resources if resources is None else manager_for(resources)
        return cls(
            site_name,
            manager,
            # A call on other resources keeps the run's handlers but not its limiter.
            run=run if manager is run.resources else None,
            index=index,
            node_id=f"{prefix}fn:{site_name}",
            priority=run.priority(index, 1, scope.order),
            run_seed=run.seed,
            counts=run.counts(scope.order) if run.seed is not None else None,
            scope=prefix.rstrip("/") or None,
            order=scope.order,
        )

    def check_alias(self, alias: str) -> None:
        config = self.resources.config
        if config and alias not in config:
            from plait.resources.config import ConfigurationError

            known = ", ".join(sorted(config)) or "none"
            raise ConfigurationError(
                f"{self.name}: alias {alias!r} is not in the resources (they configure: "
                f"{known}); add it to the ResourceConfig (passed as resources=, to bind() "
                "or to ExecutionSettings), or call one of the configured aliases"
            )

    # -- what is a function of the call --------------------------------------------------
    def seeds(self, request: LLMRequest, samples: int = 1) -> list[int] | None:
        """The seeds the call's ``samples`` requests send (`plait.sampling.call_seed`),
        or None when no seed is in force (no run seed and a single sample).

        The k-th identical request of a site for an input gets the k-th seed: counted
        per (site, request), never per site, so calls that interleave as latencies
        decide keep their seeds.
        """
        if self.run_seed is None and samples == 1:
            return None
        digest = request.fingerprint()
        counts = self.counts if self.counts is not None else CallCounts()
        site = self.node_id if self.node_id is not None else self.name
        counter = counts.next((site, digest))
        return [
            call_seed(self.run_seed, self.name, self.order, self.node_id, digest, counter, k)
            for k in range(samples)
        ]

    async def send(self, request: LLMRequest, timing: CallTiming) -> LLMResponse:
        """The default action of every LLM call: a slot of the run's limiter when the call
        belongs to a run, then the endpoint, built at the first request really sent (a
        run that handlers answer entirely never needs an endpoint, nor the local model)."""
        run, priority = self.run, self.priority
        if run is None or priority is None:
            return await self.resources.endpoint_for(request).complete(request, 0.0, timing)
        queued = time.monotonic()
        if not run.limiter.try_acquire():  # a free slot is taken without a coroutine
            await run.limiter.acquire(priority)
        try:
            timing.add("queue", queued, time.monotonic(), limit="run")
            endpoint = self.resources.endpoint_for(request)
            run.aliases.add(request.alias)
            return await endpoint.complete(request, priority, timing)
        finally:
            run.limiter.release()

    async def invoke(
        self,
        request: LLMRequest,
        *,
        module: Any = None,
        upstream: Callable[[], list[str]] | None = None,
        ref: str | None = None,
        output: bool = False,
    ) -> Value:
        """The atomic LLM op: ``request`` as an ``"llm"`` message, then `send` unless a
        handler answered.  Never raises for a failed call (an ERROR value comes back).

        ``upstream`` gives the node ids of the calls this one waited for, which handlers
        see in the message's meta.  With ``output`` the value is what an `LLMInference`
        node outputs for the reply (`module_output`), built without the reply's own.
        When no active handler hooks LLM messages, nobody would see the message: the
        call is sent without one (and without `apply_stack`'s coroutines), exactly as
        `apply_stack` would have sent it.
        """
        name = self.name
        stack = current_stack()
        if not stack or not any(type(handler).sees("llm") for handler in stack):
            # Nothing reads a node's timing when no handler sees its call.
            timing = UNSEEN_TIMING if output else CallTiming()
            try:
                reply: Any = await self.send(request, timing)
            except Exception as exc:
                return error_value(exc, module_path=name, ref=ref)
            final: Any = request
            handled: Mapping[str, Any] = _NO_META
        else:
            timing = CallTiming()
            send = self.send

            def default(request: LLMRequest) -> Any:
                return send(request, timing)

            msg = Message(
                type="llm",
                name=name,
                fn=default,
                kwargs={"request": request},
                module=module,
                node_id=self.node_id,
                input_index=self.index,
                # For handlers: where each alias leads, where this call's time went, and
                # the calls it waited for (node ids), which a profiler's critical path needs.
                meta={
                    "resources": self.resources,
                    "timing": timing,
                    "upstream": upstream() if upstream is not None else [],
                    # The node id of the call this one is made inside, if any.
                    "scope": self.scope,
                },
            )
            try:
                reply = await apply_stack(msg)
            except Exception as exc:
                return error_value(exc, module_path=name, ref=ref)
            final = msg.kwargs.get("request", request)
            handled = msg.meta
        if isinstance(reply, LLMResponse):
            response = reply
            raw = False
        else:
            response = as_response(reply)
            raw = True
        if output:
            return _node_output(name, response, reply, raw, ref)
        meta: dict[str, Any] = {
            "module_path": name,
            "alias": final.alias if isinstance(final, LLMRequest) else request.alias,
            "answered_by": _answered_by(handled, timing),
        }
        if raw:
            meta[RAW_REPLY] = reply
        meta["usage"] = response.usage
        meta["model"] = response.model
        return Value(ValueKind.RESPONSE, response, ref=ref, meta=meta)

    async def cascade(
        self,
        request: LLMRequest,
        tiers: tuple[str, ...],
        accept: Callable[[Any], Any] | float,
        *,
        module: Any = None,
        upstream: Callable[[], list[str]] | None = None,
        ref: str | None = None,
    ) -> Value:
        """An `LLMInference` node's call answered by a cascade: ``request`` at its own
        alias, then again at each alias of ``tiers`` while ``accept`` rejects the
        answer (or the tier could not give one in the format asked for).  Each tier's
        request is an ``"llm"`` message of its own, so handlers, usage and
        checkpoints see it at its alias.

        Returns:
            What the node outputs (`module_output`) for the answer kept: the last
            tier's whatever ``accept`` says of it.
        """
        from plait.providers.base import ReplyFormatError
        from plait.resources.usage import record_for

        current = request
        for tier in (None, *tiers):
            if tier is not None:
                record_for(current.alias).escalated += 1
                current = replace(current, alias=tier)
            reply = await self.invoke(current, module=module, upstream=upstream, ref=ref)
            last = tier == tiers[-1]
            if reply.kind is ValueKind.ERROR:
                if last or not isinstance(reply.payload, ReplyFormatError):
                    return reply
                continue  # the tier could not answer in the format asked for
            if last or _accepted(accept, reply.payload, self.name):
                output = module_output(reply)
                if tier is not None:
                    output.meta["escalated_to"] = tier
                return output
        raise AssertionError("unreachable: the last tier's answer is always kept")

    async def call(self, request: LLMRequest) -> Value:
        """A functional call: seeded here unless it gives itself a seed, then invoked."""
        if "seed" not in request.extra:
            seeds = self.seeds(request)
            if seeds is not None:
                request = with_seed(request, seeds[0])
        return await self.invoke(request)


def module_output(reply: Value) -> Value:
    """What an `LLMInference` node outputs for ``reply``: the text, or the parsed object.

    An ERROR value passes through; a reply a handler gave in another form than an
    `LLMResponse` is output as it was given.  (`CallSite.invoke` with ``output=True``
    builds the same value straight from the reply.)
    """
    if reply.kind is ValueKind.ERROR:
        return reply
    meta = reply.meta
    is_raw = RAW_REPLY in meta
    return _node_output(
        meta["module_path"], reply.payload, meta[RAW_REPLY] if is_raw else None, is_raw, reply.ref
    )


def _node_output(
    name: str, response: LLMResponse, raw: Any, is_raw: bool, ref: str | None
) -> Value:
    """`module_output` of a reply: ``response`` is the reply as an `LLMResponse`, and
    with ``is_raw`` a handler answered with ``raw``, which was not one."""
    meta: dict[str, Any] = {"module_path": name}
    if is_raw:
        payload = raw.payload if isinstance(raw, Value) else raw
        return Value(kind_of(payload), payload, ref=ref, meta=meta)
    meta["usage"] = response.usage
    kind = ValueKind.STRUCTURED if response.parsed is not None else ValueKind.TEXT
    return Value(kind, response.payload, ref=ref, meta=meta)


def as_response(reply: Any) -> LLMResponse:
    """A reply a handler gave in another form (text, an object, a Value) as an `LLMResponse`."""
    if isinstance(reply, Value):
        reply = reply.payload
    if isinstance(reply, LLMResponse):
        return reply
    if isinstance(reply, str):
        return LLMResponse(reply)
    if reply is None:
        return LLMResponse("")
    return LLMResponse(as_text(reply), reply)


def _accepted(accept: Callable[[Any], Any] | float, response: LLMResponse, name: str) -> bool:
    """Whether a cascade keeps a tier's answer: ``accept`` of its payload, or its
    label's probability at least ``accept``."""
    if not callable(accept):
        scores = response.label_scores
        if not scores:
            from plait.resources.config import ConfigurationError

            raise ConfigurationError(
                f"{name}: accept={accept!r} keeps an answer by its label's probability, but "
                "this reply has none: give the call label_method='logprob' or 'calibrated' "
                "on an endpoint that returns log-probabilities, or accept a function of the "
                "reply"
            )
        return max(scores.values()) >= accept
    try:
        return accept(response.payload) is not False
    except (ValueError, AssertionError):
        return False


#: The meta of a call no handler saw.
_NO_META: Mapping[str, Any] = {}


def _answered_by(meta: Mapping[str, Any], timing: CallTiming) -> str:
    """The endpoint, when a request was sent; else the handler that answered."""
    for span in timing.spans:
        if span.kind == "request":
            return "endpoint"
    if meta.get("mock"):
        return "mock"
    for flag in ("replay", "cache", "checkpoint"):
        if meta.get(flag) == "hit":
            return flag
    return "handler"


def _path_of(prefix: str) -> str:
    """The module path of the node whose forward is running, from its node-id prefix."""
    last = prefix.rstrip("/").rpartition("/")[2]
    return last.partition(":")[2]


_default_manager: list[ResourceManager] = []
_managers: dict[int, tuple[weakref.ReferenceType[Any], ResourceManager]] = {}


def manager_for(resources: Any) -> ResourceManager:
    """One `ResourceManager` per resources object, so its endpoints are built once."""
    from plait.resources.manager import ResourceManager

    if isinstance(resources, ResourceManager):
        return resources
    if resources is None:
        if not _default_manager:
            _default_manager.append(ResourceManager(None))
        return _default_manager[0]
    key, managers = id(resources), _managers
    found = managers.get(key)
    if found is not None and found[0]() is resources:
        return found[1]
    manager = ResourceManager.coerce(resources)

    def forget(_: object) -> None:
        managers.pop(key, None)

    try:
        ref = weakref.ref(resources, forget)
    except TypeError:  # a plain dict cannot be referred to weakly: not worth caching
        return manager
    managers[key] = (ref, manager)
    return manager
