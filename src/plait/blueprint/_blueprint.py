"""`Blueprint`: layered, lazy arguments for any constructor, resolved only by ``make()``.

The front of the package: a blueprint keeps its layers and presets as given, and
each ``make()``, ``describe()`` or ``help()`` plans afresh from them
(`plait.blueprint._plan`) and, for ``make()``, evaluates the plan
(`plait.blueprint._evaluate`).  ``make_from_argv`` adds a script's command line as
the top layer.
"""

from __future__ import annotations

import difflib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from plait.blueprint._evaluate import BlueprintError, evaluate, evaluate_plan
from plait.blueprint._keys import Layer
from plait.blueprint._plan import ArgInfo, ConstNode, Failure, Node, Plan, Planner
from plait.blueprint._types import Castable, CastError, is_factory, load_object, object_text

__all__ = ["COMMAND_LINE", "Blueprint", "make_from_argv", "parse_cli_args"]

T = TypeVar("T")

#: The layer name of ``key=value`` arguments from a command line.
COMMAND_LINE = "command line"


def parse_cli_args(argv: list[str]) -> dict[str, Castable]:
    """Read ``key=value`` command-line tokens as a layer for `Blueprint.apply`.

    Each value becomes a `Castable`, converted by the annotation of the parameter
    it lands on (``"0.2"`` is a float where a float is wanted).  Only the shape
    of the tokens is checked here; whether the keys exist is ``make()``'s
    business, once every layer is known.

    Args:
        argv: Tokens such as ``summarizer.temperature=0.2``; ``--key=value``
            reads too.

    Returns:
        Key -> castable value.

    Raises:
        BlueprintError: A token is not ``key=value``; every such token is listed.

    Examples:
        >>> from plait.blueprint import parse_cli_args
        >>> parse_cli_args(["summarizer.temperature=0.2", "--words=20"])
        {'summarizer.temperature': Castable('0.2'), 'words': Castable('20')}
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


def _builds_module(target: Any) -> bool:
    """Whether ``make()`` yields a plait `Module` (a class of one, or one already built),
    whose submodules' knobs are arguments only known once it is built."""
    from plait.module import Module

    return (inspect.isclass(target) and issubclass(target, Module)) or isinstance(target, Module)


class Blueprint(Generic[T]):
    """Build a pipeline, or any callable, from layers of arguments: presets, files, a command line.

    Layers are collected as given and nothing is checked or built before
    ``make()``, so they can arrive in any order; the latest layer wins, and in
    one layer the most specific key.  ``make()`` calls the constructors from the
    leaves up and raises one `BlueprintError` listing every problem, each naming
    its dotted path and the layer that set it.  For a plait `Module` target, the
    settings of the `LLMInference` calls its ``__init__`` builds are arguments
    too (``llm.temperature``, ``...max_tokens``).  The package's page describes
    how keys match (wildcards ``...``, conversions, building subclasses by name).

    Args:
        target: A class or function, or a ``"module:Name"`` /
            ``"path/file.py:Name"`` string (imported now: a target that does not
            exist is not a configuration).  An object that is neither (a module
            instance) is returned by ``make()`` as it is and takes no arguments.

    Raises:
        BlueprintError: ``target`` cannot be imported, or is not callable.

    Examples:
        ```python
        import plait
        from plait.blueprint import Blueprint, parse_cli_args


        class Summarize(plait.Module):
            def __init__(self, words: int = 50, style: str = "plain") -> None:
                super().__init__()
                self.llm = plait.LLMInference("fast", f"Summarize in {words} words, {style} style.")

            def forward(self, text: str) -> str:
                return self.llm(text)


        blueprint = Blueprint(Summarize).preset("short", {"words": 20})
        blueprint.apply({"style": "bullet points"}, layer="team defaults")
        blueprint.apply_preset("short")
        blueprint.apply(parse_cli_args(["llm.temperature=0"]))
        summarize = blueprint.make()
        print(summarize.llm.system_prompt.value, summarize.llm.temperature)
        print(blueprint.help())
        ```
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
        """What ``make()`` calls (the class or function, imported)."""
        return self._target

    @property
    def presets(self) -> tuple[str, ...]:
        """The names of the registered presets, in the order they were registered."""
        return tuple(self._presets)

    def apply(self, args: Mapping[str, Any], layer: str = COMMAND_LINE) -> Blueprint[T]:
        """Add a layer of arguments on top of the others; later layers win.

        The mapping is copied and nothing is checked until ``make()``.

        Args:
            args: Dotted key -> value (``{"summarizer.temperature": 0.2}``, a
                wildcard ``"...temperature"``); strings wrapped in `Castable` are
                converted by the annotation they land on.
            layer: The layer's name, shown by ``help()`` and in error messages.

        Returns:
            The blueprint itself, for chaining.

        Raises:
            TypeError: ``args`` is not a mapping.
        """
        if not isinstance(args, Mapping):
            raise TypeError(f"Blueprint.apply() takes a mapping, got {type(args).__name__}")
        self._layers.append(Layer.of(layer, args))
        return self

    def preset(self, name: str, args: Mapping[str, Any]) -> Blueprint[T]:
        """Register a named set of arguments, applied later with `apply_preset`.

        Args:
            name: The preset's name (listed by ``help()``).
            args: Its arguments, as `apply` takes them.

        Returns:
            The blueprint itself, for chaining.

        Raises:
            TypeError: ``args`` is not a mapping.
        """
        if not isinstance(args, Mapping):
            raise TypeError(f"Blueprint.preset() takes a mapping, got {type(args).__name__}")
        self._presets[name] = dict(args)
        return self

    def apply_preset(self, name: str) -> Blueprint[T]:
        """Apply a registered preset as a layer named after it.

        An unknown name is reported by ``make()`` with the other problems (with
        the closest registered name).

        Args:
            name: The preset's name.

        Returns:
            The blueprint itself, for chaining.
        """
        if name in self._presets:
            return self.apply(self._presets[name], layer=name)
        close = difflib.get_close_matches(name, self._presets, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(self._presets) or "none registered"
        self._pending.append(f"unknown preset {name!r} (presets: {known}){hint}")
        return self

    def clone(self) -> Blueprint[T]:
        """A copy with the same target, layers and presets, to vary without changing this one.

        Returns:
            The copy.
        """
        twin: Blueprint[T] = Blueprint(self._target)
        twin._layers = [Layer.of(layer.name, layer.values) for layer in self._layers]
        twin._presets = {k: dict(v) for k, v in self._presets.items()}
        twin._pending = list(self._pending)
        return twin

    def _plan(self) -> Plan:
        """Plan the constructor call; for a plait Module, also build it and read the knobs
        of the submodules it builds (only then are all of its arguments known)."""
        planner = Planner(self._target, self._layers)
        root: Node | None
        if is_factory(self._target):
            root = planner.build(self._target, "", None)
        else:
            # An object that is merely callable (a module instance, say) is already
            # built: calling it would run it, so it is the result, and takes no arguments.
            root = ConstNode(self._target)
        plan = Plan(root, [], [])
        builds_module = _builds_module(self._target)
        if builds_module and root is not None and not planner.problems and not self._pending:
            failures: list[Failure] = []
            built = evaluate(root, failures)
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
        """Build the target from the layers, calling constructors from the leaves up.

        Returns:
            What the target returns (the built pipeline).

        Raises:
            BlueprintError: Every problem found at once: unknown keys, values
                that do not convert, missing required arguments, constructors
                that raised, each under its dotted path.
        """
        value: T = evaluate_plan(self._plan(), object_text(self._target))
        return value

    def make_from_argv(self, argv: Sequence[str] | None = None) -> T:
        """Build from a script's ``key=value`` command-line arguments, with ``--help``.

        The arguments are applied as the ``"command line"`` layer, on top of this
        blueprint's layers, to a copy (this blueprint is left as it was).

        Args:
            argv: The arguments (default ``sys.argv[1:]``).

        Returns:
            What the target returns.

        Raises:
            SystemExit: With status 0 after printing ``help()`` for ``--help`` or
                ``-h``; with status 2 after printing every problem to stderr.
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
        """Every argument ``make()`` would use, for tools that show or check a configuration.

        Returns:
            One `ArgInfo` per argument passed or left at its default, in signature order.
        """
        return self._plan().infos

    def help(self) -> str:
        """The ``--help`` text, to see where every value came from.

        Returns:
            The target's summary, the presets, any problem ``make()`` would
                raise, and a table of each argument's type, value and layer.
        """
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
    """Build ``target`` from a script's ``key=value`` arguments: its whole command line in one call.

    ``Blueprint(target).make_from_argv(argv)``, so that
    ``python summarize.py words=20 ...temperature=0`` configures the pipeline
    and ``--help`` lists every argument.

    Args:
        target: A class or function, or a ``"module:Name"`` / ``"file.py:Name"`` string.
        argv: The arguments (default ``sys.argv[1:]``).

    Returns:
        What the target returns.

    Raises:
        BlueprintError: ``target`` cannot be imported or is not callable.
        SystemExit: With status 0 after printing the help for ``--help``; with
            status 2 after printing every problem to stderr.

    Examples:
        ```python
        import plait
        from plait.blueprint import make_from_argv


        class Summarize(plait.Module):
            def __init__(self, words: int = 50) -> None:
                super().__init__()
                self.llm = plait.LLMInference("fast", f"Summarize in {words} words.")

            def forward(self, text: str) -> str:
                return self.llm(text)


        if __name__ == "__main__":
            # python summarize.py words=20 ...temperature=0
            summarize = make_from_argv(Summarize, ["words=20", "...temperature=0"])
            print(summarize.llm.system_prompt.value, summarize.llm.temperature)
        ```
    """
    blueprint: Blueprint[T] = Blueprint(target)
    return blueprint.make_from_argv(argv)
