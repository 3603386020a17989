"""`override`: change the parameters of chosen LLM calls without editing the pipeline.

Evaluations want temperature 0, a smoke test wants a cheap model and short
replies, a reproducibility check wants a fixed seed; none of these should mean
rebuilding the modules.  An override rewrites the request of every call whose
module path matches ``where`` (a `fnmatch` glob on the dotted path from the root
module, such as ``"stage2.*"``, or a list of them) just before it is sent.

The model is not a request parameter: it belongs to the endpoint an alias names
(with its URL, key, limits and prices).  To run calls on another model, configure
an alias for it and pass ``alias="that-alias"``.

Order matters.  The innermost handler processes a call first, so an override
must be entered *inside* a `cache` or `mock` that should see the changed request
(a cache then keys on it, a mock callable receives it):
``with cache("calls.db"), override(temperature=0):``.  An override entered outside
them changes only the calls they let through.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Mapping, Sequence
from typing import Any

from plait.effects import Handler, Message
from plait.handlers.llm import request_of

__all__ = ["EXTRA_FIELDS", "REQUEST_FIELDS", "Override", "override"]

REQUEST_FIELDS = ("alias", "temperature", "max_tokens")
"""The fields of the request itself an override may change."""

EXTRA_FIELDS = (
    "seed",
    "top_p",
    "top_k",
    "stop",
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "reasoning_effort",
    "service_tier",
    "user",
)
"""Sampling fields that travel in the request's ``extra``, sent to the provider as they are.

Anything else goes through ``extra={...}``: a typo such as ``temprature=0`` must be
an error, not a field the endpoint silently ignores.
"""


class Override(Handler):
    """Rewrites the request of matching LLM calls (a copy: the original stays as it was).

    Made by `override`, whose arguments it takes.

    Args:
        where: A module-path glob, or a list of them.
        **changes: The fields to change (see `override`).

    Raises:
        TypeError: When ``where`` is not a glob or a list of them, there is no
            change, or a change names an unknown field or ``model``.
        ValueError: When a change's value is out of range.
    """

    def __init__(self, where: str | Sequence[str] = "*", **changes: Any) -> None:
        self.where = _patterns(where)
        self.fields, self.extra = _validate(changes)
        self.changes = dict(changes)

    def matches(self, name: str) -> bool:
        """Whether a call at this module path is rewritten.

        Args:
            name: The call's module path.

        Returns:
            True when one of the globs matches it.
        """
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.where)

    def process_llm(self, msg: Message) -> None:
        """Replace a matching call's request with the changed copy.

        Args:
            msg: The LLM call's message.

        Raises:
            plait.ConfigurationError: When the new ``alias`` is not in the run's
                resources.
        """
        if msg.done or not self.matches(msg.name):
            return
        request = request_of(msg)
        fields = dict(self.fields)
        if self.extra:
            extra = dict(request.extra)
            for key, value in self.extra.items():
                if value is None:
                    extra.pop(key, None)
                else:
                    extra[key] = value
            fields["extra"] = extra
        alias = fields.get("alias")
        if alias is not None and alias != request.alias:
            _check_alias(msg, alias)
        msg.kwargs["request"] = dataclasses.replace(request, **fields)
        msg.meta.setdefault("overrides", []).append(self.changes)


def _patterns(where: str | Sequence[str]) -> tuple[str, ...]:
    patterns = (where,) if isinstance(where, str) else tuple(where)
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise TypeError(
            f"override(where=...) takes a module-path glob or a list of them, got {where!r}"
        )
    return patterns


def _validate(changes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split the changes into request fields and extra fields, or say what is wrong."""
    if not changes:
        raise TypeError(
            "override() needs at least one change, e.g. override(temperature=0); allowed: "
            + _allowed()
        )
    fields: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "model":
            raise TypeError(
                "override(model=...) is not supported: the model belongs to the endpoint an "
                "alias names. Configure an alias for that model in the resources and use "
                "override(alias='that-alias')"
            )
        if name == "temperature":
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(
                    f"override(temperature=...) must be a number >= 0 or None, got {value!r}"
                )
            fields[name] = value
        elif name == "max_tokens":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(
                    f"override(max_tokens=...) must be a positive integer or None, got {value!r}"
                )
            fields[name] = value
        elif name == "alias":
            if not isinstance(value, str) or not value:
                raise ValueError(f"override(alias=...) must be a non-empty string, got {value!r}")
            fields[name] = value
        elif name == "extra":
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise TypeError(
                    f"override(extra=...) must be a mapping of field name -> value, got {value!r}"
                )
            extra.update(value)
        elif name in EXTRA_FIELDS:
            extra[name] = value
        else:
            raise TypeError(f"override() got an unknown parameter {name!r}; allowed: {_allowed()}")
    return fields, extra


def _allowed() -> str:
    return ", ".join((*REQUEST_FIELDS, *EXTRA_FIELDS, "extra={...} (any other provider field)"))


def _check_alias(msg: Message, alias: str) -> None:
    resources = msg.meta.get("resources")
    if resources is None:
        return
    try:
        resources.config_for(alias)
    except KeyError as exc:
        from plait.resources.config import ConfigurationError

        raise ConfigurationError(
            f"override(alias={alias!r}) for the call at {msg.name!r}: {exc.args[0]}"
        ) from None


def override(where: str | Sequence[str] = "*", **changes: Any) -> Override:
    """Change the parameters of the LLM calls whose module path matches ``where``.

    Evaluations want temperature 0, a smoke test wants a cheap model and short
    replies: none of these should mean rebuilding the modules.

    Args:
        where: A `fnmatch` glob on the module path from the root (``"stage2.*"``),
            or a list of them; ``"*"`` matches every call.
        **changes: ``temperature``, ``max_tokens`` and ``alias`` (another configured
            endpoint, which is how a call moves to another model) change the
            request; ``seed``, ``top_p``, ``stop`` and the other `EXTRA_FIELDS`, or
            any provider field through ``extra={...}``, are sent along with it
            (``None`` removes one).

    Returns:
        The `Override` handler: enter it with ``with``.

    Raises:
        TypeError: When ``where`` is not a glob, there is no change, or a change
            names an unknown field or ``model`` (configure an alias instead).
        ValueError: When a change's value is out of range.

    Examples:
        ```python
        import plait
        from plait.handlers import override

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        cheap = {"provider": "openai", "model": "gpt-4.1-nano", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast, "cheap": cheap})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.").bind(resources=resources)

        with override(temperature=0, seed=1):
            print(summarize.run_sync("A long text."))
        with override("*", alias="cheap", max_tokens=64):
            print(summarize.run_sync("A long text."))
        ```
    """
    return Override(where, **changes)
