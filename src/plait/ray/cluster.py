"""Joining or starting Ray, and the cluster-wide actors plait shares between runs.

`ensure_ray` connects to ``address`` (an existing cluster) or, with none, starts a
local Ray for this process, which `shutdown_if_started` stops again: the embedded
default needs no cluster set up beforehand.  `broker` returns the one
`LimitBroker` actor of the namespace, created on first use and found by name
afterwards, so every run, worker and Ray Data task in the cluster shares it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["BROKER_NAME", "NAMESPACE", "broker", "ensure_ray", "import_ray", "shutdown_if_started"]

NAMESPACE = "plait"
BROKER_NAME = "plait-limits"

_lock = threading.Lock()
_started_here = False


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "running on several processes needs Ray: pip install 'plait[ray]'"
        ) from None
    return ray


def ensure_ray(address: str | None = None, workers: int | None = None) -> Any:
    """Ray, initialised: joined at ``address``, already running, or started here."""
    global _started_here
    ray = import_ray()
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
            ray.init(address=address, **kwargs)
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
