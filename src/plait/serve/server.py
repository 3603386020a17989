"""uvicorn, running a served pipeline with the shutdown an operations team expects."""

from __future__ import annotations

import math
import signal
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

__all__ = ["Server", "serve"]


class Server(uvicorn.Server):
    """uvicorn's server, telling the service the moment shutdown begins: health turns
    not-ready and new work is refused while the requests in flight finish."""

    def __init__(self, config: uvicorn.Config, service: Any) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.service.draining = True
        super().handle_exit(sig, frame)


def serve(api: FastAPI, sock: socket.socket, grace: float, log_level: str) -> bool:
    """Serve ``api`` on the bound ``sock`` until SIGTERM or SIGINT; whether it started.

    Shutdown: the socket stops accepting, requests in flight get ``grace`` seconds to
    finish (then they are cancelled), then the app's lifespan ends (jobs stopped where
    they are, on their checkpoints).
    """
    config = uvicorn.Config(
        api,
        log_level=log_level,
        timeout_graceful_shutdown=math.ceil(grace),  # 0: cancel them at once
        lifespan="on",
    )
    server = Server(config, api.state.service)
    # uvicorn raises the signal that stopped it again once it is done, to end the
    # process the signal's way: after a shutdown that succeeded, SIGTERM ends here.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
    return bool(server.started)
