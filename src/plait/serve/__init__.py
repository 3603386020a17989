"""A pipeline behind an HTTP API: invoke, batch, server-sent-event streams, background
jobs on checkpoints, health, and an OpenAPI schema read from ``forward``.

``plait serve TARGET`` runs it; ``plait.serve.app(pipeline)`` is the ASGI app to mount
in a server of your own.  Needs ``pip install 'plait[serve]'`` (FastAPI and uvicorn),
which ``import plait`` never loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["app"]


def app(pipeline: Any, resources: Any = None, **options: Any) -> FastAPI:
    """The ASGI app serving ``pipeline`` (see `plait.serve.http.app` for the options)."""
    try:
        from plait.serve.http import app as make
    except ImportError as exc:
        raise ImportError(
            f"plait.serve needs FastAPI and uvicorn ({exc}): pip install 'plait[serve]'"
        ) from None
    return make(pipeline, resources, **options)
