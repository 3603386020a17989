"""Annotations: reading them off signatures, converting strings by them, naming them."""

from __future__ import annotations

import ast
import collections.abc
import contextlib
import difflib
import enum
import functools
import importlib
import importlib.util
import inspect
import json
import pathlib
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union

from plait._digest import hex_digest

__all__ = [
    "DEFAULT_LAYER",
    "EMPTY",
    "CastError",
    "Castable",
    "Lookup",
    "Param",
    "accepts",
    "cast",
    "classes_in",
    "constructible_class",
    "factory_fits",
    "find_factory",
    "is_factory",
    "is_mapping",
    "load_object",
    "mapping_value_type",
    "module_of",
    "object_text",
    "signature_params",
    "type_text",
]

EMPTY: Any = inspect.Parameter.empty

#: The layer name of values nobody set: the signature's default, or a class built
#: from a required parameter's annotation.
DEFAULT_LAYER = "default"

_SCALARS = (str, bytes, int, float, bool, complex, type(None))
_NOT_BUILT = (*_SCALARS, object, type, list, dict, tuple, set, frozenset)
_TRUE = frozenset({"true", "t", "yes", "y", "1", "on"})
_FALSE = frozenset({"false", "f", "no", "n", "0", "off"})
_NULL = frozenset({"none", "null"})


class Castable(str):
    """A string to be converted by the annotation of the parameter it lands on.

    Plain strings are values like any other; wrapping marks text that came from a
    command line or a file, where ``"0.2"`` means a float if the parameter wants
    one (bools from true/false/yes/no/1/0, ``None``/``null`` for optionals, lists
    from ``a,b`` or JSON, dicts from JSON, enums by name or value, classes from
    ``module:Name``).

    Examples:
        >>> from plait.blueprint import Blueprint, Castable
        >>> def scaled(factor: float = 1.0) -> float:
        ...     return factor * 2
        >>> Blueprint(scaled).apply({"factor": Castable("0.5")}).make()
        1.0
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Castable({str.__repr__(self)})"


class CastError(ValueError):
    """A string that does not fit the annotation; the message says what was expected."""


@dataclass(frozen=True, slots=True)
class Param:
    """One parameter a factory accepts, with its annotation already resolved."""

    name: str
    annotation: Any  # EMPTY when there is none
    default: Any  # EMPTY when required
    kind: inspect._ParameterKind = inspect.Parameter.KEYWORD_ONLY
    doc: str = ""
    default_layer: str = DEFAULT_LAYER
    #: Which layer the default came from when a layer's whole mapping supplied it.
    default_index: int = -1

    @property
    def required(self) -> bool:
        return self.default is EMPTY

    @property
    def effective(self) -> Any:
        """What to convert strings to: the annotation, else the type of a simple default."""
        if self.annotation is not EMPTY:
            return self.annotation
        if isinstance(self.default, (*_SCALARS, enum.Enum)) and self.default is not None:
            return type(self.default)
        return Any


# -- reading signatures -----------------------------------------------------------------


def signature_params(factory: Callable[..., Any]) -> tuple[list[Param], Param | None]:
    """The named parameters of ``factory`` and its ``**kwargs`` parameter, if any.

    ``*args`` cannot be addressed by name, so it is left out; string annotations
    (``from __future__ import annotations``) are resolved the way ``get_type_hints``
    does, falling back to the defining module's globals one name at a time.
    """
    signature = inspect.signature(factory)
    hints = _hints(factory)
    docs = _param_docs(factory)
    params: list[Param] = []
    var_kw: Param | None = None
    for name, p in signature.parameters.items():
        if p.kind is p.VAR_POSITIONAL:
            continue
        annotation = p.annotation
        if isinstance(annotation, str):
            annotation = hints.get(name, _eval_annotation(annotation, factory))
        param = Param(name, annotation, p.default, p.kind, docs.get(name, ""))
        if p.kind is p.VAR_KEYWORD:
            var_kw = param
        else:
            params.append(param)
    return params, var_kw


def _unwrapped(factory: Any) -> Any:
    while isinstance(factory, functools.partial):
        factory = factory.func
    return factory


def module_of(factory: Any) -> types.ModuleType | None:
    """The module that defines ``factory`` (a partial's function): where its names resolve."""
    return sys.modules.get(getattr(_unwrapped(factory), "__module__", "") or "")


def _hints(factory: Any) -> dict[str, Any]:
    target = _unwrapped(factory)
    candidates = [target.__init__, target.__new__] if inspect.isclass(target) else [target]
    for candidate in candidates:
        try:
            hints = typing.get_type_hints(candidate, include_extras=True)
        except Exception:
            continue
        if hints:
            return hints
    return {}


def _eval_annotation(text: str, factory: Any) -> Any:
    module = module_of(factory)
    namespace = dict(vars(module)) if module is not None else {}
    try:
        return eval(text, namespace)
    except Exception:
        return text  # unresolvable: shown as written, strings pass through unconverted


def _param_docs(factory: Any) -> dict[str, str]:
    """Per-parameter help from pydantic field descriptions and Google/Sphinx docstrings."""
    target = _unwrapped(factory)
    docs: dict[str, str] = {}
    fields = getattr(target, "model_fields", None)
    if isinstance(fields, Mapping):
        for name, info in fields.items():
            description = getattr(info, "description", None)
            if description:
                docs[name] = str(description)
    sources = [target]
    if inspect.isclass(target):
        sources.append(target.__dict__.get("__init__"))
    for source in sources:
        text = inspect.getdoc(source) if source is not None else None
        if text:
            for name, doc in _parse_docstring(text):
                docs.setdefault(name, doc)
    return docs


_SPHINX = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_GOOGLE_ITEM = re.compile(r"^(\s+)(\*{0,2}\w+)\s*(?:\([^)]*\))?:\s*(.*)$")


def _parse_docstring(text: str) -> Iterator[tuple[str, str]]:
    """Each documented parameter's name and its description's first sentence, from a
    Google ``Args:`` section (an item's description may go on over the lines indented
    under it) or reST ``:param name:`` lines."""
    in_args = False
    item: tuple[str, int, list[str]] | None = None  # (name, indent, description lines)
    for line in [*text.splitlines(), ""]:
        indent = len(line) - len(line.lstrip())
        if item is not None and line.strip() and indent > item[1]:
            item[2].append(line.strip())
            continue
        if item is not None:
            yield item[0], _first_sentence(" ".join(item[2]))
            item = None
        sphinx = _SPHINX.match(line)
        if sphinx:
            yield sphinx.group(1), sphinx.group(2).strip()
            continue
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            if line.strip() and not line[:1].isspace():
                in_args = False
                continue
            found = _GOOGLE_ITEM.match(line)
            if found and len(found.group(1)) <= 8:
                item = (found.group(2).lstrip("*"), len(found.group(1)), [found.group(3).strip()])


def _first_sentence(text: str) -> str:
    """What a help row shows of a description: up to its first full stop."""
    end = re.search(r"[.!?](\s|$)", text)
    return text[: end.start() + 1] if end else text


# -- looking at annotations -------------------------------------------------------------


def _strip(annotation: Any) -> Any:
    """Annotated, NewType and bounded TypeVars stand for the type underneath."""
    while True:
        if typing.get_origin(annotation) is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif hasattr(annotation, "__supertype__"):
            annotation = annotation.__supertype__
        elif isinstance(annotation, typing.TypeVar):
            annotation = annotation.__bound__ if annotation.__bound__ is not None else Any
        else:
            return annotation


def _union_members(annotation: Any) -> tuple[Any, ...] | None:
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        return typing.get_args(annotation)
    return None


def _is_anything(annotation: Any) -> bool:
    return (
        annotation is EMPTY
        or annotation is Any
        or annotation is object
        or (isinstance(annotation, str))
    )


def is_mapping(annotation: Any) -> bool:
    annotation = _strip(annotation)
    origin = typing.get_origin(annotation) or annotation
    return (
        inspect.isclass(origin)
        and issubclass(origin, collections.abc.Mapping)
        and (origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping))
    )


def mapping_value_type(annotation: Any) -> Any:
    args = typing.get_args(_strip(annotation))
    return args[1] if len(args) == 2 else Any


def classes_in(annotation: Any) -> list[type]:
    """The plain classes an annotation names (the members of a union, or itself)."""
    annotation = _strip(annotation)
    members = _union_members(annotation)
    if members is not None:
        return [c for m in members for c in classes_in(m)]
    if inspect.isclass(annotation) and typing.get_origin(annotation) is None:
        return [annotation]
    return []


def constructible_class(annotation: Any) -> type | None:
    """The one class plait builds for this annotation when nothing says which.

    Scalars, containers, enums, abstract classes and protocols are never built;
    a union qualifies only when exactly one member could be.
    """
    candidates = [
        c
        for c in classes_in(annotation)
        if c not in _NOT_BUILT
        and not issubclass(c, enum.Enum)
        and not inspect.isabstract(c)
        and not getattr(c, "_is_protocol", False)
        and not _is_typed_dict(c)
    ]
    return candidates[0] if len(candidates) == 1 else None


def _is_typed_dict(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, dict) and hasattr(cls, "__required_keys__")


def is_factory(value: Any) -> bool:
    """Things plait calls to make a value: classes, functions, methods, partials."""
    return (
        inspect.isclass(value) or inspect.isroutine(value) or isinstance(value, functools.partial)
    )


def factory_fits(factory: Any, annotation: Any) -> bool:
    """Whether ``factory`` can make something of the annotated type, as far as we can tell."""
    if _is_anything(annotation):
        return True
    annotation = _strip(annotation)
    members = _union_members(annotation) or (annotation,)
    if any(_is_anything(_strip(m)) for m in members):
        return True
    classes = classes_in(annotation)
    if not classes:
        return True  # a generic or protocol we cannot check: let the call decide
    made = _unwrapped(factory)
    if not inspect.isclass(made):
        returns = _hints(made).get("return", EMPTY)
        if returns is EMPTY or not inspect.isclass(_strip(returns)):
            return True
        made = _strip(returns)
    return any(_subclass(made, c) for c in classes)


def _subclass(a: type, b: type) -> bool:
    try:
        return issubclass(a, b)
    except TypeError:
        return True


def accepts(value: Any, annotation: Any) -> bool:
    """A lenient isinstance for annotations: unsure means yes, the constructor decides."""
    if _is_anything(annotation):
        return True
    annotation = _strip(annotation)
    if annotation is Any or annotation is object:
        return True
    members = _union_members(annotation)
    if members is not None:
        return any(accepts(value, m) for m in members)
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin is type:
        if not inspect.isclass(value):
            return False
        return (
            not args
            or _is_anything(args[0])
            or any(_subclass(value, c) for c in classes_in(args[0]))
        )
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        return callable(value)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is complex:
        return isinstance(value, int | float | complex) and not isinstance(value, bool)
    if origin is not None and inspect.isclass(origin):
        if not _isinstance(value, origin):
            return False
        if origin in (list, set, frozenset, collections.abc.Sequence) and args:
            return all(accepts(item, args[0]) for item in value)
        if is_mapping(origin) and len(args) == 2:
            return all(accepts(v, args[1]) for v in value.values())
        return True
    if inspect.isclass(annotation):
        return _isinstance(value, annotation)
    return True


def _isinstance(value: Any, cls: type) -> bool:
    try:
        return isinstance(value, cls)
    except TypeError:  # e.g. a protocol that is not runtime-checkable
        return True


# -- converting strings ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lookup:
    """Where a bare name is searched: the module of the owner and of the blueprint's target."""

    modules: tuple[types.ModuleType, ...]


def cast(text: str, annotation: Any, lookup: Lookup) -> Any:
    """Convert a command-line string by the annotation, or raise `CastError` saying why."""
    text = str(text)
    if _is_anything(annotation):
        return text
    annotation = _strip(annotation)
    if annotation is Any or annotation is object:
        return text
    members = _union_members(annotation)
    if members is not None:
        return _cast_union(text, annotation, members, lookup)
    if annotation is None or annotation is type(None):
        if text.strip().lower() in _NULL:
            return None
        raise CastError(f"expected None (none/null), got {text!r}")
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return _cast_literal(text, annotation, args, lookup)
    if origin is type or annotation is type:
        return _cast_class(text, args[0] if args else Any, lookup)
    if origin is collections.abc.Callable or annotation is collections.abc.Callable:
        found = find_factory(text, Any, lookup)
        if not callable(found):
            raise CastError(f"{text!r} names {found!r}, which is not callable")
        return found
    container = origin if origin is not None else annotation
    if container in (list, set, frozenset, tuple, collections.abc.Sequence):
        return _cast_sequence(text, annotation, container, args, lookup)
    if is_mapping(container):
        return _cast_mapping(text, annotation, lookup)
    if not inspect.isclass(annotation):
        raise CastError(f"cannot convert a string to {type_text(annotation)}")
    return _cast_scalar(text, annotation)


def _cast_union(text: str, annotation: Any, members: tuple[Any, ...], lookup: Lookup) -> Any:
    def rank(member: Any) -> int:
        m = _strip(member)
        if m is type(None):
            return 0
        return 2 if m is str or _is_anything(m) or m is Any else 1

    reasons = []
    for member in sorted(members, key=rank):
        try:
            return cast(text, member, lookup)
        except CastError as exc:
            if _strip(member) is not type(None):
                reasons.append(str(exc))
    if len(reasons) == 1:  # an Optional: what the one real type wanted says it best
        raise CastError(reasons[0])
    raise CastError(f"{text!r} fits none of {type_text(annotation)}")


def _cast_literal(text: str, annotation: Any, args: tuple[Any, ...], lookup: Lookup) -> Any:
    for option in args:
        if isinstance(option, str) and option == text:
            return option
    for option in args:
        if isinstance(option, str):
            continue
        try:
            if cast(text, type(option), lookup) == option:
                return option
        except CastError:
            continue
    options = ", ".join(repr(a) for a in args)
    raise CastError(f"{text!r} is not one of {options}")


def _cast_scalar(text: str, cls: type) -> Any:
    if cls is bool:
        word = text.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise CastError(f"expected a boolean (true/false, yes/no, 1/0), got {text!r}")
    if cls is int:
        try:
            return int(text)
        except ValueError:
            try:
                return int(text, 0)
            except ValueError:
                raise CastError(f"expected an integer, got {text!r}") from None
    if cls is float:
        try:
            return float(text)
        except ValueError:
            raise CastError(f"expected a number, got {text!r}") from None
    if cls is complex:
        try:
            return complex(text)
        except ValueError:
            raise CastError(f"expected a complex number, got {text!r}") from None
    if cls is bytes:
        return text.encode()
    if issubclass(cls, enum.Enum):
        return _cast_enum(text, cls)
    if issubclass(cls, str | pathlib.PurePath):
        return cls(text)
    if hasattr(cls, "__get_pydantic_core_schema__") or hasattr(cls, "model_validate"):
        return _cast_pydantic(text, cls)
    raise CastError(f"cannot convert a string to {type_text(cls)}")


def _cast_enum(text: str, cls: type[enum.Enum]) -> Any:
    members = cls.__members__
    if text in members:
        return members[text]
    folded = {name.lower(): m for name, m in members.items()}
    if text.lower() in folded:
        return folded[text.lower()]
    for member in cls:
        if str(member.value) == text:
            return member
    names = ", ".join(members)
    raise CastError(f"{text!r} is not a member of {cls.__name__} ({names})")


def _cast_pydantic(text: str, cls: type) -> Any:
    from pydantic import TypeAdapter, ValidationError

    payload: Any = text
    if text.lstrip().startswith(("{", "[")):
        with contextlib.suppress(ValueError):
            payload = json.loads(text)
    try:
        return TypeAdapter(cls).validate_python(payload)
    except ValidationError as exc:
        first = exc.errors()[0]["msg"] if exc.errors() else str(exc)
        raise CastError(f"not a valid {cls.__name__}: {first}") from None


def _structured(text: str, opener: str, what: str) -> Any:
    """JSON first, then Python literal syntax (single quotes, tuples)."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise CastError(f"{text!r} starts with {opener!r} but is not a valid {what}") from None


def _cast_item(item: Any, item_type: Any, lookup: Lookup, where: str) -> Any:
    """One element of parsed JSON (a list item, a mapping value): text is converted by
    the element type, anything else must already fit it.  ``where`` starts the error."""
    if isinstance(item, str):
        return cast(item, item_type, lookup)
    if accepts(item, item_type):
        return item
    raise CastError(f"{where}{item!r} is not {type_text(item_type)}")


def _cast_sequence(
    text: str, annotation: Any, container: Any, args: tuple[Any, ...], lookup: Lookup
) -> Any:
    stripped = text.strip()
    raw: list[Any]
    if stripped.startswith(("[", "(")):
        parsed = _structured(stripped, stripped[0], "list")
        if not isinstance(parsed, list | tuple):
            raise CastError(f"expected a list, got {text!r}")
        raw = list(parsed)
    else:
        raw = [part.strip() for part in text.split(",")] if stripped else []
    if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        if len(raw) != len(args):
            raise CastError(f"expected {len(args)} comma-separated items, got {len(raw)}")
        return tuple(_cast_item(r, a, lookup, "item ") for r, a in zip(raw, args, strict=True))
    item_type = args[0] if args else Any
    items = [_cast_item(item, item_type, lookup, "item ") for item in raw]
    if container is collections.abc.Sequence:
        return items
    result: Any = container(items)
    return result


def _cast_mapping(text: str, annotation: Any, lookup: Lookup) -> Any:
    stripped = text.strip()
    if not stripped:
        return {}
    if not stripped.startswith("{"):
        raise CastError(f"expected a JSON object like '{{\"key\": ...}}', got {text!r}")
    parsed = _structured(stripped, "{", "JSON object")
    if not isinstance(parsed, dict):
        raise CastError(f"expected a JSON object, got {text!r}")
    value_type = mapping_value_type(annotation)
    return {
        key: _cast_item(item, value_type, lookup, f"key {key!r}: ") for key, item in parsed.items()
    }


def _cast_class(text: str, base: Any, lookup: Lookup) -> Any:
    found = find_factory(text, base, lookup)
    if not inspect.isclass(found):
        raise CastError(f"{text!r} names {object_text(found)}, which is not a class")
    bases = classes_in(base)
    if bases and not any(_subclass(found, b) for b in bases):
        wanted = " or ".join(b.__name__ for b in bases)
        raise CastError(f"{text!r} names {object_text(found)}, which is not a {wanted}")
    return found


# -- finding classes and functions by name ---------------------------------------------


def load_object(spec: str) -> Any:
    """Import what a ``module:Name`` or ``path/to/file.py:Name`` string names, as targets are named.

    Args:
        spec: ``module:Name`` or ``path/to/file.py:Name``; a dotted name reaches
            attributes (``module:Class.method``).  A file is loaded once, however
            often it is named.

    Returns:
        The object.

    Raises:
        ValueError: ``spec`` is not of that form, the module or file cannot be
            imported, or it has no such attribute.

    Examples:
        >>> from plait.blueprint import load_object
        >>> load_object("json:dumps")([1, 2])
        '[1, 2]'
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise CastError(f"{spec!r} is not of the form 'module:Name' or 'file.py:Name'")
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = _load_file(where)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise CastError(f"cannot import module {where!r}: {exc}") from None
    value: Any = module
    for part in name.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CastError(f"{where!r} has no attribute {name!r}") from None
    return value


#: What the modules of files loaded by path are named with (`_load_file`).
_FILE_MODULE_PREFIX = "_plait_blueprint_"


def _load_file(location: str) -> types.ModuleType:
    path = pathlib.Path(location).expanduser().resolve()
    if not path.is_file():
        raise CastError(f"no such file: {location}")
    # One module per file, named after its path: loading twice yields the same classes.
    # The name is part of what a checkpoint keys a pipeline's code by (`code_of`), so
    # its hash stays the SHA-1 it has always been.
    digest = hex_digest(str(path), size=5, algorithm="sha1")
    stem = re.sub(r"\W", "_", path.stem)
    name = f"{_FILE_MODULE_PREFIX}{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CastError(f"cannot load {location} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Like `python file.py`: siblings of the file are importable from it.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    sys.modules[name] = module  # get_type_hints and dataclasses look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise CastError(f"importing {location} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _subclasses(cls: type) -> list[type]:
    seen: dict[int, type] = {id(cls): cls}
    stack = [cls]
    while stack:
        current = stack.pop()
        children: list[type] = type.__subclasses__(current)  # works for `type` itself too
        for child in children:
            if id(child) not in seen:
                seen[id(child)] = child
                stack.append(child)
    return list(seen.values())


def find_factory(text: str, annotation: Any, lookup: Lookup) -> Any:
    """The class or callable a string names, for polymorphic construction.

    ``module:Name`` (or ``file.py:Name``) is imported; a bare name is looked up among
    the subclasses of the annotated class(es), then in the module that defines the
    owner of the parameter and in the target's module.
    """
    text = text.strip()
    if ":" in text:
        return load_object(text)
    bases = [c for c in classes_in(annotation) if c not in _SCALARS]
    matches: dict[int, Any] = {}
    known: set[str] = set()
    for base in bases:
        for sub in _subclasses(base):
            known.add(sub.__name__)
            if text in (sub.__name__, sub.__qualname__):
                matches[id(sub)] = sub
    if len(matches) > 1:
        options = ", ".join(sorted(object_text(m, qualified=True) for m in matches.values()))
        raise CastError(f"{text!r} is ambiguous: write one of {options}")
    if matches:
        return next(iter(matches.values()))
    for module in lookup.modules:
        value: Any = module
        for part in text.split("."):
            value = getattr(value, part, None)
        if value is not None and callable(value):
            return value
    hint = ""
    close = difflib.get_close_matches(text, known, n=1)
    if close:
        hint = f"; did you mean {close[0]!r}?"
    elif known:
        hint = f" (known: {', '.join(sorted(known)[:12])})"
    where = " or ".join(f"subclasses of {b.__name__}" for b in bases) or "the target's module"
    raise CastError(f"found no {text!r} among {where}{hint}")


# -- naming things -----------------------------------------------------------------------


def type_text(annotation: Any) -> str:
    if annotation is EMPTY:
        return ""
    if isinstance(annotation, str):
        return annotation
    if annotation is type(None) or annotation is None:
        return "None"
    if annotation is Any:
        return "Any"
    if typing.get_origin(annotation) is typing.Annotated:
        return type_text(typing.get_args(annotation)[0])
    members = _union_members(annotation)
    if members is not None:
        return " | ".join(type_text(m) for m in members)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return f"Literal[{', '.join(repr(a) for a in typing.get_args(annotation))}]"
    if origin is not None:
        args = typing.get_args(annotation)
        inner = ", ".join("..." if a is Ellipsis else type_text(a) for a in args)
        if origin is collections.abc.Callable and args:
            params = args[0]
            shown = "..." if params is Ellipsis else f"[{', '.join(map(type_text, params))}]"
            inner = f"{shown}, {type_text(args[-1])}"
        name = getattr(origin, "__qualname__", None) or str(origin)
        return f"{name}[{inner}]" if args else name
    if inspect.isclass(annotation):
        return annotation.__qualname__
    return str(annotation).replace("typing.", "")


def object_text(value: Any, *, qualified: bool = False) -> str:
    """A short name for a class or function (``module:Name`` when asked to be exact)."""
    target = _unwrapped(value)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return repr(value)
    if qualified:
        return f"{_module_text(getattr(target, '__module__', '?'))}:{name}"
    return str(name)


def _module_text(module_name: str) -> str:
    """How a user names a module: a file loaded as ``file.py:Name`` by its path (relative
    to the working directory when it is under it), not by the name `_load_file` gave it."""
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if not module_name.startswith(_FILE_MODULE_PREFIX) or not file:
        return module_name
    path = pathlib.Path(file)
    try:
        return str(path.relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)
