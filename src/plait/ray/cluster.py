"""Joining or starting Ray, and the cluster-wide actors plait shares between runs.

`ensure_ray` connects to ``address`` (an existing cluster) or, with none, starts a
local Ray for this process, which `shutdown_if_started` stops again: the embedded
default needs no cluster set up beforehand.  `broker` returns the one
`LimitBroker` actor of the namespace, created on first use and found by name
afterwards, so every run, worker and Ray Data task in the cluster shares it.

Joining is bounded: Ray itself retries an address nobody answers at for minutes,
so the address is checked first (its form, then a TCP connection to it, retried
for up to ``PLAIT_RAY_CONNECT_TIMEOUT`` seconds, default `CONNECT_TIMEOUT_S`), and
any failure is one `ClusterUnreachable` naming the address.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

__all__ = [
    "BROKER_NAME",
    "CONNECT_TIMEOUT_S",
    "NAMESPACE",
    "ClusterUnreachable",
    "broker",
    "check_address",
    "cluster_address",
    "ensure_ray",
    "import_ray",
    "shutdown_if_started",
]

NAMESPACE = "plait"
BROKER_NAME = "plait-limits"

#: How long joining a cluster may wait for its address to answer (seconds); the
#: environment variable ``PLAIT_RAY_CONNECT_TIMEOUT`` overrides it.
CONNECT_TIMEOUT_S = 15.0

_lock = threading.Lock()
_started_here = False


class ClusterUnreachable(ConnectionError):
    """The Ray cluster at the address given cannot be joined (its form, or nobody answers)."""

    def __init__(self, address: str, why: str) -> None:
        self.address = address
        from_environment = address == _environment_address()
        where = "RAY_ADDRESS holds" if from_environment else "Give"
        instead = "unset RAY_ADDRESS" if from_environment else "leave --ray-address/ray_address out"
        super().__init__(
            f"cannot join the Ray cluster at {address!r}: {why}. {where} the address of a "
            "running cluster's head (host:port, as `ray start --head` prints it, "
            f"ray://host:port, or 'auto' for the one on this machine), or {instead} to "
            "start Ray for the run"
        )


def _environment_address() -> str | None:
    return os.environ.get("RAY_ADDRESS", "").strip() or None


def cluster_address(address: str | None) -> str | None:
    """The Ray cluster a run joins: ``address`` when given, else the one ``RAY_ADDRESS``
    names (as Ray's own tools read it), else None: start a local Ray for the run."""
    return address if address is not None else _environment_address()


def connect_timeout() -> float:
    raw = os.environ.get("PLAIT_RAY_CONNECT_TIMEOUT")
    if raw is None or not raw.strip():
        return CONNECT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        from plait.resources.config import ConfigurationError

        raise ConfigurationError(
            f"PLAIT_RAY_CONNECT_TIMEOUT must be a positive number of seconds, got {raw!r}"
        )
    return value


def _host_port(address: str) -> tuple[str, int] | None:
    """The head's (host, port) for ``address``; None when Ray is to find or start it
    ("auto" with no cluster recorded on this machine, "local")."""
    target = address.removeprefix("ray://")
    if target == address:
        try:  # "auto" is the address Ray recorded for this machine's cluster, if any
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:  # a Ray without it: let ray.init resolve such names
            if address in ("auto", "local"):
                return None
        else:
            try:
                resolved = canonicalize_bootstrap_address(address)
            except ValueError:
                raise ClusterUnreachable(address, "that is not a Ray address") from None
            if resolved is None:
                return None
            target = resolved
    host, colon, port = target.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # an IPv6 literal
    if not colon or not host or not port:
        raise ClusterUnreachable(address, "that is not a Ray address")
    if not port.isdigit():
        raise ClusterUnreachable(address, f"the port {port!r} is not a number")
    return host, int(port)


def check_address(address: str) -> None:
    """Fail within the connect timeout if ``address`` is no address or nothing answers
    there (a command checks before it opens any file; `ensure_ray` checks again)."""
    import_ray()
    if not address.strip():  # Ray would take "" for "start one here": not what was asked
        raise ClusterUnreachable(address, "the address is empty")
    target = _host_port(address)
    if target is None:
        return
    limit = connect_timeout()
    deadline = time.monotonic() + limit
    while True:
        remaining = deadline - time.monotonic()
        try:
            with socket.create_connection(target, timeout=max(0.1, remaining)):
                return
        except OSError as exc:
            problem = exc.strerror or type(exc).__name__
        if time.monotonic() + 0.5 >= deadline:
            raise ClusterUnreachable(
                address,
                f"nothing answered there within {limit:g} s ({problem}; "
                "PLAIT_RAY_CONNECT_TIMEOUT sets how long to wait)",
            )
        time.sleep(0.5)  # a head node may be starting: try again until the deadline


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "running on several processes needs Ray: pip install 'plait[ray]'"
        ) from None
    return ray


def ensure_ray(address: str | None = None, workers: int | None = None) -> Any:
    """Ray, initialised: joined at ``address`` (or ``RAY_ADDRESS``), already running, or
    started here."""
    global _started_here
    ray = import_ray()
    address = cluster_address(address)
    with _lock:
        if ray.is_initialized():
            return ray
        kwargs: dict[str, Any] = {
            "namespace": NAMESPACE,
            "log_to_driver": bool(os.environ.get("PLAIT_RAY_LOGS")),
            "include_dashboard": False,
            "configure_logging": False,
        }
        if address is not None:
            check_address(address)
            try:
                ray.init(address=address, **kwargs)
            except (ValueError, ConnectionError, TimeoutError) as exc:
                raise ClusterUnreachable(address, f"{type(exc).__name__}: {exc}") from None
        else:
            # A local Ray just for this process: enough CPU slots for the workers asked
            # for (they mostly wait on the network) plus the broker.
            cpus = max(os.cpu_count() or 1, (workers or 1) + 1)
            ray.init(num_cpus=cpus, **kwargs)
            _started_here = True
        return ray


def shutdown_if_started() -> None:
    """Stop the local Ray `ensure_ray` started (a joined cluster is left running)."""
    global _started_here
    ray = import_ray()
    with _lock:
        if _started_here and ray.is_initialized():
            ray.shutdown()
        _started_here = False


def broker() -> Any:
    """The cluster's `LimitBroker` actor (created by the first caller)."""
    ray = import_ray()
    from plait.ray.broker import LimitBroker

    actor = ray.remote(num_cpus=0, max_concurrency=10_000)(LimitBroker)
    return actor.options(
        name=BROKER_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()
