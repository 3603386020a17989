"""The backward pass: feedback from a loss, through the recorded graph, into Parameters.

A training-mode call keeps its input's graph and every node's result (a `Tape`).
`backward` starts from the loss's feedback at the graph's output and walks the
nodes in reverse dependency order.  Each module node's own ``backward(feedback,
ctx)`` decides what each of its inputs and parameters hears; the feedback for an
input then reaches every node and parameter that input was built from, so a
prompt assembled from two upstream outputs (an f-string, a ``+``, a join) sends
it to both, and a node read by several downstream nodes hears all of them.
Nodes that no longer wait on anyone's feedback run their ``backward`` together,
so a wide graph's backward pass is as concurrent as its forward pass; what they
send is taken in the graph's order once all of them are done, so the texts a node
or parameter hears, and their order, do not depend on which ``backward`` (which
may make LLM calls) finished first.

`backward` is `collect_feedback` (the walk, parameters untouched) followed by
`receive` (the feedback put into the parameters).  The two halves may run in
different processes: a Ray worker runs the walk and sends back what it collected,
and the driver gives it to its own parameters (`plait.learning.Trainer` with
``workers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plait._signature import forward_shape
from plait.effects import find_interpreter
from plait.execution.calls import NodeScope
from plait.learning.feedback import feedback_text
from plait.parameter import Parameter
from plait.tracing.graph import Graph, Node, NodeRef, ParamRef, references, resolve
from plait.tracing.tracer import Tracer
from plait.values import Value, ValueKind

if TYPE_CHECKING:
    from plait.execution.tape import Tape

__all__ = [
    "Received",
    "backward",
    "collect_feedback",
    "feedback_text",
    "receive",
    "upstream_rank",
]

#: Where in its graph each parameter last received feedback, as a fraction of the
#: graph (0 is the first call); optimizers rewrite upstream parameters first.
_upstream_rank: weakref.WeakKeyDictionary[Parameter, float] = weakref.WeakKeyDictionary()


def upstream_rank(param: Parameter) -> float:
    """How close to the inputs ``param`` shapes the output (lower is further upstream);
    infinite for a parameter no backward pass has reached."""
    return _upstream_rank.get(param, math.inf)


@dataclass(frozen=True, slots=True)
class Received:
    """One feedback text a backward pass sends a parameter, and where in the graph.

    ``rank`` is the position of the node it came from as a fraction of the graph
    (0 is the first call): what `upstream_rank` keeps the lowest of.
    """

    param: Parameter
    text: str
    rank: float


async def backward(value: Value, feedback: Any = None) -> None:
    """Send feedback from an output back to every learnable `Parameter` that shaped it.

    What ``await value.backward()`` does.  The walk goes through the recorded
    graph in reverse; each module's ``backward`` decides what its inputs and
    parameters hear (a module's own ``backward`` may make LLM calls).  Each
    parameter reached accumulates the text for the optimizer's next ``step()``;
    a frozen parameter ignores it.

    Args:
        value: An output of a module called in ``train()`` mode (typically a
            `TrainingStep`'s loss).
        feedback: What to send: a `Feedback`, or text (default: the value's
            own, a loss's `Feedback`).

    Raises:
        RuntimeError: ``value`` has no record of how it was computed (its module
            was not in ``train()`` mode), or is the error of a failed call.
    """
    receive(await collect_feedback(value, feedback))


def receive(received: Iterable[Received]) -> None:
    """Put collected feedback into its parameters, in order, as `backward` does.

    Each text is appended to its parameter's buffer (a frozen parameter ignores it)
    and the parameter's `upstream_rank` becomes the lowest rank it has received.
    """
    for item in received:
        item.param.accumulate_feedback(item.text)
        _upstream_rank[item.param] = min(item.rank, _upstream_rank.get(item.param, math.inf))


async def collect_feedback(value: Value, feedback: Any = None) -> list[Received]:
    """The backward pass from ``value``, without touching any parameter.

    Returns what every parameter reached would receive, in the order `backward`
    gives it to them (`receive` does that).  Module ``backward`` methods run, LLM
    calls included, exactly as in `backward`.
    """
    tape = value.meta.get("_tape")
    if tape is None:
        raise RuntimeError(
            "this Value has no record of how it was computed: call the module (or "
            "TrainingStep) after .train() so its outputs keep their graph for backward()"
        )
    if value.kind is ValueKind.ERROR:
        raise RuntimeError(
            f"cannot run backward from a failed call ({value.meta.get('error_type')}: "
            f"{value.meta.get('message')}); skip failed inputs before backward()"
        )
    text = feedback_text(value if feedback is None else feedback)
    walk = _Walk(tape, text)
    await walk.run()
    return walk.received


#: What visiting a node produces: feedback for a node upstream (its id and the text),
#: or for a parameter.
_Effect = tuple[int, str] | Received


class _Walk:
    """One backward pass over one tape."""

    def __init__(self, tape: Tape, text: str) -> None:
        self.tape = tape
        self.graph: Graph = tape.graph
        self.heard: dict[int, list[str]] = {}
        self.received: list[Received] = []
        start: list[_Effect] = []
        self._send(self.graph.output, text, len(self.graph.nodes), start)
        self._apply(start)

    def _tell(self, node: int, text: str) -> None:
        texts = self.heard.setdefault(node, [])
        if text not in texts:
            texts.append(text)

    def _apply(self, effects: list[_Effect]) -> None:
        for effect in effects:
            if isinstance(effect, Received):
                self.received.append(effect)
            else:
                self._tell(*effect)

    async def run(self) -> None:
        for level in _levels_from_output(self.graph):
            ready = [self.graph.nodes[n] for n in level if n in self.heard]
            # A level's nodes only send feedback further upstream (to later levels), so
            # what they send is taken after all of them ran, in the level's node order.
            for effects in await asyncio.gather(*(self._visit(node) for node in ready)):
                self._apply(effects)

    async def _visit(self, node: Node) -> list[_Effect]:
        text = "\n".join(self.heard[node.id])
        module = node.module
        out: list[_Effect] = []
        if node.kind == "exit" and module is not None and _overrides_backward(module):
            # A composite with its own backward speaks for everything inside it.
            assert node.pair is not None
            enter = self.graph.nodes[node.pair]
            await self._call_backward(module, node, enter.args, enter.kwargs, text, out)
        elif node.kind != "module" or module is None:
            # ops, and the brackets of composite calls, pass feedback to what they read
            for expr in (*node.args, *node.kwargs.values()):
                self._send(expr, text, node.id, out)
        else:
            await self._call_backward(module, node, node.args, node.kwargs, text, out)
        return out

    async def _call_backward(
        self,
        module: Any,
        node: Node,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        text: str,
        out: list[_Effect],
    ) -> None:
        results = self.tape.results
        arguments = _bind(module, args, kwargs)
        ctx_type, result_type = _context_types()
        ctx = ctx_type(
            inputs={name: resolve(expr, results) for name, expr in arguments.items()},
            output=results[node.id].payload if node.id in results else None,
            node_id=node.key,
            module_path=node.path,
        )
        result = await self._run_backward(
            module, Value(ValueKind.TEXT, text, ref=f"node:{node.id}"), ctx
        )
        if not isinstance(result, result_type):
            raise TypeError(
                f"{type(module).__name__}.backward() at {node.path!r} must return a "
                f"BackwardResult, got {type(result).__name__}"
            )
        own = dict(module.named_parameters())
        for name, feedback in result.parameter_feedback.items():
            param = own.get(name)
            if param is None:
                raise KeyError(
                    f"{type(module).__name__}.backward() at {node.path!r} sent feedback to "
                    f"parameter {name!r}, which it does not have (its parameters: "
                    f"{', '.join(own) or 'none'})"
                )
            self._learn(param, feedback_text(feedback), node.id, out)
        for name, feedback in result.input_feedback.items():
            if name not in arguments:
                raise KeyError(
                    f"{type(module).__name__}.backward() at {node.path!r} sent feedback to "
                    f"input {name!r}, which this call did not receive (its inputs: "
                    f"{', '.join(arguments) or 'none'})"
                )
            self._send(arguments[name], feedback_text(feedback), node.id, out)

    async def _run_backward(self, module: Any, feedback: Value, ctx: Any) -> Any:
        """Call ``module.backward``; module calls it makes run as part of the backward pass.

        In a sync ``backward`` they are recorded (as in a forward) and then run on the
        engine that ran the input, so their replies, not placeholders, become the
        feedback; in an ``async def backward`` they are awaited on that engine directly.
        """
        engine = self.tape.engine
        tracer = Tracer(engine.paths if engine is not None else None, lift_parameters=False)
        with tracer:
            result = module.backward(feedback, ctx)
        # Module calls an async backward awaits run on the engine that ran the input (as
        # part of the node whose code calls backward, if any).
        outer = find_interpreter(NodeScope)
        where = (outer.index, outer.prefix) if outer is not None else (0, "eager/")
        scope = NodeScope(engine, *where) if engine is not None else contextlib.nullcontext()
        with scope:
            if inspect.isawaitable(result):
                result = await result
            if not tracer.graph.nodes or not hasattr(result, "input_feedback"):
                return result
            if engine is None:
                raise RuntimeError(
                    f"{type(module).__name__}.backward() calls modules, but this output's record "
                    "has no engine to run them on; produce it with a module call in train() mode"
                )
            sent = {
                "inputs": dict(result.input_feedback),
                "params": dict(result.parameter_feedback),
            }
            tracer.graph.output = tracer.capture(sent, set(), {})
            answered = await engine.run_recorded(tracer.graph)
        result.input_feedback = answered["inputs"]
        result.parameter_feedback = answered["params"]
        return result

    def _send(self, expr: Any, text: str, at: int, out: list[_Effect]) -> None:
        for node in _refs(expr):
            out.append((node, text))
        for param in _params(expr):
            self._learn(param, text, at, out)

    def _learn(self, param: Parameter, text: str, at: int, out: list[_Effect]) -> None:
        out.append(Received(param, text, at / max(1, len(self.graph.nodes))))


def _context_types() -> tuple[Any, Any]:
    from plait.module import BackwardContext, BackwardResult

    return BackwardContext, BackwardResult


def _overrides_backward(module: Any) -> bool:
    from plait.module import Module

    return type(module).backward is not Module.backward


def _bind(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The recorded argument expressions by ``forward``'s parameter names."""
    signature = forward_shape(type(module)).signature
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        names = {f"arg{i}": expr for i, expr in enumerate(args)}
        return {**names, **kwargs}
    arguments: dict[str, Any] = {}
    for name, expr in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(expr)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            arguments.update({f"{name}{i}": item for i, item in enumerate(expr)})
        else:
            arguments[name] = expr
    return arguments


def _refs(expr: Any) -> Iterator[int]:
    """Every node an argument expression was built from."""
    return (ref.node for ref in references(expr) if isinstance(ref, NodeRef))


def _params(expr: Any) -> Iterator[Parameter]:
    """Every parameter spliced into an argument expression."""
    if isinstance(expr, Parameter):
        yield expr
    yield from (ref.param for ref in references(expr) if isinstance(ref, ParamRef))


def _levels_from_output(graph: Graph) -> list[list[int]]:
    """Nodes grouped by distance from the output: a level depends only on earlier ones."""
    depth = [0] * len(graph.nodes)
    for node in reversed(graph.nodes):
        if node.dependents:
            depth[node.id] = 1 + max(depth[d] for d in node.dependents)
    levels: dict[int, list[int]] = {}
    for node_id, level in enumerate(depth):
        levels.setdefault(level, []).append(node_id)
    return [levels[k] for k in sorted(levels)]
