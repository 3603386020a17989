"""``plait check``: will each alias work?  Config, key, endpoint and model, in that order.

A run finds a bad key or a wrong port at its first request, possibly hours into
a batch; this finds it in a second.  Each alias is checked on its own, so one
broken alias does not hide the state of the others, and a check stops at the
first step that fails, since the later ones could only fail for the same reason.
The API key is never printed: only where it comes from.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from plait._secrets import looks_like_variable_name, redact_url, register, scrub, unset_variable
from plait.execution.loop import run_blocking
from plait.providers import make_provider
from plait.providers.base import LLMRequest, ProviderError
from plait.resources.config import (
    ConfigurationError,
    EndpointConfig,
    ResourceConfig,
    check_fallbacks,
    fallback_chain,
    read_resource_file,
)
from plait.resources.manager import LOCAL_DEFAULT, ResourceManager
from plait.resources.routing import breaker_for

__all__ = ["AliasCheck", "build_parser", "check_alias", "main"]

DEFAULT_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}
PROMPT = "Reply with the single word OK."

DESCRIPTION = """\
Check every alias of a resource file (or the embedded local model, without
--resources), one row each:
  config       the alias's settings are valid
  fallbacks    (an alias with fallbacks) the chain a failed call follows, the
               failures that move it on, and the endpoint's circuit breaker
  deployments  (an alias with deployments) each one, its limits and circuit breaker
  key          the API key is there (api_key, or the variable api_key_env names)
  endpoint     base_url accepts a connection (local: the model file and llama.cpp)
  model        one tiny request (a few tokens) gets an answer; skipped with --no-call
  limits       the rate limits that answer stated (requests and tokens per minute:
               in force, reported, configured; what is left and when it resets)
Exit status: 0 every alias ok, 1 any failed, 2 the file cannot be read.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="plait check",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--resources", metavar="FILE", help="resource file (TOML or YAML)")
    parser.add_argument(
        "--alias", action="append", default=[], metavar="NAME", help="check only this alias"
    )
    parser.add_argument("--no-call", action="store_true", help="do not send the test request")
    parser.add_argument(
        "--timeout", type=float, default=20.0, metavar="S", help="per connection and request (20)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the rows as JSON (each alias's steps, and the limits its reply stated)",
    )
    return parser


@dataclass
class AliasCheck:
    """One alias's row: each step's outcome, in order, until one fails."""

    alias: str
    endpoint: str = ""
    steps: list[tuple[str, bool, str]] = field(default_factory=list)
    #: The limits per minute configured, stated by the test request's reply and in force
    #: (`plait.resources.usage.AliasUsage.limits`), once the model step has run.
    limits: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return all(passed for _, passed, _ in self.steps)

    def passed(self, step: str, detail: str) -> None:
        self.steps.append((step, True, scrub(detail)))

    def failed(self, step: str, detail: str) -> None:
        self.steps.append((step, False, scrub(detail)))

    def problem(self) -> str:
        for step, passed, detail in self.steps:
            if not passed:
                return f"{step}: {detail}"
        return ""


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    if ns.timeout <= 0:
        print("plait check: error: --timeout must be positive", file=sys.stderr)
        return 2
    try:
        specs = _specs(ns.resources, ns.alias)
    except ConfigurationError as exc:
        print(f"plait check: error: {exc}", file=sys.stderr)
        return 2

    graph = _fallbacks(Path(ns.resources)) if ns.resources else {}

    async def everything() -> list[AliasCheck]:
        checks = [
            check_alias(alias, spec, ns.timeout, not ns.no_call, graph) for alias, spec in specs
        ]
        return list(await asyncio.gather(*checks))

    results = run_blocking(everything())
    if ns.json:
        _report_json(results)
    else:
        _report(results, ns.resources)
    return 0 if all(r.ok for r in results) else 1


def _specs(path: str | None, only: list[str]) -> list[tuple[str, Any]]:
    """The aliases to check, as raw settings (validated per alias, not all at once)."""
    if path is None:
        return [("(every alias)", LOCAL_DEFAULT)]
    aliases = _read(Path(path))
    for name in only:
        if name not in aliases:
            known = ", ".join(aliases) or "none"
            raise ConfigurationError(f"{path} has no alias {name!r} (its aliases: {known})")
    names = only or list(aliases)
    return [(name, aliases[name]) for name in names]


def _fallbacks(file: Path) -> dict[str, tuple[str, ...]]:
    """Each alias's ``fallbacks`` in the file, as written (judged with the chain step)."""
    graph: dict[str, tuple[str, ...]] = {}
    for alias, spec in _read(file).items():
        names = spec.get("fallbacks") if isinstance(spec, Mapping) else None
        graph[str(alias)] = tuple(str(n) for n in names) if isinstance(names, list) else ()
    return graph


def _read(file: Path) -> Mapping[str, Any]:
    data = read_resource_file(file)
    if not data:
        raise ConfigurationError(f"{file} defines no aliases (it should map alias -> settings)")
    return data


# -- the steps ----------------------------------------------------------------------------------
async def check_alias(
    alias: str,
    spec: Any,
    timeout: float,
    call: bool,
    fallbacks: Mapping[str, tuple[str, ...]] | None = None,
) -> AliasCheck:
    result = AliasCheck(alias)
    config = _config(result, alias, spec)
    if config is None:
        return result
    result.endpoint = _describe(config)
    if config.fallbacks and not _chain(result, alias, config, fallbacks or {}):
        return result
    if config.deployments:
        _deployments(result, config)
        result.endpoint = f"{len(config.deployments)} deployments"
    for each in config.deployment_configs() or [config]:
        # The alias's own settings only describe its deployments: each is checked.
        await _works(result, alias, each, timeout, call)
    return result


async def _works(
    result: AliasCheck, alias: str, config: EndpointConfig, timeout: float, call: bool
) -> None:
    """The key, endpoint and model steps for one endpoint (the alias's, or a deployment's)."""
    if not _key(result, config):
        return
    provider_ok = await _reachable(result, config, timeout)
    if not provider_ok:
        return
    if not call:
        result.passed("model", "not called (--no-call)")
        return
    await _answers(result, alias, config, timeout)


def _config(result: AliasCheck, alias: str, spec: Any) -> EndpointConfig | None:
    if isinstance(spec, EndpointConfig):
        result.passed("config", "valid")
        return spec
    if not isinstance(spec, Mapping):
        result.failed("config", f"expected a table of settings, got {type(spec).__name__}")
        return None
    settings = dict(spec)
    # Whether the key variable is set is the next step's business, and the aliases the
    # fallbacks name are the chain step's: validate the rest here.
    rest = {k: v for k, v in settings.items() if k not in ("api_key_env", "fallbacks")}
    try:
        ResourceConfig({alias: rest})
        config = EndpointConfig(**settings)
    except ConfigurationError as exc:
        result.failed("config", str(exc).removeprefix(f"alias {alias!r}: "))
        return None
    except Exception as exc:
        result.failed("config", f"{type(exc).__name__}: {exc}")
        return None
    result.passed("config", "valid")
    return config


def _chain(
    result: AliasCheck, alias: str, config: EndpointConfig, fallbacks: Mapping[str, tuple[str, ...]]
) -> bool:
    """The chain a failed call of ``alias`` follows, what moves it on, and the breaker."""
    try:
        check_fallbacks(fallbacks)
    except ConfigurationError as exc:
        result.failed("fallbacks", str(exc))
        return False
    chain = " -> ".join(fallback_chain(fallbacks, alias))
    breaker = breaker_for(config)
    result.passed(
        "fallbacks",
        f"{chain}; moves on after: {', '.join(config.fallback_on) or 'nothing'}; circuit "
        f"breaker {breaker.state} (opens after {config.breaker_failures} failures in a row, "
        f"probes after {config.breaker_cooldown_s:g} s)",
    )
    return True


def _deployments(result: AliasCheck, config: EndpointConfig) -> None:
    """Each deployment of the alias, with its limits and circuit breaker."""
    shown = []
    for own in config.deployment_configs():
        limits = f"{own.max_concurrent} at once"
        if own.requests_per_minute:
            limits += f", {own.requests_per_minute}/min"
        shown.append(f"{_describe(own)} ({limits}; circuit breaker {breaker_for(own).state})")
    result.passed("deployments", "; ".join(shown))


def _describe(config: EndpointConfig) -> str:
    if config.provider == "local":
        return f"local/{config.model or 'default'}"
    url = config.base_url or DEFAULT_URLS.get(config.provider, "")
    return f"{config.provider}/{config.model} @ {redact_url(url)}"


def _key(result: AliasCheck, config: EndpointConfig) -> bool:
    if config.provider == "local":
        result.passed("key", "not needed")
        return True
    if config.api_key is not None:
        result.passed("key", "set in the file (not shown)")
        return True
    env = config.api_key_env
    if env is not None:
        if not looks_like_variable_name(env):
            register(env)  # it may be the key itself: never shown
            result.failed(
                "key",
                f"api_key_env must be the name of an environment variable, and what it holds "
                f"({len(env)} characters, not shown) is not one: export the key as a variable "
                "and name that variable here",
            )
            return False
        value = os.environ.get(env)
        if value and value.strip():
            register(value)
            result.passed("key", f"from ${env}")
            return True
        if value is None:
            result.failed("key", f"api_key_env {unset_variable(env)}; export it before running")
            return False
        result.failed(
            "key",
            f"the environment variable {env} (api_key_env) is set but empty; export it "
            "before running",
        )
        return False
    if config.provider == "anthropic":
        if os.environ.get("ANTHROPIC_API_KEY"):
            result.passed("key", "from $ANTHROPIC_API_KEY")
            return True
        result.failed("key", "none: set api_key_env in the alias, or export ANTHROPIC_API_KEY")
        return False
    if config.base_url is None:
        result.failed("key", "none: api.openai.com needs one; set api_key_env in the alias")
        return False
    if _is_local(config.base_url):
        result.passed("key", "none (a server on this machine may need none)")
        return True
    result.passed("key", "none set (fine only if the server needs none)")
    return True


def _runtime_version() -> str:
    """The installed llama.cpp runtime, as a bug report would want it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"xllamacpp {version('xllamacpp')}"
    except PackageNotFoundError:
        return "xllamacpp (version unknown)"


def _is_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private


async def _reachable(result: AliasCheck, config: EndpointConfig, timeout: float) -> bool:
    try:
        provider = make_provider(config)
    except ConfigurationError as exc:
        result.failed("endpoint", str(exc))
        return False
    except Exception as exc:  # a provider SDK that is missing or refuses the settings
        result.failed("endpoint", f"{type(exc).__name__}: {exc}")
        return False
    if config.provider == "local":
        result.passed(
            "endpoint",
            f"model file {getattr(provider, 'model_path', '?')}, runtime {_runtime_version()}",
        )
        return True
    url = config.base_url or DEFAULT_URLS.get(config.provider, "")
    parts = urlsplit(url)
    host = parts.hostname
    if not host or parts.scheme not in ("http", "https"):
        result.failed("endpoint", f"base_url {redact_url(url)!r} is not an http(s) URL")
        return False
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        result.failed("endpoint", f"base_url {redact_url(url)!r} has an invalid port")
        return False
    started = time.monotonic()
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except TimeoutError:
        result.failed("endpoint", f"no answer from {host}:{port} within {timeout:g} s")
        return False
    except OSError as exc:
        if isinstance(exc, ConnectionRefusedError):
            reason = "connection refused"
        else:
            reason = exc.strerror or str(exc) or type(exc).__name__
        result.failed(
            "endpoint",
            f"cannot connect to {host}:{port} ({reason}): is the server running, and is "
            "base_url right?",
        )
        return False
    elapsed = time.monotonic() - started
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    result.passed("endpoint", f"{host}:{port} accepts connections ({elapsed * 1000:.0f} ms)")
    return True


_HINTS = {
    401: "the key was refused: check api_key / api_key_env",
    403: "the key may not use this model or endpoint",
    404: (
        "check the model name and base_url (OpenAI-compatible servers end it in /v1; a "
        "?query after it is kept)"
    ),
    429: "rate limited right now: the endpoint works, but lower the limits or wait",
}


async def _answers(result: AliasCheck, alias: str, config: EndpointConfig, timeout: float) -> None:
    single = config.model_copy(update={"max_retries": 0, "timeout": min(config.timeout, timeout)})
    request = LLMRequest(
        alias=alias, messages=[{"role": "user", "content": PROMPT}], temperature=0, max_tokens=8
    )
    started = time.monotonic()
    try:
        endpoint = ResourceManager(ResourceConfig({alias: single})).endpoint(alias)
        response = await endpoint.complete(request)
    except ProviderError as exc:
        hint = _HINTS.get(exc.status or 0, "")
        result.failed("model", f"{exc}" + (f" ({hint})" if hint else ""))
        return
    except Exception as exc:
        result.failed("model", f"{type(exc).__name__}: {exc}")
        return
    elapsed = time.monotonic() - started
    reply = " ".join(response.text.split())
    if len(reply) > 40:
        reply = reply[:37] + "..."
    result.passed("model", f"answered in {elapsed * 1000:.0f} ms: {reply!r}")
    result.limits = endpoint.usage.limits()
    result.passed("limits", _limits_detail(result.limits, response.limits is not None))


def _limits_detail(limits: dict[str, Any] | None, stated: bool) -> str:
    """The limits the reply stated next to the configured ones, as the usage table shows
    them; or that it stated none (then only the configured ones pace the alias)."""
    from plait.resources.usage import limits_text

    shown = limits_text(limits)
    if not stated:
        configured = "none" if shown == "-" else shown.replace("\n", "; ")
        return f"the reply stated no rate limits; configured: {configured}"
    return shown.replace("\n", "; ")


# -- the report ---------------------------------------------------------------------------------
def _report_json(results: list[AliasCheck]) -> None:
    import json

    rows = [
        {
            "alias": row.alias,
            "endpoint": row.endpoint,
            "ok": row.ok,
            "steps": [
                {"step": step, "ok": passed, "detail": detail} for step, passed, detail in row.steps
            ],
            "limits": row.limits,
        }
        for row in results
    ]
    print(json.dumps(rows, indent=2))


def _report(results: list[AliasCheck], path: str | None) -> None:
    from rich.table import Table

    from plait.cli.progress import console

    table = Table(title=f"plait check: {path or 'the embedded local model'}")
    table.add_column("alias")
    table.add_column("endpoint")
    table.add_column("status")
    table.add_column("details")
    for row in results:
        lines = []
        for step, passed, detail in row.steps:
            lines.append(f"{step}: {detail}" if passed else f"[red]{step}: {detail}[/red]")
        status = "[green]ok[/green]" if row.ok else "[bold red]problem[/bold red]"
        table.add_row(row.alias, row.endpoint or "-", status, "\n".join(lines))
    console(sys.stdout).print(table)
    failed = [row for row in results if not row.ok]
    for row in failed:
        print(f"plait check: alias {row.alias!r}: {row.problem()}", file=sys.stderr)
    print(
        f"plait check: {len(results) - len(failed)} of {len(results)} alias(es) ok", file=sys.stderr
    )
