"""The ``plait`` command: ``plait run``, ``graph``, ``check``, ``train``, ``eval``, ``status``,
``serve``.

Each command lives in a module of its own and is imported only when used, so
``plait check`` does not pay for the tracer and ``plait --help`` pays for nothing.
Every command returns its exit status instead of exiting, so ``main()`` can be
called in-process (tests, notebooks) as well as from the console script.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Sequence

__all__ = ["main"]

#: command -> (module, one-line summary)
COMMANDS = {
    "run": ("plait.cli.run", "run a pipeline over a file of inputs (resumable, with progress)"),
    "graph": ("plait.cli.graph", "draw a pipeline's call graph (Mermaid, DOT, HTML); no calls"),
    "check": ("plait.cli.check", "check each resource alias: config, key, endpoint, model"),
    "train": ("plait.cli.train", "train a pipeline's prompts on a dataset (resumable, plotted)"),
    "eval": ("plait.cli.eval", "score a pipeline on a dataset: mean, 95% interval, failures"),
    "status": ("plait.cli.status", "show a run's checkpoint: finished inputs, pending batches"),
    "serve": ("plait.cli.serve", "serve a pipeline over HTTP: invoke, batch, stream, jobs"),
}

USAGE = "usage: plait [--version] [--help] COMMAND [ARGS]"


def _overview() -> str:
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<7} {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "`plait COMMAND --help` describes a command's arguments and options."]
    return "\n".join(lines)


def _reader_left() -> int:
    """What the command wrote to went away (``plait run T --help | head``): nothing is
    wrong with the command, so no traceback; stdout goes nowhere from here on (Python
    would otherwise fail again flushing it at exit), and the status is the one a
    program stopped by SIGPIPE has (128 + 13), as other command-line tools end."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (0 ok, 1 failures, 2 usage, 130 Ctrl-C)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_overview(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(_overview())
        return 0
    if args[0] == "--version":
        from plait._version import __version__

        print(f"plait {__version__}")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        known = ", ".join(COMMANDS)
        print(USAGE, file=sys.stderr)
        print(f"plait: error: unknown command {args[0]!r} (commands: {known})", file=sys.stderr)
        return 2
    module = importlib.import_module(command[0])
    try:
        status: int = module.main(args[1:])
    except SystemExit as exc:  # argparse reports usage errors (2) and --help (0) this way
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    except KeyboardInterrupt:
        print(f"plait {args[0]}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_left()
    except Exception as exc:
        # A failure no command turned into a message of its own: its traceback, through
        # the same scrubber as everything else plait writes (an endpoint may have quoted
        # the API key into the exception's message).
        from plait._secrets import scrub

        print(scrub("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
        return 1
    return status
