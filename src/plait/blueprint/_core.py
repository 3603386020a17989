"""`Blueprint`: layered, lazy arguments for any constructor, resolved only by ``make()``."""

from __future__ import annotations

import difflib
import enum
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar, overload

from plait.blueprint._keys import Found, Layer, found_items, join_path
from plait.blueprint._knobs import BUILT, KNOB_NAMES, Knob, knobs_of
from plait.blueprint._types import (
    DEFAULT_LAYER,
    EMPTY,
    Castable,
    CastError,
    Lookup,
    Param,
    accepts,
    cast,
    classes_in,
    constructible_class,
    factory_fits,
    find_factory,
    is_factory,
    is_mapping,
    load_object,
    mapping_value_type,
    module_of,
    object_text,
    signature_params,
    type_text,
)

__all__ = [
    "ArgInfo",
    "Blueprint",
    "BlueprintError",
    "Castable",
    "make_from_argv",
    "parse_cli_args",
]

T = TypeVar("T")

COMMAND_LINE = "command line"


class BlueprintError(ValueError):
    """Everything wrong with a blueprint at once, so one run shows every fix to make."""

    def __init__(self, problems: list[str], what: str = "the blueprint") -> None:
        self.problems = list(problems)
        count = len(self.problems)
        heading = f"cannot build {what}: " + ("1 problem" if count == 1 else f"{count} problems")
        super().__init__(heading + "".join(f"\n  - {p}" for p in self.problems))


@dataclass(frozen=True, slots=True)
class ArgInfo:
    """One argument as ``make()`` would use it, for ``--help`` and for tools."""

    path: str
    type: str
    value: str
    layer: str  # "default", a preset's name, "command line", another layer's name; "" if unset
    required: bool
    doc: str = ""
    #: The key that set it when that was not the path itself (a wildcard, say).
    key: str | None = None


def parse_cli_args(argv: list[str]) -> dict[str, Castable]:
    """``key=value`` tokens to a layer of castable strings (``--key=value`` also reads).

    Only the shape of the tokens is checked here; whether the keys exist is
    ``make()``'s business, once every layer is known.
    """
    args: dict[str, Castable] = {}
    bad: list[str] = []
    for token in argv:
        key, sep, value = token.partition("=")
        key = key.removeprefix("--")
        if not sep or not key:
            bad.append(
                f"{token!r} is not an argument: write key=value, "
                "e.g. summarizer.temperature=0.2 or ...temperature=0"
            )
        else:
            args[key] = Castable(value)
    if bad:
        raise BlueprintError(bad, "the command line")
    return args


# -- the plan: what make() will call, found without calling anything -------------------


@dataclass(slots=True)
class _Const:
    value: Any


@dataclass(slots=True)
class _Call:
    path: str
    factory: Callable[..., Any]
    positional: list[_Node]
    keywords: dict[str, _Node]


@dataclass(slots=True)
class _Dict:
    items: dict[str, _Node]


_Node: TypeAlias = _Const | _Call | _Dict


@dataclass(slots=True)
class _Plan:
    root: _Node | None
    infos: list[ArgInfo]
    problems: list[str]
    #: The target, when the plan had to build it to find its submodules' knobs.
    built: Any = None
    failures: list[tuple[str, Any, BaseException]] | None = None
    knobs: list[tuple[Knob, Any]] | None = None


def _value_text(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if is_factory(value):
        return object_text(value)
    text = repr(str(value)) if isinstance(value, Castable) else repr(value)
    if "\n" in text:  # a module tree, say: its class is what a table can show
        return f"{type(value).__name__}(…)"
    return text if len(text) <= 60 else text[:57] + "..."


def _fields_of(value: Any) -> Mapping[Any, Any]:
    """What a default contributes when arguments under it rebuild it: a mapping's items,
    or the fields a pydantic model was given; anything else is replaced whole."""
    if isinstance(value, Mapping):
        return value
    fields_set = getattr(value, "model_fields_set", None)
    if isinstance(fields_set, set | frozenset):
        return {name: getattr(value, name) for name in fields_set}
    return {}


class _Planner:
    """One walk over the target's parameters, reading the layers and noting problems."""

    def __init__(self, target: Callable[..., Any], layers: list[Layer]) -> None:
        self.target = target
        self.layers = layers
        self.target_module = module_of(target)
        self.used: set[tuple[int, str]] = set()
        self.reported: set[str] = set()
        self.infos: dict[str, ArgInfo] = {}
        self.built: dict[str, tuple[Any, str]] = {}  # path -> (factory, layer)
        self.problems: list[str] = []
        self.building: list[Any] = []
        self.knob_paths: set[str] = set()

    # -- reading layers ---------------------------------------------------------------
    def lookup(self, path: str) -> Found | None:
        for index in range(len(self.layers) - 1, -1, -1):
            hit = self.layers[index].find(path)
            if hit is not None:
                key, value = hit
                self.used.add((index, key))
                return Found(value, self.layers[index].name, index, key)
        return None

    def lookup_exact(self, path: str) -> Found | None:
        for index in range(len(self.layers) - 1, -1, -1):
            layer = self.layers[index]
            if path in layer.exact:
                self.used.add((index, path))
                return Found(layer.exact[path], layer.name, index, path)
        return None

    def below(self, path: str) -> list[str]:
        """Exact keys under ``path``: these ask for it to be built, wildcards never do."""
        prefix = path + "."
        keys: dict[str, None] = {}
        for layer in self.layers:
            for key in layer.exact:
                if key.startswith(prefix):
                    keys[key] = None
        return list(keys)

    def lookup_for(self, owner: Any) -> Lookup:
        modules = [m for m in (module_of(owner), self.target_module) if m is not None]
        return Lookup(tuple(dict.fromkeys(modules)))

    # -- recording --------------------------------------------------------------------
    def record(
        self,
        param: Param,
        path: str,
        value: str,
        layer: str,
        key: str | None = None,
    ) -> None:
        self.infos[path] = ArgInfo(
            path=path,
            type=type_text(param.annotation),
            value=value,
            layer=layer,
            required=param.required,
            doc=param.doc,
            key=key if key != path else None,
        )

    def problem(self, path: str, message: str, found: Found | None = None) -> None:
        where = path or object_text(self.target)
        if found is not None:
            via = f" via {found.key!r}" if found.key and found.key != path else ""
            where += f" (from {found.layer}{via})"
        self.problems.append(f"{where}: {message}")

    # -- the walk ---------------------------------------------------------------------
    def build(self, factory: Any, path: str, fallbacks: Mapping[str, Found] | None) -> _Node | None:
        self.building.append(factory)
        try:
            return self.call(factory, path, fallbacks or {})
        finally:
            self.building.pop()

    def call(self, factory: Any, path: str, fallbacks: Mapping[str, Found]) -> _Node | None:
        try:
            params, var_kw = signature_params(factory)
        except (TypeError, ValueError) as exc:
            self.problem(path, f"cannot read the parameters of {object_text(factory)}: {exc}")
            return None
        node = _Call(path, factory, [], {})
        names = {p.name for p in params}
        for param in params:
            sub = join_path(path, param.name)
            child = self.param(param, sub, factory, fallbacks.get(param.name))
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                # Later positional values need every earlier slot filled.
                node.positional.append(child or _Const(param.default))
            elif child is not None:
                node.keywords[param.name] = child
        extra = [k for k in self.children(path) if k not in names]
        extra += [k for k in fallbacks if k not in names and k not in extra]
        for name in extra:
            sub = join_path(path, name)
            if var_kw is None:
                if name in fallbacks:
                    self.problem(
                        sub,
                        f"{object_text(factory)} has no parameter {name!r}",
                        fallbacks[name],
                    )
                continue  # exact keys: reported as unknown, with suggestions, at the end
            param = Param(name, var_kw.annotation, None, inspect.Parameter.KEYWORD_ONLY)
            child = self.param(param, sub, factory, fallbacks.get(name))
            if child is not None:
                node.keywords[name] = child
        return node

    def children(self, path: str) -> list[str]:
        start = len(path) + 1 if path else 0
        names: dict[str, None] = {}
        for layer in self.layers:
            for key in layer.exact:
                if not path or key.startswith(path + "."):
                    names[key[start:].split(".", 1)[0]] = None
        return list(names)

    def param(self, param: Param, path: str, owner: Any, fallback: Found | None) -> _Node | None:
        found = self.lookup(path)
        # A value inherited from a whole mapping competes with the keys by layer order.
        if fallback is not None and (found is None or found.index < fallback.index):
            found = fallback
        below = self.below(path)
        if found is None:
            return self.unspecified(param, path, below, owner)
        if isinstance(found.value, Castable):
            return self.from_text(param, path, found, below, owner)
        return self.from_object(param, path, found, below, owner)

    def unspecified(self, param: Param, path: str, below: list[str], owner: Any) -> _Node | None:
        annotation = param.effective
        base = _fields_of(param.default)
        base_found = found_items(base, param.default_layer, param.default_index)
        if below and is_mapping(annotation):
            self.record(param, path, "{…}", param.default_layer if base else DEFAULT_LAYER)
            return self.mapping(param, path, owner, base_found)
        cls = constructible_class(annotation)
        if below and cls is None:
            what = type_text(annotation) or "an unannotated parameter"
            self.nested_in_value(path, below, f"{path!r} is {what}, which takes no arguments")
        elif cls is not None and (below or (param.required and cls not in self.building)):
            self.record(param, path, object_text(cls), DEFAULT_LAYER)
            self.built[path] = (cls, DEFAULT_LAYER)
            return self.build(cls, path, base_found if below else None)
        if param.required:
            self.record(param, path, "<missing>", "")
            example = f"{path}=<Class>" if cls is not None else f"{path}=..."
            self.problem(
                path,
                f"missing required argument ({type_text(annotation) or 'any'}); "
                f"set it with {example}",
            )
            return None
        self.record(param, path, _value_text(param.default), param.default_layer)
        return None

    def from_text(
        self, param: Param, path: str, found: Found, below: list[str], owner: Any
    ) -> _Node | None:
        lookup = self.lookup_for(owner)
        text = str(found.value)
        annotation = param.effective
        cast_error: CastError | None = None
        if not below:
            try:
                value = cast(text, annotation, lookup)
            except CastError as exc:
                cast_error = exc
            else:
                self.record(param, path, _value_text(value), found.layer, found.key)
                return _Const(value)
        elif is_mapping(annotation):
            try:
                base = cast(text, annotation, lookup)
            except CastError as exc:
                self.record(param, path, _value_text(found.value), found.layer, found.key)
                self.problem(path, str(exc), found)
                return None
            self.record(param, path, _value_text(base), found.layer, found.key)
            return self.mapping(param, path, owner, found_items(base, found.layer, found.index))
        if below or constructible_class(annotation) is not None or _wants_factory(annotation):
            try:
                factory = find_factory(text, annotation, lookup)
            except CastError as exc:
                reason = str(exc)
                if cast_error is not None:
                    reason = f"{cast_error}; nor does it name a class to build: {exc}"
                elif below:
                    reason = (
                        f"{text!r} must name a class or function to build, since "
                        f"{below[0]!r} is set: {exc}"
                    )
                self.record(param, path, _value_text(found.value), found.layer, found.key)
                self.problem(path, reason, found)
                self.reported.update(below)
                return None
            return self.factory(param, path, factory, found)
        self.record(param, path, _value_text(found.value), found.layer, found.key)
        self.problem(path, str(cast_error), found)
        return None

    def from_object(
        self, param: Param, path: str, found: Found, below: list[str], owner: Any
    ) -> _Node | None:
        value = found.value
        annotation = param.effective
        if not below and accepts(value, annotation):
            self.record(param, path, _value_text(value), found.layer, found.key)
            return _Const(value)
        if below and is_mapping(annotation) and isinstance(value, Mapping):
            self.record(param, path, _value_text(value), found.layer, found.key)
            items = found_items(value, found.layer, found.index)
            return self.mapping(param, path, owner, items)
        if is_factory(value):
            return self.factory(param, path, value, found)
        self.record(param, path, _value_text(value), found.layer, found.key)
        if below:
            self.nested_in_value(
                path,
                below,
                f"{path!r} is set to the object {_value_text(value)} (from {found.layer}); "
                f"set {path}=<Class> to build one from arguments instead",
            )
            return None
        hint = ""
        if isinstance(value, str):
            hint = " (wrap text from a command line or file in Castable to convert it)"
        self.problem(
            path,
            f"expected {type_text(annotation)}, got {type(value).__name__} "
            f"{_value_text(value)}{hint}",
            found,
        )
        return None

    def factory(self, param: Param, path: str, factory: Any, found: Found) -> _Node | None:
        self.record(param, path, object_text(factory), found.layer, found.key)
        if not callable(factory):
            self.problem(path, f"{_value_text(factory)} is not a class or function", found)
            return None
        if not factory_fits(factory, param.effective):
            self.problem(
                path,
                f"{object_text(factory)} does not make a {type_text(param.effective)}",
                found,
            )
            return None
        self.built[path] = (factory, found.layer)
        return self.build(factory, path, None)

    def mapping(
        self, param: Param, path: str, owner: Any, base: Mapping[str, Found]
    ) -> _Node | None:
        """A dict built key by key: ``aliases.fast.model=x`` over any whole value given."""
        value_type = mapping_value_type(param.effective)
        names = self.children(path)
        node = _Dict({k: _Const(f.value) for k, f in base.items()})
        for name in names:
            inherited = base.get(name)
            element = Param(
                name,
                value_type,
                inherited.value if inherited is not None else EMPTY,
                inspect.Parameter.KEYWORD_ONLY,
                default_layer=inherited.layer if inherited is not None else DEFAULT_LAYER,
                default_index=inherited.index if inherited is not None else -1,
            )
            child = self.param(element, join_path(path, name), owner, None)
            if child is None and inherited is not None:
                child = _Const(inherited.value)
            if child is not None:
                node.items[name] = child
        return node

    def nested_in_value(self, path: str, below: list[str], why: str) -> None:
        for key in below:
            if key in self.reported:
                continue
            self.reported.add(key)
            index = max(i for i, layer in enumerate(self.layers) if key in layer.exact)
            layer = self.layers[index]
            self.used.add((index, key))
            self.problems.append(f"{key} (from {layer.name}): cannot apply, {why}")

    # -- submodules' knobs, once the target is built ------------------------------------
    def knobs(self, root: Any) -> list[tuple[Knob, Any]]:
        """Read every knob of ``root``'s submodules from the layers; what to set, converted.

        A constructor argument at the same path wins (it built that module already), and
        where a module above the knob takes a constructor argument of the knob's name
        (``Judge(temperature=...)`` building ``judge.llm``), that argument is the
        module's interface for it: wildcards stop there, and only a key naming the
        knob's own path reaches past it.
        """
        settings: list[tuple[Knob, Any]] = []
        arguments = set(self.infos)
        for knob in knobs_of(root):
            if knob.path in arguments:
                continue
            self.knob_paths.add(knob.path)
            parts = knob.path.split(".")[:-1]
            shadowed = any(
                join_path(".".join(parts[:i]), knob.name) in arguments for i in range(len(parts))
            )
            found = self.lookup_exact(knob.path) if shadowed else self.lookup(knob.path)
            if found is None:
                self.infos[knob.path] = ArgInfo(
                    knob.path, knob.type, _value_text(knob.current()), BUILT, False
                )
                continue
            raw = str(found.value) if isinstance(found.value, Castable) else found.value
            key = found.key if found.key != knob.path else None
            try:
                value = knob.convert(raw)
            except CastError as exc:
                self.infos[knob.path] = ArgInfo(
                    knob.path, knob.type, _value_text(found.value), found.layer, False, key=key
                )
                self.problem(knob.path, str(exc), found)
                continue
            self.infos[knob.path] = ArgInfo(
                knob.path, knob.type, _value_text(value), found.layer, False, key=key
            )
            settings.append((knob, value))
        return settings

    # -- after the walk ---------------------------------------------------------------
    def unused(self, knobs_unknown: bool = False) -> None:
        """Report keys nothing used.  ``knobs_unknown``: the target could not be built, so
        keys that may name a submodule's knob are left unjudged rather than called unknown."""
        known = list(self.infos)
        for index, layer in enumerate(self.layers):
            for message in layer.invalid:
                self.problems.append(f"{message} (from {layer.name})")
            for key in layer.exact:
                if (index, key) in self.used or key in self.infos or key in self.reported:
                    continue
                if knobs_unknown and key.rsplit(".", 1)[-1] in KNOB_NAMES:
                    continue
                self.problems.append(
                    f"{key} (from {layer.name}): unknown argument{self.suggest(key, known)}"
                )
            for pattern in layer.wildcards:
                if (index, pattern.key) in self.used:
                    continue
                if any(pattern.matches(p) for p in known):
                    continue
                if knobs_unknown and pattern.last_name in KNOB_NAMES:
                    continue
                close = difflib.get_close_matches(
                    pattern.last_name, {p.rsplit(".", 1)[-1] for p in known}, n=1
                )
                hint = ""
                if close:
                    hint = f"; did you mean {pattern.key[: -len(pattern.last_name)] + close[0]!r}?"
                self.problems.append(
                    f"{pattern.key} (from {layer.name}): matches no argument{hint}"
                )

    def suggest(self, key: str, known: list[str]) -> str:
        arguments = [p for p in known if p not in self.knob_paths]
        close = difflib.get_close_matches(key, arguments, n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]!r}?"
        nested = [p for p in arguments if p.endswith("." + key)]
        if nested:
            return f"; did you mean {nested[0]!r}?"
        parts = key.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            ancestor = ".".join(parts[:cut])
            if ancestor in self.built:
                factory, layer = self.built[ancestor]
                inside = [p for p in known if p.startswith(ancestor + ".")]
                siblings = [p[len(ancestor) + 1 :] for p in inside]
                siblings = [p for p in siblings if "." not in p]
                close = difflib.get_close_matches(parts[cut], siblings, n=1)
                if close:
                    tip = f"; did you mean {ancestor + '.' + close[0]!r}?"
                else:  # a knob of a submodule it builds, say
                    deeper = [p for p in inside if p.rsplit(".", 1)[-1] == parts[-1]]
                    deeper += difflib.get_close_matches(key, inside, n=1, cutoff=0.6)
                    tip = f"; did you mean {deeper[0]!r}?" if deeper else ""
                return (
                    f": {ancestor!r} is {object_text(factory)} (from {layer}), which has no "
                    f"parameter {parts[cut]!r}{tip}"
                )
            if ancestor in self.infos:
                return f": {ancestor!r} is not built from arguments"
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        if close:
            return f"; did you mean {close[0]!r}?"
        last = difflib.get_close_matches(parts[-1], {p.rsplit(".", 1)[-1] for p in known}, n=1)
        if last:
            matches = [p for p in known if p.rsplit(".", 1)[-1] == last[0]]
            return f"; did you mean {matches[0]!r}?"
        return ""


def _module_class() -> type:
    from plait.module import Module

    return Module


def _wants_factory(annotation: Any) -> bool:
    """Whether a name could stand for a factory here: some user class, abstract ones included."""
    return any(
        c.__module__ != "builtins" and not issubclass(c, enum.Enum) for c in classes_in(annotation)
    )


def _evaluate(node: _Node, failures: list[tuple[str, Any, BaseException]]) -> Any:
    if isinstance(node, _Const):
        return node.value
    if isinstance(node, _Dict):
        items = {k: _evaluate(v, failures) for k, v in node.items.items()}
        return _FAILED if any(v is _FAILED for v in items.values()) else items
    args = [_evaluate(n, failures) for n in node.positional]
    kwargs = {k: _evaluate(n, failures) for k, n in node.keywords.items()}
    if any(v is _FAILED for v in args) or any(v is _FAILED for v in kwargs.values()):
        return _FAILED
    try:
        return node.factory(*args, **kwargs)
    except Exception as exc:
        failures.append((node.path, node.factory, exc))
        return _FAILED


_FAILED: Any = object()


def _explain(
    path: str, name: str, factory: Any, exc: BaseException, infos: Mapping[str, ArgInfo]
) -> list[str]:
    """A constructor's failure; pydantic's per-field errors go back to the argument's path."""
    errors = getattr(exc, "errors", None)
    if type(exc).__name__ == "ValidationError" and callable(errors):
        lines = []
        for error in errors():
            loc = [str(part) for part in error.get("loc", ())]
            if not loc:
                continue
            info = infos.get(join_path(path, loc[0]))
            source = f" (from {info.layer})" if info is not None and info.layer else ""
            lines.append(f"{join_path(path, '.'.join(loc))}{source}: {error.get('msg', error)}")
        if lines:
            return lines
    return [f"{path or name}: {object_text(factory)}(...) raised {type(exc).__name__}: {exc}"]


# -- the public object --------------------------------------------------------------------


class Blueprint(Generic[T]):
    """Arguments for ``target``, layered and lazy: nothing is checked or built before ``make()``.

    ``target`` is a class or callable, or a ``"module:Name"`` / ``"path/file.py:Name"``
    string (imported now: a target that does not exist is not a configuration).
    A target that is an object rather than a class or function (a module instance)
    is returned by ``make()`` as it is and takes no arguments.
    """

    @overload
    def __init__(self: Blueprint[Any], target: str) -> None: ...
    @overload
    def __init__(self, target: Callable[..., T]) -> None: ...
    def __init__(self, target: Callable[..., T] | str) -> None:
        if isinstance(target, str):
            try:
                target = load_object(target)
            except CastError as exc:
                raise BlueprintError([str(exc)], repr(target)) from None
        if not callable(target):
            raise BlueprintError([f"{target!r} is not a class or function"], "the blueprint")
        self._target: Callable[..., T] = target
        self._layers: list[Layer] = []
        self._presets: dict[str, dict[str, Any]] = {}
        self._pending: list[str] = []

    @property
    def target(self) -> Callable[..., T]:
        return self._target

    @property
    def presets(self) -> tuple[str, ...]:
        return tuple(self._presets)

    def apply(self, args: Mapping[str, Any], layer: str = COMMAND_LINE) -> Blueprint[T]:
        """Add a layer on top; later layers win.  The mapping is copied, nothing is checked."""
        if not isinstance(args, Mapping):
            raise TypeError(f"Blueprint.apply() takes a mapping, got {type(args).__name__}")
        self._layers.append(Layer.of(layer, args))
        return self

    def preset(self, name: str, args: Mapping[str, Any]) -> Blueprint[T]:
        """Register a named layer, applied later with `apply_preset` (and listed by ``help()``)."""
        if not isinstance(args, Mapping):
            raise TypeError(f"Blueprint.preset() takes a mapping, got {type(args).__name__}")
        self._presets[name] = dict(args)
        return self

    def apply_preset(self, name: str) -> Blueprint[T]:
        """Apply a registered preset as a layer named after it; an unknown name fails in make()."""
        if name in self._presets:
            return self.apply(self._presets[name], layer=name)
        close = difflib.get_close_matches(name, self._presets, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(self._presets) or "none registered"
        self._pending.append(f"unknown preset {name!r} (presets: {known}){hint}")
        return self

    def clone(self) -> Blueprint[T]:
        twin: Blueprint[T] = Blueprint(self._target)
        twin._layers = [Layer.of(layer.name, layer.values) for layer in self._layers]
        twin._presets = {k: dict(v) for k, v in self._presets.items()}
        twin._pending = list(self._pending)
        return twin

    def _builds_module(self) -> bool:
        from plait.module import Module

        return inspect.isclass(self._target) and issubclass(self._target, Module)

    def _plan(self) -> _Plan:
        """Plan the constructor call; for a plait Module, also build it and read the knobs
        of the submodules it builds (only then are all of its arguments known)."""
        planner = _Planner(self._target, self._layers)
        root: _Node | None
        if is_factory(self._target):
            root = planner.build(self._target, "", None)
        else:
            # An object that is merely callable (a module instance, say) is already
            # built: calling it would run it, so it is the result, and takes no arguments.
            root = _Const(self._target)
        plan = _Plan(root, [], [])
        builds_module = self._builds_module() or isinstance(self._target, _module_class())
        if builds_module and root is not None and not planner.problems and not self._pending:
            failures: list[tuple[str, Any, BaseException]] = []
            built = _evaluate(root, failures)
            if failures:
                plan.failures = failures
            else:
                plan.built = built
                plan.knobs = planner.knobs(built)
        planner.unused(knobs_unknown=builds_module and plan.knobs is None)
        plan.infos = list(planner.infos.values())
        plan.problems = self._pending + planner.problems
        return plan

    def make(self) -> T:
        """Build the target; every problem found is raised together as a `BlueprintError`."""
        plan = self._plan()
        name = object_text(self._target)
        failures = plan.failures or []
        result = plan.built
        if not plan.problems and plan.root is not None and plan.knobs is None and not failures:
            result = _evaluate(plan.root, failures)
        problems = list(plan.problems)
        if failures:
            infos = {info.path: info for info in plan.infos}
            problems += [
                line
                for path, factory, exc in failures
                for line in _explain(path, name, factory, exc, infos)
            ]
        if problems or plan.root is None:
            cause = failures[0][2] if failures else None
            raise BlueprintError(problems or ["nothing to build"], name) from cause
        for knob, setting in plan.knobs or ():
            knob.set(setting)
        value: T = result
        return value

    def make_from_argv(self, argv: Sequence[str] | None = None) -> T:
        """Build from ``key=value`` command-line arguments (default ``sys.argv[1:]``).

        They are applied as the ``"command line"`` layer, on top of this blueprint's
        layers, to a copy (this blueprint is left as it was).  ``--help`` or ``-h``
        prints every argument with its value and the layer it came from, then
        exits with status 0; any problem exits with status 2 and every message.
        """
        args = list(sys.argv[1:] if argv is None else argv)
        wants_help = any(a in ("--help", "-h") for a in args)
        args = [a for a in args if a not in ("--help", "-h")]
        blueprint = self.clone()
        try:
            blueprint.apply(parse_cli_args(args), layer=COMMAND_LINE)
        except BlueprintError as exc:
            if not wants_help:
                print(f"error: {exc}", file=sys.stderr)
                raise SystemExit(2) from None
            blueprint._pending.extend(exc.problems)
        if wants_help:
            print(blueprint.help(), end="")
            raise SystemExit(0)
        try:
            return blueprint.make()
        except BlueprintError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None

    def describe(self) -> list[ArgInfo]:
        """Every argument ``make()`` would pass or leave at its default, in signature order."""
        return self._plan().infos

    def help(self) -> str:
        """The ``--help`` text: each argument's type, value and the layer it came from."""
        plan = self._plan()
        target = self._target
        lines = [f"{object_text(target)}  ({object_text(target, qualified=True)})"]
        # Only the target's own docstring: an inherited one describes the base class.
        own = vars(target).get("__doc__") if inspect.isclass(target) else target.__doc__
        doc = inspect.cleandoc(own or "")
        summary = doc.split("\n\n", 1)[0].strip()
        if summary:
            lines += ["", *("  " + line for line in summary.splitlines())]
        if self._presets:
            lines += ["", "Presets: " + ", ".join(self._presets)]
        if plan.problems:
            lines += ["", "Problems (make() would fail):"]
            lines += [f"  - {p}" for p in plan.problems]
        lines += ["", "Arguments:"]
        rows = [("argument", "type", "value", "from", "")]
        for info in plan.infos:
            source = info.layer or "required"
            if info.key:
                source += f" ({info.key})"
            rows.append((info.path, info.type or "-", info.value, source, info.doc))
        if len(rows) == 1:
            lines.append("  (none)")
            return "\n".join(lines) + "\n"
        widths = [min(40, max(len(row[i]) for row in rows)) for i in range(4)]
        for row in rows:
            cells = [row[i].ljust(widths[i]) for i in range(4)] + [row[4]]
            lines.append(("  " + "  ".join(cells)).rstrip())
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        layers = ", ".join(repr(layer.name) for layer in self._layers)
        return f"Blueprint({object_text(self._target)}, layers=[{layers}])"


def make_from_argv(target: Callable[..., T] | str, argv: Sequence[str] | None = None) -> T:
    """``Blueprint(target).make_from_argv(argv)``: a script's whole command line in one call.

    ``python train.py judge=StrictJudge ...temperature=0 --help``
    """
    blueprint: Blueprint[T] = Blueprint(target)
    return blueprint.make_from_argv(argv)
