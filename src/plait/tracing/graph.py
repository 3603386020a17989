"""The recorded graph: leaf-call nodes, and argument templates that name their inputs.

Arguments are stored as they were passed, except that every place a traced output
or a parameter appeared holds a reference (`NodeRef`, `ParamRef`), strings that
embedded them (f-strings, ``+``, ``str.format``, ``str.join``) hold a `Template`,
and containers that hold any of these become a `Struct`.  Plain constants stay
as they are and are never walked again when the graph runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plait._text import as_text, prompt_text
from plait.values import Value

if TYPE_CHECKING:
    from plait.effects import Handler
    from plait.module import Module
    from plait.parameter import Parameter

__all__ = [
    "Formatted",
    "Graph",
    "Node",
    "NodeRef",
    "ParamRef",
    "Resolvable",
    "Struct",
    "Template",
    "as_text",
    "prompt_text",
    "references",
    "resolve",
]

Results = dict[int, Value]


class Resolvable:
    """Something in a recorded argument that becomes a real value when the graph runs."""

    __slots__ = ()

    def resolve(self, results: Results) -> Any:
        raise NotImplementedError


class NodeRef(Resolvable):
    __slots__ = ("node",)

    def __init__(self, node: int) -> None:
        self.node = node

    def resolve(self, results: Results) -> Any:
        return results[self.node].payload

    def __repr__(self) -> str:
        return f"NodeRef({self.node})"


class ParamRef(Resolvable):
    __slots__ = ("param",)

    def __init__(self, param: Parameter) -> None:
        self.param = param

    def resolve(self, results: Results) -> Any:
        return self.param.current()

    def __repr__(self) -> str:
        return f"ParamRef({self.param.qualified_name!r})"


class Formatted(Resolvable):
    """A hole in a template whose value was formatted on the way in.

    ``as_repr`` is True where Python called ``repr()`` on the traced output (``str()``
    of a dict or list that holds it, ``f"{x!r}"``); ``json`` is ``"ascii"`` or
    ``"unicode"`` where ``json.dumps`` then escaped it (with ``ensure_ascii`` on or
    off), and ``quoted`` where the hole was a whole JSON string, quotes included.
    Resolving reproduces what Python would have produced from the real value.
    """

    __slots__ = ("as_repr", "json", "quoted", "ref")

    def __init__(
        self, ref: NodeRef | ParamRef, *, as_repr: bool, json: str | None, quoted: bool
    ) -> None:
        self.ref = ref
        self.as_repr = as_repr
        self.json = json
        self.quoted = quoted

    def resolve(self, results: Results) -> str:
        payload = self.ref.resolve(results)
        if self.as_repr:
            payload = repr(payload)
        if self.json is None:
            return as_text(payload)
        import json

        ascii_only = self.json == "ascii"
        if self.quoted:
            return json.dumps(_jsonable(payload), ensure_ascii=ascii_only)
        return json.dumps(as_text(payload), ensure_ascii=ascii_only)[1:-1]

    def __repr__(self) -> str:
        how = "repr" if self.as_repr else "str"
        return f"Formatted({self.ref!r}, {how}, json={self.json}, quoted={self.quoted})"


def _jsonable(payload: Any) -> Any:
    dump = getattr(payload, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return payload


class Template(Resolvable):
    """A string with holes: literal parts alternate with references."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[str | NodeRef | ParamRef | Formatted]) -> None:
        self.parts = parts

    def resolve(self, results: Results) -> str:
        # A list: join would build one from a generator anyway.
        return "".join(
            [
                part if isinstance(part, str) else as_text(part.resolve(results))
                for part in self.parts
            ]
        )

    def __repr__(self) -> str:
        return f"Template({self.parts!r})"


class Struct(Resolvable):
    """A list, tuple or dict that contains references somewhere inside."""

    __slots__ = ("items", "kind")

    def __init__(self, kind: type, items: Any) -> None:
        self.kind = kind
        self.items = items

    def resolve(self, results: Results) -> Any:
        if self.kind is dict:
            return {key: resolve(value, results) for key, value in self.items}
        values = [resolve(value, results) for value in self.items]
        if self.kind is list:
            return values
        if self.kind is tuple:
            return tuple(values)
        return self.kind(*values)  # named tuples

    def __repr__(self) -> str:
        return f"Struct({self.kind.__name__}, {self.items!r})"


def references(obj: Any) -> Iterator[NodeRef | ParamRef]:
    """Every reference inside a recorded argument: a template's holes, a container's items."""
    if isinstance(obj, NodeRef | ParamRef):
        yield obj
    elif isinstance(obj, Formatted):
        yield obj.ref
    elif isinstance(obj, Template):
        for part in obj.parts:
            if isinstance(part, Formatted):
                yield part.ref
            elif not isinstance(part, str):
                yield part
    elif isinstance(obj, Struct):
        items = (value for _, value in obj.items) if obj.kind is dict else obj.items
        for item in items:
            yield from references(item)


def resolve(obj: Any, results: Results) -> Any:
    return obj.resolve(results) if isinstance(obj, Resolvable) else obj


@dataclass(slots=True, eq=False)
class Node:
    """One node of a traced input.

    ``"module"``: a leaf call (an LLM call, a module with no submodules, an async
    forward).  ``"op"``: a deferred operation on values (``out["key"]``,
    ``out.strip()``).  ``"enter"``/``"exit"``: a composite module's call, which is
    traced through: ``enter`` holds its arguments and is where handlers process the
    call, ``exit`` holds its output and is where they postprocess it; the calls
    made inside sit between the two.
    """

    id: int
    kind: str
    path: str
    module: Module | None
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deps: tuple[int, ...]
    params: tuple[Parameter, ...] = ()
    op: Callable[..., Any] | None = None
    dependents: list[int] = field(default_factory=list)
    #: The ``enter`` node of the innermost composite call this node was recorded in.
    scope: int | None = None
    #: For an ``exit`` node, its call's ``enter`` node.
    pair: int | None = None
    #: The handlers whose ``with`` blocks inside a ``forward`` enclosed this node's
    #: recording, innermost last: the engine enters them again around the node.
    handlers: tuple[Handler, ...] = ()

    @property
    def key(self) -> str:
        """Stable within a deterministic forward: what checkpoints key completed calls by."""
        return f"{self.id}:{self.path}"


@dataclass(slots=True, eq=False)
class Graph:
    """Every leaf call of one traced input, and where the output takes its values from."""

    nodes: list[Node] = field(default_factory=list)
    output: Any = None
    params: dict[int, Parameter] = field(default_factory=dict)

    def heights(self) -> list[int]:
        """Per node, the longest chain of calls from it to an output, itself included.

        The engine runs tall nodes first once a batch is draining, so the critical
        path is never left for last.  Ops cost nothing; ids are topological.
        """
        heights = [0] * len(self.nodes)
        for node in reversed(self.nodes):
            below = 0
            for dependent in node.dependents:  # a loop: max() of a generator per node costs more
                if heights[dependent] > below:
                    below = heights[dependent]
            heights[node.id] = below + (node.kind == "module")
        return heights

    def call_deps(self, node_id: int) -> list[int]:
        """The calls (module nodes) a node waits on, looking through the ops between."""
        return self.deps_through(node_id, lambda node: node.kind == "module")

    def deps_through(self, node_id: int, keep: Callable[[Node], bool]) -> list[int]:
        """The nearest nodes ``keep`` accepts that a node takes data from, looking through
        others (and past the ordering-only edges to a composite call's ``enter``)."""
        found: list[int] = []
        pending = self.data_deps(self.nodes[node_id])
        seen: set[int] = set()
        while pending:
            dep = pending.pop()
            if dep in seen:
                continue
            seen.add(dep)
            if keep(self.nodes[dep]):
                found.append(dep)
            else:
                pending.extend(self.data_deps(self.nodes[dep]))
        return sorted(found)

    @staticmethod
    def data_deps(node: Node) -> list[int]:
        """A node's dependencies less the edges that only order it after its call's enter."""
        return [d for d in node.deps if d != node.scope and d != node.pair]

    def roots(self) -> list[Node]:
        return [node for node in self.nodes if not node.deps]

    def module_nodes(self) -> list[Node]:
        return [node for node in self.nodes if node.kind == "module"]

    def describe(self) -> str:
        """A readable listing: one line per node with what it waits for."""
        lines = []
        for node in self.nodes:
            deps = ", ".join(str(d) for d in node.deps) or "-"
            lines.append(f"{node.id:>3} {node.kind:<6} {node.path:<40} <- {deps}")
        return "\n".join(lines)
