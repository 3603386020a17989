"""What the commands that take a TARGET share on their command lines."""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "target_parser"]


def positive_int(text: str) -> int:
    """An argparse type: counts and limits, where 0 or less is always a mistake."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def target_parser(command: str, usage: str, description: str) -> argparse.ArgumentParser:
    """A parser that takes ``TARGET [key=value ...]`` first, as run, graph and train do.

    ``--help`` is the command's own (it prints the TARGET's blueprint too), so
    argparse's is off.
    """
    parser = argparse.ArgumentParser(
        prog=f"plait {command}",
        usage=usage,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    parser.add_argument("target", nargs="?", metavar="TARGET", help="file.py:Name or module:Name")
    parser.add_argument(
        "assignments", nargs="*", metavar="key=value", help="arguments for TARGET (blueprint)"
    )
    return parser
