"""What the commands that take a TARGET share on their command lines."""

from __future__ import annotations

import argparse
import sys

__all__ = ["parse_target_args", "positive_int", "target_parser"]


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


def parse_target_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """Parse; answer ``--help`` and a missing TARGET here (an exit status), else the args.

    ``--help`` prints the TARGET's blueprint arguments (type, value, layer) before
    the command's own options, since those are what a user is usually looking for.
    """
    ns = parser.parse_intermixed_args(argv)
    if ns.help:
        if ns.target is not None:
            from plait.cli.target import Target, TargetError
            from plait.resources.config import ConfigurationError

            try:
                text = Target(ns.target, ns.assignments).help()
            except (TargetError, ConfigurationError) as exc:
                text = f"(cannot describe {ns.target}: {exc})"
            print(f"Arguments of {ns.target}:\n{text.rstrip()}\n")
        parser.print_help()
        return 0
    if ns.target is None:
        parser.print_usage(sys.stderr)
        print(
            f"{parser.prog}: error: TARGET is missing: give file.py:Name or package.module:Name",
            file=sys.stderr,
        )
        return 2
    return ns
