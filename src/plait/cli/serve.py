"""``plait serve``: a pipeline behind an HTTP API, on uvicorn.

The target is loaded and its resources resolved as ``plait run`` does (the same
options, the same errors) before the server binds its port, so a target that cannot
load is a one-line error and exit status 2, never a server that answers 500s.

Shutdown (SIGTERM, or Ctrl-C): the port stops accepting, requests in flight get up to
``--grace`` seconds to finish (then they are cancelled), running jobs stop where they
are (their checkpoints hold every finished call), and the process exits; started again
on the same ``--jobs-dir``, the server resumes those jobs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from plait.cli.options import (
    UsageError,
    add_otel_argument,
    add_parameters_argument,
    add_profile_argument,
    add_resources_argument,
    add_run_settings_arguments,
    non_negative_float,
    otel_handler,
    parse_target_args,
    report_error,
    resolve_resources,
    target_parser,
)
from plait.cli.parameters import ParametersError, load_parameters
from plait.effects import Handler
from plait.handlers.profiling import Profiler, profile
from plait.resources.config import ConfigurationError
from plait.target import Target, TargetError

__all__ = ["build_parser", "main"]

DESCRIPTION = """\
Serve TARGET over HTTP (FastAPI on uvicorn; needs `pip install 'plait[serve]'`):
  POST /invoke           one input (forward's parameters by name) -> {"output": ...}
  POST /batch            {"inputs": [...]} -> {"rows": [...]}, in input order
  POST /stream           {"inputs": [...]} -> server-sent events, a row per input as it
                         finishes, then a summary
  POST /jobs             {"inputs": [...]} -> a background job (needs --jobs-dir)
  GET  /jobs/ID          its state and counts;  GET /jobs/ID/result  its rows once ended
  DELETE /jobs/ID        cancel it (an ended job: delete it)
  GET  /health           200 ready, 503 starting or shutting down
  GET  /openapi.json     the schema, from forward's signature; /docs to try it

Every request shares one run of the pipeline: the endpoints' limits and
--max-concurrent hold for all of them, and every job, together.

SIGTERM or Ctrl-C: stop accepting, let requests in flight finish (up to --grace
seconds), stop the jobs where they are and exit; a server started again on the
same --jobs-dir resumes them, paying for no call that had finished.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = target_parser("serve", "plait serve TARGET [key=value ...] [options]", DESCRIPTION)
    add_resources_argument(parser)
    add_parameters_argument(parser)
    add_run_settings_arguments(parser)
    add_profile_argument(parser)
    add_otel_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=8000, help="port to listen on (8000; 0: any free one)"
    )
    parser.add_argument(
        "--jobs-dir",
        metavar="DIR",
        help="keep background jobs here, each a checkpoint (without it: no /jobs)",
    )
    parser.add_argument(
        "--grace",
        type=non_negative_float,
        default=30.0,
        metavar="SECONDS",
        help="on shutdown, how long requests in flight may take to finish before they are "
        "cancelled (30; 0: at once)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (info: a line per request)",
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def main(argv: list[str]) -> int:
    ns = parse_target_args(build_parser(), argv)
    if isinstance(ns, int):
        return ns
    try:
        from plait.serve.http import app
        from plait.serve.server import serve
    except ImportError as exc:
        return report_error(
            "serve", f"plait serve needs FastAPI and uvicorn ({exc}): pip install 'plait[serve]'"
        )
    handlers: list[Handler] = []
    profiler: Profiler | None = None
    telemetry: Any = contextlib.nullcontext()
    try:
        if ns.profile is not None:
            _refuse_to_clobber(ns)
            profiler = profile()
            handlers.append(profiler)
        telemetry = otel_handler(ns)
        if isinstance(telemetry, Handler):
            handlers.append(telemetry)
        module = Target(ns.target, ns.assignments).make()
        if ns.parameters is not None:
            load_parameters(module, ns.parameters, "serve", sys.stderr)
        resources = resolve_resources("serve", ns.target, module, ns.resources)
        api = app(
            module,
            resources,
            jobs_dir=ns.jobs_dir,
            handlers=handlers,
            max_concurrent=ns.max_concurrent,
            seed=ns.seed,
        )
    except (UsageError, TargetError, ConfigurationError, ParametersError, TypeError) as exc:
        return report_error("serve", str(exc))
    if ns.jobs_dir is not None and (problem := _unwritable(Path(ns.jobs_dir))) is not None:
        return report_error("serve", problem)
    try:
        sock = _listen(ns.host, ns.port)
    except OSError as exc:
        return report_error(
            "serve", f"cannot listen on {ns.host}:{ns.port} ({exc.strerror or exc}); give --port"
        )
    host, port = sock.getsockname()[:2]
    print(f"plait serve: {ns.target} on http://{host}:{port}", file=sys.stderr, flush=True)
    _log_to_stderr(ns.log_level)
    try:
        # Open for the server's life: its exporters live as long as the server, and the
        # spans every request and job leaves are flushed once, when it stops.
        with telemetry:
            started = serve(api, sock, ns.grace, ns.log_level)
    finally:
        sock.close()
        if profiler is not None:  # every request's and job's calls, since the start
            profiler.write(ns.profile)
            print(f"plait serve: trace: {ns.profile} (open it in ui.perfetto.dev)", file=sys.stderr)
    if not started:
        return report_error("serve", "the server did not start (see the lines above)", 1)
    print("plait serve: stopped", file=sys.stderr, flush=True)
    return 0


def _refuse_to_clobber(ns: argparse.Namespace) -> None:
    """The trace is written at shutdown: never over a file the server reads, and only
    where it can be written, both checked before the port is bound."""
    from plait.cli.run import check_writable, refuse_to_clobber
    from plait.target import code_files

    reads = {"--resources": ns.resources, "--parameters": ns.parameters}
    refuse_to_clobber(reads, {"--profile": ns.profile})
    for path in code_files(ns.target):
        refuse_to_clobber({"TARGET": path}, {"--profile": ns.profile})
    check_writable("--profile", Path(ns.profile))


def _log_to_stderr(level: str) -> None:
    """The server's own lines (a job resumed or skipped at startup) on stderr beside
    uvicorn's, at the level ``--log-level`` gives both."""
    logger = logging.getLogger("plait.serve")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def _unwritable(directory: Path) -> str | None:
    """Why jobs cannot be kept in ``directory``, found before the port is bound."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create --jobs-dir {directory} ({exc.strerror or exc}); choose another"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"--jobs-dir {directory} is not writable; choose a directory you can write to"
    return None


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {value}")
    return value


def _listen(host: str, port: int) -> socket.socket:
    """Bind the port here, so the address printed is the one bound (``--port 0``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock
