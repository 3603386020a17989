"""`Module`: the unit users write, as in ``torch.nn.Module`` (seed 000).

Children and parameters assigned as attributes register themselves.  Calling a
module builds one `Message` and hands it to the innermost interpreter
(`plait.effects`), which decides what the call means where it is made:

1. while a graph is being traced, the call is recorded (a leaf becomes a node, a
   composite is traced through);
2. inside an ``async def forward`` that a run executes, it runs as part of that run;
3. from plain code, when the module can reach an LLM (resources bound, an
   `ExecutionSettings` context, or LLM calls somewhere in its tree) it returns an
   awaitable that traces and runs the whole pipeline, or an async iterator when
   streaming; otherwise ``forward()`` runs directly, like any Python function.

A module knows no tracer, engine or runtime: those are interpreters above it.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from plait.effects import Message, interpret, runtime
from plait.options import check_setting_names
from plait.parameter import Parameter, ParameterValueError
from plait.values import Value

__all__ = ["BackwardContext", "BackwardResult", "Module", "llm_aliases"]


class _Keep:
    """Default of `Module.bind`'s named arguments: tells "not given" from ``None`` (remove)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<unchanged>"


_KEEP = _Keep()


@dataclass(slots=True)
class BackwardContext:
    """What a module's ``backward`` may look at: its inputs, output and node."""

    inputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    node_id: str | None = None
    module_path: str | None = None


@dataclass(slots=True)
class BackwardResult:
    """Feedback a module sends upstream: per input name and per parameter name."""

    input_feedback: dict[str, Any] = field(default_factory=dict)
    parameter_feedback: dict[str, Any] = field(default_factory=dict)


class Module:
    """Base class of every pipeline step; subclass it and implement ``forward``.

    ``forward`` is plain synchronous code over strings and structures; plait records
    the module calls it makes into one dependency graph and runs that graph with
    as much concurrency as the endpoints allow.  A module may instead define
    ``async def forward`` to make decisions on real values; its module calls still
    go through plait's runtime, limits and handlers.
    """

    _children: dict[str, Module]
    _parameters: dict[str, Parameter]
    _name: str | None
    #: A `ResourceConfig` or `ResourceManager` (typed loosely: the core sits below them).
    _bound_resources: Any
    _bound_config: dict[str, Any]
    _training: bool
    _state_version: int
    _parent: weakref.ReferenceType[Module] | None

    #: LLMInference sets this; plait needs resources to run such a module.
    _calls_llm: ClassVar[bool] = False
    #: Parameter containers set this: owning one does not make a module composite.
    _holds_only_parameters: ClassVar[bool] = False
    #: Wrappers that hold a user's pipeline without owning it (``TrainingStep``)
    #: clear this, so the pipeline's parameters keep the names its own root gives them.
    _adopts_children: ClassVar[bool] = True

    def __init__(self) -> None:
        object.__setattr__(self, "_children", {})
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_name", None)
        object.__setattr__(self, "_bound_resources", None)
        object.__setattr__(self, "_bound_config", {})
        object.__setattr__(self, "_training", False)
        object.__setattr__(self, "_state_version", 0)
        object.__setattr__(self, "_parent", None)

    # -- registration --------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        try:
            children = self.__dict__["_children"]
            params = self.__dict__["_parameters"]
        except KeyError:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() ran: call "
                f"super().__init__() first in {type(self).__name__}.__init__"
            ) from None
        self._release(name, keep=value)
        if isinstance(value, Module):
            if value is self:
                raise ValueError(f"a module cannot be its own child ({name!r})")
            children[name] = value
            orphan = value._parent_module() is None
            if value._name is None or (orphan and value._parent is not None):
                object.__setattr__(value, "_name", name)  # never named, or its owner is gone
            if orphan and self._adopts_children and not self._descends_from(value):
                object.__setattr__(value, "_parent", weakref.ref(self))
        elif isinstance(value, Parameter):
            params[name] = value
            if value.owner is None:
                value._owner = weakref.ref(self)
                value._name = name
        object.__setattr__(self, name, value)

    # -- pickling (sending a pipeline to Ray workers, saving it) ---------------------
    def __getstate__(self) -> dict[str, Any]:
        """The attributes, with the weak link to the owning module replaced by a mark:
        the owner's ``__setstate__`` restores the link, so unpickling a pipeline gives
        back the same tree (an owner that was not pickled along leaves no link)."""
        state = dict(self.__dict__)
        parent = self._parent_module()
        state["_parent"] = None
        state["_pickled_parent"] = id(parent) if parent is not None else None
        state["_pickled_id"] = id(self)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        mine = state.pop("_pickled_id", None)
        self.__dict__.update(state)
        if mine is None:
            return
        for child in self._children.values():
            if child.__dict__.get("_pickled_parent") == mine and child._parent is None:
                object.__setattr__(child, "_parent", weakref.ref(self))
        for param in self._parameters.values():
            if param._pickled_owner() == mine and param._owner is None:
                param._owner = weakref.ref(self)

    def __delattr__(self, name: str) -> None:
        self._release(name)
        object.__delattr__(self, name)

    def _release(self, name: str, keep: Any = None) -> None:
        """Unregister what ``name`` held; a child or parameter this module had adopted
        forgets it, so it takes its name from wherever it is registered next."""
        child = self._children.pop(name, None)
        if child is not None and child is not keep and child._parent_module() is self:
            object.__setattr__(child, "_parent", None)
            object.__setattr__(child, "_name", None)
        param = self._parameters.pop(name, None)
        if param is not None and param is not keep and param.owner is self:
            param._owner = None
            param._name = None

    def _parent_module(self) -> Module | None:
        return self._parent() if self._parent is not None else None

    def _descends_from(self, other: Module) -> bool:
        node: Module | None = self
        seen: set[int] = set()
        while node is not None and id(node) not in seen:
            if node is other:
                return True
            seen.add(id(node))
            node = node._parent_module()
        return False

    @property
    def qualified_path(self) -> str:
        """Dotted path from the root that owns this module ('' for a root).

        A module is owned by the first module it was assigned to; the path is the
        chain of those assignments, so it is the same whichever module is run and
        matches the owning root's ``named_modules()``/``state_dict()`` keys.
        """
        names: list[str] = []
        node: Module | None = self
        seen: set[int] = set()
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            parent = node._parent_module()
            if parent is None:
                break
            names.append(node._name or "?")
            node = parent
        return ".".join(reversed(names))

    def _binding(self) -> tuple[Any, dict[str, Any]]:
        """Resources and options from `bind()`, name by name: this module's, else the
        nearest owner's that bound it.

        A child binding one option of its own (``root.gen.bind(seed=9)``) must not
        lose the resources and other options its owner bound for it.
        """
        chain: list[Module] = []
        node: Module | None = self
        seen: set[int] = set()
        while node is not None and id(node) not in seen:
            chain.append(node)
            seen.add(id(node))
            node = node._parent_module()
        resources: Any = None
        config: dict[str, Any] = {}
        for node in reversed(chain):  # the root first, so nearer bindings win
            if node._bound_resources is not None:
                resources = node._bound_resources
            config.update(node._bound_config)
        return resources, config

    def register_module(self, name: str, module: Module | None) -> None:
        """Register a child under ``name`` (what attribute assignment does)."""
        setattr(self, name, module)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        setattr(self, name, param)

    def _bump_state_version(self) -> None:
        object.__setattr__(self, "_state_version", self._state_version + 1)

    @property
    def module_state_version(self) -> int:
        """Bumps whenever a parameter this module owns changes (seed 002)."""
        return self._state_version

    # -- computation ---------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        """Send feedback upstream; by default every input receives it unchanged."""
        return BackwardResult(input_feedback={name: feedback for name in ctx.inputs})

    def bind(
        self,
        resources: Any = _KEEP,
        max_concurrent: int | _Keep | None = _KEEP,
        **kwargs: Any,
    ) -> Self:
        """Add resources and execution options to this module's binding.

        Each call adds to what earlier calls bound, as a chained configuration call
        does: ``m.bind(resources=r, checkpoint_dir=d)`` then ``m.bind(seed=7)`` keeps
        ``r`` and ``d``. Passing ``None`` for a name removes it from the binding (the
        option falls back to the owner's binding, `ExecutionSettings` or its default).
        Bound options rank below per-call options and above `ExecutionSettings`, and
        reach every submodule this module owns: ``root.bind(resources=r)`` then
        ``root.child.run_sync(x)`` runs on ``r``; the names a submodule binds itself win
        for it, name by name (``root.child.bind(seed=9)`` keeps the owner's ``r``).
        ``max_concurrent`` caps the tasks this module runs at once (default 100).
        """
        options = dict(kwargs)
        if not isinstance(max_concurrent, _Keep):
            options["max_concurrent"] = max_concurrent
        check_setting_names(options, where="bind()")
        config = dict(self._bound_config)
        for name, value in options.items():
            if value is None:
                config.pop(name, None)
            else:
                config[name] = value
        if not isinstance(resources, _Keep):
            object.__setattr__(self, "_bound_resources", resources)
        object.__setattr__(self, "_bound_config", config)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        msg = Message(
            type="module",
            name=type(self).__name__,
            fn=self.forward,
            args=args,
            kwargs=kwargs,
            module=self,
        )
        return interpret(msg)

    @classmethod
    @functools.cache
    def _async_forward_of(cls) -> bool:
        return inspect.iscoroutinefunction(cls.forward)

    def _has_async_forward(self) -> bool:
        return type(self)._async_forward_of()

    def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        """Run to completion and return the result; works inside a running event loop too."""
        return runtime().run_sync(self, args, kwargs)

    def stream(self, inputs: Any, **options: Any) -> AsyncIterator[Any]:
        """Yield a `BatchResult` per input as each completes (or in order, with preserve_order)."""
        return runtime().stream(self, inputs, options)

    # -- introspection -------------------------------------------------------------
    def children(self) -> Iterator[Module]:
        yield from self._children.values()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._children.items()

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Every module once, under the first path that reaches it (shared modules included)."""
        seen: set[int] = set()
        stack: list[tuple[str, Module]] = [(prefix, self)]
        while stack:
            path, module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            yield path, module
            items = list(module._children.items())
            for name, child in reversed(items):
                stack.append((f"{path}.{name}" if path else name, child))

    def parameters(self) -> Iterator[Parameter]:
        for _, param in self.named_parameters():
            yield param

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter once, named by the dotted path of its first occurrence."""
        seen: set[int] = set()
        for path, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                yield (f"{path}.{name}" if path else name), param

    # -- state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every parameter value by dotted name: what training learned, ready to save."""
        return {name: param.value for name, param in self.named_parameters()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load values saved by `state_dict` (or a parameters file); missing keys are kept.

        Every value is checked before any is written, so a state that does not fit
        leaves the module as it was: an unknown name raises KeyError, and a value its
        parameter cannot hold (`Parameter.checked`: a number for a prompt, a pool
        for demonstrations is fine) raises `ParameterValueError` naming each.
        """
        params = dict(self.named_parameters())
        unknown = [name for name in state_dict if name not in params]
        if unknown:
            known = ", ".join(params) or "none"
            raise KeyError(
                f"unknown parameter(s) {', '.join(map(repr, unknown))} for "
                f"{type(self).__name__} (its parameters: {known})"
            )
        checked: dict[str, Any] = {}
        wrong: list[str] = []
        for name, value in state_dict.items():
            try:
                checked[name] = params[name].checked(value)
            except ParameterValueError as exc:
                wrong.append(f"{name} ({exc})")
        if wrong:
            raise ParameterValueError(
                f"value(s) of the wrong kind for {type(self).__name__}: {'; '.join(wrong)}",
                tuple(wrong),
            )
        for name, value in checked.items():
            params[name].value = value

    # -- modes -----------------------------------------------------------------------
    def train(self, mode: bool = True) -> Self:
        """Training mode: calls return `Value`s that carry the record `backward()` walks."""
        for module in self.modules():
            object.__setattr__(module, "_training", bool(mode))
        return self

    def eval(self) -> Self:
        return self.train(False)

    @property
    def training(self) -> bool:
        return self._training

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Freeze (False) or unfreeze every parameter in the tree."""
        for param in self.parameters():
            param.requires_grad = requires_grad
        return self

    # -- display ---------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, child in self._children.items():
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        if len(lines) == 1:
            return lines[0] + ")"
        return "\n".join(lines) + "\n)"


def llm_aliases(module: Any) -> set[str]:
    """The aliases the LLM calls of ``module``'s tree name (what its resources must
    configure, what a checkpoint records, what a batch run must be able to batch)."""
    return {m.alias for m in module.modules() if getattr(m, "_calls_llm", False)}
