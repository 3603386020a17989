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
    """The wire protocol of ``config``'s endpoint, imported only now that an alias uses it.

    Args:
        config: The alias's configuration; its ``provider`` names the protocol.

    Returns:
        A provider that sends requests to the endpoint, one attempt per ``send``.

    Raises:
        KeyError: ``config.provider`` is not in `PROVIDERS` (an `EndpointConfig`
            refuses such a name when it is made).
    """
    module_name, _, class_name = PROVIDERS[config.provider].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    provider: Provider = cls(config)
    return provider


def make_batch_api(config: EndpointConfig) -> BatchAPI:
    """The batch API of ``config``'s endpoint, for runs at the batch price (``backend="batch"``).

    Args:
        config: The alias's configuration.

    Returns:
        The provider's batch API (submit, poll, read results, cancel).

    Raises:
        ConfigurationError: The provider sells no batches; the message names
            those that do.
    """
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
