"""The tracer: a handler that records leaf-module calls into a `Graph`.

While tracing, a call of a leaf module (an `LLMInference`, a module with no
submodules, or one with ``async def forward``) becomes a node and returns a
`TracedValue` placeholder; a composite module is traced through, so pipelines
nested any number of levels deep flatten into one graph of leaf calls.

A `TracedValue` is a ``str`` whose text is a unique token.  Because it is a real
string, f-strings, ``+``, ``%``, ``str.format`` and ``str.join`` accept it, and
the token survives in the strings they build; when such a string reaches another
call, the tracer finds the tokens and records the dependencies.  Operations whose
answer depends on the unknown value (``bool()``, ``==``, ``len()``, iteration)
raise a `TracingError` that names the fix.
"""

from __future__ import annotations

import inspect
import itertools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from plait._tracing_hook import active_tracer
from plait.handlers.stack import Handler, Message
from plait.parameter import Parameter
from plait.tracing.graph import Graph, Node, NodeRef, ParamRef, Resolvable, Struct, Template

if TYPE_CHECKING:
    from plait.module import Module

__all__ = ["TracedValue", "Tracer", "TracingError", "active_trace", "module_paths", "trace"]

_OPEN = "\ue000"
_CLOSE = "\ue001"
_serials = itertools.count(1)

#: The tracer recording right now, if any (the same variable parameters consult).
active_trace = active_tracer


class TracingError(TypeError):
    """Something in ``forward()`` needs a value that only exists when the graph runs."""


class TracedValue(str):
    """Placeholder for a leaf call's output while ``forward()`` is being traced."""

    _plait_node: int
    _plait_tracer: Tracer
    _plait_path: str

    def __new__(cls, tracer: Tracer, node: int, path: str) -> TracedValue:
        self = super().__new__(cls, f"{_OPEN}{tracer.serial}:n{node}{_CLOSE}")
        self.__dict__["_plait_node"] = node
        self.__dict__["_plait_tracer"] = tracer
        self.__dict__["_plait_path"] = path
        return self

    @property
    def ref(self) -> str:
        return f"node:{self._plait_node}"

    @property
    def payload(self) -> NoReturn:
        self._refuse("reading .payload")

    # -- deferred operations: recorded as nodes, applied to the real value later ----
    def __getitem__(self, key: Any) -> TracedValue:
        return self._plait_tracer.record_op(operator.getitem, (self, key), f"[{key!r}]", self)

    def __getattr__(self, name: str) -> TracedValue:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._plait_tracer.record_op(getattr, (self, name), f".{name}", self)

    def __call__(self, *args: Any, **kwargs: Any) -> TracedValue:
        return self._plait_tracer.record_op(_call, (self, *args), "()", self, kwargs)

    # -- text: keep the token, so the dependency survives ------------------------------
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        if spec:
            self._refuse(f"formatting with the spec {spec!r}")
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"<traced output of {self._plait_path}>"

    def __copy__(self) -> TracedValue:
        return self

    def __deepcopy__(self, memo: Any) -> TracedValue:
        return self

    __hash__ = object.__hash__

    # -- questions about the value: not answerable while tracing -----------------------
    def __bool__(self) -> NoReturn:
        self._refuse("a truth test (if/while/and/or/not)")

    def __len__(self) -> NoReturn:
        self._refuse("len()")

    def __iter__(self) -> NoReturn:
        self._refuse("iteration or unpacking (index it instead: out[0], out['key'])")

    def __contains__(self, item: object) -> NoReturn:
        self._refuse("'in'")

    def __eq__(self, other: object) -> NoReturn:
        self._refuse("a comparison (==)")

    def __ne__(self, other: object) -> NoReturn:
        self._refuse("a comparison (!=)")

    def __lt__(self, other: object) -> NoReturn:
        self._refuse("a comparison (<)")

    def __le__(self, other: object) -> NoReturn:
        self._refuse("a comparison (<=)")

    def __gt__(self, other: object) -> NoReturn:
        self._refuse("a comparison (>)")

    def __ge__(self, other: object) -> NoReturn:
        self._refuse("a comparison (>=)")

    def _refuse(self, what: str) -> NoReturn:
        raise TracingError(
            f"the output of {self._plait_path!r} was used in {what} while tracing, but it has "
            "no value until the graph runs. To decide on real values, give the deciding module "
            "an `async def forward(...)`: it runs eagerly on real values, and its calls "
            "(await self.llm(x)) still go through plait's runtime, limits and handlers. "
            "Plain text use (f-strings, +, str.format, str.join) and indexing are fine"
        )


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _deferred_method(name: str) -> property:
    def get(self: TracedValue) -> TracedValue:
        return self._plait_tracer.record_op(getattr, (self, name), f".{name}", self)

    return property(get)


# str's own methods would act on the token; make them deferred operations instead.
for _name in dir(str):
    if not _name.startswith("_"):
        setattr(TracedValue, _name, _deferred_method(_name))
del _name


def module_paths(root: Module) -> dict[int, str]:
    """Dotted path of every module under ``root`` (the root is named by its class)."""
    paths = {}
    for path, module in root.named_modules():
        paths[id(module)] = path or type(root).__name__
    for name, param in root.named_parameters():
        param._path = name
    return paths


_signatures: dict[type, _Shape] = {}


def _check_arguments(module: Module, path: str, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """Fail at trace time, naming the module, when a leaf is called with wrong arguments."""
    cls = type(module)
    shape = _signatures.get(cls)
    if shape is None:
        shape = _signatures[cls] = _Shape(inspect.signature(cls.forward))
    if shape.accepts(args, kw):
        return
    try:
        shape.signature.bind(module, *args, **kw)
    except TypeError as exc:
        raise TypeError(f"{path} ({cls.__name__}.forward): {exc}") from None


class _Shape:
    """A forward signature, with a quick check for the common plain-parameter case.

    Binding a signature costs ~14 µs, paid once per leaf call per input while
    tracing; plain ``forward(self, a, b=...)`` signatures are checked by counting
    instead, and anything else (or any mismatch) goes to `inspect` for its message.
    """

    __slots__ = ("names", "required", "signature", "simple")

    def __init__(self, signature: inspect.Signature) -> None:
        self.signature = signature
        params = list(signature.parameters.values())[1:]  # self
        self.simple = all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
        self.names = tuple(p.name for p in params)
        self.required = frozenset(p.name for p in params if p.default is inspect.Parameter.empty)

    def accepts(self, args: tuple[Any, ...], kw: dict[str, Any]) -> bool:
        if not self.simple or len(args) > len(self.names):
            return False
        positional = self.names[: len(args)]
        if kw and (not set(kw) <= set(self.names) or not set(kw).isdisjoint(positional)):
            return False
        return self.required <= {*positional, *kw}


class Tracer(Handler):
    """Records one forward pass; the innermost handler while it runs."""

    def __init__(self, paths: dict[int, str] | None = None) -> None:
        self.serial = next(_serials)
        self.graph = Graph()
        self.paths = paths if paths is not None else {}
        self._params: list[Parameter] = []
        self._param_index: dict[int, int] = {}
        self._unnamed = itertools.count(1)

    # -- the handler: leaf calls become nodes; composites run their forward ------------
    def process(self, msg: Message) -> None:
        if msg.phase != "trace":
            return
        msg.stop = True  # trace-time calls are the tracer's business alone
        module = msg.module
        if module is not None and _is_node(module):
            msg.value = self.record_module(module, msg.args, msg.kwargs)
            msg.done = True

    def path_of(self, module: Module) -> str:
        path = self.paths.get(id(module))
        if path is None:
            path = f"<{type(module).__name__}#{next(self._unnamed)}>"
            self.paths[id(module)] = path
        return path

    def record_module(self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        path = self.path_of(module)
        _check_arguments(module, path, args, kwargs)
        deps: set[int] = set()
        params: dict[int, Parameter] = {}
        cargs = tuple(self.capture(a, deps, params) for a in args)
        ckwargs = {k: self.capture(v, deps, params) for k, v in kwargs.items()}
        own = getattr(module, "system_prompt", None)
        if isinstance(own, Parameter):
            params[id(own)] = own
        node = self._add(
            Node(
                len(self.graph.nodes),
                "module",
                path,
                module,
                cargs,
                ckwargs,
                tuple(sorted(deps)),
                tuple(params.values()),
            )
        )
        return TracedValue(self, node.id, path)

    def record_op(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        suffix: str,
        source: TracedValue,
        kwargs: dict[str, Any] | None = None,
    ) -> TracedValue:
        deps: set[int] = set()
        params: dict[int, Parameter] = {}
        cargs = tuple(self.capture(a, deps, params) for a in args)
        ckwargs = {k: self.capture(v, deps, params) for k, v in (kwargs or {}).items()}
        path = source._plait_path + suffix
        node = self._add(
            Node(
                len(self.graph.nodes),
                "op",
                path,
                None,
                cargs,
                ckwargs,
                tuple(sorted(deps)),
                tuple(params.values()),
                op=fn,
            )
        )
        return TracedValue(self, node.id, path)

    def _add(self, node: Node) -> Node:
        self.graph.nodes.append(node)
        for dep in node.deps:
            self.graph.nodes[dep].dependents.append(node.id)
        for param in node.params:
            self.graph.params[id(param)] = param
        return node

    def lift_parameter(self, param: Parameter) -> str:
        index = self._param_index.get(id(param))
        if index is None:
            index = self._param_index[id(param)] = len(self._params)
            self._params.append(param)
        return f"{_OPEN}{self.serial}:p{index}{_CLOSE}"

    # -- turning arguments into references -------------------------------------------
    def capture(self, obj: Any, deps: set[int], params: dict[int, Parameter]) -> Any:
        cls = type(obj)
        if cls is TracedValue:
            if obj._plait_tracer is not self:
                raise TracingError(_foreign(obj._plait_path))
            deps.add(obj._plait_node)
            return NodeRef(obj._plait_node)
        if cls is str:
            return self._capture_text(obj, deps, params) if _OPEN in obj else obj
        if isinstance(obj, Parameter):
            params[id(obj)] = obj
            return ParamRef(obj)
        if cls is list or cls is tuple or (isinstance(obj, tuple) and hasattr(obj, "_fields")):
            items = [self.capture(item, deps, params) for item in obj]
            if any(isinstance(item, Resolvable) for item in items):
                return Struct(cls, items)
            return obj
        if cls is dict:
            pairs = []
            changed = False
            for key, value in obj.items():
                if type(key) is TracedValue:
                    key._refuse("a dict key")
                captured = self.capture(value, deps, params)
                changed = changed or isinstance(captured, Resolvable)
                pairs.append((key, captured))
            return Struct(dict, pairs) if changed else obj
        if isinstance(obj, str) and _OPEN in obj:
            return self._capture_text(str(obj), deps, params)
        return obj

    def _capture_text(self, text: str, deps: set[int], params: dict[int, Parameter]) -> Any:
        pieces = text.split(_OPEN)
        parts: list[str | NodeRef | ParamRef] = [pieces[0]] if pieces[0] else []
        for piece in pieces[1:]:
            token, _, rest = piece.partition(_CLOSE)
            serial, _, ident = token.partition(":")
            if serial != str(self.serial) or not ident:
                raise TracingError(_foreign(text[:60]))
            index = int(ident[1:])
            if ident[0] == "n":
                deps.add(index)
                parts.append(NodeRef(index))
            else:
                param = self._params[index]
                params[id(param)] = param
                parts.append(ParamRef(param))
            if rest:
                parts.append(rest)
        if len(parts) == 1 and not isinstance(parts[0], str):
            only = parts[0]
            if isinstance(only, NodeRef):
                return only
        return Template(parts)


def _foreign(what: str) -> str:
    return (
        f"{what!r} holds a traced output from a different trace; traced outputs are only "
        "meaningful inside the forward() call that produced them (do not keep them in "
        "attributes or globals between calls)"
    )


def _is_node(module: Module) -> bool:
    if module._calls_llm or module._has_async_forward():
        return True
    return all(child._holds_only_parameters for child in module._children.values())


def trace(
    root: Module,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    paths: dict[int, str] | None = None,
) -> Graph:
    """Record ``root(*args, **kwargs)`` as a graph of leaf calls."""
    tracer = Tracer(paths if paths is not None else module_paths(root))
    with tracer:
        token = active_trace.set(tracer)
        try:
            out = root(*args, **(kwargs or {}))
        finally:
            active_trace.reset(token)
    deps: set[int] = set()
    params: dict[int, Parameter] = {}
    tracer.graph.output = tracer.capture(out, deps, params)
    for param in params.values():
        tracer.graph.params[id(param)] = param
    return tracer.graph
