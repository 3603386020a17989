"""`Recurrence`: process a sequence step by step with an explicit state.

A recurrence scans a step function over a sequence: the subclass says what the
state starts as (``initial_state``) and what one step does with an
item and the state (``step``, returning the step's output and the new state);
``apply`` runs the scan.  For LLM pipelines the items are chunks of a long
document, turns of a conversation or records of a stream, and a step is a few
module calls (update a running summary, carry an answer forward).

Two ways to run the scan:

* static (the default): ``apply`` unrolls the loop while ``forward`` is traced, so
  every step's calls are nodes of the one graph.  Work a step does that does not
  depend on the state (cleaning its chunk, say) starts as soon as its own input
  exists, not when the previous step ends; a batch of sequences runs step t of
  every sequence concurrently under the same limits; and ``backward()`` reaches
  the step's parameters through every step, each step's node giving its own
  feedback.  The length must be known when ``forward`` runs (a list, not an
  LLM's output).
* dynamic (``static=False``): the module runs on real values, one step after the
  other, each step's calls traced and run as their own small graph; after each
  step ``should_stop(output, state)`` may end the scan (data-dependent stopping),
  and the sequence may itself be computed by an earlier call.  Backward cannot
  see inside a dynamic scan, so training one with learnable parameters is an
  error naming ``static=True``.

``resets`` marks positions where the state starts over (several documents in one
stream): before the step at such a position the state is ``initial_state`` of the
segment that starts there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plait.effects import current_interpreter
from plait.module import Module
from plait.tracing import TracingError

__all__ = ["Recurrence"]


class Recurrence(Module):
    """Base class of modules that process a sequence step by step, carrying a state.

    For chunks of a long document, turns of a conversation, records of a stream.
    Implement ``initial_state(items)`` and ``step(item, state) -> (output,
    new_state)``, both synchronous and made of module calls and text operations
    like any ``forward``; optionally ``should_stop(output, state)`` (dynamic mode
    only).  ``forward(sequence, state=None, resets=None)`` is ``apply``: it returns
    ``(outputs, final_state)``; override ``forward`` to take other inputs (a whole
    document, chunked first) and call ``self.apply`` from it.

    Static mode (the default) unrolls the scan while ``forward`` is traced, so
    every step's calls are nodes of one graph: work that does not need the state
    starts early, a batch of sequences runs step t of each concurrently, and
    ``backward()`` reaches the step's parameters through every step; the length
    must be known when ``forward`` runs.  Dynamic mode (``static=False``) runs the
    steps one after the other on real values, so ``should_stop`` can end the scan
    and the sequence may come from an earlier call; it cannot be trained.

    A sequence given as one input is a tuple, or a list inside the batch
    (``run_sync([chunks])``): a bare list is a batch of inputs.

    Args:
        static: Unroll the scan into the traced graph (True), or run it step by
            step on real values (False).

    Raises:
        TypeError: ``static`` is not a bool.

    Examples:
        ```python
        import plait
        from plait.sequences import Recurrence


        class Story(Recurrence):
            def __init__(self) -> None:
                super().__init__()
                self.write = plait.LLMInference("fast", "Continue the story in one sentence.")

            def initial_state(self, items: list[str]) -> str:
                return "Once upon a time."

            def step(self, item: str, state: str) -> tuple[str, str]:
                sentence = self.write(f"Story so far: {state}\\nNow bring in: {item}")
                return sentence, sentence


        resources = plait.ResourceConfig(
            {"fast": plait.EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")}
        )
        story = Story().bind(resources=resources)
        sentences, ending = story.run_sync(("a dragon", "a knight", "a castle"))
        print(len(sentences), ending.splitlines()[-1])
        ```
    """

    static: bool
    _step_call: _StepCall

    def __init__(self, *, static: bool = True) -> None:
        super().__init__()
        if not isinstance(static, bool):
            raise TypeError(f"static must be True or False, got {static!r}")
        object.__setattr__(self, "static", static)
        object.__setattr__(self, "_step_call", _StepCall(self))

    # -- what a subclass writes ------------------------------------------------------
    def initial_state(self, items: Sequence[Any]) -> Any:
        """The state before the first step (and after each reset); a subclass writes it.

        Args:
            items: The segment about to be scanned (up to the next reset).

        Returns:
            The initial state.

        Raises:
            NotImplementedError: The subclass does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement initial_state()")

    def step(self, item: Any, state: Any) -> tuple[Any, Any]:
        """One step of the scan; a subclass writes it, with module calls as in ``forward``.

        Args:
            item: The sequence's next item.
            state: The state before it.

        Returns:
            ``(output, new_state)``.

        Raises:
            NotImplementedError: The subclass does not define it.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def should_stop(self, output: Any, state: Any) -> bool:
        """Whether to end the scan after this step, from real values (dynamic mode only).

        Args:
            output: The step's output.
            state: The state after the step.

        Returns:
            True to stop (default: never).
        """
        return False

    # -- running ---------------------------------------------------------------------
    def forward(self, sequence: Any, state: Any = None, resets: Any = None) -> Any:
        """Scan the sequence (`apply`); override it to take other inputs.

        Args:
            sequence: A list or tuple of items.
            state: A state to start from instead of ``initial_state``.
            resets: One flag per item, True where the state starts over.

        Returns:
            ``(outputs, final_state)``.
        """
        return self.apply(sequence, state, resets)

    def apply(self, sequence: Any, state: Any = None, resets: Any = None) -> Any:
        """Scan ``step`` over ``sequence``, carrying the state from each step to the next.

        Args:
            sequence: A list or tuple of items.
            state: A state to start from instead of ``initial_state``.
            resets: One flag per item, True where the state starts over
                (several documents in one stream).

        Returns:
            ``(outputs, final_state)``; in dynamic mode an awaitable of it
                (``forward`` is then run on real values by plait's runtime).

        Raises:
            TypeError: ``sequence`` is not a list or tuple, ``resets`` holds
                anything but bools, ``step`` returned no pair, or a static scan
                defines ``should_stop``.
            ValueError: ``resets`` does not give one flag per item.
        """
        if not self.static:
            return self._apply_dynamic(sequence, state, resets)
        items = self._items(sequence)
        flags = _flags(resets, len(items), type(self).__name__)
        if type(self).should_stop is not Recurrence.should_stop:
            raise TypeError(
                f"{type(self).__name__} defines should_stop(), which needs real values: "
                "build it with static=False (a dynamic scan) to stop on what a step returned"
            )
        return self._scan_static(items, state, flags)

    def _scan_static(self, items: list[Any], state: Any, flags: list[bool]) -> Any:
        outputs: list[Any] = []
        if state is None:
            state = self.initial_state(_segment(items, flags, 0))
        for t, item in enumerate(items):
            if flags[t] and t > 0:
                state = self.initial_state(_segment(items, flags, t))
            output, state = _pair(self.step(item, state), type(self).__name__)
            outputs.append(output)
        return outputs, state

    async def _apply_dynamic(self, sequence: Any, state: Any, resets: Any) -> Any:
        if not current_interpreter().awaits_calls:  # called outside a run
            raise RuntimeError(
                f"{type(self).__name__}.apply() in dynamic mode runs inside plait's runtime: "
                "call the module (await module(sequence), module.run_sync(sequence))"
            )
        if self.training and any(p.requires_grad for p in self.parameters()):
            raise TracingError(
                f"{type(self).__name__} is a dynamic scan (static=False): backward() cannot "
                "reach the parameters of its steps; build it with static=True to train it"
            )
        items = self._items(sequence)
        flags = _flags(resets, len(items), type(self).__name__)
        outputs: list[Any] = []
        if state is None:
            state = await self._run_initial(_segment(items, flags, 0))
        for t, item in enumerate(items):
            if flags[t] and t > 0:
                state = await self._run_initial(_segment(items, flags, t))
            output, state = _pair(
                await self._step_call(item, state),
                type(self).__name__,
            )
            outputs.append(output)
            if self.should_stop(output, state):
                break
        return outputs, state

    async def _run_initial(self, items: list[Any]) -> Any:
        return await _InitialCall(self)(items)

    def _has_async_forward(self) -> bool:
        """A dynamic scan runs on real values, as an ``async def forward`` does."""
        return not self.static or super()._has_async_forward()

    def _items(self, sequence: Any) -> list[Any]:
        if isinstance(sequence, str | bytes) or not isinstance(sequence, Sequence):
            kind = type(sequence).__name__
            hint = (
                "; a traced output's length is not known while forward() is traced: "
                "use static=False to scan what an earlier call returned"
                if self.static and "Traced" in kind
                else ""
            )
            raise TypeError(
                f"{type(self).__name__}.apply() scans a list or tuple of items, got {kind}"
                f"{hint} (chunk a text first, e.g. plait.sequences.chunk_text(text, 2000))"
            )
        return list(sequence)

    def extra_repr(self) -> str:
        """What the module's repr shows inside its parentheses.

        Returns:
            The ``static`` setting.
        """
        return f"static={self.static}"


class _OwnedCall(Module):
    """A method of a `Recurrence` as a module of its own, so a dynamic scan can trace
    and run it (the owner is not registered: its parameters stay the owner's)."""

    owner: Recurrence

    def __init__(self, owner: Recurrence) -> None:
        super().__init__()
        object.__setattr__(self, "owner", owner)


class _StepCall(_OwnedCall):
    """``step``, one step at a time."""

    def forward(self, item: Any, state: Any) -> Any:
        return tuple(_pair(self.owner.step(item, state), type(self.owner).__name__))


class _InitialCall(_OwnedCall):
    """``initial_state``, at the start and at each reset."""

    def forward(self, items: list[Any]) -> Any:
        return self.owner.initial_state(items)


def _pair(result: Any, name: str) -> tuple[Any, Any]:
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"{name}.step() must return (output, new_state), got {result!r:.80}")
    return result[0], result[1]


def _flags(resets: Any, length: int, name: str) -> list[bool]:
    if resets is None:
        return [False] * length
    if isinstance(resets, str | bytes) or not isinstance(resets, Sequence):
        raise TypeError(f"{name}.apply(resets=...) takes one flag per item, a list of bools")
    flags = list(resets)
    if len(flags) != length:
        raise ValueError(
            f"{name}.apply() got {len(flags)} reset flag(s) for {length} item(s): give one "
            "flag per item (True where the state starts over)"
        )
    if not all(isinstance(flag, bool) for flag in flags):
        raise TypeError(f"{name}.apply(resets=...) flags must be True or False")
    return flags


def _segment(items: list[Any], flags: list[bool], start: int) -> list[Any]:
    """The items from ``start`` up to the next reset."""
    end = next((t for t in range(start + 1, len(items)) if flags[t]), len(items))
    return items[start:end]
