"""Where a batch runs: a backend behind one small interface, chosen by name.

`run_sync`, ``await module(batch)``, ``plait run`` and the `Trainer` hand a batch to
a backend and get one result per input back, in order, each a raw output or an
ERROR `Value` (never a missing row).  Two are registered today: ``"local"`` (this
process's event loop, `plait.execution.runtime`) and ``"ray"`` (`plait.ray.backend`,
Ray workers sharing the cluster's limits).  The composition root (``plait/__init__``)
registers them by a loader, so a backend and its dependencies load on first use and
this layer never imports the ones above it.

A new backend implements `Backend.run_batch` and is registered with
`register_backend`; the run options it receives are the resolved ones (`plait.options`).
Two capabilities beyond that, each a protocol a backend may also implement:
`RowBackend` hands each row over as it arrives (both backends do: ``plait run`` picks
one by name, ``"local"`` or ``"ray"`` for ``--workers``, and writes each row at once),
and `TrainingBackend` runs a `Trainer`'s passes (``run_steps``, within a ``session``;
both do: ``"local"`` is registered by the composition root as
`plait.learning.passes.LocalTrainingBackend`, the runtime's `LocalBackend` with the
passes, which live in the learning layer above it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Backend",
    "BackendError",
    "PassLog",
    "RowBackend",
    "TrainingBackend",
    "backend",
    "backend_names",
    "register_backend",
]


class BackendError(LookupError):
    """No backend is registered under the name a run asked for."""


class Backend(Protocol):
    """Runs a batch of inputs of a module somewhere, with the run's options."""

    async def run_batch(
        self,
        module: Any,
        items: Iterable[Any],
        extra: tuple[Any, ...],
        kwargs: dict[str, Any],
        opts: dict[str, Any],
    ) -> list[Any]:
        """Each input's result, in input order: the output, or its ERROR `Value`."""
        ...


@runtime_checkable
class RowBackend(Protocol):
    """A backend that hands each row over as it arrives, not a list at the end."""

    def deliver_rows(
        self,
        module: Any,
        resources: Any,
        items: Iterable[Any],
        prepare: Callable[[Any], Any],
        deliver: Callable[[int, Any, Any], None],
        opts: dict[str, Any],
        checkpoint: Any = None,
    ) -> None:
        """Run each item, calling ``deliver(index, item, value)`` as its row arrives.
        Blocks the calling thread until every row is delivered.

        ``prepare(item)`` is called once per item, as the backend admits it: it gives
        the item's ``(args, kwargs)``, or an ERROR `Value` that is delivered as it is
        (the caller can count what is in flight between the two calls).  ``checkpoint``
        is one the caller opened and closes; finished inputs are answered from it (their
        value's ``meta["checkpoint"]`` is ``"hit"``).  A ``deliver`` that raises (the
        row cannot be written) stops the run at once and its exception is raised here;
        so is a `CheckpointError`, and a `TracingError` of the first input.  Rows come
        in completion order; with ``opts["preserve_order"]`` in input order (the local
        backend keeps a waiting row's slot of the window, so what waits stays bounded;
        Ray holds a row that finished early until the earlier ones have come)."""
        ...

    def session(self) -> AbstractContextManager[None]:
        """Keep what the backend starts alive for the run; stop what it started."""
        ...


class PassLog(Protocol):
    """A `Trainer`'s call log at its current position, as a backend that runs a pass in
    other processes needs it: the checkpoint the pass's calls go to, and where in it."""

    checkpoint: Any

    def pass_offset(self, work: Any, values: dict[str, Any], seed: int | None) -> int:
        """The first input index of the calls of a pass running ``work`` (its method and
        examples) with these parameter ``values`` and ``seed``."""
        ...


@runtime_checkable
class TrainingBackend(Protocol):
    """A backend the `Trainer` runs its minibatch and validation passes on."""

    async def run_steps(
        self,
        step: Any,
        examples: list[tuple[Any, Any]],
        opts: dict[str, Any],
        *,
        train: bool,
        call_log: PassLog | None = None,
        feedback: bool = True,
    ) -> list[Any]:
        """Each ``(input, target)`` example through the training step ``step`` as it is
        now (its parameter values, its mode), one `Value` per example in order.  With
        ``train`` each row's payload holds the loss's ``output``, the ``feedback`` its
        backward pass gave each parameter (none when ``feedback`` is false; a backend
        may compute it anyway) and the run's ``trace`` (`plait.learning.passes`).

        A backend that runs the calls in this process leaves seeds and logging to the
        caller's run (each call draws its seed; the call log is on the handler stack).
        One that sends the pass elsewhere draws the pass's seed from the step, as a
        batch run does, and has its calls logged to ``call_log.checkpoint`` under
        indexes from ``call_log.pass_offset(...)``, so a resumed pass finds them again.
        """
        ...

    def session(self) -> AbstractContextManager[None]:
        """Keep what the backend starts alive across a training run's passes; what it
        started for the run is stopped at the end, what was running already is left."""
        ...


_loaders: dict[str, Callable[[], Backend]] = {}
_loaded: dict[str, Backend] = {}


def register_backend(name: str, loader: Callable[[], Backend]) -> Callable[[], Backend] | None:
    """Make ``loader()`` (called once, on first use) the backend named ``name``; returns
    the loader it replaces (None for a new name), so it can be put back."""
    previous = _loaders.get(name)
    _loaders[name] = loader
    _loaded.pop(name, None)
    return previous


def backend(name: str) -> Backend:
    """The backend registered as ``name``."""
    found = _loaded.get(name)
    if found is None:
        loader = _loaders.get(name)
        if loader is None:
            known = ", ".join(sorted(_loaders)) or "none"
            raise BackendError(f"no backend named {name!r} is registered (known: {known})")
        found = _loaded[name] = loader()
    return found


def backend_names() -> list[str]:
    return sorted(_loaders)
