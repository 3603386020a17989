"""Endpoints by alias: configuration, shared limits and per-endpoint accounting.

A pipeline names aliases; a `ResourceConfig` (usually read from a
``resources.toml``) says which endpoint each means, as an `EndpointConfig`:
provider, model, key, and how hard it may be driven.  A `ResourceManager` turns
the configuration into live `Endpoint`s whose limits the whole process shares.
Without any configuration, every alias runs on the embedded local model.
"""

from plait.resources.config import ConfigurationError, EndpointConfig, ResourceConfig
from plait.resources.limits import PriorityLimiter
from plait.resources.manager import Endpoint, ResourceManager

__all__ = [
    "ConfigurationError",
    "Endpoint",
    "EndpointConfig",
    "PriorityLimiter",
    "ResourceConfig",
    "ResourceManager",
]
