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
    """Put a pipeline behind an HTTP API: the ASGI app to run or mount in a server of your own.

    ``plait serve TARGET`` runs the same app.  Its endpoints: ``POST /invoke``
    (one input, ``forward``'s parameters by name, -> ``{"output": ...}``),
    ``POST /batch`` (``{"inputs": [...]}`` -> ``{"rows": [...]}``), ``POST /stream``
    (server-sent events, a row per input as it finishes), ``/jobs`` (background
    runs on checkpoints, with ``jobs_dir``), ``GET /health`` and the OpenAPI
    schema typed from ``forward`` (``/openapi.json``, ``/docs``).  Every request's
    inputs share one run of the pipeline, so each alias's limits hold for all
    clients together.  A failure inside the pipeline is that input's error (a
    ``502`` from ``/invoke`` when an endpoint failed, a ``500`` when the
    pipeline's code did), scrubbed of secrets.  A mounted app starts at its first
    request; for jobs to resume at startup and stop cleanly at shutdown, enter
    its lifespan from yours.

    Args:
        pipeline: The plait `Module` to serve.
        resources: Where its calls go (default: what the pipeline is bound to).
        **options: ``jobs_dir`` (a directory: enables the ``/jobs`` endpoints, each
            job a checkpoint directory under it, resumed by a server restarted
            on it), ``handlers`` (handlers entered around every request's and
            job's work: a budget, a cache...), ``max_concurrent`` (a cap on the
            LLM calls in flight for all requests together) and ``seed`` (the run
            seed, for sampling).

    Returns:
        The FastAPI app.

    Raises:
        ImportError: FastAPI or uvicorn is missing (``pip install 'plait[serve]'``).
        TypeError: An option the app does not take.

    Examples:
        ```python
        import json
        import socket
        import threading
        import time
        import urllib.request

        import uvicorn

        import plait
        import plait.serve


        class Review(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference("fast", "Review this text.")

            def forward(self, text: str) -> str:
                return self.llm(text)


        resources = plait.ResourceConfig(
            {"fast": plait.EndpointConfig(model="gpt-4o-mini", api_key_env="OPENAI_API_KEY")}
        )
        api = plait.serve.app(Review(), resources)

        # Serve it with uvicorn on a free port, in a thread, and call /invoke.
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(api, log_level="warning"))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
        thread.start()
        while not server.started:
            time.sleep(0.01)
        request = urllib.request.Request(
            f"http://127.0.0.1:{sock.getsockname()[1]}/invoke",
            data=json.dumps({"text": "Fast shipping."}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request) as reply:
            print(json.load(reply))  # {'output': '...'}
        server.should_exit = True
        thread.join()
        ```
    """
    try:
        from plait.serve.http import app as make
    except ImportError as exc:
        raise ImportError(
            f"plait.serve needs FastAPI and uvicorn ({exc}): pip install 'plait[serve]'"
        ) from None
    return make(pipeline, resources, **options)
