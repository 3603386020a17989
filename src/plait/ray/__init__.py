"""plait on many processes and machines, on Ray.

``pipeline.run_sync(inputs, workers=4)`` (or ``plait run ... --workers 4``) runs a
batch on four Ray worker processes, each with the whole pipeline, while every
endpoint's limits (``max_concurrent``, ``requests_per_minute``,
``tokens_per_minute``, 429 pauses) hold for the cluster as a whole: a
`LimitBroker` actor leases capacity to the workers in blocks (`plait.ray.broker`).
``ray_address="auto"`` (``--ray-address``) joins a running cluster; with none, a
local Ray is started for the run and stopped after it.  `Pipeline` is the same
for Ray Data's ``map_batches``.  Needs ``pip install 'plait[ray]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from plait._lazy import lazy_exports

if TYPE_CHECKING:
    from plait.ray.cluster import ClusterUnreachable
    from plait.ray.data import Pipeline
    from plait.ray.spec import make_spec

__all__ = ["ClusterUnreachable", "Pipeline", "make_spec"]

__getattr__ = lazy_exports(
    __name__,
    {
        "ClusterUnreachable": "plait.ray.cluster",
        "Pipeline": "plait.ray.data",
        "make_spec": "plait.ray.spec",
    },
)
