"""Blueprints: build a pipeline, its resources or any callable from layered arguments.

A `Blueprint` collects argument maps ("layers": defaults, presets, a config file,
the command line) and only ``make()`` resolves them, calling constructors from
the leaves up.  Nothing is checked before then, so layers can arrive in any order
and one `BlueprintError` lists every problem, each naming its dotted path and the
layer that set it.

How a parameter at dotted path ``p`` gets its value:

1. Layers are consulted newest first; the first layer with a key matching ``p``
   decides.  Within that layer an exact key beats a wildcard, and among wildcards
   the one with more named segments wins (``...judge...temperature`` over
   ``...temperature``), then the longer key.  So: the latest layer wins, and in
   one layer the most specific key wins.
2. ``...`` matches any number of segments: ``...temperature=0`` reaches every
   ``temperature`` at any depth, ``stage1...temperature`` every one under
   ``stage1``.  A wildcard only sets arguments of things that are being built;
   it never causes something to be built.
3. A value that fits the annotation is used as is.  A `Castable` string is
   converted by the annotation (float, int, bool from true/false/yes/no/1/0,
   ``None``/``null`` for optionals, lists from ``a,b`` or JSON, dicts from JSON,
   Literal, Enum by name or value, classes and callables from ``module:Name``).
4. Otherwise the value names what to build (polymorphism): a class or function,
   or a string ``module:Name`` / ``file.py:Name`` / bare ``Name``.  A bare name is
   looked up among the subclasses of the annotated class, then in the module that
   defines the parameter's owner and in the target's module.  Arguments under the
   path (``judge=StrictJudge judge.strict=true``) go to that call.
5. Exact keys under ``p`` with no value for ``p`` itself build ``p`` from its
   annotated class (``summarizer.temperature=0.2`` builds ``summarizer``); for a
   ``dict``/``Mapping`` parameter they set its items (``aliases.fast.model=m``),
   merged leaf by leaf with a whole mapping some layer gave (the later layer
   wins each leaf; items of a pydantic model given whole count as its fields).
6. Nothing set: the signature's default is kept (the layer shown is
   ``default``).  A required parameter annotated with a buildable class is built
   from it; any other required parameter is reported missing.

7. Once a plait `Module` target is built, the settings of the `LLMInference`
   calls its ``__init__`` built are arguments too, under each call's module path:
   ``praise.temperature``, ``compare.alias``, ``...max_tokens``,
   ``judge.llm.system_prompt`` (setting a learnable system prompt sets its
   `Parameter`'s value).  ``--help`` lists them, with ``built by __init__`` as the
   layer of those nobody set.  A constructor argument at the same path wins, and
   where a module above takes a constructor argument of that name
   (``Judge(temperature=...)``), wildcards stop at it: only a key naming the
   call's own path (``judge.llm.temperature``) reaches past it.

`make_from_argv(target)` (or ``blueprint.make_from_argv(argv)``) builds from a
script's ``key=value`` arguments as the ``command line`` layer; ``--help`` prints
the table of every argument, its value and where that came from.

A ``**kwargs`` parameter accepts names the signature does not list, at its own
level only (converted by the ``**kwargs`` annotation); ``*args`` is not
addressable.  Unannotated parameters take strings as they are, unless their
default is a bool, number, string or enum, whose type is then used.
"""

from plait.blueprint._blueprint import Blueprint, make_from_argv, parse_cli_args
from plait.blueprint._evaluate import BlueprintError
from plait.blueprint._plan import ArgInfo
from plait.blueprint._types import Castable, load_object

__all__ = [
    "ArgInfo",
    "Blueprint",
    "BlueprintError",
    "Castable",
    "load_object",
    "make_from_argv",
    "parse_cli_args",
]
