"""The names and defaults of the run options (``resources``, ``max_concurrent``,
``seed``...), and the check every place that takes them shares.

`Module.bind`, `ExecutionSettings` and per-call keyword arguments all take these
names; keeping them here, in the core, lets a module check its binding without
knowing the runtime that reads it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULTS", "SETTING_NAMES", "check_setting_names", "inputs_in_flight"]

DEFAULTS: dict[str, Any] = {
    "resources": None,
    "max_concurrent": 100,
    "checkpoint_dir": None,
    "streaming": False,
    "preserve_order": False,
    "max_inputs_in_flight": None,
    "workers": None,
    "ray_address": None,
    "seed": None,
    "backend": None,
}
SETTING_NAMES = frozenset(DEFAULTS)


def check_setting_names(options: dict[str, Any], where: str) -> None:
    unknown = sorted(set(options) - SETTING_NAMES)
    if unknown:
        raise TypeError(
            f"{where} got unknown execution option(s) {', '.join(map(repr, unknown))}; "
            f"known options: {', '.join(sorted(SETTING_NAMES))}"
        )


def inputs_in_flight(options: dict[str, Any]) -> int:
    """How many inputs a batch keeps in flight at once: ``max_inputs_in_flight``, else
    twice the run's ``max_concurrent`` and at least 64 (enough to keep every slot busy
    while finished inputs are replaced)."""
    given = options.get("max_inputs_in_flight")
    if given:
        return int(given)
    return max(64, 2 * int(options.get("max_concurrent") or DEFAULTS["max_concurrent"]))
