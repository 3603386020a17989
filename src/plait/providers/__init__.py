"""Wire protocols: one class per kind of endpoint. Request in, `LLMResponse` out.

A provider makes exactly one attempt per `send`; retries, rate limits, usage
accounting and structured-output validation live in `plait.resources.endpoint`
and are the same for every provider.  Providers are imported only when an alias
uses them, so `import plait` never pays for an SDK it does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from plait.providers.base import (
    BATCH_APIS,
    PROVIDERS,
    BatchAPI,
    LLMRequest,
    LLMResponse,
    Provider,
    ProviderError,
    Usage,
)

if TYPE_CHECKING:
    from plait.resources.config import EndpointConfig

__all__ = [
    "PROVIDERS",
    "LLMRequest",
    "LLMResponse",
    "Provider",
    "ProviderError",
    "Usage",
    "make_batch_api",
    "make_provider",
]


def make_provider(config: EndpointConfig) -> Provider:
    module_name, _, class_name = PROVIDERS[config.provider].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    provider: Provider = cls(config)
    return provider


def make_batch_api(config: EndpointConfig) -> BatchAPI:
    """The batch API of ``config``'s endpoint; a clear error for a provider without one."""
    target = BATCH_APIS.get(config.provider)
    if target is None:
        from plait.resources.config import ConfigurationError

        known = ", ".join(repr(p) for p in BATCH_APIS)
        raise ConfigurationError(
            f"provider {config.provider!r} has no batch API plait can use (those with one: "
            f"{known}); run this alias without backend='batch' (--batch-api), or point it "
            "at a provider that sells batches"
        )
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    api: BatchAPI = cls(config)
    return api
