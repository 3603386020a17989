"""What the commands that take a TARGET share on their command lines."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import Any

__all__ = [
    "UsageError",
    "add_otel_argument",
    "add_profile_argument",
    "add_run_settings_arguments",
    "make_loss",
    "needs_target",
    "non_negative_float",
    "note_embedded",
    "otel_handler",
    "parse_target_args",
    "positive_int",
    "report_error",
    "resolve_resources",
    "target_parser",
]


class UsageError(Exception):
    """A problem with the command line or configuration: exit status 2."""


def report_error(command: str, message: str, status: int = 2) -> int:
    """Say what went wrong on stderr, as ``plait COMMAND: error: ...``; the exit status."""
    print(f"plait {command}: error: {message}", file=sys.stderr)
    return status


#: Resource files a user may have left in the working directory and expect to be read.
_RESOURCE_FILES = ("resources.toml", "resources.yaml", "resources.yml")


def note_embedded(command: str, module: Any, resources: Any, given: str | None) -> None:
    """Say once, on stderr, which aliases will run on the embedded model, and how to point
    them elsewhere; and that a resource file in the working directory was not read.

    A run on the 135M-parameter model looks like a bad pipeline, not like a missing
    ``--resources``, and a ``resources.toml`` next to the data looks like it is in use.
    """
    from pathlib import Path

    from plait.resources.manager import embedded_said

    config = getattr(resources, "config", resources)  # a bound ResourceManager
    if given is not None or config:
        return
    aliases = sorted({m.alias for m in module.modules() if getattr(m, "_calls_llm", False)})
    if not aliases or embedded_said():
        return
    names = ", ".join(map(repr, aliases))
    print(
        f"plait {command}: {names} run on the embedded local model (SmolLM2-135M-Instruct, "
        "in-process): no resources were given; to use your endpoints, pass --resources "
        "resources.toml (plait check --resources resources.toml tests them)",
        file=sys.stderr,
    )
    for name in _RESOURCE_FILES:
        if Path(name).is_file():
            print(
                f"plait {command}: ./{name} was NOT used (plait reads no resource file unless "
                f"told): add --resources {name} to use it",
                file=sys.stderr,
            )


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number that may be 0 (a margin, a threshold)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def seed_value(text: str) -> int:
    """An argparse type: a run seed (`plait.sampling.check_seed` says what one is)."""
    from plait.sampling import SeedError, check_seed

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a seed, an integer >= 0, got {text!r}"
        ) from None
    try:
        return check_seed(value, "a seed")
    except SeedError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    """An argparse type: counts and limits, where 0 or less is always a mistake."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


#: The losses ``plait train`` and ``plait eval`` score examples with.
LOSSES = ("exact", "contains", "judge")


def add_resources_argument(parser: argparse.ArgumentParser) -> None:
    """``--resources``, worded the same for every command that runs a pipeline."""
    parser.add_argument(
        "--resources",
        metavar="FILE",
        help="aliases -> endpoints (TOML or YAML); default: the embedded local model",
    )


def add_run_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """The settings of a pipeline's runs that every command running one shares
    (``plait run``, ``plait serve``): the run-wide cap on LLM calls and the run seed."""
    parser.add_argument(
        "--max-concurrent", type=positive_int, metavar="N", help="LLM calls in flight (100)"
    )
    parser.add_argument(
        "--seed",
        type=seed_value,
        metavar="N",
        help="run seed: every LLM call sends a seed derived from it, so a sampled run repeats",
    )


def resolve_resources(command: str, target: str, module: Any, path: str | None) -> Any:
    """The `ResourceManager` a command runs ``module`` on: ``--resources`` (``path``) if
    given, else what the target is bound to, else the embedded model (said once on
    stderr).  Every alias is resolved now, so a missing one is a usage error before
    anything runs."""
    from plait.module import llm_aliases
    from plait.resources.config import ResourceConfig
    from plait.resources.manager import ResourceManager

    config: Any = module._bound_resources
    if path is not None:
        config = ResourceConfig.load(path)
    manager = ResourceManager.coerce(config)
    note_embedded(command, module, manager, path)
    aliases = sorted(llm_aliases(module))
    missing = [alias for alias in aliases if manager.config and alias not in manager.config]
    if missing:
        where = path or "the resources the target is bound to"
        raise UsageError(
            f"{target} uses the alias(es) {', '.join(map(repr, missing))}, which "
            f"{where} does not define (it defines: {', '.join(manager.config)}); add them "
            "there, or change the module's alias"
        )
    for alias in aliases:
        manager.endpoint(alias)
    return manager


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """``--profile``: the `profile` handler over everything the command runs, its
    Perfetto trace written when the command ends (``plait run``, ``plait serve``)."""
    parser.add_argument("--profile", metavar="TRACE", help="write a Perfetto trace (JSON) here")


def add_parameters_argument(parser: argparse.ArgumentParser) -> None:
    """``--parameters``: learned values to load before the run (``plait run``/``eval``)."""
    parser.add_argument(
        "--parameters",
        metavar="FILE",
        help="load learned values (the parameters.json plait train writes)",
    )


def add_example_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of commands that read labelled examples (``plait train`` and
    ``plait eval``): which field is the input, which the target, and how to score."""
    parser.add_argument(
        "--input-field",
        metavar="NAME",
        help="the field passed to the pipeline (default: fields named like forward's "
        "parameters, else input)",
    )
    parser.add_argument(
        "--target-field",
        metavar="NAME",
        help="the field holding the expected answer, given to the loss (default: target)",
    )
    parser.add_argument(
        "--loss", choices=LOSSES, help="how an output is scored against the target (exact)"
    )
    parser.add_argument(
        "--metric",
        metavar="MODULE:FUNCTION",
        help="score with your function metric(example, prediction) -> bool or a number in "
        "[0, 1] (module:function or path/to/file.py:function), instead of --loss",
    )
    parser.add_argument(
        "--criteria", action="append", metavar="TEXT", help="what the judge grades (repeatable)"
    )
    parser.add_argument(
        "--judge-alias",
        default="judge",
        metavar="ALIAS",
        help="the alias the judge's calls use, with --loss judge (judge)",
    )


def needs_target(ns: argparse.Namespace) -> bool:
    """Whether every example must have a target: ``--loss exact`` and ``contains``
    compare with it; a judge and a metric can score without one, unless
    ``--target-field`` names it."""
    return ns.target_field is not None or (ns.metric is None and ns.loss != "judge")


def make_loss(ns: argparse.Namespace, module: Any) -> Any:
    """The loss the example options ask for (``plait train`` and ``plait eval``): a
    metric function (``--metric``) or a named loss (``--loss``, exact by default).
    Everything it needs is checked now, before any call: a metric that cannot be
    imported or called as one is a `UsageError` naming the reference."""
    from plait.learning import losses

    if ns.metric is not None:
        if ns.loss is not None:
            raise UsageError(
                f"--loss {ns.loss} and --metric {ns.metric} both say how to score: give one"
            )
        return _metric_loss(ns, module)
    if ns.loss in (None, "exact"):
        return losses.ExactMatch()
    if ns.loss == "contains":
        return losses.Contains()
    if not ns.criteria:
        raise UsageError("--loss judge needs --criteria TEXT: what the judge should grade")
    return losses.LLMJudge(ns.judge_alias, ns.criteria)


def _metric_loss(ns: argparse.Namespace, module: Any) -> Any:
    """``--metric module:function`` (or ``path/to/file.py:function``) as a `MetricLoss`."""
    from plait.blueprint import load_object
    from plait.learning.data import input_field_name
    from plait.learning.losses import MetricLoss

    spec: str = ns.metric
    fix = "give --metric module:function or --metric path/to/file.py:function"
    if ":" not in spec.strip(":"):
        raise UsageError(f"--metric {spec}: no function named; {fix}")
    try:
        metric = load_object(spec)
    except Exception as exc:  # the metric's own module may raise anything while importing
        raise UsageError(f"--metric {spec}: {exc}; {fix}") from None
    target_field = ns.target_field or "target"
    input_field = input_field_name(ns.data, ns.input_field, target_field, forward=module.forward)
    try:
        return MetricLoss(metric, spec, target_field=target_field, input_field=input_field)
    except TypeError as exc:  # its message starts with the reference
        raise UsageError(f"--metric {exc}") from None


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
            from plait.resources.config import ConfigurationError
            from plait.target import Target, TargetError

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


def add_otel_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--otel",
        action="store_true",
        help="export OpenTelemetry spans and GenAI metrics as the standard OTEL_* "
        "variables say (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_TRACES_EXPORTER, "
        "OTEL_METRICS_EXPORTER, OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT, ...; "
        "needs plait[otel])",
    )


def otel_handler(ns: argparse.Namespace) -> Any:
    """The `plait.handlers.otel` handler ``--otel`` asks for (exporting where the
    standard ``OTEL_*`` variables say), or a block that does nothing without it."""
    if not getattr(ns, "otel", False):
        return contextlib.nullcontext()
    try:
        from plait.handlers.telemetry import TelemetrySettingsError, otel
    except ImportError as exc:
        raise UsageError(f"--otel: {exc}") from None
    try:
        return otel()
    except TelemetrySettingsError as exc:
        raise UsageError(f"--otel: {exc}") from None
