"""plait's layers import one way, and ``import plait`` stays light.

The import graph is read from the source with `ast`, so it holds every import a
module can make: top-level, inside functions, and under ``TYPE_CHECKING``.  Two
rules hold over it:

* no cycle between modules (a package's ``__init__`` counts as a module);
* no import from a lower layer into a higher one.

The layers, lowest first, are declared in `LAYERS` here and described in
``docs/architecture.md``; a module belongs to the first layer with a prefix that
names it (a package prefix covers everything inside it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "plait"

#: Lowest first.  A module may import from its own layer and the layers before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("utilities", ("plait._",)),
    ("data", ("plait.inputs",)),
    ("core", ("plait.effects", "plait.options", "plait.values", "plait.parameter", "plait.module")),
    ("modules", ("plait.containers", "plait.not_data")),
    ("tracing", ("plait.tracing",)),
    ("text", ("plait.labels", "plait.retrieval")),
    ("llm", ("plait.providers", "plait.resources", "plait.structured", "plait.demos")),
    ("nn", ("plait.inference", "plait.sampling", "plait.sequences")),
    ("handlers", ("plait.handlers",)),
    ("execution", ("plait.execution", "plait.functional")),
    ("learning", ("plait.learning",)),
    ("configuration", ("plait.blueprint", "plait.target")),
    ("backends", ("plait.ray",)),
    ("interfaces", ("plait.cli", "plait.testing", "plait.serve")),
    ("composition root", ("plait",)),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(node: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """The dotted names one import statement asks for (``from m import n`` asks
    for ``m.n``, which is a module or a name inside ``m``)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = name.split(".") if is_package else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            origin = ".".join([*base, *([node.module] if node.module else [])])
        else:
            origin = node.module or ""
        for alias in node.names:
            yield f"{origin}.{alias.name}"


def import_graph() -> dict[str, set[str]]:
    """Each plait module and the plait modules it imports (itself excluded)."""
    modules = source_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            for wanted in _imported(node, name, is_package):
                while wanted and wanted not in modules:
                    wanted = wanted.rpartition(".")[0]
                if wanted and wanted != name:
                    targets.add(wanted)
        graph[name] = targets
    return graph


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.endswith("_") and module.startswith(prefix):
                return index
            if module == prefix or module.startswith(prefix + "."):
                return index
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep graph cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_every_module_is_in_a_layer() -> None:
    for name in source_modules():
        layer_of(name)


def test_no_import_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    described = []
    for component in found:
        members = set(component)
        edges = [f"  {a} -> {b}" for a in component for b in sorted(graph[a] & members)]
        described.append(f"{len(component)} modules:\n" + "\n".join(edges))
    assert not found, "import cycles:\n" + "\n".join(described)


def test_imports_go_down_the_layers() -> None:
    upward = []
    for name, targets in import_graph().items():
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                upward.append(
                    f"  {name} ({LAYERS[layer_of(name)][0]}) -> "
                    f"{target} ({LAYERS[layer_of(target)][0]})"
                )
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_the_checker_sees_function_level_and_type_only_imports(tmp_path: Path) -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from plait.module import Module\n"
        "def f():\n    from plait.execution import runtime\n    import plait.values\n"
    )
    found = set()
    for node in ast.walk(ast.parse(source)):
        found.update(_imported(node, "plait.x", False))
    assert {"plait.module.Module", "plait.execution.runtime", "plait.values"} <= found
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    "heavy",
    [
        "ray",
        "matplotlib",
        "pandas",
        "openai",
        "anthropic",
        "xllamacpp",
        "fastapi",
        "uvicorn",
        "opentelemetry",
    ],
)
def test_import_plait_stays_light(heavy: str) -> None:
    code = (
        "import sys, plait\n"
        f"loaded = [m for m in sys.modules if m == {heavy!r} or m.startswith({heavy!r} + '.')]\n"
        "print(','.join(loaded))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"import plait imported {out}"
