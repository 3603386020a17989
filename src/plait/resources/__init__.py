"""Endpoints by alias: configuration, shared limits and per-endpoint accounting."""

from plait.resources.config import EndpointConfig, ResourceConfig
from plait.resources.limits import PriorityLimiter
from plait.resources.manager import Endpoint, ResourceManager

__all__ = ["Endpoint", "EndpointConfig", "PriorityLimiter", "ResourceConfig", "ResourceManager"]
