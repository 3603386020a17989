"""The reference pages that are read from the code, so that they cannot drift from it.

A page holds a marker line, ``<!-- generated: NAME -->``; when MkDocs builds the site
this hook replaces it with the markdown `generated(NAME)` makes from the code:

* ``cli``: every ``plait`` command, from its argparse parser (``build_parser()`` in
  ``plait.cli.<command>``): usage, arguments and options (value, default, choices,
  help), and the description ``--help`` prints;
* ``resources-toml``: every key an alias takes, from the fields of
  `plait.resources.config.EndpointConfig` (type, constraints and default from pydantic,
  meaning from each field's ``description``).

``mkdocs.yml`` lists this file under ``hooks:``; ``tests/test_reference_pages.py``
checks what it makes against the parsers and the model.
"""

from __future__ import annotations

import argparse
import html
import importlib
import re
import types
import typing
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["MARKER", "cli_reference", "expand", "generated", "resources_reference"]

#: A marker line: ``<!-- generated: cli -->``.
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)

#: What each argparse ``type=`` function of plait's commands accepts, in words.
_VALUE_TYPES = {
    "positive_int": "integer ≥ 1",
    "non_negative_float": "number ≥ 0",
    "seed_value": "integer ≥ 0",
    "_port": "0 to 65535",
    "int": "integer",
    "float": "number",
}


# -- markdown ---------------------------------------------------------------------------------
def _cell(text: str) -> str:
    """Plain text as the content of a table cell: no markup read into it."""
    text = html.escape(" ".join(text.split()), quote=False)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _code(text: str) -> str:
    """Text as inline code in a table cell (a ``|`` would end the cell)."""
    return "`" + text.replace("|", "\\|") + "`"


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line.strip() else "" for line in text.splitlines())


# -- the CLI ----------------------------------------------------------------------------------
def command_parsers() -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(command, one-line summary, parser) for every ``plait`` command, in the order
    ``plait --help`` lists them."""
    from plait.cli import COMMANDS

    for name, (module_name, summary) in COMMANDS.items():
        module = importlib.import_module(module_name)
        build: Callable[[], argparse.ArgumentParser] | None = getattr(module, "build_parser", None)
        if build is None:
            raise RuntimeError(
                f"{module_name} has no build_parser(): the CLI reference reads every "
                "command's options from it"
            )
        yield name, summary, build()


def _option(action: argparse.Action) -> str:
    """The option's spellings, the last with the value it takes: ``-i``, ``--input FILE``
    (``--loss LOSS``: its choices are listed with what it does)."""
    names = list(action.option_strings)
    if action.nargs != 0:
        shown = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        names[-1] += f" {shown}"
    return ", ".join(_code(name) for name in names)


def _details(action: argparse.Action) -> str:
    """What the option does (its help), then what it accepts and its default."""
    parts = [_cell(action.help or "").rstrip(".") + "." if action.help else ""]
    kind = _VALUE_TYPES.get(getattr(action.type, "__name__", ""))
    if kind and action.nargs != 0:
        parts.append(f"A value: {kind}.")
    if action.choices is not None:
        parts.append("One of " + ", ".join(_code(str(choice)) for choice in action.choices) + ".")
    if isinstance(action, argparse._AppendAction) and "repeat" not in (action.help or ""):
        parts.append("Repeatable.")
    default = action.default
    if not (default is None or default == [] or action.nargs == 0):
        parts.append(f"Default: {_code(str(default))}.")
    return " ".join(part for part in parts if part)


def _arguments(actions: list[argparse.Action]) -> list[str]:
    if not actions:
        return []
    lines = ["| argument | what it is |", "|---|---|"]
    for action in actions:
        shown = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        many = " ..." if action.nargs == "*" else ""
        lines.append(f"| {_code(shown + many)} | {_details(action)} |")
    return [*lines, ""]


def _options(actions: list[argparse.Action]) -> list[str]:
    lines = ["| option | what it does |", "|---|---|"]
    for action in actions:
        lines.append(f"| {_option(action)} | {_details(action)} |")
    return [*lines, ""]


def _command(name: str, summary: str, parser: argparse.ArgumentParser) -> list[str]:
    positionals = [a for a in parser._actions if not a.option_strings]
    options = [a for a in parser._actions if a.option_strings]
    usage = parser.format_usage().strip().removeprefix("usage: ")
    lines = [
        f"## plait {name}",
        "",
        summary[0].upper() + summary[1:] + ".",
        "",
        "```text",
        usage,
        "```",
        "",
        *_arguments(positionals),
        *_options(options),
    ]
    if parser.description:
        lines += [
            f'??? note "What `plait {name} --help` says"',
            "",
            "    ```text",
            _indent(parser.description.rstrip()),
            "    ```",
            "",
        ]
    return lines


def cli_reference() -> str:
    """Every ``plait`` command: usage, argument and option tables, its description."""
    from plait.cli import _overview

    lines = ["```text", _overview(), "```", ""]
    for name, summary, parser in command_parsers():
        lines += _command(name, summary, parser)
    return "\n".join(lines)


# -- resources.toml ---------------------------------------------------------------------------
def _type_text(annotation: Any) -> str:
    """A field's type as a TOML user reads it."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kept = [arg for arg in args if arg is not type(None)]
        return " or ".join(_type_text(arg) for arg in kept)
    if origin is typing.Literal:
        return "one of " + ", ".join(_code(f'"{arg}"') for arg in args)
    if origin is dict:
        return "table of settings"
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _type_text(args[0])
        if item.startswith("one of "):
            return f"list of {item[len('one of ') :]}"
        if item == "table of settings":
            return "list of tables of settings"
        return f"list of {item}s"
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in names:
        return names[annotation]
    if getattr(annotation, "__name__", "") == "SecretStr":
        return "string (secret)"
    raise TypeError(f"no TOML name for the type {annotation!r}: add it to _type_text")


def _constraints(metadata: list[Any]) -> str:
    bounds = []
    for item in metadata:
        for attribute, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            bound = getattr(item, attribute, None)
            if bound is not None:
                bounds.append(f"{sign} {bound}")
    return " and ".join(bounds)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return _code("true" if value else "false")
    if isinstance(value, str):
        return _code(f'"{value}"')
    if isinstance(value, tuple):
        return _code("[" + ", ".join(f'"{item}"' for item in value) + "]")
    return _code(repr(value))


def _description(text: str) -> str:
    """A field's description (markdown already: code spans in backticks) for a cell."""
    return " ".join(text.split()).replace("|", "\\|")


def resources_reference(model: type[BaseModel] | None = None) -> str:
    """One row per key an alias takes (the fields of ``model``, by default
    `EndpointConfig`), in the model's order.

    Raises:
        ValueError: A field has no description, so the page could not say what it means.
    """
    if model is None:
        from plait.resources.config import EndpointConfig

        model = EndpointConfig
    lines = ["| key | type; default | what it means |", "|---|---|---|"]
    for name, field in model.model_fields.items():
        if not field.description:
            raise ValueError(
                f"{model.__name__}.{name} has no description: give it "
                "Field(description=...), which the resources.toml reference shows"
            )
        kind = _type_text(field.annotation)
        bounds = _constraints(field.metadata)
        if bounds:
            kind += f" {bounds}"
        default = "unset" if field.default is None else _toml_value(field.default)
        lines.append(f"| {_code(name)} | {kind}; {default} | {_description(field.description)} |")
    return "\n".join(lines) + "\n"


# -- the hook ---------------------------------------------------------------------------------
_GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "resources-toml": resources_reference,
}


def generated(name: str) -> str:
    """The markdown a ``<!-- generated: NAME -->`` marker stands for."""
    try:
        return _GENERATORS[name]()
    except KeyError:
        known = ", ".join(_GENERATORS)
        raise ValueError(f"no generated section {name!r} (known: {known})") from None


def expand(markdown: str) -> str:
    """``markdown`` with every marker line replaced by what it stands for."""
    return MARKER.sub(lambda found: generated(found.group(1)), markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs' hook: a page's markdown, markers expanded, before it is rendered."""
    return expand(markdown)
