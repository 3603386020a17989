"""Wire protocols: one class per kind of endpoint. Request in, `LLMResponse` out."""

from plait.providers.base import LLMRequest, LLMResponse, Provider, ProviderError, Usage

__all__ = ["LLMRequest", "LLMResponse", "Provider", "ProviderError", "Usage"]
