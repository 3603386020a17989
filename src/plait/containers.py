"""Containers: hold modules or parameters so they register, as in ``torch.nn``.

The list-shaped containers (`Sequential`, `ModuleList`, `ParameterList`) key their
entries ``0``, ``1``, ... by position and renumber after every insertion, removal
or reorder, so `named_modules()`, `named_parameters()` and `state_dict()` always
read ``0..n-1``.  A `Sequential` built from a mapping keeps its step names (they
survive slicing, ``+`` and removals; unnamed steps are numbered by position).

The dict-shaped containers (`ModuleDict`, `ParameterDict`) and named `Sequential`
steps take keys that are Python identifiers, do not start with ``_`` and do not
collide with an attribute of the container (``forward``, ``train``, ``keys``...),
since every key also becomes an attribute and a segment of a dotted path.

Naming follows `Module`: a child takes the name of its first registration.  When
that first registration was in a container, the child's name follows its key when
the container renumbers it, and is cleared when the container drops it; a removed
parameter the container owned is released the same way.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, ClassVar, Generic, Self, TypeVar, overload

from plait.module import Module
from plait.parameter import Parameter

__all__ = ["ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"]

_T = TypeVar("_T")
_MISSING: Any = object()


# -- checks and messages ------------------------------------------------------------
def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_module(value: object, where: str) -> Module:
    if not isinstance(value, Module):
        hint = (
            "; wrap a plain function in a Module subclass whose forward() calls it"
            if callable(value)
            else ""
        )
        raise TypeError(
            f"{where} expects a Module, got {type(value).__name__} {_short(value)}{hint}"
        )
    return value


def _check_parameter(value: object, where: str) -> Parameter:
    if not isinstance(value, Parameter):
        raise TypeError(
            f"{where} expects a Parameter, got {type(value).__name__} {_short(value)}; wrap "
            "values as Parameter(value, description=...)"
        )
    return value


def _position(index: object, length: int, owner: str) -> int:
    """``index`` as a position in ``0..length-1`` (negative counts from the end)."""
    try:
        i = operator.index(index)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{owner} indices must be integers or slices, not {type(index).__name__}"
        ) from None
    pos = i + length if i < 0 else i
    if not 0 <= pos < length:
        if length == 0:
            raise IndexError(f"{owner} index {i} is out of range: the {owner} is empty")
        raise IndexError(
            f"{owner} index {i} is out of range for a {owner} of length {length} "
            f"(valid indices: {-length} to {length - 1})"
        )
    return pos


def _slice_text(index: slice) -> str:
    parts = ["" if part is None else str(part) for part in (index.start, index.stop, index.step)]
    return ":".join(parts if index.step is not None else parts[:2])


def _is_position_key(key: str) -> bool:
    return key.isascii() and key.isdigit()


def _check_key(container: Module, key: object, taken: Mapping[str, object]) -> str:
    """A key for a dict-like container (or a named `Sequential` step), or a clear error."""
    owner = type(container).__name__
    if not isinstance(key, str):
        raise TypeError(f"{owner} keys must be str, got {type(key).__name__} {_short(key)}")
    if not key.isidentifier():
        suggestion = re.sub(r"\W", "_", key) or "step"
        if not suggestion.isidentifier():
            suggestion = "k_" + suggestion
        raise ValueError(
            f"{owner} key {key!r} is not a valid Python identifier: keys become attribute "
            "names and segments of dotted state_dict paths, so use letters, digits and "
            f"underscores, not starting with a digit (e.g. {suggestion!r})"
        )
    if key.startswith("_"):
        raise ValueError(
            f"{owner} key {key!r} starts with '_', which is reserved for Module internals; "
            f"use a key without the leading underscore (e.g. {key.lstrip('_') or 'step'!r})"
        )
    if hasattr(type(container), key):
        raise ValueError(
            f"{owner} key {key!r} would shadow {owner}.{key}; choose another key "
            f"(e.g. {key + '_step'!r})"
        )
    if key in container.__dict__ and key not in taken:
        raise ValueError(
            f"{owner} key {key!r} would overwrite the attribute {key!r} of this {owner}; "
            f"choose another key (e.g. {key + '_step'!r})"
        )
    return key


def _missing_key(container: Module, key: object, keys: Iterable[str]) -> str:
    owner = type(container).__name__
    known = list(keys)
    if not known:
        return f"{key!r} is not a key of this {owner}: it is empty"
    listed = ", ".join(repr(k) for k in known)
    close = difflib.get_close_matches(key, known, n=1) if isinstance(key, str) else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key!r} is not a key of this {owner} (its keys: {listed}){hint}"


def _pairs(source: object, where: str, kind: str) -> list[tuple[object, object]]:
    """(key, value) pairs from a mapping, anything with ``keys()``, or an iterable of pairs."""
    if isinstance(source, Mapping):
        return list(source.items())
    keys = getattr(source, "keys", None)
    if callable(keys) and hasattr(source, "__getitem__"):
        return [(key, source[key]) for key in keys()]
    if isinstance(source, str | bytes) or not isinstance(source, Iterable):
        raise TypeError(
            f"{where} takes a mapping or an iterable of (key, {kind}) pairs, "
            f"got {type(source).__name__} {_short(source)}"
        )
    pairs: list[tuple[object, object]] = []
    for i, item in enumerate(source):
        if isinstance(item, str | bytes) or not isinstance(item, Iterable):
            raise TypeError(
                f"{where}: element #{i} is {type(item).__name__} {_short(item)}, not a "
                f"(key, {kind}) pair; pass a mapping or an iterable of (key, {kind}) pairs"
            )
        pair = tuple(item)
        if len(pair) != 2:
            raise TypeError(
                f"{where}: element #{i} has {len(pair)} items, not 2; each element must be "
                f"a (key, {kind}) pair"
            )
        pairs.append((pair[0], pair[1]))
    return pairs


def _describe_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = []
    if args or not kwargs:
        parts.append(f"{len(args)} positional argument{'s' if len(args) != 1 else ''}")
    if kwargs:
        parts.append("keyword argument(s) " + ", ".join(repr(k) for k in kwargs))
    return " and ".join(parts)


# -- module containers ------------------------------------------------------------------
class _ModuleContainer(Module):
    """What the module containers share.

    Renaming is `Module`'s registration at work: removing a key releases a child
    this container adopted (its name and owner are cleared), and registering it
    again under its new key adopts it under that key, while a child first
    registered elsewhere keeps the name its owner gave it.
    """

    def _put(self, key: str, module: Module) -> None:
        if module._parent is not None and module._parent() is None:
            # Its owner is gone (say a temporary Sequential consumed by ``+``): let this
            # container adopt it, so its name and dotted path follow its key here.
            object.__setattr__(module, "_parent", None)
            object.__setattr__(module, "_name", None)
        setattr(self, key, module)

    def _drop_all(self) -> None:
        for key in list(self._children):
            delattr(self, key)


_Entry = tuple[str | None, Module]  # (step name, module); None: keyed by position
_S = TypeVar("_S", bound="_ModuleSequence[Any]")


class _ModuleSequence(_ModuleContainer, Generic[_S]):
    """The list behaviour `Sequential` and `ModuleList` share."""

    #: Whether named entries keep their names (Sequential) or become positions.
    _keeps_names: ClassVar[bool] = False

    def _new_empty(self) -> _S:
        raise NotImplementedError

    def _entries(self) -> list[_Entry]:
        return [
            (None if _is_position_key(key) else key, module)
            for key, module in self._children.items()
        ]

    def _set_entries(self, entries: list[_Entry]) -> None:
        seen: set[str] = set()
        for name, _ in entries:
            if name is not None:
                if name in seen:
                    raise ValueError(
                        f"{type(self).__name__} would hold two steps named {name!r}; "
                        "rename one of them, e.g. by building the Sequential from a mapping"
                    )
                seen.add(name)
        self._drop_all()
        for pos, (name, module) in enumerate(entries):
            self._put(str(pos) if name is None else name, module)

    def _incoming(self, modules: object, where: str) -> list[_Entry]:
        if isinstance(modules, _ModuleSequence):
            entries = modules._entries()
            return entries if self._keeps_names else [(None, m) for _, m in entries]
        if isinstance(modules, Module):
            raise TypeError(
                f"{where} takes an iterable of Modules, got a single {type(modules).__name__}; "
                "use append() to add one module"
            )
        if isinstance(modules, Mapping):
            raise TypeError(
                f"{where} takes an iterable of Modules, got a {type(modules).__name__}; "
                "pass its .values()"
            )
        if isinstance(modules, str | bytes) or not isinstance(modules, Iterable):
            raise TypeError(
                f"{where} takes an iterable of Modules, got {type(modules).__name__} "
                f"{_short(modules)}"
            )
        return [
            (None, _check_module(module, f"{where} element #{i}"))
            for i, module in enumerate(list(modules))
        ]

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[Module]:
        return iter(list(self._children.values()))

    def __contains__(self, item: object) -> bool:
        """Membership by identity: is this very module one of the entries?"""
        return any(module is item for module in self._children.values())

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> _S: ...
    def __getitem__(self, index: int | slice) -> Module | _S:
        entries = self._entries()
        if isinstance(index, slice):
            new = self._new_empty()
            new._set_entries(entries[index])
            return new
        return entries[_position(index, len(entries), type(self).__name__)][1]

    @overload
    def __setitem__(self, index: int, value: Module) -> None: ...
    @overload
    def __setitem__(self, index: slice, value: Iterable[Module]) -> None: ...
    def __setitem__(self, index: int | slice, value: Module | Iterable[Module]) -> None:
        owner = type(self).__name__
        entries = self._entries()
        if isinstance(index, slice):
            entries[index] = self._incoming(value, f"{owner}[{_slice_text(index)}] = ...")
        else:
            pos = _position(index, len(entries), owner)
            entries[pos] = (entries[pos][0], _check_module(value, f"{owner}[{index}] = ..."))
        self._set_entries(entries)

    def __delitem__(self, index: int | slice) -> None:
        entries = self._entries()
        if isinstance(index, slice):
            del entries[index]
        else:
            del entries[_position(index, len(entries), type(self).__name__)]
        self._set_entries(entries)

    def append(self, module: Module) -> Self:
        """Add ``module`` at the end; returns the container, so calls chain."""
        checked = _check_module(module, f"{type(self).__name__}.append()")
        self._put(str(len(self._children)), checked)
        return self

    def extend(self, modules: Iterable[Module]) -> Self:
        """Add every module of ``modules`` at the end (named steps keep their names)."""
        incoming = self._incoming(modules, f"{type(self).__name__}.extend()")
        self._set_entries(self._entries() + incoming)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before ``index``, like ``list.insert``; later entries shift."""
        checked = _check_module(module, f"{type(self).__name__}.insert()")
        entries = self._entries()
        entries.insert(operator.index(index), (None, checked))
        self._set_entries(entries)

    def pop(self, index: int = -1) -> Module:
        """Remove and return the module at ``index`` (default: the last one)."""
        owner = type(self).__name__
        entries = self._entries()
        if not entries:
            raise IndexError(f"pop from an empty {owner}")
        _, module = entries.pop(_position(index, len(entries), owner))
        self._set_entries(entries)
        return module

    def __iadd__(self, modules: Iterable[Module]) -> Self:
        return self.extend(modules)

    def _concat(self, other: _ModuleSequence[Any]) -> _S:
        new = self._new_empty()
        new._set_entries(self._entries() + new._incoming(other, "+"))
        return new


class Sequential(_ModuleSequence["Sequential"]):
    """Modules applied one after another: each output is the next module's input.

    ``Sequential(a, b, c)`` numbers the steps ``0``, ``1``, ``2``;
    ``Sequential({"summarize": a, "analyze": b})`` names them.  An empty Sequential
    returns its single input unchanged.

    Args:
        *modules: The steps in order, or one mapping of step names to modules.

    Raises:
        TypeError: When a step is not a `Module`, or a mapping is not the only argument.
        ValueError: When a step name is not a valid key (see the module docstring).

    Examples:
        ```python
        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        pipeline = plait.Sequential(
            {
                "summarize": plait.LLMInference("fast", system_prompt="Summarize."),
                "translate": plait.LLMInference("fast", system_prompt="Translate to French."),
            }
        ).bind(resources=resources)
        print(pipeline.run_sync("A long text."))
        print([name for name, _ in pipeline.named_children()])
        ```
    """

    _keeps_names: ClassVar[bool] = True

    @overload
    def __init__(self, *modules: Module) -> None: ...
    @overload
    def __init__(self, steps: Mapping[str, Module], /) -> None: ...
    def __init__(self, *modules: Module | Mapping[str, Module]) -> None:
        super().__init__()
        entries: list[_Entry] = []
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for pos, (key, module) in enumerate(modules[0].items()):
                name: str | None
                if isinstance(key, str) and _is_position_key(key):
                    if key != str(pos):
                        raise ValueError(
                            f"Sequential key {key!r} is at position {pos}: numeric keys are "
                            "positions; name the step with an identifier instead"
                        )
                    name = None
                else:
                    name = _check_key(self, key, {})
                entries.append((name, _check_module(module, f"Sequential step {key!r}")))
        else:
            for i, step in enumerate(modules):
                if isinstance(step, Mapping):
                    raise TypeError(
                        "a mapping of named steps must be Sequential's only argument, "
                        "e.g. Sequential({'first': a, 'second': b})"
                    )
                entries.append((None, _check_module(step, f"Sequential step #{i}")))
        self._set_entries(entries)

    def _new_empty(self) -> Sequential:
        return Sequential()

    def __add__(self, other: Sequential) -> Sequential:
        """A new Sequential running this one's steps, then ``other``'s (names kept)."""
        if not isinstance(other, Sequential):
            return NotImplemented
        return self._concat(other)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the first step with the inputs, then each next step with the last output.

        Args:
            *args: The first step's inputs.
            **kwargs: The first step's keyword inputs.

        Returns:
            The last step's output (the single input, for an empty Sequential).

        Raises:
            TypeError: When an empty Sequential gets other than exactly one input.
        """
        steps = list(self._children.values())
        if not steps:
            if len(args) == 1 and not kwargs:
                return args[0]
            raise TypeError(
                "an empty Sequential returns its single input unchanged, but it got "
                f"{_describe_arguments(args, kwargs)}; pass exactly one input, or append() a "
                "step that accepts these arguments"
            )
        out = steps[0](*args, **kwargs)
        for step in steps[1:]:
            out = step(out)
        return out


class ModuleList(_ModuleSequence["ModuleList"]):
    """A list of modules, indexable and iterable; children are named ``0``, ``1``, ...

    Modules kept in a plain list are traced too; a `ModuleList` also registers them,
    so their parameters are in `state_dict` and the optimizers' reach.

    Args:
        modules: The initial modules.
    """

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self._set_entries(self._incoming(modules, "ModuleList()"))

    def _new_empty(self) -> ModuleList:
        return ModuleList()

    def __add__(self, other: ModuleList) -> ModuleList:
        """A new ModuleList with this one's modules, then ``other``'s."""
        if not isinstance(other, ModuleList):
            return NotImplemented
        return self._concat(other)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not callable: iterate over the list inside your own module's ``forward``.

        Args:
            *args: Ignored.
            **kwargs: Ignored.

        Returns:
            Never returns.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError(
            "ModuleList has no forward(); iterate over it inside your own module's forward"
        )


class ModuleDict(_ModuleContainer):
    """Modules by name, in insertion order; keys are identifiers (see the module docstring).

    Args:
        modules: The initial entries: a mapping or an iterable of (key, module) pairs.
    """

    def __init__(
        self,
        modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | ModuleDict | None = None,
    ) -> None:
        super().__init__()
        if modules is not None:
            self._update(modules, "ModuleDict()")

    def _update(self, modules: object, where: str) -> None:
        checked: list[tuple[str, Module]] = []
        for key, module in _pairs(modules, where, "Module"):
            name = _check_key(self, key, self._children)
            checked.append((name, _check_module(module, f"{where} value for key {name!r}")))
        for name, module in checked:
            self._put(name, module)

    def update(
        self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | ModuleDict
    ) -> None:
        """Add or replace entries from a mapping or an iterable of (key, module) pairs.

        Args:
            modules: The entries to add.
        """
        self._update(modules, "ModuleDict.update()")

    def __getitem__(self, key: str) -> Module:
        try:
            return self._children[key]
        except KeyError:
            raise KeyError(_missing_key(self, key, self._children)) from None

    def __setitem__(self, key: str, module: Module) -> None:
        name = _check_key(self, key, self._children)
        self._put(name, _check_module(module, f"ModuleDict[{name!r}] = ..."))

    def __delitem__(self, key: str) -> None:
        if key not in self._children:
            raise KeyError(_missing_key(self, key, self._children))
        delattr(self, key)

    @overload
    def pop(self, key: str) -> Module: ...
    @overload
    def pop(self, key: str, default: _T) -> Module | _T: ...
    def pop(self, key: str, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its module (or ``default`` if given and ``key`` is absent).

        Args:
            key: The entry to remove.
            default: What to return when ``key`` is absent.

        Returns:
            The removed module, or ``default``.

        Raises:
            KeyError: When ``key`` is absent and no default is given (listing the keys).
        """
        if key not in self._children:
            if default is _MISSING:
                raise KeyError(_missing_key(self, key, self._children))
            return default
        module = self._children[key]
        del self[key]
        return module

    def get(self, key: str, default: _T | None = None) -> Module | _T | None:
        """The module under ``key``, or ``default``.

        Args:
            key: The entry's key.
            default: What to return when ``key`` is absent.

        Returns:
            The module, or ``default``.
        """
        return self._children.get(key, default)

    def clear(self) -> None:
        """Remove every entry."""
        self._drop_all()

    def __contains__(self, key: object) -> bool:
        return key in self._children

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._children))

    def keys(self) -> KeysView[str]:
        """The keys, in insertion order.

        Returns:
            A view of the keys.
        """
        return self._children.keys()

    def values(self) -> ValuesView[Module]:
        """The modules, in insertion order.

        Returns:
            A view of the modules.
        """
        return self._children.values()

    def items(self) -> ItemsView[str, Module]:
        """The (key, module) pairs, in insertion order.

        Returns:
            A view of the pairs.
        """
        return self._children.items()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not callable: index the dict inside your own module's ``forward``.

        Args:
            *args: Ignored.
            **kwargs: Ignored.

        Returns:
            Never returns.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError(
            "ModuleDict has no forward(); index it inside your own module's forward"
        )


# -- parameter containers ---------------------------------------------------------------
class _ParameterContainer(Module):
    """Bookkeeping shared by the parameter containers."""

    _holds_only_parameters: ClassVar[bool] = True

    def _put(self, key: str, param: Parameter) -> None:
        if param._owner is not None and param._owner() is None:
            param._owner = None  # its owner is gone: this container takes it over
            param._name = None
        setattr(self, key, param)

    def _drop_all(self) -> None:
        for key in list(self._parameters):
            delattr(self, key)


class ParameterList(_ParameterContainer):
    """A list of parameters (for example few-shot examples), each learnable on its own.

    Entries are named ``0``, ``1``, ... and renumbered after every change.

    Args:
        parameters: The initial parameters.
    """

    def __init__(self, parameters: Iterable[Parameter] = ()) -> None:
        super().__init__()
        self._set_items(self._incoming(parameters, "ParameterList()"))

    def _items(self) -> list[Parameter]:
        return list(self._parameters.values())

    def _set_items(self, items: list[Parameter]) -> None:
        self._drop_all()
        for pos, param in enumerate(items):
            self._put(str(pos), param)

    def _incoming(self, parameters: object, where: str) -> list[Parameter]:
        if isinstance(parameters, Parameter):
            raise TypeError(
                f"{where} takes an iterable of Parameters, got a single Parameter; "
                "use append() to add one"
            )
        if isinstance(parameters, str | bytes | Mapping) or not isinstance(parameters, Iterable):
            raise TypeError(
                f"{where} takes an iterable of Parameters, got {type(parameters).__name__} "
                f"{_short(parameters)}"
            )
        return [
            _check_parameter(param, f"{where} element #{i}")
            for i, param in enumerate(list(parameters))
        ]

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(self._items())

    def __contains__(self, item: object) -> bool:
        """Membership by identity: is this very parameter one of the entries?"""
        return any(param is item for param in self._parameters.values())

    @overload
    def __getitem__(self, index: int) -> Parameter: ...
    @overload
    def __getitem__(self, index: slice) -> ParameterList: ...
    def __getitem__(self, index: int | slice) -> Parameter | ParameterList:
        items = self._items()
        if isinstance(index, slice):
            return ParameterList(items[index])
        return items[_position(index, len(items), "ParameterList")]

    @overload
    def __setitem__(self, index: int, value: Parameter) -> None: ...
    @overload
    def __setitem__(self, index: slice, value: Iterable[Parameter]) -> None: ...
    def __setitem__(self, index: int | slice, value: Parameter | Iterable[Parameter]) -> None:
        items = self._items()
        if isinstance(index, slice):
            items[index] = self._incoming(value, f"ParameterList[{_slice_text(index)}] = ...")
        else:
            pos = _position(index, len(items), "ParameterList")
            items[pos] = _check_parameter(value, f"ParameterList[{index}] = ...")
        self._set_items(items)

    def __delitem__(self, index: int | slice) -> None:
        items = self._items()
        if isinstance(index, slice):
            del items[index]
        else:
            del items[_position(index, len(items), "ParameterList")]
        self._set_items(items)

    def append(self, param: Parameter) -> Self:
        """Add ``param`` at the end.

        Args:
            param: The parameter.

        Returns:
            This list, so that calls chain.
        """
        checked = _check_parameter(param, "ParameterList.append()")
        self._put(str(len(self._parameters)), checked)
        return self

    def extend(self, parameters: Iterable[Parameter]) -> Self:
        """Add every parameter of ``parameters`` at the end.

        Args:
            parameters: The parameters.

        Returns:
            This list, so that calls chain.
        """
        self._set_items(self._items() + self._incoming(parameters, "ParameterList.extend()"))
        return self

    def insert(self, index: int, param: Parameter) -> None:
        """Insert ``param`` before ``index``, like ``list.insert``; later entries shift.

        Args:
            index: The position to insert at.
            param: The parameter.
        """
        checked = _check_parameter(param, "ParameterList.insert()")
        items = self._items()
        items.insert(operator.index(index), checked)
        self._set_items(items)

    def pop(self, index: int = -1) -> Parameter:
        """Remove and return the parameter at ``index`` (default: the last one).

        Args:
            index: The position to remove.

        Returns:
            The removed parameter.

        Raises:
            IndexError: When the list is empty or ``index`` is out of range.
        """
        items = self._items()
        if not items:
            raise IndexError("pop from an empty ParameterList")
        param = items.pop(_position(index, len(items), "ParameterList"))
        self._set_items(items)
        return param

    def __iadd__(self, parameters: Iterable[Parameter]) -> Self:
        return self.extend(parameters)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not callable: a parameter list holds state.

        Args:
            *args: Ignored.
            **kwargs: Ignored.

        Returns:
            Never returns.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError("ParameterList holds parameters; it has no forward()")


class ParameterDict(_ParameterContainer):
    """Parameters by name, in insertion order; keys are identifiers (see the module docstring).

    Args:
        parameters: The initial entries: a mapping or an iterable of (key, parameter)
            pairs.
    """

    def __init__(
        self,
        parameters: Mapping[str, Parameter]
        | Iterable[tuple[str, Parameter]]
        | ParameterDict
        | None = None,
    ) -> None:
        super().__init__()
        if parameters is not None:
            self._update(parameters, "ParameterDict()")

    def _update(self, parameters: object, where: str) -> None:
        checked: list[tuple[str, Parameter]] = []
        for key, param in _pairs(parameters, where, "Parameter"):
            name = _check_key(self, key, self._parameters)
            checked.append((name, _check_parameter(param, f"{where} value for key {name!r}")))
        for name, param in checked:
            self._put(name, param)

    def update(
        self, parameters: Mapping[str, Parameter] | Iterable[tuple[str, Parameter]] | ParameterDict
    ) -> None:
        """Add or replace entries from a mapping or an iterable of (key, parameter) pairs.

        Args:
            parameters: The entries to add.
        """
        self._update(parameters, "ParameterDict.update()")

    def __getitem__(self, key: str) -> Parameter:
        try:
            return self._parameters[key]
        except KeyError:
            raise KeyError(_missing_key(self, key, self._parameters)) from None

    def __setitem__(self, key: str, param: Parameter) -> None:
        name = _check_key(self, key, self._parameters)
        checked = _check_parameter(param, f"ParameterDict[{name!r}] = ...")
        self._put(name, checked)

    def __delitem__(self, key: str) -> None:
        if key not in self._parameters:
            raise KeyError(_missing_key(self, key, self._parameters))
        delattr(self, key)

    @overload
    def pop(self, key: str) -> Parameter: ...
    @overload
    def pop(self, key: str, default: _T) -> Parameter | _T: ...
    def pop(self, key: str, default: Any = _MISSING) -> Any:
        """Remove ``key`` and return its parameter (or ``default`` if given and absent).

        Args:
            key: The entry to remove.
            default: What to return when ``key`` is absent.

        Returns:
            The removed parameter, or ``default``.

        Raises:
            KeyError: When ``key`` is absent and no default is given (listing the keys).
        """
        if key not in self._parameters:
            if default is _MISSING:
                raise KeyError(_missing_key(self, key, self._parameters))
            return default
        param = self._parameters[key]
        del self[key]
        return param

    def get(self, key: str, default: _T | None = None) -> Parameter | _T | None:
        """The parameter under ``key``, or ``default``.

        Args:
            key: The entry's key.
            default: What to return when ``key`` is absent.

        Returns:
            The parameter, or ``default``.
        """
        return self._parameters.get(key, default)

    def clear(self) -> None:
        """Remove every entry."""
        self._drop_all()

    def __contains__(self, key: object) -> bool:
        return key in self._parameters

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._parameters))

    def keys(self) -> KeysView[str]:
        """The keys, in insertion order.

        Returns:
            A view of the keys.
        """
        return self._parameters.keys()

    def values(self) -> ValuesView[Parameter]:
        """The parameters, in insertion order.

        Returns:
            A view of the parameters.
        """
        return self._parameters.values()

    def items(self) -> ItemsView[str, Parameter]:
        """The (key, parameter) pairs, in insertion order.

        Returns:
            A view of the pairs.
        """
        return self._parameters.items()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not callable: a parameter dict holds state.

        Args:
            *args: Ignored.
            **kwargs: Ignored.

        Returns:
            Never returns.

        Raises:
            NotImplementedError: Always.
        """
        raise NotImplementedError("ParameterDict holds parameters; it has no forward()")
