"""What a module's ``forward`` takes, read once per class.

Several places ask the same question of ``forward``'s signature: the tracer (are
these arguments acceptable, before any call is made?), the runtime (is this
keyword an execution setting or the forward's own argument?), the backward pass
(which argument is which parameter?), and the CLI (which fields of a record are
``forward``'s parameters?).  `inspect.signature` is slow (tens of µs) and the
tracer asks once per leaf call per input, so the answer is computed once per
class and kept; everything derived from it is precomputed on the `Shape`.

A `Shape` describes ``forward`` as it is called, on an instance: ``self`` is not
among its parameters.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Shape", "forward_shape", "shape_of"]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True, slots=True, eq=False)
class Shape:
    """A callable's parameters, and the questions plait asks of them, answered once."""

    #: The signature as called (``self`` already bound): `bind` it for inspect's checks
    #: and messages.
    signature: inspect.Signature
    #: Its parameters, in order.
    parameters: tuple[inspect.Parameter, ...]
    #: The parameters that can be passed by name (neither ``*args``, ``**kwargs`` nor
    #: positional-only), in order.
    names: tuple[str, ...]
    #: Those of `names` that have no default.
    required: frozenset[str]
    #: How many arguments it can take by position (not counting ``*args``).
    positional: int
    #: Whether it has ``*args``.
    var_positional: bool
    #: Whether it has ``**kwargs``.
    var_keyword: bool
    #: Whether every parameter is a plain one (``def forward(self, a, b=1)``), so that
    #: `fits` can decide by counting.
    simple: bool

    @classmethod
    def of(cls, signature: inspect.Signature) -> Shape:
        params = tuple(signature.parameters.values())
        names = tuple(p.name for p in params if p.kind in _BY_NAME)
        defaults = {p.name: p.default for p in params}
        return cls(
            signature=signature,
            parameters=params,
            names=names,
            required=frozenset(n for n in names if defaults[n] is inspect.Parameter.empty),
            positional=sum(1 for p in params if p.kind in _POSITIONAL),
            var_positional=any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params),
            var_keyword=any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params),
            simple=all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params),
        )

    @property
    def keywords(self) -> frozenset[str] | None:
        """The names it accepts as keyword arguments, or None when ``**kwargs`` takes any."""
        return None if self.var_keyword else frozenset(self.names)

    def fits(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """True when a call with ``args`` and ``kwargs`` certainly binds.

        Binding a signature costs ~14 µs; for a `simple` signature this counts
        instead.  False means "not sure": ask `signature.bind`, which also says
        what is wrong.
        """
        names = self.names
        if not self.simple or len(args) > len(names):
            return False
        if not kwargs and len(args) == len(names):
            return True  # every parameter given by position: nothing left to check
        given = names[: len(args)]
        if kwargs and (not set(kwargs) <= set(names) or not set(kwargs).isdisjoint(given)):
            return False
        return self.required <= {*given, *kwargs}


#: Class -> (its ``forward`` when read, the shape).  The function is kept to notice a
#: ``forward`` replaced after the first read (a test's monkeypatch).  Classes are held
#: as the caches this one replaced held them: a pipeline's classes live as long as
#: their module anyway.
_shapes: dict[type, tuple[Any, Shape]] = {}


def forward_shape(cls: type) -> Shape:
    """The `Shape` of ``cls.forward`` as called on an instance (without ``self``),
    computed once per class."""
    forward = cls.forward  # type: ignore[attr-defined]
    hit = _shapes.get(cls)
    if hit is not None and hit[0] == forward:
        return hit[1]
    shape = Shape.of(_without_self(inspect.signature(forward)))
    _shapes[cls] = (forward, shape)
    return shape


def shape_of(fn: Callable[..., Any]) -> Shape:
    """The `Shape` of any callable; a module's bound ``forward`` is read through the
    per-class cache.  Raises what `inspect.signature` raises for a callable it
    cannot read (TypeError, ValueError)."""
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, type):
        kind, func = type(owner), getattr(fn, "__func__", None)
        if func is not None and func is getattr(kind, "forward", None):
            return forward_shape(kind)
    return Shape.of(inspect.signature(fn))


def _without_self(signature: inspect.Signature) -> inspect.Signature:
    """``signature`` of a function read off its class, as called on an instance: its
    first parameter (``self``) bound, unless ``*args`` takes it (as inspect does
    for a bound method)."""
    params = list(signature.parameters.values())
    if params and params[0].kind in _POSITIONAL:
        return signature.replace(parameters=params[1:])
    return signature
