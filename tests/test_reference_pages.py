"""The reference pages of the documentation site say what the code does.

* ``docs/reference/cli.md`` and ``resources-toml.md`` are generated from the code when
  the site is built (``tools/docs_reference.py``, an MkDocs hook): these tests expand
  the pages as the build does and look for every option and every key in them.
* ``environment.md`` is written by hand: every environment variable the source reads
  (found by reading ``src/plait`` with `ast`) must be on it.
* ``spans.md``: every attribute, event and metric the OpenTelemetry handler writes
  (read from its source, and exported by a real run against the fake server) must be
  on it, and everything it names must be written by the code.
* ``exit-codes.md``: every exit status each command's code returns must be explained
  for that command.
* ``docs/reference/api/*.md``: every name a package exports is found by the tool that
  renders the page (griffe, which mkdocstrings uses), so none silently goes missing.
"""

from __future__ import annotations

import argparse
import ast
import html
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from .conftest import ROOT

SRC = ROOT / "src" / "plait"
REFERENCE = ROOT / "docs" / "reference"


def _hook() -> ModuleType:
    """The MkDocs hook, loaded from its file as MkDocs loads it."""
    path = ROOT / "tools" / "docs_reference.py"
    spec = importlib.util.spec_from_file_location("docs_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mkdocs() -> dict[str, Any]:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    # mkdocs.yml may hold !!python/name tags; none are needed to read hooks and nav.
    loaded: dict[str, Any] = yaml.load(text, Loader=yaml.BaseLoader)
    return loaded


def _plain(markdown: str) -> str:
    """Markdown as the reader sees its text: escapes undone, whitespace collapsed."""
    return " ".join(html.unescape(markdown.replace("\\", "")).split())


def _code_spans(text: str) -> set[str]:
    return set(re.findall(r"`([^`\n]+)`", text))


# -- the CLI -------------------------------------------------------------------------------------
def test_the_hook_is_registered_and_the_generated_pages_hold_its_markers() -> None:
    assert "tools/docs_reference.py" in _mkdocs()["hooks"]
    hook = _hook()
    assert hook.MARKER.search((REFERENCE / "cli.md").read_text(encoding="utf-8"))
    assert hook.MARKER.search((REFERENCE / "resources-toml.md").read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="no generated section 'nope'"):
        hook.generated("nope")


def _command_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    from plait.cli import COMMANDS

    for name, (module_name, _) in COMMANDS.items():
        yield name, importlib.import_module(module_name).build_parser()


def test_the_cli_page_has_every_command_option_choice_and_default() -> None:
    page = _hook().expand((REFERENCE / "cli.md").read_text(encoding="utf-8"))
    spans = _code_spans(page)
    commands = list(_command_parsers())
    assert len(commands) == 7
    for name, parser in commands:
        section = page.split(f"\n## plait {name}\n", 1)[1].split("\n## ", 1)[0]
        assert parser.format_usage().strip().removeprefix("usage: ") in section
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if not action.option_strings:
                assert any(str(action.metavar) in span for span in spans), action.metavar
                continue
            shown = _code_spans(section)
            for option in action.option_strings:
                assert any(span.split(" ")[0] == option for span in shown), (name, option)
            for choice in action.choices or ():
                assert f"`{choice}`" in section, (name, action.option_strings, choice)
            if action.default not in (None, False, [], argparse.SUPPRESS):
                assert f"Default: `{action.default}`" in section, (name, action.dest)
            if action.help:
                assert " ".join(action.help.split()) in _plain(section), (name, action.dest)
        assert parser.description is None or parser.description.splitlines()[0] in section


def test_every_command_has_a_parser_the_reference_can_read() -> None:
    """A command added to COMMANDS without ``build_parser()`` would break the build."""
    from plait.cli import COMMANDS

    for module_name, _ in COMMANDS.values():
        assert callable(getattr(importlib.import_module(module_name), "build_parser", None))


# -- resources.toml ------------------------------------------------------------------------------
def test_the_resources_page_has_a_row_for_every_key_with_its_default_and_meaning() -> None:
    from plait.resources.config import EndpointConfig

    page = _hook().expand((REFERENCE / "resources-toml.md").read_text(encoding="utf-8"))
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in page.splitlines()
        if line.startswith("| `")
    }
    for name, field in EndpointConfig.model_fields.items():
        assert name in rows, f"{name} is not on resources-toml.md"
        assert field.description is not None
        assert " ".join(field.description.split())[:40] in rows[name]
        default = field.default
        if isinstance(default, bool):
            assert str(default).lower() in rows[name], name
        elif isinstance(default, tuple):  # a list in TOML
            assert "[" + ", ".join(f'"{item}"' for item in default) + "]" in rows[name], name
        elif default is not None:
            assert str(default) in rows[name], name


def test_a_key_without_a_description_fails_the_build() -> None:
    from pydantic import BaseModel, Field

    class Described(BaseModel):
        model: str = Field(default="", description="the model")
        slots: int | None = Field(default=None, ge=1, description="how many")

    class Undescribed(Described):
        secret_knob: int = 3

    hook = _hook()
    table = hook.resources_reference(Described)
    assert '| `model` | string; `""` | the model |' in table
    assert "| `slots` | integer ≥ 1; unset | how many |" in table
    with pytest.raises(ValueError, match="secret_knob has no description"):
        hook.resources_reference(Undescribed)


# -- environment variables -----------------------------------------------------------------------
#: Reads whose variable is not a constant in the code, by (file, function): the variables
#: they read.  A new read of this kind fails `test_every_environment_variable_read_is_documented`
#: until it is listed here and its variables are on environment.md.
DYNAMIC_READS: dict[tuple[str, str], set[str]] = {
    # the variable an alias's api_key_env names (the page's own row)
    ("cli/check.py", "_key"): {"api_key_env"},
    ("resources/config.py", "_check_key_reference"): {"api_key_env"},
    ("resources/config.py", "resolved_api_key"): {"api_key_env"},
    ("ray/spec.py", "make_spec"): {"api_key_env"},
    # written on a Ray worker: the driver's api_key_env values and OTEL_* settings
    ("ray/worker.py", "load"): {"api_key_env"},
    ("handlers/telemetry.py", "__setstate__"): {"OTEL_*"},
    ("handlers/telemetry.py", "__init__"): {"OTEL_*"},
    # the base URL variable of the alias's provider
    ("resources/config.py", "_base_url_from_environment"): {
        "OPENAI_BASE_URL",
        "ANTHROPIC_BASE_URL",
    },
    # OTEL_TRACES_EXPORTER, OTEL_METRICS_EXPORTER, OTEL_LOGS_EXPORTER
    ("handlers/otel_setup.py", "_exporter_names"): {
        "OTEL_TRACES_EXPORTER",
        "OTEL_METRICS_EXPORTER",
        "OTEL_LOGS_EXPORTER",
    },
    ("handlers/otel_setup.py", "export_settings"): set(),  # hands environ to the two below
    ("handlers/otel_setup.py", "_protocol"): {
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    },
    ("handlers/otel_setup.py", "session"): {"OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER"},
    # copies the environment for the fake server's process, setting its key variable
    ("testing/__init__.py", "start"): {"PLAIT_FAKE_OPENAI_API_KEY", "PLAIT_FAKE_ANTHROPIC_API_KEY"},
}

_VARIABLE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return node.name
    return "<module>"


def _constants() -> dict[str, str]:
    """Every module-level ``NAME = "TEXT"`` in plait (the names a read may use)."""
    found: dict[str, str] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            target = value = None
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, value = node.target, node.value
            if (
                isinstance(target, ast.Name)
                and isinstance(value, ast.Constant)
                and isinstance(value.value, str)
            ):
                found[target.id] = value.value
    return found


def _is_environ(node: ast.AST) -> bool:
    """``os.environ``, or a mapping parameter named ``environ`` (passed os.environ)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


def environment_reads() -> dict[tuple[str, str], set[str | None]]:
    """(file, function) -> the variables each read there names: a text, or None when the
    name is computed (a variable, an attribute, the whole environment)."""
    constants = _constants()
    reads: dict[tuple[str, str], set[str | None]] = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        parents = _parents(tree)
        where = str(path.relative_to(SRC))
        for node in ast.walk(tree):
            key: ast.AST | None = None
            site: ast.AST | None = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                reads_one = node.func.attr in ("get", "pop") and _is_environ(owner)
                if reads_one or node.func.attr == "getenv":
                    key, site = (node.args[0] if node.args else None), node
                elif node.func.attr in ("items", "keys", "copy") and _is_environ(owner):
                    site = node  # the whole environment
            elif isinstance(node, ast.Subscript) and _is_environ(node.value):
                key, site = node.slice, node
            elif isinstance(node, ast.Compare) and any(
                _is_environ(right) for right in node.comparators
            ):
                key, site = node.left, node
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "dict"
                and node.args
                and _is_environ(node.args[0])
            ):
                site = node
            elif isinstance(node, ast.Call) and any(_is_environ(arg) for arg in node.args):
                site = node  # environ handed to a helper
            if site is None:
                continue
            name: str | None = None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                name = key.value
            elif isinstance(key, ast.Name) and key.id in constants:
                name = constants[key.id]
            reads.setdefault((where, _function(site, parents)), set()).add(name)
    return reads


def _documented(page: str) -> tuple[set[str], list[re.Pattern[str]]]:
    """The variables environment.md names: exact names, and patterns (``OTEL_BSP_*``)."""
    names, patterns = set(), []
    for span in _code_spans(page):
        if _VARIABLE.match(span):
            names.add(span)
        elif re.match(r"^[A-Z][A-Z0-9_]*\*$", span):
            patterns.append(re.compile(re.escape(span[:-1]) + r"[A-Z0-9_]*$"))
    return names, patterns


def test_every_environment_variable_read_is_documented() -> None:
    page = (REFERENCE / "environment.md").read_text(encoding="utf-8")
    names, patterns = _documented(page)
    reads = environment_reads()
    # The scan finds the reads this page was written from (it would find none if broken).
    assert reads[("ray/cluster.py", "connect_timeout")] == {"PLAIT_RAY_CONNECT_TIMEOUT"}
    assert reads[("handlers/otel_setup.py", "capture_content_from")] == {
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
    }
    missing = []
    for site, found in reads.items():
        wanted = {name for name in found if name is not None}
        if None in found:
            if site not in DYNAMIC_READS:
                missing.append(
                    f"{site}: reads a variable whose name is computed; say which in "
                    "DYNAMIC_READS and document it on docs/reference/environment.md"
                )
                continue
            wanted |= DYNAMIC_READS[site]
        for name in wanted:
            if name == "api_key_env":
                if "the variable an alias's `api_key_env` names" not in page:
                    missing.append(f"{site}: the variable api_key_env names")
            elif name.endswith("*"):
                if f"`{name}`" not in page and not any(
                    span.startswith(name[:-1]) for span in names
                ):
                    missing.append(f"{site}: {name}")
            elif name not in names and not any(p.match(name) for p in patterns):
                missing.append(f"{site}: {name}")
    assert not missing, "not on docs/reference/environment.md:\n" + "\n".join(missing)


def test_the_environment_page_names_no_plait_variable_the_code_does_not_read() -> None:
    page = (REFERENCE / "environment.md").read_text(encoding="utf-8")
    names, _ = _documented(page)
    read = {name for found in environment_reads().values() for name in found if name}
    read |= {name for names_ in DYNAMIC_READS.values() for name in names_}
    ours = {name for name in names if name.startswith("PLAIT_")}
    assert ours == {name for name in read if name.startswith("PLAIT_")}
    assert {"OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"} <= read


# -- span attributes -----------------------------------------------------------------------------
#: An attribute, event or metric name, in the namespaces plait writes to (the rest of
#: the dotted text in the handler's source is host names and modules).
_ATTRIBUTE = re.compile(r"^(gen_ai|plait|server|error|exception|service|telemetry)(\.[a-z0-9_]+)+$")


def _loop_values(node: ast.AST, name: str, parents: dict[ast.AST, ast.AST]) -> list[str] | None:
    """The constants ``name`` takes in the ``for name in ("a", "b")`` around ``node``."""
    while node in parents:
        node = parents[node]
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and isinstance(node.iter, ast.Tuple)
        ):
            return [elt.value for elt in node.iter.elts if isinstance(elt, ast.Constant)]
    return None


def _telemetry_names() -> tuple[set[str], set[str]]:
    """What the handler's source writes: (names of attributes, events and metrics; the
    event names and event attributes of a call's phases, from every ``timing.add``)."""
    names: set[str] = set()
    for file in ("handlers/telemetry.py", "handlers/otel_setup.py"):
        tree = ast.parse((SRC / file).read_text(encoding="utf-8"))
        parents = _parents(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr):
                head = node.values[0] if node.values else None
                prefix = head.value if isinstance(head, ast.Constant) else ""
                if not (isinstance(prefix, str) and _ATTRIBUTE.match(prefix + "x")):
                    continue
                part = node.values[1] if len(node.values) == 2 else None
                value = part.value if isinstance(part, ast.FormattedValue) else None
                loop = (
                    _loop_values(node, value.id, parents) if isinstance(value, ast.Name) else None
                )
                if loop is not None:
                    names |= {prefix + item for item in loop}
                else:  # f"plait.{...}": a phase's event or its info (below)
                    assert _function(node, parents) == "_add_phase", ast.unparse(node)
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _ATTRIBUTE.match(node.value)
                and not isinstance(parents.get(node), ast.JoinedStr)
            ):
                names.add(node.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_event"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(node.args[0].value)  # "exception"
    phases: set[str] = {"plait.duration_s"}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "timing"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                phases.add(f"plait.{node.args[0].value}")
                phases |= {f"plait.{kw.arg}" for kw in node.keywords if kw.arg}
    return names, phases


def _page_names() -> set[str]:
    """The names in the first column of every table on spans.md, and the attributes
    its Metrics section lists in prose."""
    page = (REFERENCE / "spans.md").read_text(encoding="utf-8")
    names: set[str] = set()
    for line in page.splitlines():
        if line.startswith("| `"):
            names |= _code_spans(line.split("|")[1])
        elif line.startswith("| "):  # events table: its third column lists attributes
            cells = line.split("|")
            if len(cells) > 3:
                names |= {s for s in _code_spans(cells[3]) if _ATTRIBUTE.match(s)}
    metrics = page.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    names |= {span for span in _code_spans(metrics) if _ATTRIBUTE.match(span)}
    events = page.split("## Events", 1)[1].split("\n## ", 1)[0]
    names |= {span for span in _code_spans(events) if _ATTRIBUTE.match(span)}
    return {name for name in names if _ATTRIBUTE.match(name) or name == "exception"}


def _exported(server: Any, tmp_path: Path) -> set[str]:
    """Every attribute, event and metric name a real run exports: calls that succeed,
    fail, are retried after a 429, are answered from a cache, with content captured."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import plait
    from plait.handlers import cache, otel

    from .conftest import make_resources

    class Review(plait.Module):
        def __init__(self) -> None:
            super().__init__()
            self.summarize = plait.LLMInference(alias="fast", system_prompt="Summarize.")
            self.grade = plait.LLMInference(alias="fast", system_prompt="Grade it.")

        def forward(self, review: str) -> str:
            return self.grade(self.summarize(review))

    resources = make_resources(
        server,
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
        max_retries=1,
        max_retry_after_s=0.05,
    )
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    inputs = ["a fine product", "[[status:400]] refused", "[[status:429]] busy"]
    pipeline = Review().bind(resources=resources, seed=3)
    with otel(tracer_provider, MeterProvider(metric_readers=[reader]), capture_content=True):
        pipeline.run_sync(inputs)
        with cache(tmp_path / "calls"):
            pipeline.run_sync(inputs[:1])
            pipeline.run_sync(inputs[:1])
    found: set[str] = set()
    outcomes = set()
    for span in spans.get_finished_spans():
        found |= set(span.attributes or {})
        outcomes.add((span.attributes or {}).get("plait.outcome"))
        for event in span.events:
            found.add(event.name)
            found |= set(event.attributes or {})
    assert {"ok", "error", "cache hit"} <= outcomes  # the paths this run was meant to take
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                found.add(metric.name)
                for point in metric.data.data_points:
                    found |= set(point.attributes or {})
    return found


def test_the_spans_page_lists_exactly_what_the_handler_writes(server: Any, tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from plait.handlers.telemetry import SEMCONV_VERSION

    page = (REFERENCE / "spans.md").read_text(encoding="utf-8")
    assert f"version **{SEMCONV_VERSION}**" in page
    listed = _page_names()
    written, phases = _telemetry_names()
    exported = _exported(server, tmp_path)
    # What the run exported is what the source writes (the scan is not missing a way).
    assert exported - written - phases == set()
    assert {"plait.retries", "plait.backoff", "gen_ai.output.messages", "exception"} <= exported
    missing = (written | phases | exported) - listed
    assert not missing, f"written by plait, not on docs/reference/spans.md: {sorted(missing)}"
    stale = listed - written - phases - exported
    assert not stale, f"on docs/reference/spans.md, written by no code: {sorted(stale)}"


# -- exit codes ----------------------------------------------------------------------------------
def _statuses_returned(tree: ast.AST) -> set[int]:
    """The exit statuses a command module's code can return: ``return N``,
    ``return A if ... else B``, ``report_error(..., N)`` / ``_error(..., N)`` (2 when no
    status is given), and argparse's usage error (2) and ``--help`` (0)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None:
            value = node.value
            options = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
            found |= {
                o.value for o in options if isinstance(o, ast.Constant) and type(o.value) is int
            }
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("report_error", "_error"):
                given = [a.value for a in node.args if isinstance(a, ast.Constant)]
                given += [k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)]
                statuses = [g for g in given if type(g) is int]
                found |= set(statuses) or {2}
            elif node.func.id == "parse_target_args":
                found |= {0, 2}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("parse_args", "parse_intermixed_args")
        ):
            found |= {0, 2}
    return found


def _page_statuses() -> dict[str, dict[int, str]]:
    """Each section of exit-codes.md (``Every command``, ``plait run``, ...) -> its table."""
    page = (REFERENCE / "exit-codes.md").read_text(encoding="utf-8")
    sections: dict[str, dict[int, str]] = {}
    for chunk in page.split("\n## ")[1:]:
        title, _, body = chunk.partition("\n")
        rows = re.findall(r"^\| (\d+) \| (.+) \|$", body, flags=re.MULTILINE)
        sections[title.strip()] = {int(status): meaning for status, meaning in rows}
    return sections


def test_every_exit_status_a_command_returns_is_explained_for_it() -> None:
    from plait.cli import COMMANDS

    sections = _page_statuses()
    every = _statuses_returned(ast.parse((SRC / "cli" / "__init__.py").read_text("utf-8")))
    # `plait` itself: 0 (--help, --version), 2 (no or unknown command), 130 (Ctrl-C),
    # 1 (a failure no command turned into a message), 141 (the reader left).
    assert every | {1, 130} == set(sections["Every command"]) == {0, 1, 2, 130, 141}
    for name, (module_name, _) in COMMANDS.items():
        path = SRC / Path(*module_name.split(".")[1:]).with_suffix(".py")
        returned = _statuses_returned(ast.parse(path.read_text(encoding="utf-8")))
        explained = set(sections[f"plait {name}"])
        assert returned <= explained, f"plait {name} returns {sorted(returned - explained)}"
        assert explained <= returned | {1, 130}, f"plait {name}: {sorted(explained - returned)}"
        assert 0 in explained and 2 in explained


def test_the_exit_statuses_the_commands_describe_match_the_page() -> None:
    """Each ``--help`` that ends with "Exit status: 0 ..., 1 ..." lists the statuses
    the page gives for that command."""
    sections = _page_statuses()
    for name, parser in _command_parsers():
        described = (parser.description or "").split("Exit status:", 1)
        if len(described) == 1:
            continue
        said = {int(n) for n in re.findall(r"\b(0|1|2|130)\b", described[1])}
        assert said == set(sections[f"plait {name}"]), name


# -- the Python API ------------------------------------------------------------------------------
def _api_pages() -> dict[str, Path]:
    """Module -> its page, for every ``::: module`` in docs/reference/api/."""
    pages = {}
    for path in sorted((REFERENCE / "api").glob("*.md")):
        found = re.findall(r"^::: ([\w.]+)$", path.read_text(encoding="utf-8"), re.MULTILINE)
        assert found == [path.stem], f"{path.name} renders {found}, not {path.stem}"
        pages[path.stem] = path
    return pages


def test_every_public_package_has_an_api_page_in_the_navigation() -> None:
    pages = _api_pages()
    packages = {"plait"} | {
        f"plait.{path.parent.name}"
        for path in SRC.glob("*/__init__.py")
        if not path.parent.name.startswith("_")
    }
    # What a user imports from; the rest are plait's own layers (see architecture.md).
    internal = {"plait.cli", "plait.execution", "plait.tracing"}
    assert packages - internal <= set(pages), sorted(packages - internal - set(pages))
    nav = yaml.safe_dump(_mkdocs()["nav"])
    for module in pages:
        assert f"reference/api/{module}.md" in nav, module


def test_every_exported_name_is_found_by_the_api_reference() -> None:
    """mkdocstrings renders what griffe finds: a name in ``__all__`` that griffe cannot
    see (a lazy export with no import it can read) would be missing from its page."""
    griffe = pytest.importorskip("griffe")
    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")])
    package = loader.load("plait")
    loader.resolve_aliases(implicit=False, external=None)
    missing = []
    for module_name in _api_pages():
        module = importlib.import_module(module_name)
        documented = package if module_name == "plait" else package[module_name[6:]]
        for name in module.__all__:
            member = documented.members.get(name)
            if member is None or (member.is_alias and not member.resolved):
                missing.append(f"{module_name}.{name}")
    assert not missing, f"not rendered on their API pages: {missing}"


# -- benchmarks ----------------------------------------------------------------------------------
def test_every_figure_on_the_benchmarks_page_is_in_the_measured_results() -> None:
    """docs/benchmarks.md copies its tables from benchmarks/RESULTS.md (the record the
    benchmark scripts write): a figure there that is not in the record was not measured."""
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 60
    figures = {
        figure
        for row in rows
        for figure in re.findall(r"(?<![\w.])\$?\d[\d,]*(?:\.\d+)?%?", row)
        if len(figure.strip("$%")) > 1
    }
    assert not sorted(f for f in figures if f not in results)
