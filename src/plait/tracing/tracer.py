"""The tracer: the interpreter that records leaf-module calls into a `Graph`.

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

A handler's ``with`` block inside ``forward`` is recorded too: every node made while
it is open carries the handler (`Node.handlers`), and the engine enters it again
around that node when it runs (`Tracer.entering`; see docs/architecture.md).
"""

from __future__ import annotations

import inspect
import itertools
import operator
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from plait._signature import forward_shape
from plait.effects import Handler, Interpreter, Message
from plait.parameter import Parameter
from plait.parameter import _snapshot as _parameter_snapshot
from plait.tracing.graph import (
    Formatted,
    Graph,
    Node,
    NodeRef,
    ParamRef,
    Resolvable,
    Struct,
    Template,
)

if TYPE_CHECKING:
    from plait.module import Module

__all__ = [
    "LiftedParameter",
    "TracedValue",
    "Tracer",
    "TracingError",
    "module_paths",
    "trace",
]

# A placeholder is OPEN MARK "<serial>:<n|p><index>[r]" CLOSE.  OPEN and CLOSE are
# private-use characters no real text contains; MARK is a control character, which
# ``repr()`` and ``json.dumps`` escape in their own ways, so a placeholder that went
# through either is still recognised, and the real value is formatted the same way.
_OPEN = "\ue000"
_CLOSE = "\ue001"
_MARK = "\x1f"
_serials = itertools.count(1)
_BODY = r"(\d+):([np])(\d+)(r?)"
# Every alternative starts with OPEN, a quote or a backslash: the lookahead lets the
# scan pass any other position with one character test instead of trying all four
# alternatives there (the pattern runs over the text of every traced prompt).
_PLACEHOLDER = re.compile(
    f'(?=[{_OPEN}"\\\\])(?:'
    + "|".join(
        (
            f"{_OPEN}{_MARK}(?P<raw>{_BODY}){_CLOSE}",
            # json.dumps(..., ensure_ascii=True): every character escaped
            rf'(?P<qa>"?)\\ue000\\u001f(?P<ascii>{_BODY})\\ue001(?P=qa)',
            # json.dumps(..., ensure_ascii=False): only the control character escaped
            rf'(?P<qu>"?){_OPEN}\\u001f(?P<unicode>{_BODY}){_CLOSE}(?P=qu)',
            # repr() of a string that holds a placeholder
            rf"\\ue000\\x1f(?P<repr>{_BODY})\\ue001",
        )
    )
    + ")"
)
_DEBRIS = re.compile(rf"[{_OPEN}{_CLOSE}]|\\ue00[01]")


class TracingError(TypeError):
    """Something in ``forward()`` needs a value that only exists when the graph runs.

    In a plain ``forward`` a module call's result is a stand-in until the graph
    runs: pass it on, format it into text, index it, but do not ask questions about
    it (``if out:``, ``len(out)``, ``out == "x"``).  Decide on real values in an
    ``async def forward`` instead.  The message names the fix.
    """


class _Placeholder(str):
    """A stand-in, while tracing, for a value that is only read when the graph runs.

    Its text is a placeholder token, so text use (f-strings, ``+``, ``%``,
    ``str.format``, ``join``, ``repr``) carries it into strings the tracer parses
    back into dependencies; indexing and ``str`` methods are recorded and applied
    to the real value later.  Questions whose answer would be read off the token
    (truth tests, ``len``, comparisons, iteration) raise `TracingError`.
    """

    _plait_tracer: Tracer
    _iteration = "iteration"

    @property
    def _plait_path(self) -> str:
        raise NotImplementedError

    def _refuse(self, what: str) -> NoReturn:
        raise NotImplementedError

    # -- deferred operations: recorded as nodes, applied to the real value later ----
    def __getitem__(self, key: Any) -> TracedValue:
        path = f"{self._plait_path}[{key!r}]"
        return self._plait_tracer.record_op(operator.getitem, (self, key), path)

    # -- text: keep the token, so the dependency survives ------------------------------
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        if spec:
            self._refuse(f"formatting with the spec {spec!r}")
        return str.__str__(self)

    def __repr__(self) -> str:
        # str(dict_of_outputs), f"{x!r}": a token that resolves to repr(real value), so
        # the text is exactly what Python would have made of the real value.
        return str.__str__(self)[:-1] + "r" + _CLOSE

    # -- questions about the value: not answerable while tracing -----------------------
    def __bool__(self) -> NoReturn:
        self._refuse("a truth test (if/while/and/or/not)")

    def __len__(self) -> NoReturn:
        self._refuse("len()")

    def __iter__(self) -> NoReturn:
        self._refuse(self._iteration)

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


class TracedValue(_Placeholder):
    """Placeholder for a leaf call's output while ``forward()`` is being traced."""

    _plait_node: int
    _iteration = "iteration or unpacking (index it instead: out[0], out['key'])"

    def __new__(cls, tracer: Tracer, node: int, path: str) -> TracedValue:
        self = str.__new__(cls, f"{_OPEN}{_MARK}{tracer.serial}:n{node}{_CLOSE}")
        attributes = self.__dict__
        attributes["_plait_node"] = node
        attributes["_plait_tracer"] = tracer
        attributes["_plait_label"] = path
        return self

    @property
    def _plait_path(self) -> str:
        return str(self.__dict__["_plait_label"])

    @property
    def ref(self) -> str:
        return f"node:{self._plait_node}"

    @property
    def payload(self) -> NoReturn:
        self._refuse("reading .payload")

    def __getattr__(self, name: str) -> TracedValue:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._plait_tracer.record_op(getattr, (self, name), f"{self._plait_path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> TracedValue:
        return self._plait_tracer.record_op(_call, (self, *args), f"{self._plait_path}()", kwargs)

    def __copy__(self) -> TracedValue:
        return self

    def __deepcopy__(self, memo: Any) -> TracedValue:
        return self

    __hash__ = object.__hash__

    def _refuse(self, what: str) -> NoReturn:
        raise TracingError(
            f"the output of {self._plait_path!r} was used in {what} while tracing, but it has "
            "no value until the graph runs. To decide on real values, give the deciding module "
            "an `async def forward(...)`: it runs eagerly on real values, and its calls "
            "(await self.llm(x)) still go through plait's runtime, limits and handlers. "
            "Plain text use (f-strings, +, str.format, str.join) and indexing are fine"
        )


class LiftedParameter(_Placeholder):
    """What ``param.value`` (or ``str(param)``) is while ``forward()`` is traced: the
    parameter stays in the graph (visible to backward and the optimizer), read as it
    is when each input starts."""

    _plait_param: Parameter

    def __new__(cls, token: str, param: Parameter, tracer: Tracer) -> LiftedParameter:
        self = super().__new__(cls, token)
        self._plait_param = param
        self._plait_tracer = tracer
        return self

    @property
    def _plait_path(self) -> str:
        return f"param:{self._plait_param.qualified_name}"

    __hash__ = str.__hash__

    def _refuse(self, what: str) -> NoReturn:
        raise TracingError(
            f"{self._plait_path!r} was used in {what} while tracing forward(); its value is "
            "read when each input starts (so an optimizer step never changes an input "
            "half-way), and here it is a placeholder. Use it in text (f-strings, +, "
            "str.format, join), call its str methods, or pass it to a module; to branch "
            "on its value, do so in an `async def forward`, or outside forward()"
        )


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _deferred_method(name: str) -> property:
    def get(self: _Placeholder) -> TracedValue:
        return self._plait_tracer.record_op(getattr, (self, name), f"{self._plait_path}.{name}")

    return property(get)


# str's own methods would act on the token; make them deferred operations instead.
for _name in dir(str):
    if not _name.startswith("_"):
        setattr(_Placeholder, _name, _deferred_method(_name))
del _name


def _select(value: Any, where: tuple[Any, ...]) -> Any:
    for key in where:
        value = value[key]
    return value


def _holds_placeholder(text: str) -> bool:
    return _OPEN in text or "\\ue00" in text


def _pin(param: Parameter) -> None:
    """Fix the value this input runs with, for a parameter its root does not own."""
    snapshot = _parameter_snapshot.get()
    if snapshot is not None and id(param) not in snapshot:
        snapshot[id(param)] = param._value


def module_paths(root: Module) -> dict[int, str]:
    """Dotted path of every module under ``root`` (the root is named by its class)."""
    paths = {}
    for path, module in root.named_modules():
        paths[id(module)] = path or type(root).__name__
    return paths


def _check_arguments(module: Module, path: str, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """Fail at trace time, naming the module, when a leaf is called with wrong arguments.

    Plain signatures are checked by counting (binding costs ~14 µs per leaf call per
    input); anything else, or a mismatch, goes to `inspect` for its message.
    """
    cls = type(module)
    shape = forward_shape(cls)
    if shape.fits(args, kw):
        return
    try:
        shape.signature.bind(*args, **kw)
    except TypeError as exc:
        raise TypeError(f"{path} ({cls.__name__}.forward): {exc}") from None


class Tracer(Interpreter):
    """Records one forward pass; the innermost interpreter while it runs."""

    def __init__(
        self, paths: dict[int, str] | None = None, *, lift_parameters: bool = True
    ) -> None:
        self.serial = next(_serials)
        self.graph = Graph()
        self.paths = paths if paths is not None else {}
        #: False where code runs on real values but its module calls are recorded (a
        #: leaf's sync forward, a sync backward): parameters then read as values.
        self.lift_parameters = lift_parameters
        self._params: list[Parameter] = []
        self._param_index: dict[int, int] = {}
        self._unnamed = itertools.count(1)
        self._scopes: list[int] = []
        #: The handlers entered inside the forward being recorded and not left yet,
        #: innermost last: each node recorded meanwhile carries them (`Node.handlers`).
        self._handlers: tuple[Handler, ...] = ()
        #: Where each of them was entered (``Review.forward()``), for the errors.
        self._entered_in: tuple[str, ...] = ()
        #: True while the blocks a forward left open are being closed.
        self._closing = False

    # -- handler blocks inside forward: recorded on the calls they enclose ----------------
    def entering(self, handler: Handler) -> None:
        """A handler's block opens inside the forward being recorded: the calls recorded
        until it ends carry the handler, and run inside it; or it is refused here."""
        where = self._where()
        reason = handler.forward_refusal()
        if reason is not None:
            raise TracingError(
                f"{_named(handler)} was entered inside {where}, where plait records the "
                "calls and runs them later, entering the handler again around each call "
                f"made inside its block; {reason}"
            )
        self._handlers = (*self._handlers, handler)
        self._entered_in = (*self._entered_in, where)

    def leaving(self, handler: Handler) -> None:
        """A handler's block ends inside the forward being recorded: it must be the
        innermost one entered there (a block entered outside forward cannot end inside
        it: the calls recorded before would run without it)."""
        entered = self._handlers
        if entered and entered[-1] is handler:
            self._handlers = entered[:-1]
            self._entered_in = self._entered_in[:-1]
            return
        if self._closing:
            return
        where = self._where()
        if any(open_ is handler for open_ in entered):
            raise TracingError(
                f"{_named(handler)} was left inside {where} while a handler entered after "
                f"it there ({type(entered[-1]).__name__}) was still active; leave handlers "
                "in the reverse order of entering them (`with` blocks do)"
            )
        raise TracingError(
            f"{_named(handler)} was left inside {where} but entered outside it; plait runs "
            "a forward's calls after it returns, so a block cannot start outside forward "
            "and end inside it: enter and leave the handler inside forward (a `with` "
            "block), or around the whole run"
        )

    def _where(self) -> str:
        """The forward being recorded, for messages: ``Review.forward()``."""
        if self._scopes:
            return f"{self.graph.nodes[self._scopes[-1]].path}.forward()"
        return "forward()"

    def __exit__(self, *exc: object) -> None:
        """Leave the interpreters' slot; a block a forward left open is closed here, and
        refused when nothing else went wrong (its calls would run outside it)."""
        left_open, where = self._handlers, self._entered_in
        if not left_open:
            super().__exit__(*exc)
            return
        self._closing = True
        try:
            for handler in reversed(left_open):
                handler.__exit__(None, None, None)
        finally:
            self._handlers, self._entered_in, self._closing = (), (), False
            super().__exit__(*exc)
        if not exc or exc[0] is None:
            names = ", ".join(
                f"{_named(h)} (entered in {w})" for h, w in zip(left_open, where, strict=True)
            )
            raise TracingError(
                f"a handler block was left open in forward(): {names}; plait runs a "
                "forward's calls after it returns, so a handler entered inside forward "
                "must be left there too: use a `with` block"
            )

    # -- the interpreter: leaf calls become nodes; composites are traced through ---------
    def call_module(self, msg: Message) -> Any:
        """Record the call: handlers see it when it runs, not while it is recorded."""
        return self.call(msg.module, msg.args, msg.kwargs)

    def call(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record the call, with no message: none is needed to record it, and handlers
        see the call through the engine's message when it runs."""
        if _is_node(module):
            return self.record_module(module, args, kwargs)
        return self.record_composite(module, args, kwargs)

    def record_composite(
        self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Trace through a composite call, bracketed by ``enter`` and ``exit`` nodes.

        Its forward sees its arguments as read from ``enter`` (so a handler that
        rewrites them in ``process`` is obeyed) and its caller sees its output as
        read from ``exit`` (so ``postprocess`` rewrites are too); both keep the
        structure of what was passed and returned.  Only the traced parts are read
        through the brackets: constants in the arguments or output stay as written.
        """
        path = self.path_of(module)
        deps: set[int] = set()
        params: dict[int, Parameter] = {}
        capture = self.capture
        cargs = tuple([capture(a, deps, params) for a in args])
        ckwargs = {k: capture(v, deps, params) for k, v in kwargs.items()}
        enter = self._add(
            Node(
                len(self.graph.nodes),
                "enter",
                path,
                module,
                cargs,
                ckwargs,
                _in_order(deps),
                tuple(params.values()),
            )
        )
        label = f"{path} (argument)"
        substitute, source = self._substitute, enter.id
        inner_args = tuple([substitute(a, source, (0, i), label) for i, a in enumerate(args)])
        inner_kwargs = {k: substitute(v, source, (1, k), label) for k, v in kwargs.items()}
        self._scopes.append(source)
        try:
            out = module.forward(*inner_args, **inner_kwargs)
        finally:
            self._scopes.pop()
        # A traced output is never awaitable: only something else is worth inspect's test.
        if type(out) is not TracedValue and inspect.isawaitable(out):
            if inspect.iscoroutine(out):
                out.close()
            raise TracingError(
                f"{path} ({type(module).__name__}.forward) returned an awaitable while "
                "tracing; declare it `async def forward` so plait runs it on real values"
            )
        odeps: set[int] = {enter.id}
        oparams: dict[int, Parameter] = {}
        cout = self.capture(out, odeps, oparams)
        exit_node = self._add(
            Node(
                len(self.graph.nodes),
                "exit",
                path,
                module,
                (cout,),
                {},
                _in_order(odeps),
                tuple(oparams.values()),
                pair=enter.id,
            )
        )
        return self._substitute(out, exit_node.id, (), path)

    def _substitute(self, obj: Any, source: int, where: tuple[Any, ...], label: str) -> Any:
        """``obj`` with every traced part replaced by a read of node ``source`` at ``where``."""
        cls = type(obj)
        if cls is str:
            return self._projection(source, where, label) if _holds_placeholder(obj) else obj
        if cls is TracedValue or cls is LiftedParameter:
            return self._projection(source, where, label)
        if cls is list or cls is tuple or (isinstance(obj, tuple) and hasattr(obj, "_fields")):
            items = [
                self._substitute(item, source, (*where, i), label) for i, item in enumerate(obj)
            ]
            if all(new is old for new, old in zip(items, obj, strict=True)):
                return obj
            if cls is list:
                return items
            return tuple(items) if cls is tuple else cls(*items)
        if cls is dict:
            pairs = {k: self._substitute(v, source, (*where, k), label) for k, v in obj.items()}
            if all(pairs[k] is v for k, v in obj.items()):
                return obj
            return pairs
        return obj

    def _projection(self, source: int, where: tuple[Any, ...], label: str) -> TracedValue:
        whole = TracedValue(self, source, label)
        if not where:
            return whole
        suffix = "".join(f"[{key!r}]" for key in where)
        return self.record_op(_select, (whole, where), f"{label}{suffix}")

    def path_of(self, module: Module) -> str:
        path = self.paths.get(id(module))
        if path is None:
            path = f"<{type(module).__name__}#{next(self._unnamed)}>"
            self.paths[id(module)] = path
        return path

    def record_module(self, module: Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        path = self.paths.get(id(module)) or self.path_of(module)
        if not forward_shape(type(module)).fits(args, kwargs):
            _check_arguments(module, path, args, kwargs)
        deps: set[int] = set()
        params: dict[int, Parameter] = {}
        capture = self.capture
        if len(args) == 1:  # the usual leaf call: no comprehension (a frame of its own)
            cargs: tuple[Any, ...] = (capture(args[0], deps, params),)
        else:
            cargs = tuple([capture(a, deps, params) for a in args])
        ckwargs = {k: capture(v, deps, params) for k, v in kwargs.items()} if kwargs else {}
        for attribute in _OWN_PARAMETERS:
            own = getattr(module, attribute, None)
            if own is not None and isinstance(own, Parameter):
                params[id(own)] = own
        node = self._add(
            Node(
                len(self.graph.nodes),
                "module",
                path,
                module,
                cargs,
                ckwargs,
                tuple(deps) if len(deps) < 2 else tuple(sorted(deps)),  # `_in_order`, inline
                tuple(params.values()),
            )
        )
        out = TracedValue(self, node.id, path)
        samples = getattr(module, "n", 1) if module._calls_llm else 1
        if samples != 1:
            # n samples: a list of n values, so forward can index, iterate and pass them.
            return [out[i] for i in range(samples)]
        return out

    def record_op(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        path: str,
        kwargs: dict[str, Any] | None = None,
    ) -> TracedValue:
        deps: set[int] = set()
        params: dict[int, Parameter] = {}
        capture = self.capture
        cargs = tuple([capture(a, deps, params) for a in args])
        ckwargs = {k: capture(v, deps, params) for k, v in (kwargs or {}).items()}
        node = self._add(
            Node(
                len(self.graph.nodes),
                "op",
                path,
                None,
                cargs,
                ckwargs,
                _in_order(deps),
                tuple(params.values()),
                op=fn,
            )
        )
        return TracedValue(self, node.id, path)

    def _add(self, node: Node) -> Node:
        handlers = self._handlers
        if handlers:
            node.handlers = handlers
        if self._scopes:
            # Everything recorded inside a composite call waits for its ``enter``, where
            # handlers may answer the call themselves (then the inside is skipped).
            scope = self._scopes[-1]
            node.scope = scope
            if scope not in node.deps:
                node.deps = (*node.deps, scope)
        graph = self.graph
        nodes = graph.nodes
        nodes.append(node)
        for dep in node.deps:
            nodes[dep].dependents.append(node.id)
        if node.params:
            known = graph.params
            for param in node.params:
                known[id(param)] = param
        return node

    def lift_parameter(self, param: Parameter) -> str:
        index = self._param_index.get(id(param))
        if index is None:
            index = self._param_index[id(param)] = len(self._params)
            self._params.append(param)
            _pin(param)
        return LiftedParameter(f"{_OPEN}{_MARK}{self.serial}:p{index}{_CLOSE}", param, self)

    # -- turning arguments into references -------------------------------------------
    def capture(self, obj: Any, deps: set[int], params: dict[int, Parameter]) -> Any:
        cls = type(obj)
        if cls is TracedValue:
            if obj._plait_tracer is not self:
                raise TracingError(_foreign(obj._plait_path))
            deps.add(obj._plait_node)
            return NodeRef(obj._plait_node)
        if cls is str:
            if _holds_placeholder(obj):
                return self._capture_text(obj, deps, params)
            return obj
        if isinstance(obj, Parameter):
            params[id(obj)] = obj
            _pin(obj)
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
        if isinstance(obj, str) and str.__contains__(obj, _OPEN):
            return self._capture_text(str.__str__(obj), deps, params)
        return obj

    def _capture_text(self, text: str, deps: set[int], params: dict[int, Parameter]) -> Any:
        parts: list[str | NodeRef | ParamRef | Formatted] = []
        end = 0
        serial_text = str(self.serial)
        for match in _PLACEHOLDER.finditer(text):
            if match.start() > end:
                parts.append(self._literal(text[end : match.start()]))
            end = match.end()
            # The alternative that matched is the last group to close (its name), and
            # the body's four groups follow it.
            group = match.lastgroup
            at = match.lastindex
            assert group is not None and at is not None
            serial, kind, index, as_repr = match.group(at + 1, at + 2, at + 3, at + 4)
            if serial != serial_text:
                raise TracingError(_foreign(text[:60]))
            ref = self._reference(kind, int(index), deps, params)
            if group == "repr":
                raise TracingError(
                    "a string built from a traced output was itself formatted with repr() "
                    "(for example str() or an f-string of a dict or list that holds "
                    'f"...{output}..." strings); Python would quote the real text, which '
                    "plait cannot know while tracing. Put the outputs themselves in the "
                    "container (str({'a': out}) works), or join the text yourself"
                )
            if group == "raw" and not as_repr:
                parts.append(ref)
                continue
            json_kind = {"ascii": "ascii", "unicode": "unicode"}.get(group)
            quoted = bool(match.group("qa") or match.group("qu"))
            parts.append(Formatted(ref, as_repr=bool(as_repr), json=json_kind, quoted=quoted))
        if end < len(text):
            parts.append(self._literal(text[end:]))
        if len(parts) == 1 and isinstance(parts[0], NodeRef | ParamRef):
            return parts[0]
        return Template(parts)

    def _reference(
        self, kind: str, index: int, deps: set[int], params: dict[int, Parameter]
    ) -> NodeRef | ParamRef:
        if kind == "n":
            if index >= len(self.graph.nodes):
                raise TracingError(_foreign(f"node {index}"))
            deps.add(index)
            return NodeRef(index)
        param = self._params[index]
        params[id(param)] = param
        return ParamRef(param)

    @staticmethod
    def _literal(text: str) -> str:
        """Text between placeholders; what is left of a broken one is an error, not text."""
        if _OPEN not in text and _CLOSE not in text and "\\ue00" not in text:
            return text  # nothing `_DEBRIS` could find: no regex search
        debris = _DEBRIS.search(text)
        if debris is not None:
            start = max(0, debris.start() - 20)
            raise TracingError(
                "text built from a traced output was changed in a way plait cannot follow "
                f"(near {text[start : debris.start() + 30]!r}): a placeholder for a value "
                "that does not exist yet was cut, re-cased, escaped or replaced. Apply str "
                "methods and slicing to the output itself (out.upper(), out[:100]) or to "
                "text in an `async def forward`, where values are real"
            )
        return text


def _named(handler: Handler) -> str:
    """A handler as the errors name it: its class (the catalogue's are ``Override``,
    ``Budget``, ``Profiler``...; a user's own by the name they gave it)."""
    return f"the handler {type(handler).__name__}"


def _foreign(what: str) -> str:
    return (
        f"{what!r} holds a traced output from a different trace; traced outputs are only "
        "meaningful inside the forward() call that produced them (do not keep them in "
        "attributes or globals between calls)"
    )


#: A leaf's own parameters, recorded on its node (an `LLMInference`'s; any module's).
_OWN_PARAMETERS = ("system_prompt", "demos")


def _in_order(deps: set[int]) -> tuple[int, ...]:
    """A node's dependencies in id order (most nodes have none or one: no sort)."""
    if len(deps) < 2:
        return tuple(deps)
    return tuple(sorted(deps))


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
        out = root(*args, **(kwargs or {}))
    deps: set[int] = set()
    params: dict[int, Parameter] = {}
    tracer.graph.output = tracer.capture(out, deps, params)
    for param in params.values():
        tracer.graph.params[id(param)] = param
    return tracer.graph
