"""What each alias has cost: requests, retries, 429s, tokens, latency and dollars.

Dollars are added up reply by reply at the price of the tier that served it
(standard, flex or batch) with prompt-cache reads and writes at theirs
(`plait.resources.pricing`), so a run that mixes them is priced as billed.

Counters are process-wide per alias (every run that uses an alias adds to it),
readable as data with `usage()` and as a `rich` table with `usage().table()`.
Latencies are kept in full up to a cap, then as a uniform reservoir sample, so
percentiles stay honest on long runs without unbounded memory.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plait.resources.pricing import Prices

if TYPE_CHECKING:
    from rich.console import RenderableType

    from plait.providers.base import Usage
    from plait.providers.ratelimits import ReportedLimits

__all__ = ["AliasUsage", "UsageReport", "limits_text", "record_for", "reset_usage", "usage"]

_RESERVOIR = 10_000


@dataclass
class AliasUsage:
    """Counters for one alias."""

    alias: str
    provider: str = ""
    model: str = ""
    requests: int = 0
    succeeded: int = 0
    failed: int = 0
    retries: int = 0
    rate_limited: int = 0
    #: 429s that said the tier (flex) had no capacity, retried like any other.
    unavailable: int = 0
    reasks: int = 0
    #: Calls this alias handed on to the next alias of a chain of fallbacks (it failed
    #: them, or its circuit breaker was open).
    moved_on: int = 0
    #: Calls of a cascade whose answer here was not accepted, answered again by the
    #: next tier's alias.
    escalated: int = 0
    #: Second copies of slow requests (``hedge_after``), part of ``requests``.
    hedged: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Requests served by a batch API and on the flex tier (part of ``requests``), and
    #: the batches submitted.
    batch_requests: int = 0
    flex_requests: int = 0
    batches: int = 0
    #: Prompt tokens read from and written to the provider's prompt cache.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    #: Dollars, added reply by reply at the tier's prices (`add_reply`).
    spent: float = 0.0
    prices: Prices = field(default_factory=Prices)
    #: The latest rate limits a reply stated, and the limits per minute (requests,
    #: tokens) configured and in force when it came (`note_limits`).
    reported: ReportedLimits | None = None
    configured_limits: tuple[int | None, int | None] = (None, None)
    effective_limits: tuple[int | None, int | None] = (None, None)
    #: For an alias with deployments: the calls each deployment answered, by its label.
    deployments: dict[str, int] = field(default_factory=dict)
    _latencies: list[float] = field(default_factory=list, repr=False)
    _seen: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_deployment(self, label: str) -> None:
        """One more call answered by the deployment ``label``."""
        with self._lock:
            self.deployments[label] = self.deployments.get(label, 0) + 1

    def _add_latency_locked(self, seconds: float) -> None:
        """Keep ``seconds`` in the reservoir of latencies (the lock held)."""
        self._seen += 1
        if len(self._latencies) < _RESERVOIR:
            self._latencies.append(seconds)
        else:
            slot = random.randrange(self._seen)
            if slot < _RESERVOIR:
                self._latencies[slot] = seconds

    def latency_percentile(self, q: float) -> float | None:
        """The ``q`` quantile (0..1) of successful call latency, in seconds."""
        with self._lock:
            data = sorted(self._latencies)
        if not data:
            return None
        index = min(len(data) - 1, max(0, round(q * (len(data) - 1))))
        return data[index]

    def add_reply(self, used: Usage, tier: str = "standard", latency: float | None = None) -> None:
        """Count one reply's tokens, and its dollars at ``tier``'s prices; with
        ``latency`` (seconds) its latency too, in the reservoir the percentiles read,
        under the same lock: every successful call counts both."""
        with self._lock:
            if latency is not None:
                self._add_latency_locked(latency)
            self.prompt_tokens += used.prompt_tokens
            self.completion_tokens += used.completion_tokens
            self.cache_read_tokens += used.cache_read_tokens
            self.cache_write_tokens += used.cache_write_tokens
            if tier == "batch":
                self.batch_requests += 1
            elif tier == "flex":
                self.flex_requests += 1
            if self.prices.known:  # unpriced, every reply costs 0 and `cost` says None
                self.spent += self.prices.cost(used, tier)

    def note_limits(
        self,
        reported: ReportedLimits,
        configured: tuple[int | None, int | None],
        effective: tuple[int | None, int | None],
    ) -> None:
        """Keep what the latest reply stated of its limits, for the report.  Three plain
        assignments: it runs on every reply that states them."""
        self.reported = reported
        self.configured_limits = configured
        self.effective_limits = effective

    def limits(self) -> dict[str, Any] | None:
        """Requests and tokens per minute: configured, reported (by the latest reply that
        stated them), in force (the smaller), and what was left of each and the seconds
        until its reset when that reply came; None when nothing is configured and no
        reply stated a limit."""
        seen = self.reported
        if seen is None and self.configured_limits == (None, None):
            return None
        now = time.monotonic()

        def reset(seconds: float | None) -> float | None:
            if seen is None or seconds is None:
                return None
            return round(max(0.0, seen.at + seconds - now), 3)

        rows: dict[str, Any] = {}
        for index, kind in enumerate(("requests", "tokens")):
            rows[f"{kind}_per_minute"] = {
                "configured": self.configured_limits[index],
                "reported": getattr(seen, f"{kind}_limit", None),
                "effective": self.effective_limits[index],
                "remaining": getattr(seen, f"{kind}_remaining", None),
                "reset_s": reset(getattr(seen, f"{kind}_reset_s", None)),
            }
        return rows

    @property
    def cost(self) -> float | None:
        """Estimated dollars, when the endpoint's prices are configured."""
        return self.spent if self.prices.known else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "provider": self.provider,
            "model": self.model,
            "requests": self.requests,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "retries": self.retries,
            "rate_limited": self.rate_limited,
            "unavailable": self.unavailable,
            "reasks": self.reasks,
            "moved_on": self.moved_on,
            "escalated": self.escalated,
            "hedged": self.hedged,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "batch_requests": self.batch_requests,
            "flex_requests": self.flex_requests,
            "batches": self.batches,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "latency_p50_s": self.latency_percentile(0.5),
            "latency_p90_s": self.latency_percentile(0.9),
            "latency_p99_s": self.latency_percentile(0.99),
            "cost_usd": self.cost,
            "limits": self.limits(),
            "deployments": dict(self.deployments),
        }


_records: dict[str, AliasUsage] = {}
_records_lock = threading.Lock()
#: Other processes' counters (Ray workers of a run this process drives), by worker.
_remote: dict[str, list[dict[str, Any]]] = {}
_SHIPPED_LATENCIES = 2_000
_NAMES = ("alias", "provider", "model")
#: What the latest reply stated of the limits (the latest of all processes wins).
_LIMITS = ("reported", "configured_limits", "effective_limits")
#: The counters that add up across processes.
_COUNTERS = (
    "requests",
    "succeeded",
    "failed",
    "retries",
    "rate_limited",
    "unavailable",
    "reasks",
    "moved_on",
    "escalated",
    "hedged",
    "prompt_tokens",
    "completion_tokens",
    "batch_requests",
    "flex_requests",
    "batches",
    "cache_read_tokens",
    "cache_write_tokens",
    "spent",
)


def snapshot_records() -> list[dict[str, Any]]:
    """This process's counters as data another process can add up (`absorb_remote`)."""
    with _records_lock:
        records = list(_records.values())
    out = []
    for record in records:
        with record._lock:
            latencies = list(record._latencies)
            deployments = dict(record.deployments)
        if len(latencies) > _SHIPPED_LATENCIES:
            latencies = random.sample(latencies, _SHIPPED_LATENCIES)
        fields = {name: getattr(record, name) for name in (*_NAMES, *_COUNTERS, *_LIMITS)}
        fields.update(
            prices=record.prices, latencies=latencies, seen=record._seen, deployments=deployments
        )
        out.append(fields)
    return out


def absorb_remote(worker: str, snapshot: list[dict[str, Any]]) -> None:
    """Keep ``worker``'s latest counters: `usage()` adds them to this process's."""
    with _records_lock:
        _remote[worker] = snapshot


def _combined() -> list[AliasUsage]:
    with _records_lock:
        local = list(_records.values())
        remote = [row for rows in _remote.values() for row in rows]
    if not remote:
        return local
    merged: dict[str, AliasUsage] = {}
    for record in local:
        with record._lock:
            latencies = list(record._latencies)
            fields = {**record.__dict__, "deployments": dict(record.deployments)}
        copy = AliasUsage(record.alias, record.provider, record.model)
        _add(copy, fields, latencies)
        merged[record.alias] = copy
    for row in remote:
        target = merged.get(row["alias"])
        if target is None:
            target = merged[row["alias"]] = AliasUsage(row["alias"], row["provider"], row["model"])
        _add(target, row, row["latencies"])
    return list(merged.values())


def _add(target: AliasUsage, source: dict[str, Any], latencies: list[float]) -> None:
    for name in _COUNTERS:
        setattr(target, name, getattr(target, name) + source[name])
    seen = source.get("reported")
    if seen is not None and (target.reported is None or seen.at > target.reported.at):
        for name in _LIMITS:  # the latest statement of the limits, from whichever process
            setattr(target, name, source[name])
    if not target.prices.known:
        target.prices = source["prices"]
    for label, calls in source.get("deployments", {}).items():
        target.deployments[label] = target.deployments.get(label, 0) + calls
    target._latencies.extend(latencies)


def record_for(alias: str) -> AliasUsage:
    with _records_lock:
        found = _records.get(alias)
        if found is None:
            found = _records[alias] = AliasUsage(alias)
        return found


class UsageReport:
    """A snapshot of every alias's counters."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def __getitem__(self, alias: str) -> dict[str, Any]:
        for row in self.rows:
            if row["alias"] == alias:
                return row
        known = ", ".join(r["alias"] for r in self.rows) or "none"
        raise KeyError(f"no usage recorded for alias {alias!r} (aliases with usage: {known})")

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {row["alias"]: row for row in self.rows}

    def table(self) -> RenderableType:
        """The usage table; below it, when a reply stated limits or some were configured,
        the limits in force per alias (a table of their own: in a column of the usage
        table their lines squeezed every other column at a terminal's 80 characters)."""
        from rich.console import Group
        from rich.table import Table

        table = Table(title="plait usage")
        # Which alias answered a call is the row its request and cost are counted in;
        # calls an alias handed on to a fallback get a column when there are any.
        moved = any(row.get("moved_on") for row in self.rows)
        columns = ("alias", "model", "requests", "batched", "retries", "429s")
        for name in (*columns, *(("moved on",) if moved else ()), "tokens in", "cached in"):
            table.add_column(name, justify="left" if name in ("alias", "model") else "right")
        for name in ("tokens out", "p50", "p90", "cost"):
            table.add_column(name, justify="right")
        for row in self.rows:
            cells = [
                row["alias"],
                f"{row['provider']}/{row['model']}",
                str(row["requests"]),
                str(row["batch_requests"]),
                str(row["retries"]),
                str(row["rate_limited"]),
            ]
            if moved:
                cells.append(str(row.get("moved_on", 0)))
            table.add_row(
                *cells,
                f"{row['prompt_tokens']:,}",
                f"{row['cache_read_tokens']:,}",
                f"{row['completion_tokens']:,}",
                _seconds(row["latency_p50_s"]),
                _seconds(row["latency_p90_s"]),
                "-" if row["cost_usd"] is None else f"${row['cost_usd']:.4f}",
            )
        limited = [row for row in self.rows if row.get("limits")]
        if not limited:
            return table
        limits = Table(title="plait rate limits")
        limits.add_column("alias")
        limits.add_column("in force per minute (as reported, as configured), left, reset")
        for row in limited:
            limits.add_row(row["alias"], limits_text(row["limits"]))
        return Group(table, limits)

    def __rich__(self) -> RenderableType:
        return self.table()


def limits_text(limits: dict[str, Any] | None) -> str:
    """Per minute, one line each: ``req 600 (reported 600, configured -), 9 left, reset 0.4 s``."""
    if not limits:
        return "-"
    lines = []
    for kind, short in (("requests", "req"), ("tokens", "tok")):
        row = limits[f"{kind}_per_minute"]
        if row["effective"] is None and row["reported"] is None:
            continue
        line = (
            f"{short} {_number(row['effective'])}/min (reported {_number(row['reported'])}, "
            f"configured {_number(row['configured'])})"
        )
        if row["remaining"] is not None:
            line += f", {row['remaining']:,} left"
        if row["reset_s"] is not None:
            line += f", reset {row['reset_s']:g} s"
        lines.append(line)
    return "\n".join(lines) or "-"


def _number(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def usage() -> UsageReport:
    """What each alias has cost: requests, retries, 429s, tokens, latency and dollars.

    Counted since the process started (or since `reset_usage`), with the counters
    of the Ray workers of runs this process drove added in.

    Returns:
        A snapshot: ``usage()["fast"]["requests"]`` reads one counter, ``as_dict()``
        gives them all, and printing ``usage().table()`` with ``rich`` shows a table.

    Examples:
        ```python
        import plait

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.").bind(resources=resources)
        summarize.run_sync(["First text.", "Second text."])
        print(plait.usage()["fast"]["requests"])
        ```
    """
    return UsageReport([r.as_dict() for r in _combined()])


def reset_usage() -> None:
    """Set every alias's counters back to zero (what `usage` reports starts again)."""
    with _records_lock:
        _records.clear()
        _remote.clear()
