"""What a call costs: one rule for the usage report, a `budget` and the benchmarks.

A provider sells the same tokens at several prices: the standard rate, the batch
APIs and OpenAI's flex tier at a discount (half, as of 2026), prompt-cache reads
at a tenth, cache writes at a premium (1.25x for Anthropic's 5-minute TTL, 2x for
its hour).  An alias configures its standard prices and, when its provider's
differ from these defaults, the factors (`plait.resources.config.EndpointConfig`);
every place that prices a call asks `Prices.cost`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plait.providers.base import Usage
    from plait.resources.config import EndpointConfig

__all__ = ["TIERS", "Prices"]

#: How a request was served: at the standard rate, on the flex tier, or in a batch.
TIERS = ("standard", "flex", "batch")


@dataclass(frozen=True, slots=True)
class Prices:
    """One alias's prices, in dollars per million tokens, and its discounts."""

    input: float | None = None
    output: float | None = None
    batch_factor: float = 0.5
    flex_factor: float = 0.5
    cache_read_factor: float = 0.1
    cache_write_factor: float = 1.25
    cache_write_1h_factor: float = 2.0

    @classmethod
    def of(cls, config: EndpointConfig) -> Prices:
        return cls(
            config.input_price_per_mtok,
            config.output_price_per_mtok,
            config.batch_price_factor,
            config.flex_price_factor,
            config.cache_read_price_factor,
            config.cache_write_price_factor,
            config.cache_write_1h_price_factor,
        )

    @property
    def known(self) -> bool:
        """Whether any price is configured (else a cost cannot be stated)."""
        return self.input is not None or self.output is not None

    def tier_factor(self, tier: str) -> float:
        if tier == "batch":
            return self.batch_factor
        if tier == "flex":
            return self.flex_factor
        if tier == "standard":
            return 1.0
        raise ValueError(f"unknown service tier {tier!r}; known: {', '.join(TIERS)}")

    def cost(self, usage: Usage, tier: str = "standard") -> float:
        """Dollars for ``usage`` served on ``tier``: prompt tokens read from or written to
        the prompt cache at their factors (they are part of ``prompt_tokens``), the rest
        of the prompt and the completion at the tier's price."""
        factor = self.tier_factor(tier)
        price_in, price_out = (self.input or 0.0) * factor, (self.output or 0.0) * factor
        read, written = usage.cache_read_tokens, usage.cache_write_tokens
        hour = min(usage.cache_write_1h_tokens, written)
        plain = max(0, usage.prompt_tokens - read - written)
        prompt = (
            plain
            + read * self.cache_read_factor
            + (written - hour) * self.cache_write_factor
            + hour * self.cache_write_1h_factor
        )
        return (prompt * price_in + usage.completion_tokens * price_out) / 1_000_000
