"""`Module`: the unit users write, as in ``torch.nn.Module``.

Children and parameters assigned as attributes register themselves.  Calling a
module hands the call to the innermost interpreter (`plait.effects.interpret_call`),
which makes it one `Message` and decides what the call means where it is made:

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

from plait.effects import interpret_call, runtime
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
    """What a module's ``backward`` may look at: its inputs, output and node.

    Attributes:
        inputs: The call's arguments by ``forward`` parameter name.
        output: What the call returned.
        node_id: The call's node in the run's graph.
        module_path: The module's dotted path from the root.
    """

    inputs: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    node_id: str | None = None
    module_path: str | None = None


@dataclass(slots=True)
class BackwardResult:
    """Feedback a module sends upstream: per input name and per parameter name.

    Attributes:
        input_feedback: Feedback for the producer of each input, by ``forward``
            parameter name.
        parameter_feedback: Feedback for each of the module's own parameters, by
            attribute name (``"system_prompt"``).
    """

    input_feedback: dict[str, Any] = field(default_factory=dict)
    parameter_feedback: dict[str, Any] = field(default_factory=dict)


class Module:
    """Base class of every pipeline step; subclass it and implement ``forward``.

    ``forward`` is plain synchronous code over strings and structures; plait records
    the module calls it makes into one dependency graph and runs that graph with
    as much concurrency as the endpoints allow.  A module may instead define
    ``async def forward`` to make decisions on real values; its module calls still
    go through plait's runtime, limits and handlers.

    Submodules and `Parameter`s assigned as attributes register themselves, as in
    PyTorch: `named_modules`, `named_parameters` and `state_dict` find them.  Call
    a module with ``await module(x)`` or ``module.run_sync(x)``; a list (or any
    iterator) of inputs runs as a batch and returns a list of outputs, one per
    input, where a failed input is a `Value` of kind ERROR.

    Examples:
        Two calls that run concurrently, and a third that waits for both:

        ```python
        import plait


        class ExtractAndCompare(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.facts = plait.LLMInference("fast", system_prompt="Extract the facts.")
                self.risks = plait.LLMInference("fast", system_prompt="Extract the risks.")
                self.compare = plait.LLMInference("fast", system_prompt="Compare them.")

            def forward(self, document: str) -> str:
                facts = self.facts(document)
                risks = self.risks(document)
                return self.compare(f"Facts: {facts} Risks: {risks}")


        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        pipeline = ExtractAndCompare().bind(resources=resources)
        print(pipeline.run_sync("The roof leaks; the price is fair."))
        print(len(pipeline.run_sync(["first document", "second document"])))
        ```
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
        """Register a child under ``name`` (what attribute assignment does).

        Args:
            name: The attribute name.
            module: The child, or None to remove what ``name`` held.
        """
        setattr(self, name, module)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register a parameter under ``name`` (what attribute assignment does).

        Args:
            name: The attribute name.
            param: The parameter, or None to remove what ``name`` held.
        """
        setattr(self, name, param)

    def _bump_state_version(self) -> None:
        object.__setattr__(self, "_state_version", self._state_version + 1)

    @property
    def module_state_version(self) -> int:
        """A counter that goes up whenever a parameter this module owns changes value."""
        return self._state_version

    # -- computation ---------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The module's computation: subclasses define it (plain or ``async def``).

        In a plain ``forward`` the module calls it makes are recorded into a graph
        and run as soon as their inputs exist; their results are stand-ins to pass
        on, format into text or return, not to inspect (`TracingError` says how to
        decide on real values: an ``async def forward``).

        Args:
            *args: The input(s), as the caller passes them.
            **kwargs: Keyword inputs.

        Returns:
            The module's output: text, a structure, or the result of a module call.

        Raises:
            NotImplementedError: When the subclass defines no ``forward``.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward()")

    def backward(self, feedback: Value, ctx: BackwardContext) -> BackwardResult:
        """Send feedback upstream; by default every input receives it unchanged.

        Override it to say how feedback on this module's output becomes feedback on
        its inputs and parameters (module calls made here run for real, as part of
        the backward pass).

        Args:
            feedback: Feedback on the module's output (its payload is the text).
            ctx: The call's inputs, output and place in the graph.

        Returns:
            Feedback per input name and per parameter name.
        """
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

        Args:
            resources: The endpoints the aliases lead to: a `ResourceConfig`, a
                `ResourceManager` or a mapping of aliases to endpoint settings.
            max_concurrent: How many LLM calls one run keeps in flight (default 100).
            **kwargs: Other run options: ``checkpoint_dir``, ``seed``, ``workers``,
                ``streaming``, ``preserve_order``, ``max_inputs_in_flight``,
                ``ray_address``, ``backend``.

        Returns:
            This module, so that the call can be chained.

        Raises:
            TypeError: When an option name is unknown (the message lists the known ones).

        Examples:
            ```python
            import plait

            fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
            resources = plait.ResourceConfig({"fast": fast})
            summarize = plait.LLMInference("fast", system_prompt="Summarize.")
            summarize.bind(resources=resources, checkpoint_dir="runs/summaries")
            summarize.bind(seed=7)  # keeps the resources and the checkpoint directory
            print(summarize.run_sync("A long text."))
            ```
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
        return interpret_call(self, args, kwargs)

    @classmethod
    @functools.cache
    def _async_forward_of(cls) -> bool:
        return inspect.iscoroutinefunction(cls.forward)

    def _has_async_forward(self) -> bool:
        return type(self)._async_forward_of()

    def run_sync(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module to completion and return its output, from plain (sync) code.

        It works inside a running event loop too (a notebook): the run goes to
        plait's own loop.  A list or iterator as the first argument is a batch.

        Args:
            *args: The input, or a batch of inputs (a list or any iterator).
            **kwargs: Keyword inputs of ``forward``, and per-call run options
                (``resources``, ``max_concurrent``, ``checkpoint_dir``, ``seed``...),
                which rank above `bind` and `ExecutionSettings`.

        Returns:
            The output; for a batch, a list of outputs in input order, where an
            input that failed is a `Value` of kind ERROR.  In ``train()`` mode, the
            output `Value` itself.

        Raises:
            ExecutionError: When the single input's pipeline failed (``.value`` is
                the ERROR `Value`: module path, exception, traceback).
            TracingError: When ``forward`` uses an output in a way plait cannot
                record (before any call is sent).

        Examples:
            ```python
            import plait

            fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
            resources = plait.ResourceConfig({"fast": fast})
            summarize = plait.LLMInference("fast", system_prompt="Summarize.")
            summarize.bind(resources=resources)
            print(summarize.run_sync("One input."))
            for output in summarize.run_sync(["First input.", "Second input."]):
                print(output)
            ```
        """
        return runtime().run_sync(self, args, kwargs)

    def stream(self, inputs: Any, **options: Any) -> AsyncIterator[Any]:
        """Run a batch and yield each input's result as it completes.

        Args:
            inputs: The inputs: a list or any iterable.
            **options: Per-call run options; ``preserve_order=True`` yields in input
                order instead of completion order.

        Returns:
            An async iterator of `BatchResult`s: the input's ``index``, ``output``
            and, for a failed input, ``error``.

        Examples:
            ```python
            import asyncio

            import plait

            fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
            resources = plait.ResourceConfig({"fast": fast})
            summarize = plait.LLMInference("fast", system_prompt="Summarize.")
            summarize.bind(resources=resources)


            async def main() -> None:
                async for result in summarize.stream(["First.", "Second."]):
                    print(result.index, result.ok, result.output)


            asyncio.run(main())
            ```
        """
        return runtime().stream(self, inputs, options)

    # -- introspection -------------------------------------------------------------
    def children(self) -> Iterator[Module]:
        """The direct submodules, in the order they were assigned.

        Yields:
            Each child module.
        """
        yield from self._children.values()

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct submodules with their attribute names.

        Yields:
            ``(name, child)`` pairs.
        """
        yield from self._children.items()

    def modules(self) -> Iterator[Module]:
        """This module and every module below it, each once.

        Yields:
            Each module, this one first.
        """
        for _, module in self.named_modules():
            yield module

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Every module once, under the first path that reaches it (shared modules included).

        Args:
            prefix: Prepended to every path (``""``: this module's path is ``""``).

        Yields:
            ``(dotted path, module)`` pairs, this module first.
        """
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
        """Every parameter of this module and its submodules, each once.

        Yields:
            Each `Parameter`.
        """
        for _, param in self.named_parameters():
            yield param

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter once, named by the dotted path of its first occurrence.

        Args:
            prefix: Prepended to every name.

        Yields:
            ``(dotted name, parameter)`` pairs: the keys of `state_dict`.
        """
        seen: set[int] = set()
        for path, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                yield (f"{path}.{name}" if path else name), param

    # -- state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every parameter value by dotted name: what training learned, ready to save.

        Returns:
            A dict of dotted parameter name to value (JSON data for text and
            demonstrations).
        """
        return {name: param.value for name, param in self.named_parameters()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load values saved by `state_dict` (or a parameters file); missing keys are kept.

        Every value is checked before any is written, so a state that does not fit
        leaves the module as it was: an unknown name raises KeyError, and a value its
        parameter cannot hold (`Parameter.checked`: a number for a prompt, a pool
        for demonstrations is fine) raises `ParameterValueError` naming each.

        Args:
            state_dict: Dotted parameter names to values, as `state_dict` returns them.

        Raises:
            KeyError: When a name is not a parameter of this module (the message
                lists its parameters).
            ParameterValueError: When a value is of the wrong kind for its parameter.
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
        """Switch this module and its submodules to training mode (or back).

        In training mode a call returns the output `Value`, which carries the
        record `Value.backward` walks to send feedback to the parameters.

        Args:
            mode: True for training mode, False for evaluation mode.

        Returns:
            This module, so that the call can be chained.
        """
        for module in self.modules():
            object.__setattr__(module, "_training", bool(mode))
        return self

    def eval(self) -> Self:
        """Switch this module and its submodules to evaluation mode: calls return outputs.

        Returns:
            This module, so that the call can be chained.
        """
        return self.train(False)

    @property
    def training(self) -> bool:
        """Whether the module is in training mode (see `train`)."""
        return self._training

    def requires_grad_(self, requires_grad: bool = True) -> Self:
        """Freeze (False) or unfreeze every parameter in the tree.

        Args:
            requires_grad: False to keep optimizers from changing the parameters.

        Returns:
            This module, so that the call can be chained.
        """
        for param in self.parameters():
            param.requires_grad = requires_grad
        return self

    # -- display ---------------------------------------------------------------------
    def extra_repr(self) -> str:
        """What the module's ``repr`` shows between its parentheses; override to add.

        Returns:
            Text such as ``"alias='fast'"``; empty by default.
        """
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
