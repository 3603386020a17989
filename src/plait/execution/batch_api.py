"""The batch-API backend: a run whose every LLM call goes through its provider's batch API.

``run_sync(inputs, backend="batch")``, ``plait run --batch-api``.  It is the local
backend (`plait.execution.runtime.LocalBackend`: this process's event loop, the same
engine, handlers and checkpoint) on other endpoints: each alias's calls are gathered
into the provider's batches (`plait.resources.batching`), at the batch price.  A
multi-stage pipeline runs unchanged: a stage's calls become ready as the previous
stage's batch comes back, and go in the next batch.

A batch takes minutes to hours, so the run keeps many inputs in flight (every input
of the batch up to ``BATCH_INPUTS_IN_FLIGHT``, or ``max_inputs_in_flight``) and no
limit on the calls waiting in batches.  With a checkpoint (``checkpoint_dir``, as
``plait run`` always has) the batches are recorded beside it in ``batches.jsonl``: a
run killed at any point and started again submits nothing twice and downloads no
result twice.  Without one it warns that it cannot resume.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plait.execution.runtime import Deliver, LocalBackend, Prepared
from plait.module import llm_aliases
from plait.resources.batching import BatchLedger, BatchResources
from plait.resources.manager import ResourceManager

if TYPE_CHECKING:
    from plait.execution.checkpoint import Checkpoint
    from plait.module import Module

__all__ = ["BATCH_INPUTS_IN_FLIGHT", "LEDGER_NAME", "BatchAPIBackend"]

_log = logging.getLogger("plait")

#: Inputs a batch run keeps in flight unless ``max_inputs_in_flight`` says otherwise:
#: enough that one stage of them fills a large batch, few enough to hold in memory.
BATCH_INPUTS_IN_FLIGHT = 50_000
#: The ledger's file in the checkpoint directory.
LEDGER_NAME = "batches.jsonl"


class BatchAPIBackend(LocalBackend):
    """`LocalBackend` on endpoints that send through their providers' batch APIs."""

    async def rows(
        self,
        module: Module,
        resources: Any,
        items: Iterable[Any],
        prepare: Callable[[Any], Prepared],
        deliver: Deliver,
        opts: dict[str, Any],
        checkpoint: Checkpoint | None = None,
    ) -> None:
        manager = ResourceManager.coerce(resources)
        check_batch_apis(module, manager)
        directory = checkpoint.directory if checkpoint is not None else opts["checkpoint_dir"]
        if directory is None:
            _log.warning(
                "plait: a batch run without checkpoint_dir cannot resume: batches submitted "
                "before an interruption would be paid for again; pass checkpoint_dir="
            )
        ledger = BatchLedger(None if directory is None else Path(directory) / LEDGER_NAME)
        batched = BatchResources(manager, ledger)
        window = opts["max_inputs_in_flight"] or BATCH_INPUTS_IN_FLIGHT
        # The calls waiting in batches hold no connection: the run's own limit is the
        # window of inputs, and each call takes no slot worth bounding.
        opts = {**opts, "max_inputs_in_flight": window, "max_concurrent": 4 * window}
        try:
            await super().rows(module, batched, items, prepare, deliver, opts, checkpoint)
        finally:
            await batched.aclose()
            ledger.close()


def check_batch_apis(module: Module, resources: ResourceManager) -> None:
    """Refuse, before any work, a pipeline with an alias whose provider sells no batches."""
    from plait.providers.base import BATCH_APIS
    from plait.resources.config import ConfigurationError

    aliases = sorted(llm_aliases(module))
    if not resources.config:
        raise ConfigurationError(
            "a batch run needs resources: without them every alias runs on the embedded "
            "local model, which has no batch API; pass resources= (a ResourceConfig)"
        )
    for alias in aliases:
        provider = resources.config_for(alias).provider
        if provider not in BATCH_APIS:
            known = ", ".join(repr(p) for p in BATCH_APIS)
            raise ConfigurationError(
                f"alias {alias!r} uses provider {provider!r}, which has no batch API plait "
                f"can use (those with one: {known}); run without backend='batch' "
                "(--batch-api), or give the alias such a provider"
            )
