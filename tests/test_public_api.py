"""Every public name is documented, as the API reference renders it, and no internal
jargon reaches a user.

The public API is what the reference pages list: each ``::: module`` line of
``docs/reference/api/*.md``.  For each such module, every name in its ``__all__`` is
read with griffe, the library mkdocstrings renders the reference with (same search
path, same Google-style parser), so what passes here is what the site shows:

* a docstring whose first line is a one-line summary;
* ``Args:`` naming every parameter of the signature (``self``/``cls`` aside; one of
  ``*args``/``**kwargs`` may describe both), for a class those of its ``__init__``
  (``Attributes:`` also counts for a dataclass's fields);
* ``Returns:`` (or ``Yields:``) for a function that returns something;
* ``Raises:`` when the function's own body raises an exception (other than
  `NotImplementedError`): what a caller must expect on bad input;
* no warning from griffe (a documented parameter the signature lacks, a section
  it skipped), and no reST ``::`` literal block (the site renders Markdown).

The same holds for the public methods and properties of every public class, and a
constant or type alias needs a docstring too (a string right after the assignment:
griffe does not read ``#:`` comments).

The jargon test scans what users read: docstrings and string literals of
``src/plait``, the ``--help`` of every ``plait`` command, the README and the pages of
``docs/``.  And what the pages import, they import from a documented module that
exports it.  (The docstrings' examples run in ``tests/test_pages.py``.)
"""

from __future__ import annotations

import ast
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

griffe = pytest.importorskip("griffe", reason="griffe comes with the dev extra (mkdocstrings)")

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
API_PAGES = ROOT / "docs" / "reference" / "api"
SOURCE_FILES = sorted((SRC / "plait").rglob("*.py"))


def documented_modules() -> list[str]:
    """The modules the reference renders: every ``::: module`` line of its API pages."""
    found: list[str] = []
    for page in sorted(API_PAGES.glob("*.md")):
        for line in page.read_text(encoding="utf-8").splitlines():
            match = re.match(r"^:::\s+([\w.]+)\s*$", line)
            if match:
                found.append(match.group(1))
    return found


MODULES = documented_modules()


# -- loading, as mkdocstrings does ---------------------------------------------------------
class _Collect(logging.Handler):
    """Keeps what griffe logs while a docstring is parsed: its warnings, and the sections
    it skipped (logged at debug level, yet a section the page silently loses)."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.WARNING or "section skipped" in message:
            self.messages.append(message)


@contextmanager
def griffe_messages(level: int = logging.DEBUG) -> Iterator[list[str]]:
    """What griffe logs in the block, at ``level`` and above, kept from other handlers
    (formatting griffe's many debug lines for pytest's capture would cost minutes)."""
    logger = logging.getLogger("griffe")
    handler = _Collect()
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate


@pytest.fixture(scope="module")
def loaded() -> Any:
    """Every documented module, loaded and its aliases resolved as mkdocstrings does."""
    loader = griffe.GriffeLoader(search_paths=[str(SRC)], docstring_parser=griffe.Parser("google"))
    with griffe_messages(logging.WARNING) as messages:
        for package in sorted({name.split(".")[0] for name in MODULES}):
            loader.load(package, try_relative_path=False)  # its submodules too
        loader.resolve_aliases(implicit=False, external=None)
    assert messages == [], f"griffe warned while loading plait: {messages}"
    return loader.modules_collection


# -- what a docstring must say ------------------------------------------------------------
NOT_INPUT_ERRORS = {"NotImplementedError"}


def own_raises(source: str) -> set[str]:
    """The exceptions a function's own body raises by name (``raise X(...)``), not those
    of nested functions and not re-raises of a caught exception or a stored error."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:
        return set()
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    if not funcs:  # no source of its own (a dataclass's generated __init__)
        return set()
    func = funcs[0]
    found: set[str] = set()
    todo: list[ast.AST] = list(ast.iter_child_nodes(func))
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = exc.attr if isinstance(exc, ast.Attribute) else getattr(exc, "id", "")
            if name[:1].isupper() and name not in NOT_INPUT_ERRORS:
                found.add(name)
        todo.extend(ast.iter_child_nodes(node))
    return found


def sections(obj: Any, messages: list[str]) -> dict[str, list[Any]]:
    """The parsed sections of ``obj``'s docstring by kind, griffe's messages collected."""
    found: dict[str, list[Any]] = {}
    if obj.docstring is None:
        return found
    with griffe_messages() as logged:
        parsed = obj.docstring.parse(griffe.Parser("google"))
    messages.extend(logged)
    for section in parsed:
        found.setdefault(section.kind.value, []).append(section)
    return found


def documented_names(found: dict[str, list[Any]], *kinds: str) -> set[str]:
    return {
        item.name.lstrip("*")
        for kind in kinds
        for section in found.get(kind, [])
        for item in section.value
    }


def docstring_problems(obj: Any) -> list[str]:
    """What is missing from the docstring of ``obj`` (not an alias), or wrong in it."""
    where = obj.path
    doc = obj.docstring
    if doc is None or not doc.value.strip():
        return [f"{where}: no docstring"]
    problems: list[str] = []
    lines = doc.value.strip().splitlines()
    if not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
        problems.append(f"{where}: the docstring must start with a one-line summary")
    if any(line.rstrip().endswith("::") for line in lines):
        problems.append(f"{where}: a reST '::' block (write a fenced ```python block)")
    messages: list[str] = []
    found = sections(obj, messages)
    problems += [f"{where}: griffe: {message}" for message in messages]
    if obj.is_function:
        problems += _function_problems(obj, found, where)
    return problems


def _signature_names(func: Any) -> tuple[set[str], set[str]]:
    """(named parameters, variadic ones) of ``func``, ``self``/``cls`` left out."""
    named: set[str] = set()
    variadic: set[str] = set()
    params = list(func.parameters)
    if params and params[0].name in ("self", "cls") and func.parent is not None:
        params = params[1:]
    for param in params:
        if param.kind.value in ("variadic positional", "variadic keyword"):
            variadic.add(param.name)
        else:
            named.add(param.name)
    return named, variadic


def _args_problems(func: Any, found: dict[str, list[Any]], where: str, *kinds: str) -> list[str]:
    named, variadic = _signature_names(func)
    documented = documented_names(found, *kinds)
    missing = sorted(named - documented)
    if variadic and not (variadic & documented):
        missing += sorted(f"*{name}" for name in variadic)
    return [f"{where}: Args: does not describe {', '.join(missing)}"] if missing else []


def _returns_something(func: Any) -> bool:
    returns = func.returns
    if returns is None:
        return False
    text = str(returns)
    return text not in ("None", "NoReturn", "Never")


def _function_problems(func: Any, found: dict[str, list[Any]], where: str) -> list[str]:
    problems: list[str] = []
    if "property" in func.labels:
        return problems
    problems += _args_problems(func, found, where, "parameters", "other parameters")
    if _returns_something(func) and not (found.get("returns") or found.get("yields")):
        problems.append(f"{where}: no Returns: (or Yields:) section")
    problems += _raises_problems(func, found, where)
    return problems


def _raises_problems(func: Any, found: dict[str, list[Any]], where: str) -> list[str]:
    if func.source is None:
        return []
    raised = own_raises(func.source)
    if raised and not found.get("raises"):
        return [f"{where}: raises {', '.join(sorted(raised))} but has no Raises: section"]
    return []


def class_problems(cls: Any) -> list[str]:
    """The class's docstring (its ``__init__``'s arguments and errors included: the page
    shows them together), then each public method and property it defines."""
    problems = docstring_problems(cls)
    init = cls.members.get("__init__")
    if init is None and "dataclass" in cls.labels:
        init = cls.all_members.get("__init__")
    if init is not None and init.is_function:
        messages: list[str] = []
        found = sections(cls, messages)
        for kind, items in sections(init, messages).items():
            found.setdefault(kind, []).extend(items)
        problems += [f"{cls.path}.__init__: griffe: {message}" for message in messages]
        problems += _args_problems(init, found, cls.path, "parameters", "attributes")
        if init.source is not None:
            raised = own_raises(init.source)
            if raised and not found.get("raises"):
                problems.append(
                    f"{cls.path}: __init__ raises {', '.join(sorted(raised))} but the class "
                    "has no Raises: section"
                )
    for name, member in cls.members.items():
        if name.startswith("_") or member.is_alias or member.is_class:
            continue
        if member.is_function or "property" in member.labels:
            problems += docstring_problems(member)
    return problems


def public_name_problems(module: Any, name: str) -> list[str]:
    where = f"{module.path}.{name}"
    member = module.members.get(name)
    if member is None:
        return [
            f"{where}: in __all__ but not visible to the reference (a lazy export needs an "
            "import under `if TYPE_CHECKING:` so griffe sees it)"
        ]
    try:
        obj = member.final_target if member.is_alias else member
    except griffe.AliasResolutionError:
        return [f"{where}: the reference cannot resolve where it is defined"]
    if obj.is_module:
        if obj.docstring is None or not obj.docstring.value.strip():
            return [f"{where}: the module has no docstring"]
        return []
    if obj.is_class:
        return class_problems(obj)
    return docstring_problems(obj)


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_is_documented(loaded: Any, module_name: str) -> None:
    module = loaded[module_name]
    problems: list[str] = []
    if module.docstring is None or not module.docstring.value.strip():
        problems.append(f"{module_name}: the module has no docstring")
    elif any(line.rstrip().endswith("::") for line in module.docstring.value.splitlines()):
        problems.append(f"{module_name}: a reST '::' block in the module docstring")
    exports = module.exports
    assert exports, f"{module_name} has no __all__: the reference needs one to list its names"
    for name in exports:
        if isinstance(name, str) and not name.startswith("_"):
            problems += public_name_problems(module, name)
    assert problems == [], f"{len(problems)} problem(s):\n" + "\n".join(problems)


# -- names are imported from where the reference documents them ---------------------------
def _python_blocks(text: str) -> list[str]:
    """The ```python blocks of a page (not ```python3: pages show other libraries' code so)."""
    return re.findall(r"^```python(?:[ \t][^\n]*)?\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _imports(code: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(module, names)`` for each plait import of ``code`` (``names`` empty for
    ``import plait.x``); top-level ``await`` allowed, as pages show it."""
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(textwrap.dedent(code), "<block>", "exec", flags=flags)
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "plait":
            found.append((str(node.module), tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Import):
            found += [(a.name, ()) for a in node.names if a.name.split(".")[0] == "plait"]
    return found


READ_BY_USERS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize(
    "page", READ_BY_USERS, ids=[str(p.relative_to(ROOT)) for p in READ_BY_USERS]
)
def test_pages_import_from_the_public_modules(loaded: Any, page: Path) -> None:
    """What a page imports, it imports from a module the reference documents, and each
    name it takes is in that module's ``__all__``: a user copies what pages show."""
    wrong: list[str] = []
    for block in _python_blocks(page.read_text(encoding="utf-8")):
        for module, names in _imports(block):
            if module not in MODULES:
                wrong.append(f"{module} is not a documented module")
                continue
            exports = set(loaded[module].exports or ())
            wrong += [f"{module} does not export {name}" for name in names if name not in exports]
    assert wrong == []


def test_the_trainer_is_exported_where_users_look() -> None:
    from plait.learning import Trainer, TrainingEvent
    from plait.learning.trainer import Trainer as Defined

    assert Trainer is Defined and TrainingEvent.__name__ == "TrainingEvent"


# -- the checker itself catches what it must ----------------------------------------------
def test_the_checker_finds_each_kind_of_gap(tmp_path: Path) -> None:
    """An undocumented parameter, a missing Returns/Raises, a two-line summary, a reST
    block, an argument griffe cannot find and a constant with no docstring are each
    reported; the documented twin of each is not."""
    package = tmp_path / "sample"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A sample."""

            __all__ = ["LIMIT", "UNDOCUMENTED", "good", "bad", "Thing"]

            LIMIT = 3
            """How many."""

            UNDOCUMENTED = 4


            def good(x: int, *args: int, **kwargs: int) -> int:
                """Double a number.

                Args:
                    x: The number.
                    *args: Ignored.

                Returns:
                    Twice ``x``.

                Raises:
                    ValueError: When ``x`` is negative.
                """
                if x < 0:
                    raise ValueError("negative")
                return 2 * x


            def bad(x: int, y: int) -> int:
                """Double
                a number::

                    bad(1, 2)

                Args:
                    x: The number.
                    z: Not a parameter.
                """
                if x < 0:
                    raise ValueError("negative")
                return 2 * x


            class Thing:
                """A thing."""

                def __init__(self, size: int) -> None:
                    if size < 0:
                        raise ValueError("negative")
                    self.size = size

                def grow(self) -> int:
                    return self.size + 1
            '''
        ),
        encoding="utf-8",
    )
    loader = griffe.GriffeLoader(
        search_paths=[str(tmp_path)], docstring_parser=griffe.Parser("google")
    )
    module = loader.load("sample")
    problems = {name: public_name_problems(module, name) for name in module.exports}
    assert problems["LIMIT"] == [] and problems["good"] == []
    assert problems["UNDOCUMENTED"] == ["sample.UNDOCUMENTED: no docstring"]
    bad = "\n".join(problems["bad"])
    assert "one-line summary" in bad and "'::'" in bad
    assert "does not appear in the function signature" in bad
    assert "does not describe y" in bad
    assert "no Returns:" in bad and "raises ValueError" in bad
    thing = "\n".join(problems["Thing"])
    assert "does not describe size" in thing and "__init__ raises ValueError" in thing
    assert "sample.Thing.grow: no docstring" in thing


# -- no internal jargon --------------------------------------------------------------------
#: What only the people who built plait would understand: the design documents it grew
#: from ("seed 000", "the module seed"), issue numbers, work-session labels.  A user
#: reads the idea's name instead (effect handlers, blueprints, the module specification).
JARGON = [
    re.compile(r"\bseeds?\s+0\d\d\b", re.IGNORECASE),
    re.compile(r"\bmodule seed\b", re.IGNORECASE),
    re.compile(r"\bthe seed's\b", re.IGNORECASE),
    re.compile(r"\bseed (?:dataclass|document|spec)", re.IGNORECASE),
    re.compile(r"\b(?:from|in|of|by) the seeds\b(?!\s+(?:it|each|that|a|the|of)\b)", re.I),
    re.compile(r"\bissues?\s+#?\d+\b", re.IGNORECASE),
    re.compile(r"\bstop\s+\d+\b", re.IGNORECASE),
    re.compile(r"\(point\s+\d+\)", re.IGNORECASE),
    re.compile(r"\bfriction\b", re.IGNORECASE),
]


def jargon_in(text: str) -> list[str]:
    return [match.group(0) for pattern in JARGON for match in pattern.finditer(text)]


def test_the_jargon_patterns_catch_jargon_and_spare_seeds() -> None:
    assert jargon_in("as in torch (seed 000); seeds 001 and 002; Seed 004's handlers") == [
        "seed 000",
        "seeds 001",
        "Seed 004",
    ]
    assert jargon_in("see issue 12, issue #3; stop 4 (point 2); friction") != []
    assert jargon_in("the module seed says; differs from the seeds, on purpose") != []
    # Sampling seeds are a feature, not jargon.
    assert jargon_in("run seed 0; seed=42; the seeds it sends; each call's seed") == []


def _string_literals(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every string a user may read: docstrings, messages, help texts (f-strings' text
    parts included).  All literals are scanned: jargon has no place in any of them."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


@pytest.mark.parametrize("path", SOURCE_FILES, ids=[str(p.relative_to(SRC)) for p in SOURCE_FILES])
def test_no_jargon_in_the_source_strings(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hits = [
        f"{path.relative_to(ROOT)}:{line}: {found!r}"
        for line, text in _string_literals(tree)
        for found in jargon_in(text)
    ]
    assert hits == [], "internal jargon a user would read:\n" + "\n".join(hits)


def _commands() -> list[str]:
    from plait.cli import COMMANDS

    return ["", *COMMANDS]


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c or "plait")
def test_no_jargon_in_the_help_of_each_command(command: str) -> None:
    argv = [sys.executable, "-m", "plait.cli", *([command] if command else []), "--help"]
    env = {**os.environ, "COLUMNS": "100"}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    assert jargon_in(result.stdout + result.stderr) == []


DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", DOC_PAGES, ids=[str(p.relative_to(ROOT)) for p in DOC_PAGES])
def test_no_jargon_in_the_pages(page: Path) -> None:
    hits = [
        f"{page.relative_to(ROOT)}:{number}: {found!r}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for found in jargon_in(line)
    ]
    assert hits == [], "internal jargon a user would read:\n" + "\n".join(hits)
