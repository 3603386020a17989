"""The plan: what ``make()`` will call, found by reading the layers without calling anything.

`Planner` walks the target's signature, and the signatures of whatever the layers
ask it to build, taking each argument from the newest layer that names it.  The
result is a tree of nodes (a constant, a call, a mapping built item by item), a
row of `ArgInfo` per argument for ``--help``, and every problem found on the way:
the walk never stops at the first one, so one error lists every fix to make.
"""

from __future__ import annotations

import difflib
import enum
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

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
    mapping_value_type,
    module_of,
    object_text,
    signature_params,
    type_text,
)

__all__ = ["ArgInfo", "CallNode", "ConstNode", "DictNode", "Failure", "Node", "Plan", "Planner"]


@dataclass(frozen=True, slots=True)
class ArgInfo:
    """One argument as ``make()`` would use it, for ``--help`` and for tools.

    Args:
        path: The argument's dotted path (``summarizer.temperature``).
        type: Its annotation, as text.
        value: Its value, as text.
        layer: Where the value came from: ``"default"``, a preset's name,
            ``"command line"``, another layer's name, or "" when nothing set it.
        required: Whether the signature gives it no default.
        doc: Its description, from the owner's docstring.
        key: The key that set it, when that was not the path itself (a wildcard).
    """

    path: str
    type: str
    value: str
    layer: str
    required: bool
    doc: str = ""
    key: str | None = None


# -- the plan: what make() will call, found without calling anything -------------------


@dataclass(slots=True)
class ConstNode:
    """A value used as it is (given, converted from text, or a signature's default)."""

    value: Any


@dataclass(slots=True)
class CallNode:
    """A factory to call at ``path`` once its arguments are made."""

    path: str
    factory: Callable[..., Any]
    positional: list[Node]
    keywords: dict[str, Node]


@dataclass(slots=True)
class DictNode:
    """A mapping argument made item by item (``aliases.fast.model=m``)."""

    items: dict[str, Node]


Node: TypeAlias = ConstNode | CallNode | DictNode

#: A constructor that raised while a plan was made: its path, the factory, the exception.
Failure: TypeAlias = tuple[str, Any, BaseException]


@dataclass(slots=True)
class Plan:
    """What one reading of the layers found: the tree to make, the rows for ``--help``,
    and every problem (a plan with problems is never made)."""

    root: Node | None
    infos: list[ArgInfo]
    problems: list[str]
    #: The target, when the plan had to build it to find its submodules' knobs.
    built: Any = None
    failures: list[Failure] | None = None
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


class Planner:
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
    def build(self, factory: Any, path: str, fallbacks: Mapping[str, Found] | None) -> Node | None:
        self.building.append(factory)
        try:
            return self.call(factory, path, fallbacks or {})
        finally:
            self.building.pop()

    def call(self, factory: Any, path: str, fallbacks: Mapping[str, Found]) -> Node | None:
        try:
            params, var_kw = signature_params(factory)
        except (TypeError, ValueError) as exc:
            self.problem(path, f"cannot read the parameters of {object_text(factory)}: {exc}")
            return None
        node = CallNode(path, factory, [], {})
        names = {p.name for p in params}
        for param in params:
            sub = join_path(path, param.name)
            child = self.param(param, sub, factory, fallbacks.get(param.name))
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                # Later positional values need every earlier slot filled.
                node.positional.append(child or ConstNode(param.default))
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

    def param(self, param: Param, path: str, owner: Any, fallback: Found | None) -> Node | None:
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

    def unspecified(self, param: Param, path: str, below: list[str], owner: Any) -> Node | None:
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
    ) -> Node | None:
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
                return ConstNode(value)
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
    ) -> Node | None:
        value = found.value
        annotation = param.effective
        if not below and accepts(value, annotation):
            self.record(param, path, _value_text(value), found.layer, found.key)
            return ConstNode(value)
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

    def factory(self, param: Param, path: str, factory: Any, found: Found) -> Node | None:
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
    ) -> Node | None:
        """A dict built key by key: ``aliases.fast.model=x`` over any whole value given."""
        value_type = mapping_value_type(param.effective)
        names = self.children(path)
        node = DictNode({k: ConstNode(f.value) for k, f in base.items()})
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
                child = ConstNode(inherited.value)
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


def _wants_factory(annotation: Any) -> bool:
    """Whether a name could stand for a factory here: some user class, abstract ones included."""
    return any(
        c.__module__ != "builtins" and not issubclass(c, enum.Enum) for c in classes_in(annotation)
    )
