"""The backward pass: feedback from a loss, through the recorded graph, into Parameters.

A training-mode call keeps its input's graph and every node's result (a `Tape`).
`backward` starts from the loss's feedback at the graph's output and walks the
nodes in reverse dependency order.  Each module node's own ``backward(feedback,
ctx)`` decides what each of its inputs and parameters hears; the feedback for an
input then reaches every node and parameter that input was built from, so a
prompt assembled from two upstream outputs (an f-string, a ``+``, a join) sends
it to both, and a node read by several downstream nodes hears all of them.
Nodes that no longer wait on anyone's feedback run their ``backward`` together,
so a wide graph's backward pass is as concurrent as its forward pass.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from plait.learning.feedback import Feedback
from plait.parameter import Parameter
from plait.tracing.graph import Graph, Node, NodeRef, ParamRef, references, resolve
from plait.values import Value, ValueKind

if TYPE_CHECKING:
    from plait.execution.tape import Tape

__all__ = ["backward", "feedback_text", "upstream_rank"]

#: Where in its graph each parameter last received feedback, as a fraction of the
#: graph (0 is the first call); optimizers rewrite upstream parameters first.
_upstream_rank: weakref.WeakKeyDictionary[Parameter, float] = weakref.WeakKeyDictionary()


def upstream_rank(param: Parameter) -> float:
    """How close to the inputs ``param`` shapes the output (lower is further upstream);
    infinite for a parameter no backward pass has reached."""
    return _upstream_rank.get(param, math.inf)


def feedback_text(payload: Any) -> str:
    """The text a loss's output contributes: a Feedback's ``text``, or the value as text."""
    if isinstance(payload, Value):
        payload = payload.payload
    if isinstance(payload, Feedback):
        return payload.text
    return str(payload)


async def backward(value: Value, feedback: Any = None) -> None:
    """Send ``feedback`` (default: the value's own, e.g. a loss's Feedback) upstream.

    ``value`` must come from a module in ``train()`` mode; every learnable
    Parameter that shaped it accumulates feedback for the optimizer.
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
    await _Walk(tape, text).run()


class _Walk:
    """One backward pass over one tape."""

    def __init__(self, tape: Tape, text: str) -> None:
        self.tape = tape
        self.graph: Graph = tape.graph
        self.heard: dict[int, list[str]] = {}
        for node in _refs(self.graph.output):
            self._tell(node, text)
        for param in _params(self.graph.output):
            self._learn(param, text, len(self.graph.nodes))

    def _tell(self, node: int, text: str) -> None:
        texts = self.heard.setdefault(node, [])
        if text not in texts:
            texts.append(text)

    async def run(self) -> None:
        for level in _levels_from_output(self.graph):
            ready = [self.graph.nodes[n] for n in level if n in self.heard]
            await asyncio.gather(*(self._visit(node) for node in ready))

    async def _visit(self, node: Node) -> None:
        text = "\n".join(self.heard[node.id])
        if node.kind == "op" or node.module is None:
            for expr in (*node.args, *node.kwargs.values()):
                self._send(expr, text, node.id)
            return
        module = node.module
        results = self.tape.results
        arguments = _bind(module, node)
        ctx_type, result_type = _context_types()
        ctx = ctx_type(
            inputs={name: resolve(expr, results) for name, expr in arguments.items()},
            output=results[node.id].payload if node.id in results else None,
            node_id=node.key,
            module_path=node.path,
        )
        result = module.backward(Value(ValueKind.TEXT, text, ref=f"node:{node.id}"), ctx)
        if inspect.isawaitable(result):
            result = await result
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
            self._learn(param, feedback_text(feedback), node.id)
        for name, feedback in result.input_feedback.items():
            if name not in arguments:
                raise KeyError(
                    f"{type(module).__name__}.backward() at {node.path!r} sent feedback to "
                    f"input {name!r}, which this call did not receive (its inputs: "
                    f"{', '.join(arguments) or 'none'})"
                )
            self._send(arguments[name], feedback_text(feedback), node.id)

    def _send(self, expr: Any, text: str, at: int) -> None:
        for node in _refs(expr):
            self._tell(node, text)
        for param in _params(expr):
            self._learn(param, text, at)

    def _learn(self, param: Parameter, text: str, at: int) -> None:
        param.accumulate_feedback(text)
        rank = at / max(1, len(self.graph.nodes))
        _upstream_rank[param] = min(rank, _upstream_rank.get(param, math.inf))


def _context_types() -> tuple[Any, Any]:
    from plait.module import BackwardContext, BackwardResult

    return BackwardContext, BackwardResult


def _bind(module: Any, node: Node) -> dict[str, Any]:
    """The recorded argument expressions by ``forward``'s parameter names."""
    try:
        bound = inspect.signature(module.forward).bind(*node.args, **node.kwargs)
    except TypeError:
        names = {f"arg{i}": expr for i, expr in enumerate(node.args)}
        return {**names, **node.kwargs}
    arguments: dict[str, Any] = {}
    for name, expr in bound.arguments.items():
        kind = inspect.signature(module.forward).parameters[name].kind
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
