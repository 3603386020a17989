"""The release a user installs: the sdist and the wheel ``python -m build`` makes.

The wheel is installed (not editable) into a fresh venv that holds only plait's core
dependencies, and used there as a user would: ``plait --version``, ``import plait``
with no optional package importable, and an example pipeline run by the installed
``plait`` command against the fake OpenAI server started from that venv.

Nothing is downloaded (no network but loopback): the build runs on the development
venv's own setuptools (``--no-isolation``); the wheel is installed with
``--no-deps --no-index``; the core dependencies are copied from the development venv,
exactly the distributions the wheel's ``Requires-Dist`` reaches (extras left out),
each whole as its ``RECORD`` lists it; ``pip check`` in the fresh venv then proves that
the wheel's metadata and that closure agree.
"""

from __future__ import annotations

import ast
import email.parser
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path, PurePosixPath

import pytest

from plait.testing import API_KEY_ENV, READY_PREFIX

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

#: What the source tree holds that is no part of a release (venvs, builds, caches).
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "site",
    "build",
    "dist",
    "runs",
    "out",
    ".dspy-venv",
    "__pycache__",
    "*.egg-info",
    ".*_cache",
)

#: Packages only an extra brings: none may be importable in the core venv.
OPTIONAL_PACKAGES = (
    "anthropic",
    "fastapi",
    "uvicorn",
    "httptools",
    "matplotlib",
    "opentelemetry",
    "ray",
    "uvloop",
    "xllamacpp",
    "mkdocs",
)

#: Each extra and the distributions it must bring (the names users install by).
EXTRAS = {
    "anthropic": {"anthropic"},
    "local": {"xllamacpp"},
    "ray": {"ray"},
    "serve": {"fastapi", "uvicorn", "httptools"},
    "otel": {"opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http"},
    "docs": {"mkdocs", "mkdocs-material", "mkdocstrings"},
    "plot": {"matplotlib"},
}


def source_version() -> str:
    """The version as its one source, ``plait/_version.py``, states it (read, not imported)."""
    tree = ast.parse((ROOT / "src" / "plait" / "_version.py").read_text(encoding="utf-8"))
    for node in tree.body:
        match node:
            case ast.Assign(targets=[ast.Name(id="__version__")], value=ast.Constant(value=str(v))):
                return v
    raise AssertionError("src/plait/_version.py assigns no __version__ string")


def _clean_env() -> dict[str, str]:
    """The environment with pip's configuration and Python's path settings left out, so
    nothing reaches the fresh venv but what the test puts there, and pip finds no index."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("PIP_") and key not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHONNOUSERSITE="1",
    )
    return env


def _run(*args: str | Path, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(arg) for arg in args],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, args))} exited {done.returncode}\n"
        f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    )
    return done


@dataclass(frozen=True)
class Release:
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The sdist and the wheel, built as ``make dist`` builds them, from a copy of the
    source tree (so the build writes nothing into the checkout under test)."""
    pytest.importorskip("build", reason="the `build` package is missing: `make setup` installs it")
    # Without isolation the backend is the development venv's, which must meet the
    # build-system requirements (setuptools>=77 for the SPDX license field).
    from packaging.requirements import Requirement

    for text in PYPROJECT["build-system"]["requires"]:
        need = Requirement(text)
        try:
            have = importlib.metadata.version(need.name)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{need.name} is not installed, so the wheel cannot be built offline")
        if not need.specifier.contains(have, prereleases=True):
            pytest.skip(f"{need.name} {have} does not meet {need}: `make setup` installs it")
    base = tmp_path_factory.mktemp("release")
    tree = base / "plait"
    shutil.copytree(ROOT, tree, ignore=_NOT_SOURCE)
    out = base / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, tree, cwd=base)
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return Release(sdists[0], wheels[0])


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode("utf-8"))


# -- what the release holds ----------------------------------------------------------------


def test_the_version_has_one_source(release: Release) -> None:
    version = source_version()
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "plait._version.__version__"}
    assert release.wheel.name == f"plait-{version}-py3-none-any.whl"
    assert release.sdist.name == f"plait-{version}.tar.gz"
    assert wheel_metadata(release.wheel)["Version"] == version


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(release: Release) -> None:
    package = ROOT / "src" / "plait"
    expected = {
        path.relative_to(package.parent).as_posix()
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert "plait/py.typed" in expected
    with zipfile.ZipFile(release.wheel) as archive:
        names = set(archive.namelist())
    version = source_version()
    dist_info = f"plait-{version}.dist-info"
    shipped = {name for name in names if not name.startswith(f"{dist_info}/")}
    assert shipped == expected
    assert {
        f"{dist_info}/METADATA",
        f"{dist_info}/entry_points.txt",
        f"{dist_info}/licenses/LICENSE",
    } <= names


def test_the_wheel_metadata_describes_the_project(release: Release) -> None:
    from packaging.metadata import Metadata

    with zipfile.ZipFile(release.wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        Metadata.from_email(archive.read(name), validate=True)  # raises on an invalid field
    meta = wheel_metadata(release.wheel)
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert "import plait" in (meta.get_payload() or "")  # the README is the description
    classifiers = set(meta.get_all("Classifier") or [])
    for wanted in (
        "Typing :: Typed",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ):
        assert wanted in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert any(c.startswith("Topic :: ") for c in classifiers)
    assert meta["Keywords"]
    provided = set(meta.get_all("Provides-Extra") or [])
    assert set(EXTRAS) | {"dev"} == provided
    requires = meta.get_all("Requires-Dist") or []
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    for extra, wanted in EXTRAS.items():
        brought = {
            canonicalize_name(req.name)
            for req in map(Requirement, requires)
            if req.marker is not None and req.marker.evaluate({"extra": extra})
        }
        assert {canonicalize_name(name) for name in wanted} <= brought, extra
    core = sorted(str(req) for req in map(Requirement, requires) if req.marker is None)
    assert core == sorted(str(Requirement(r)) for r in PYPROJECT["project"]["dependencies"])


def test_the_sdist_holds_the_readme_license_changelog_and_package(release: Release) -> None:
    top = release.sdist.name.removesuffix(".tar.gz")
    with tarfile.open(release.sdist) as archive:
        names = {PurePosixPath(name).relative_to(top).as_posix() for name in archive.getnames()}
    for wanted in (
        "PKG-INFO",
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "CHANGELOG.md",
        "src/plait/__init__.py",
        "src/plait/_version.py",
        "src/plait/py.typed",
    ):
        assert wanted in names
    # Only what builds the package: the tests run from a clone (they need all of it).
    unwanted = (".venv", ".git/", "site/", "runs/", "tests/")
    assert not any(name.startswith(unwanted) for name in names)
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")


# -- the installed wheel ---------------------------------------------------------------------


@dataclass(frozen=True)
class CoreVenv:
    root: Path
    python: Path
    plait: Path
    site: Path


def core_closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions that ``requirements`` reach, extras left out (a
    requirement's own extras followed where it asks for them), each checked against
    the version it was asked for."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, importlib.metadata.Distribution] = {}
    extras_of: dict[str, set[str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(text, frozenset()) for text in requirements]
    while todo:
        text, parent_extras = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": extra}) for extra in (parent_extras or {""})
        ):
            continue
        name = canonicalize_name(req.name)
        dist = importlib.metadata.distribution(req.name)
        assert req.specifier.contains(dist.version, prereleases=True), (text, dist.version)
        new_extras = set(req.extras) - extras_of.get(name, set())
        if name in found and not new_extras:
            continue
        found[name] = dist
        extras_of.setdefault(name, set()).update(req.extras)
        asked = frozenset(extras_of[name] | {""})
        todo += [(child, asked) for child in dist.requires or []]
    return found


def copy_distribution(dist: importlib.metadata.Distribution, site: Path) -> int:
    """Copy one installed distribution into ``site`` as its RECORD lists it; files
    installed outside site-packages (console scripts) are left out. Returns the count."""
    origin = Path(str(dist.locate_file(""))).resolve()
    files = dist.files
    assert files, f"{dist.metadata['Name']} has no RECORD to copy it by"
    copied = 0
    for entry in files:
        source = Path(str(dist.locate_file(entry))).resolve()
        if not source.is_relative_to(origin) or not source.is_file():
            continue
        target = site / source.relative_to(origin)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        copied += 1
    return copied


@pytest.fixture(scope="module")
def core_venv(release: Release, tmp_path_factory: pytest.TempPathFactory) -> CoreVenv:
    """A fresh venv (no pip, no setuptools) holding the wheel and the core closure."""
    root = tmp_path_factory.mktemp("core-venv") / "venv"
    here = root.parent
    _run(sys.executable, "-m", "venv", "--without-pip", root, cwd=here)
    python = root / "bin" / "python"
    site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=here
        ).stdout.strip()
    )
    pip = (sys.executable, "-m", "pip", "--python", str(python))
    _run(*pip, "install", "--no-deps", "--no-index", release.wheel, cwd=here)
    requires = wheel_metadata(release.wheel).get_all("Requires-Dist") or []
    closure = core_closure([text for text in requires if "extra ==" not in text])
    assert "plait" not in closure
    for dist in closure.values():
        assert copy_distribution(dist, site) > 0
    done = _run(*pip, "check", cwd=here)
    assert "No broken requirements found" in done.stdout
    return CoreVenv(root, python, root / "bin" / "plait", site)


def test_the_fresh_venv_holds_only_plait_and_its_core_dependencies(core_venv: CoreVenv) -> None:
    pip = (sys.executable, "-m", "pip", "--python", str(core_venv.python))
    listed = json.loads(_run(*pip, "list", "--format", "json", cwd=core_venv.root).stdout)
    names = {row["name"].lower().replace("_", "-") for row in listed}
    assert "plait" in names
    for package in ("pip", "setuptools", *OPTIONAL_PACKAGES):
        assert package not in names


def test_plait_version_prints_the_version(core_venv: CoreVenv) -> None:
    done = _run(core_venv.plait, "--version", cwd=core_venv.root)
    assert done.stdout == f"plait {source_version()}\n"


_IMPORT_CHECK = """
import importlib.util, json, sys
missing = [name for name in {optional!r} if importlib.util.find_spec(name) is None]
import plait
for name in plait.__all__:
    getattr(plait, name)
import plait.handlers, plait.learning, plait.testing
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({optional!r}))
print(json.dumps({{"missing": missing, "loaded": loaded, "file": plait.__file__,
                  "version": plait.__version__}}))
"""


def test_import_plait_needs_only_the_core_dependencies(core_venv: CoreVenv) -> None:
    code = _IMPORT_CHECK.format(optional=OPTIONAL_PACKAGES)
    found = json.loads(_run(core_venv.python, "-c", code, cwd=core_venv.root).stdout)
    assert found["missing"] == list(OPTIONAL_PACKAGES)  # none of them is there at all
    assert found["loaded"] == []
    assert Path(found["file"]).resolve().is_relative_to(core_venv.site.resolve())
    assert found["version"] == source_version()


@pytest.fixture()
def installed_fake_server(core_venv: CoreVenv) -> Iterator[str]:
    """The fake OpenAI server, started from the fresh venv's plait: its base URL."""
    child = subprocess.Popen(
        [str(core_venv.python), "-m", "plait.testing.fake_openai", "--port", "0"],
        cwd=core_venv.root,
        env={**_clean_env(), API_KEY_ENV: "sk-release"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith(READY_PREFIX), (line, child.poll())
        yield f"http://127.0.0.1:{line.split('port=')[1].strip()}/v1"
    finally:
        child.terminate()
        child.communicate(timeout=30)


def test_an_example_pipeline_runs_from_the_installed_package(
    core_venv: CoreVenv, installed_fake_server: str, tmp_path: Path
) -> None:
    shutil.copy(ROOT / "examples" / "extract_and_compare.py", tmp_path)
    shutil.copy(ROOT / "examples" / "data" / "reviews.jsonl", tmp_path)
    aliases = []
    for alias in ("fast", "smart"):
        aliases += [
            f"[resources.{alias}]",
            'provider = "openai"',
            'model = "gpt-4o-mini"',
            f'base_url = "{installed_fake_server}"',
            'api_key_env = "RELEASE_TEST_KEY"',
        ]
    (tmp_path / "resources.toml").write_text("\n".join(aliases) + "\n", encoding="utf-8")
    done = subprocess.run(
        [
            str(core_venv.plait),
            "run",
            "extract_and_compare.py:ExtractAndCompare",
            "--input",
            "reviews.jsonl",
            "--output",
            "outputs.jsonl",
            "--resources",
            "resources.toml",
            "-q",
        ],
        cwd=tmp_path,
        env={**_clean_env(), "RELEASE_TEST_KEY": "sk-release"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    reviews = [json.loads(line) for line in (tmp_path / "reviews.jsonl").read_text().splitlines()]
    lines = (tmp_path / "outputs.jsonl").read_text().splitlines()
    rows = sorted((json.loads(line) for line in lines), key=lambda row: row["index"])
    assert [row["index"] for row in rows] == list(range(len(reviews))) == list(range(10))
    reader = "[You read product reviews. Answer in one short phrase.]"
    for review, row in zip(reviews, rows, strict=True):
        praise = row["output"]["praise"]
        assert praise == f"{reader} Review: {review}\n\nWhat does the reviewer like?"
        assert row["output"]["verdict"].startswith("[You are a concise shopping advisor.")
    stats_url = installed_fake_server.removesuffix("/v1") + "/_stats"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(stats_url, timeout=30) as reply:
        stats = json.load(reply)
    assert stats["requests_total"] == 30  # three calls per review, each paid once
