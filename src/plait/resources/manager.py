"""`ResourceManager`: resolves aliases to endpoints whose limits the whole process shares.

Limits belong to the remote endpoint, not to a run or an input: two batches, or
two pipelines, that drive the same endpoint share one limiter, so
``max_concurrent=4`` means four requests in flight from this process.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from plait.providers import make_provider
from plait.providers.base import LLMRequest
from plait.resources.config import (
    ConfigurationError,
    EndpointConfig,
    ResourceConfig,
    fallback_chain,
)
from plait.resources.endpoint import Endpoint
from plait.resources.hedging import Hedging
from plait.resources.limits import PriorityLimiter
from plait.resources.pricing import Prices
from plait.resources.rate import RateGovernor
from plait.resources.routing import breaker_for
from plait.resources.usage import AliasUsage, record_for

__all__ = ["LOCAL_DEFAULT", "Endpoint", "ResourceManager"]

#: What every alias means when no resources are configured: the embedded model.
LOCAL_DEFAULT = EndpointConfig(provider="local", max_concurrent=4)

_log = logging.getLogger("plait")
_embedded_said = [False]  # set once, under _registry_lock


def embedded_said() -> bool:
    """Mark the embedded model as announced (the CLI says it its own way); whether it
    already was.  Under the lock, so concurrent first calls say it once."""
    with _registry_lock:
        said = _embedded_said[0]
        _embedded_said[0] = True
    return said


def say_embedded(alias: str) -> None:
    """Once per process: an alias that silently ran on a 135M-parameter model would
    look like a bad pipeline, not a missing configuration.  A logging warning, so an
    application can silence it; Ray workers leave it to their driver, which says it
    before dispatching (`plait.execution.runtime`)."""
    if leasing() or embedded_said():
        return
    _log.warning(
        "plait: alias %r (and any other alias) runs on the embedded local model "
        "(SmolLM2-135M-Instruct, in-process) because no resources were given; pass "
        "resources=plait.ResourceConfig.load('resources.toml') to bind(), run_sync() or "
        "ExecutionSettings to use your endpoints",
        alias,
    )


_registry_lock = threading.Lock()
_governors: dict[tuple[str, str, str], RateGovernor] = {}
_factory: Callable[[EndpointConfig], RateGovernor] | None = None


def use_governors(factory: Callable[[EndpointConfig], RateGovernor] | None) -> None:
    """Make this process's endpoints take their limits from ``factory`` (None: local).

    A Ray worker (`plait.ray`) installs governors that lease capacity from the
    cluster's broker, so the same limits hold across every process of a run.
    """
    global _factory
    with _registry_lock:
        _factory = factory
        _governors.clear()


class GovernorScope:
    """Governors from ``factory`` for the calls made inside `active` only.

    A `plait.ray.Pipeline` called in a driver (to try a map function locally) leases
    its limits from the cluster's broker for its own batches; had it switched the
    whole process (`use_governors`), the driver's later plain runs would lease too,
    and fail with the broker once its Ray was shut down.  The scope follows the
    context, which a run's event loop tasks copy.
    """

    def __init__(self, factory: Callable[[EndpointConfig], RateGovernor]) -> None:
        self.factory = factory
        self.governors: dict[tuple[str, str, str], RateGovernor] = {}

    @contextmanager
    def active(self) -> Iterator[None]:
        token = _scope.set(self)
        try:
            yield
        finally:
            _scope.reset(token)


_scope: contextvars.ContextVar[GovernorScope | None] = contextvars.ContextVar(
    "plait_governor_scope", default=None
)


def leasing() -> bool:
    """Whether endpoints made here take their limits from a factory (a Ray worker's
    leases, process-wide or in this context) rather than holding them locally."""
    return _factory is not None or _scope.get() is not None


def _local_governor(config: EndpointConfig) -> RateGovernor:
    return RateGovernor(
        PriorityLimiter(config.max_concurrent),
        config.max_concurrent,
        config.requests_per_minute,
        config.tokens_per_minute,
    )


def shared_governor(config: EndpointConfig) -> RateGovernor:
    """The process-wide limiter and pacing of ``config``'s endpoint, following its config."""
    key = config.endpoint_key()
    scope = _scope.get()
    with _registry_lock:
        registry = _governors if scope is None else scope.governors
        governor = registry.get(key)
        if governor is None:
            factory = _factory or _local_governor if scope is None else scope.factory
            governor = registry[key] = factory(config)
            return governor
    governor.configure(config.max_concurrent, config.requests_per_minute, config.tokens_per_minute)
    return governor


class ResourceManager:
    """Turns a `ResourceConfig` into live endpoints (a provider under shared limits) by alias.

    Runs create one from the resources they are given; create one yourself to
    share its endpoints between runs, or to send requests without a pipeline.
    Limits belong to the remote endpoint: every manager of the process that
    names the same endpoint shares one limiter.  With no configuration at all,
    every alias resolves to the embedded local model, so a new user's pipeline
    runs with no key and no server.

    Args:
        config: A `ResourceConfig`, a mapping it accepts, or None (the embedded model).

    Raises:
        ConfigurationError: ``config`` is not a valid configuration.

    Examples:
        ```python
        import asyncio

        import plait
        from plait.providers import LLMRequest


        async def main() -> None:
            manager = plait.ResourceManager(
                {"fast": {"model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}}
            )
            request = LLMRequest("fast", [{"role": "user", "content": "Hello"}])
            response = await manager.endpoint_for(request).complete(request)
            print(response.text, response.usage.total_tokens)


        asyncio.run(main())
        ```
    """

    def __init__(self, config: ResourceConfig | Mapping[str, Any] | None = None) -> None:
        if config is None:
            config = ResourceConfig({})
        elif not isinstance(config, ResourceConfig):
            config = ResourceConfig(config)
        self.config = config
        self._endpoints: dict[str, Endpoint] = {}

    @classmethod
    def coerce(cls, resources: Any) -> ResourceManager:
        """A manager for what a ``resources=`` argument may be, so every entry point takes the same.

        Args:
            resources: A `ResourceManager` (returned as it is), a `ResourceConfig`
                or a mapping of aliases, or None (the embedded model).

        Returns:
            The manager.

        Raises:
            ConfigurationError: ``resources`` is none of these.
        """
        if isinstance(resources, ResourceManager):
            return resources
        if resources is None or isinstance(resources, Mapping):
            return cls(resources)
        raise ConfigurationError(
            f"resources must be a ResourceConfig, a ResourceManager or a mapping of aliases, "
            f"got {type(resources).__name__}"
        )

    def config_for(self, alias: str) -> EndpointConfig:
        """The configuration ``alias`` means here.

        Args:
            alias: An alias a pipeline names.

        Returns:
            Its `EndpointConfig` (the embedded model's when nothing is configured).

        Raises:
            KeyError: The configuration has no such alias; the message lists those it has.
        """
        if not self.config:
            return LOCAL_DEFAULT
        return self.config[alias]

    def endpoint(self, alias: str) -> Endpoint:
        """The live endpoint of ``alias``, made at the first request for it.

        Args:
            alias: An alias a pipeline names.

        Returns:
            The endpoint, under the process-wide limits of its remote endpoint.

        Raises:
            KeyError: The configuration has no such alias.
        """
        found = self._endpoints.get(alias)
        if found is not None:
            return found
        endpoint = self._endpoints[alias] = self._make_endpoint(alias, *self._settings(alias))
        if self.config and endpoint.config.fallbacks:
            # Its chain, each endpoint the one its alias has here (with its own limits).
            chain = fallback_chain(self.config.fallbacks(), alias)
            endpoint.fallbacks = tuple([self.endpoint(other) for other in chain[1:]])
            for member in (endpoint, *endpoint.fallbacks):
                # An alias with deployments sends nothing itself: each deployment has
                # its breaker already, and the alias's own settings name no endpoint.
                if member.breaker is None and not member.deployments:
                    member.breaker = breaker_for(member.config)
        return endpoint

    def _settings(self, alias: str) -> tuple[EndpointConfig, AliasUsage]:
        """The configuration of ``alias`` and the usage record its endpoints count in."""
        config = self.config_for(alias)
        usage = record_for(alias)
        usage.provider, usage.model = config.provider, config.model or "default"
        usage.prices = Prices.of(config)
        return config, usage

    def endpoint_for(self, request: LLMRequest) -> Endpoint:
        """The endpoint that serves ``request``: its alias's.

        Args:
            request: The request.

        Returns:
            The endpoint of ``request.alias``.

        Raises:
            KeyError: The configuration has no such alias.
        """
        # Asked on every call: a built endpoint is found without `endpoint`'s frame.
        found = self._endpoints.get(request.alias)
        return found if found is not None else self.endpoint(request.alias)

    def _make_endpoint(self, alias: str, config: EndpointConfig, usage: AliasUsage) -> Endpoint:
        """The live endpoint of ``alias``: its provider under the process-wide limits of
        its remote endpoint (`plait.resources.batching.BatchResources` makes another)."""
        if not self.config:
            say_embedded(alias)
        if config.deployments:
            members = tuple([self._live(alias, own, usage) for own in config.deployment_configs()])
            for member in members:
                member.breaker = breaker_for(member.config)
                member.label = _label(member.config)
                member.siblings = tuple([other for other in members if other is not member])
            chooser = members[0]
            return Endpoint(
                alias,
                config,
                chooser.limiter,
                chooser.governor,
                chooser.provider,
                usage,
                deployments=members,
            )
        return self._live(alias, config, usage)

    @staticmethod
    def _live(alias: str, config: EndpointConfig, usage: AliasUsage) -> Endpoint:
        """An endpoint that sends: ``config``'s provider under the process-wide limits
        of its remote endpoint, hedging if the configuration says so."""
        governor = shared_governor(config)
        endpoint = Endpoint(alias, config, governor.limiter, governor, make_provider(config), usage)
        if config.hedge_after is not None:
            endpoint.hedging = Hedging(config.hedge_after, config.max_hedge_fraction)
        return endpoint

    def check_aliases(self, aliases: set[str]) -> None:
        """Fail before any work starts if the pipeline names an alias nobody configured.

        Args:
            aliases: The aliases a pipeline calls.

        Raises:
            ConfigurationError: Some are not configured; the message names them
                and those that are.
        """
        if not self.config:
            return
        missing = sorted(a for a in aliases if a not in self.config)
        if missing:
            known = ", ".join(sorted(self.config)) or "none"
            raise ConfigurationError(
                f"the pipeline uses alias(es) {', '.join(map(repr, missing))} but the resources "
                f"configure only: {known}. Add them to the ResourceConfig passed to bind(), "
                "run() or ExecutionSettings"
            )


def _label(config: EndpointConfig) -> str:
    """A deployment's name in reports: ``provider/model @ host`` (no credentials)."""
    from urllib.parse import urlsplit

    try:
        host = urlsplit(config.base_url or "").hostname or "default"
        port = urlsplit(config.base_url or "").port
    except ValueError:
        host, port = "default", None
    where = f"{host}:{port}" if port else host
    return f"{config.provider}/{config.model or 'default'} @ {where}"
