"""What a call costs: one rule (`plait.resources.pricing.Prices`) for every tier."""

from __future__ import annotations

import pytest

from plait.providers.base import Usage
from plait.resources.config import EndpointConfig
from plait.resources.pricing import Prices


def test_each_tier_is_priced_at_its_factor_of_the_standard_price() -> None:
    prices = Prices(input=2.0, output=8.0)
    used = Usage(1_000_000, 500_000)
    assert prices.cost(used) == pytest.approx(2.0 + 4.0)
    assert prices.cost(used, "batch") == pytest.approx(3.0)
    assert prices.cost(used, "flex") == pytest.approx(3.0)


def test_prompt_cache_reads_and_writes_are_priced_as_parts_of_the_prompt() -> None:
    prices = Prices(input=10.0, output=0.0)
    # 1M prompt tokens: 600k read from the cache, 300k written (100k of them for an
    # hour), 100k plain.
    used = Usage(1_000_000, 0, cache_read_tokens=600_000, cache_write_tokens=300_000)
    used.cache_write_1h_tokens = 100_000
    expected = (100_000 + 600_000 * 0.1 + 200_000 * 1.25 + 100_000 * 2.0) * 10.0 / 1e6
    assert prices.cost(used) == pytest.approx(expected)
    # In a batch every part is at the batch price as well.
    assert prices.cost(used, "batch") == pytest.approx(expected / 2)


def test_an_alias_sets_its_own_factors_and_an_unknown_tier_is_refused() -> None:
    config = EndpointConfig(
        model="m", input_price_per_mtok=1.0, output_price_per_mtok=1.0, batch_price_factor=0.4
    )
    prices = Prices.of(config)
    assert prices.cost(Usage(1_000_000, 0), "batch") == pytest.approx(0.4)
    with pytest.raises(ValueError, match="unknown service tier 'cheap'"):
        prices.cost(Usage(1, 1), "cheap")
    assert not Prices().known and prices.known
