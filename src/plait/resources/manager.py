"""`ResourceManager`: resolves aliases to endpoints whose limits the whole process shares.

Limits belong to the remote endpoint, not to a run or an input: two batches, or
two pipelines, that drive the same endpoint share one limiter, so
``max_concurrent=4`` means four requests in flight from this process.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plait.providers.base import Provider
from plait.resources.config import ConfigurationError, EndpointConfig, ResourceConfig
from plait.resources.limits import PriorityLimiter

__all__ = ["Endpoint", "ResourceManager"]

_registry_lock = threading.Lock()
_limiters: dict[tuple[str, str, str], PriorityLimiter] = {}


def shared_limiter(config: EndpointConfig) -> PriorityLimiter:
    """The process-wide limiter of ``config``'s endpoint, following its latest limit."""
    key = config.endpoint_key()
    with _registry_lock:
        limiter = _limiters.get(key)
        if limiter is None:
            limiter = _limiters[key] = PriorityLimiter(config.max_concurrent)
    if limiter.limit != config.max_concurrent:
        limiter.set_limit(config.max_concurrent)
    return limiter


@dataclass(slots=True)
class Endpoint:
    alias: str
    config: EndpointConfig
    limiter: PriorityLimiter
    provider: Provider


class ResourceManager:
    """Turns a `ResourceConfig` into live endpoints (provider + shared limiter) by alias."""

    def __init__(self, config: ResourceConfig | Mapping[str, Any] | None = None) -> None:
        if config is None:
            config = ResourceConfig({})
        elif not isinstance(config, ResourceConfig):
            config = ResourceConfig(config)
        self.config = config
        self._endpoints: dict[str, Endpoint] = {}

    @classmethod
    def coerce(cls, resources: Any) -> ResourceManager:
        if isinstance(resources, ResourceManager):
            return resources
        if resources is None or isinstance(resources, Mapping):
            return cls(resources)
        raise ConfigurationError(
            f"resources must be a ResourceConfig, a ResourceManager or a mapping of aliases, "
            f"got {type(resources).__name__}"
        )

    def endpoint(self, alias: str) -> Endpoint:
        found = self._endpoints.get(alias)
        if found is not None:
            return found
        config = self.config[alias]
        endpoint = Endpoint(alias, config, shared_limiter(config), _make_provider(config))
        self._endpoints[alias] = endpoint
        return endpoint

    def check_aliases(self, aliases: set[str]) -> None:
        """Fail before any work starts if the pipeline names an alias nobody configured."""
        missing = sorted(a for a in aliases if a not in self.config)
        if missing:
            known = ", ".join(sorted(self.config)) or "none"
            raise ConfigurationError(
                f"the pipeline uses alias(es) {', '.join(map(repr, missing))} but the resources "
                f"configure only: {known}. Add them to the ResourceConfig passed to bind(), "
                "run() or ExecutionSettings"
            )


def _make_provider(config: EndpointConfig) -> Provider:
    if config.provider == "openai":
        from plait.providers.openai import OpenAIProvider

        return OpenAIProvider(config)
    raise ConfigurationError(f"no provider named {config.provider!r}")
