"""ResourceConfig: validation with clear errors; secrets never shown."""

from __future__ import annotations

import pytest

import plait


def test_unknown_setting_names_the_alias_and_the_known_settings() -> None:
    with pytest.raises(plait.ConfigurationError, match=r"alias 'fast'.*max_concurency"):
        plait.ResourceConfig({"fast": {"model": "m", "max_concurency": 3}})


def test_missing_model_and_bad_limit() -> None:
    with pytest.raises(plait.ConfigurationError, match="model"):
        plait.ResourceConfig({"fast": {"provider": "openai"}})
    with pytest.raises(plait.ConfigurationError, match="max_concurrent"):
        plait.ResourceConfig({"fast": {"model": "m", "max_concurrent": 0}})


def test_missing_api_key_variable_is_reported_at_load_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PLAIT_TEST_KEY", raising=False)
    with pytest.raises(plait.ConfigurationError, match=r"'fast'.*PLAIT_TEST_KEY"):
        plait.ResourceConfig({"fast": {"model": "m", "api_key_env": "PLAIT_TEST_KEY"}})
    monkeypatch.setenv("PLAIT_TEST_KEY", "sk-from-env")
    config = plait.ResourceConfig({"fast": {"model": "m", "api_key_env": "PLAIT_TEST_KEY"}})
    assert config["fast"].resolved_api_key() == "sk-from-env"


def test_a_literal_key_never_shows_in_reprs_or_errors() -> None:
    config = plait.ResourceConfig({"fast": {"model": "m", "api_key": "sk-very-secret"}})
    assert "sk-very-secret" not in repr(config)
    assert "sk-very-secret" not in repr(config["fast"])
    assert "sk-very-secret" not in str(config["fast"].model_dump())
    with pytest.raises(KeyError, match="fast") as info:
        config["slow"]
    assert "sk-very-secret" not in str(info.value)
