"""Reproducible sampling: a run seed, and a seed for every LLM call derived from it.

A sampled run (temperature > 0) is repeatable only if every call sends the
provider the same seed each time, and independent draws only if no two calls
share one.  JAX solves the same problem with counter-based keys: a seed and a
counter kept in the parameter state, folded together for each use.  plait does the
same at two levels:

* the **run seed**: ``seed=`` given to `bind`, `ExecutionSettings`, a call, or
  ``plait run --seed``; otherwise drawn from the pipeline's `Rng` (its seed and
  counter, the counter then advanced, so the next run draws fresh samples and a
  restored parameter state draws the same ones again); otherwise none;
* the **call seed**: a hash of the run seed, the call's module path, which input
  of the batch it serves, the call's place in that input's graph, the request
  itself and the sample number (`LLMInference(n=...)`).  It goes into the
  request's ``seed`` field before any handler sees the request, so cache,
  record/replay and checkpoint keys include it: n samples are n entries, and a
  resumed run asks for the same seeds it asked for before.

A run with no seed sends none (the provider samples as it likes), except that the
samples of an ``n > 1`` call always get distinct seeds (from run seed 0), so they
are distinct requests and distinct cache entries, never one answer n times.
Providers without a seed (Anthropic's Messages API) still key their cache entries
by it; their replies are not reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from plait._digest import digest
from plait.module import Module
from plait.parameter import Parameter

if TYPE_CHECKING:
    from plait.providers.base import LLMRequest

__all__ = [
    "SEED_LIMIT",
    "CallCounts",
    "Rng",
    "SeedError",
    "call_seed",
    "check_seed",
    "rng_parameter_names",
    "run_seed",
    "with_seed",
]

SEED_LIMIT = 2**31
"""Call seeds are below 2**31: every provider that takes one takes a 32-bit signed integer."""


class SeedError(ValueError):
    """A seed that is not a non-negative integer, or a pipeline with two `Rng`s."""


def check_seed(value: Any, where: str) -> int:
    """Check that ``value`` is a seed: a non-negative integer below 2**63.

    Args:
        value: The value to check.
        where: What the value was given as, for the message (``"seed"``).

    Returns:
        ``value``, unchanged.

    Raises:
        SeedError: When ``value`` is not a non-negative integer below 2**63.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise SeedError(
            f"{where} must be a non-negative integer (below 2**63), got {value!r}; e.g. seed=42"
        )
    return value


class Rng(Module):
    """A pipeline's stream of run seeds, kept as parameter state.

    Put one in a pipeline (``self.rng = plait.Rng(seed=7)``) and every run of it
    without an explicit ``seed=`` draws its run seed from ``(seed, counter)`` and
    advances the counter: two calls sample independently, and the parameter state
    taken before a run (``snapshot``, ``state_dict``, a trainer checkpoint) makes
    the same run again.  ``seed`` and ``counter`` are parameters with
    ``requires_grad=False``: optimizers leave them alone, ``split()`` puts them in
    the frozen half, ``lock()`` and checkpoints carry them like any other value.
    A run interrupted before it finishes gives its counter back, so running it
    again (resuming its checkpoint) draws the same seeds.

    Args:
        seed: The stream's seed.

    Raises:
        SeedError: When ``seed`` is not a non-negative integer.

    Examples:
        ```python
        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})


        class Brainstorm(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rng = plait.Rng(seed=7)
                self.idea = plait.LLMInference("fast", system_prompt="One idea.", temperature=1.0)

            def forward(self, topic: str) -> str:
                return self.idea(topic)


        pipeline = Brainstorm().bind(resources=resources)
        state = pipeline.state_dict()
        first = pipeline.run_sync("roofs")  # its run seed comes from (7, 0)
        print(pipeline.rng.counter.value)  # 1: the next run samples afresh
        pipeline.load_state_dict(state)  # back to counter 0: the same run again
        print(pipeline.run_sync("roofs") == first)
        ```
    """

    seed: Parameter
    counter: Parameter

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = Parameter(check_seed(seed, "Rng(seed=...)"), requires_grad=False)
        self.counter = Parameter(0, requires_grad=False)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Not callable: a run draws its seed from the `Rng` it finds in the pipeline.

        Args:
            *args: Ignored.
            **kwargs: Ignored.

        Returns:
            Never returns.

        Raises:
            TypeError: Always.
        """
        raise TypeError(
            "an Rng is not called: keep it as an attribute of the pipeline "
            "(self.rng = plait.Rng(seed=7)) and each run draws its seed from it"
        )

    def reseed(self, seed: int | None = None, counter: int | None = None) -> None:
        """Set the seed and/or the counter.

        Args:
            seed: The new seed; None keeps it.
            counter: The new counter; None keeps it.

        Raises:
            SeedError: When neither is given, or a value is not a non-negative integer.
        """
        if seed is None and counter is None:
            raise SeedError("Rng.reseed() needs seed=..., counter=... or both")
        if seed is not None:
            self.seed.value = check_seed(seed, "Rng.reseed(seed=...)")
        if counter is not None:
            self.counter.value = check_seed(counter, "Rng.reseed(counter=...)")

    def draw(self) -> tuple[int, Callable[[], None]]:
        """Draw the next run seed, advancing the counter.

        Returns:
            The run seed, and a function that gives it back (for a run that did not
            finish: the counter returns unless another draw came after).

        Raises:
            SeedError: When the seed or counter parameter holds something other than
                a non-negative integer (a loaded state, say).
        """
        seed = check_seed(self.seed.value, f"{self.qualified_path or 'Rng'}.seed")
        counter = check_seed(self.counter.value, f"{self.qualified_path or 'Rng'}.counter")
        self.counter.value = counter + 1

        def give_back() -> None:
            if self.counter.value == counter + 1:
                self.counter.value = counter

        return fold(seed, counter), give_back

    def extra_repr(self) -> str:
        """The seed and counter, as the module's ``repr`` shows them.

        Returns:
            Text such as ``"seed=7, counter=0"``.
        """
        return f"seed={self.seed.value!r}, counter={self.counter.value!r}"


def rng_parameter_names(module: Module) -> set[str]:
    """The ``state_dict()`` names of the parameters of ``module``'s `Rng`s.

    They are state that runs advance, which training must neither count as an
    update nor roll back.

    Args:
        module: The pipeline.

    Returns:
        The dotted names.
    """
    owned = {id(p) for part in module.modules() if isinstance(part, Rng) for p in part.parameters()}
    return {name for name, param in module.named_parameters() if id(param) in owned}


def fold(*parts: Any) -> int:
    """Fold ``parts`` into one seed below `SEED_LIMIT` (JAX's ``fold_in``, by hashing).

    Args:
        *parts: Anything with a stable digest (numbers, text, lists).

    Returns:
        The seed: the same parts always give the same one.
    """
    return int(digest(list(parts), fallback=repr, size=8), 16) % SEED_LIMIT


def _nothing() -> None:
    return None


def run_seed(module: Module, explicit: Any) -> tuple[int | None, Callable[[], None]]:
    """The seed of one run of ``module``: the explicit one, else one its `Rng` draws.

    Args:
        module: The pipeline about to run.
        explicit: The ``seed=`` the run was given, or None.

    Returns:
        The run seed (``explicit`` when given, else one drawn from the pipeline's
        `Rng`, else None) and a function that gives a drawn seed back.

    Raises:
        SeedError: When ``explicit`` is not a seed, or the pipeline holds more than
            one `Rng`.
    """
    if explicit is not None:
        return check_seed(explicit, "seed"), _nothing
    found = [part for part in module.modules() if isinstance(part, Rng)]
    if not found:
        return None, _nothing
    if len(found) > 1:
        paths = ", ".join(repr(part.qualified_path or "(root)") for part in found)
        raise SeedError(
            f"{type(module).__name__} holds {len(found)} Rng modules ({paths}); a run draws "
            "its seed from one: keep a single Rng (share the same object where several "
            "modules need it)"
        )
    return found[0].draw()


def call_seed(
    run: int | None,
    path: str,
    index: int | None,
    node: str | None,
    request_digest: str,
    counter: int,
    sample: int = 0,
) -> int:
    """The seed of one LLM call, derived from the run seed and where the call is made.

    Args:
        run: The run seed; None counts as 0 (used only for the samples of an
            ``n > 1`` call).
        path: The call's module path.
        index: Which input of the batch the call serves.
        node: The call's node in that input's graph.
        request_digest: The request's fingerprint before any seed.
        counter: Tells apart the identical requests one call site makes for one
            input (an ``async def forward`` calling a module twice on the same
            prompt, a functional call in a loop): it counts per request, never per
            site, so calls interleaved by timing keep their seeds.
        sample: Which sample of an ``n > 1`` call.

    Returns:
        A seed below `SEED_LIMIT`.
    """
    return fold(
        run or 0,
        path,
        -1 if index is None else index,
        node or "",
        request_digest,
        counter,
        sample,
    )


def with_seed(request: LLMRequest, seed: int) -> LLMRequest:
    """A copy of ``request`` that sends ``seed`` (the original may serve other samples).

    Args:
        request: The request.
        seed: The seed to send.

    Returns:
        The copy, with ``seed`` among its provider fields.
    """
    return replace(request, extra={**request.extra, "seed": seed})


class CallCounts:
    """How many calls each (call site, request) has made so far.

    This is the ``counter`` of `call_seed`, keyed by the request too, so
    interleaving never shifts a count.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[Hashable, int] = {}

    def next(self, site: Hashable) -> int:
        """Count one more call of ``site``.

        Args:
            site: The (call site, request) key.

        Returns:
            The number of calls ``site`` made before this one (0 for its first).
        """
        count = self._counts.get(site, 0)
        self._counts[site] = count + 1
        return count
