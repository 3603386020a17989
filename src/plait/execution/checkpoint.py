"""Resumable batches: completed LLM calls and finished outputs, logged as they happen.

The log is append-only JSON lines, each written with a single ``write`` on an
``O_APPEND`` descriptor, so a process killed at any instant leaves whole records
plus at most one torn last line, which the next run drops.  The manifest is
written atomically (temp file, then rename) and names the pipeline, so pointing
a different pipeline at the directory is an error instead of a silent mix-up.

Completed calls are replayed by a handler on the stack: a resumed run answers
them from the log and pays for none of them again.  Failed inputs are not
recorded as finished, so a resumed run retries them.  Finished outputs are
served only to a run of the same version of the pipeline: its code (`code_of`),
parameter values, LLM call settings and command-line arguments (`version_of`).
After a change to any of these, a ``code`` record in the log marks where the new
version's outputs begin, and the inputs run again, paying only for the calls whose
requests changed (a call is keyed by its request).  What the request does not say
is refused instead: another endpoint or model behind an alias, another run seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plait._digest import hex_digest, json_digest
from plait._files import write_atomic
from plait._jsonl import json_line, loads, text_line
from plait._locks import Busy, hold
from plait.effects import Handler, Message, current_stack
from plait.execution.codec import decode, encode
from plait.handlers.llm import response_from_json, response_to_json
from plait.module import llm_aliases
from plait.providers.base import LLMRequest, LLMResponse, reply_checks
from plait.structured import canonical_schema_json

if TYPE_CHECKING:
    from plait.values import Value

__all__ = ["Checkpoint", "CheckpointBusy", "CheckpointError", "CheckpointHandler"]

FORMAT = "plait-checkpoint"
#: 2: calls are keyed by node ids that count composite calls' enter/exit nodes, so a
#: version-1 log would match nothing and every call would be paid for again.
#: 3: inputs and requests are hashed by `plait._digest` (no JSON in between), so a
#: version-2 log's hashes would match nothing either.
VERSION = 3


class CheckpointError(RuntimeError):
    """The checkpoint directory cannot be used for this run; the message says why.

    For example, the directory holds another pipeline's checkpoint, or another
    process is running on it.
    """

    #: Whether starting over (deleting the checkpoint) is a way out.
    fresh_helps = True


class CheckpointBusy(CheckpointError):
    """Another run holds the checkpoint; ``holder`` names it (``process 1234``)."""

    fresh_helps = False

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def pipeline_name(module: Any) -> str:
    """The name a checkpoint records for the pipeline ``module`` is an instance of."""
    return f"{type(module).__module__}.{type(module).__qualname__}"


#: The module a pipeline file (``file.py:Name``) is loaded as, with the class's name
#: after it (`plait.blueprint`'s loader names it after the file's stem and path).
_FILE_PIPELINE = re.compile(r"_plait_blueprint_(?P<stem>\w+)_[0-9a-f]{10}\.(?P<name>.+)")


def shown_pipeline(name: str, target: str | None = None) -> str:
    """A checkpoint's pipeline as its user wrote it: the command's TARGET when it was
    recorded, else ``file.py:Name`` for a class loaded from a file (not the internal
    module the file was loaded as), else the class's dotted path."""
    if target:
        return target
    found = _FILE_PIPELINE.fullmatch(name)
    return f"{found['stem']}.py:{found['name']}" if found else name


def producer_identity(module: Any, resources: Any, seed: int | None = None) -> dict[str, Any]:
    """What a run's outputs depend on besides its inputs: each alias's endpoint
    (provider, model, and a hash of its URL, which may hold credentials), each
    parameter's value (hashed), each LLM call's settings, the run seed
    (`plait.sampling`; an `Rng`'s own parameters are that seed) and the pipeline's
    code (`code_of`).

    A checkpoint refuses to resume under other endpoints or another seed: a logged
    call is keyed by its request, which names neither the model that answered it
    nor (for a seed) anything a rerun could reuse.  The rest is the pipeline's
    version (`version_of`): when it changed, finished outputs are recomputed and the
    logged calls still answer the requests that did not change."""

    aliases = sorted(llm_aliases(module))
    endpoints = {}
    for alias in aliases:
        config = resources.config_for(alias)
        endpoints[alias] = {
            "provider": config.provider,
            "model": config.model or "default",
            "url": json_digest(config.base_url or "", size=8),
        }
    from plait.sampling import rng_parameter_names

    drawn = rng_parameter_names(module)
    parameters = {
        name: json_digest(param._value, size=8)
        for name, param in module.named_parameters()
        if name not in drawn
    }
    return {
        "endpoints": endpoints,
        "parameters": parameters,
        "calls": call_settings_of(module),
        "seed": seed,
        "configured": bool(resources.config),
        "code": code_of(module),
    }


#: Hex digits of a request hash an output record keeps per call (`output_calls`).
_SHORT_HASH = 8

#: The parts of a producer that make the pipeline's version (`version_of`), besides its code.
SETTINGS = ("parameters", "calls", "arguments")


def arguments_of(assignments: Iterable[str]) -> dict[str, str]:
    """Command-line ``key=value`` arguments as a producer keeps them: each value hashed
    (a value may be a secret), by key, so a change can be named without showing it."""
    found: dict[str, str] = {}
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        found[key] = json_digest(value, size=8)
    return dict(sorted(found.items()))


def version_of(producer: dict[str, Any]) -> dict[str, Any]:
    """The version of the pipeline that a producer (`producer_identity`) ran: its code
    and the settings that shape its requests and outputs (parameter values, LLM call
    settings, command-line arguments). Finished outputs are served only to a run of
    the same version; the calls it logged serve any version that sends their requests."""
    return {"code": producer.get("code"), **{key: producer.get(key) or {} for key in SETTINGS}}


def version_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two versions (`version_of`), in words for the user."""
    found: list[str] = []
    if before.get("code") != now.get("code"):
        found.append("the pipeline's code")
    old, new = before.get("parameters") or {}, now.get("parameters") or {}
    found += [
        f"parameter {name!r}"
        for name in sorted(set(old) | set(new))
        if old.get(name) != new.get(name)
    ]
    old, new = before.get("calls") or {}, now.get("calls") or {}
    found += [
        f"the settings of the LLM call {path!r}"
        for path in sorted(set(old) | set(new))
        if old.get(path) != new.get(path)
    ]
    old, new = before.get("arguments") or {}, now.get("arguments") or {}
    keys = [key for key in sorted(set(old) | set(new)) if old.get(key) != new.get(key)]
    if keys:
        found.append(f"the command-line arguments ({', '.join(keys)})")
    return found


def call_settings_of(module: Any) -> dict[str, str]:
    """A hash of each LLM call's own settings (alias, temperature, max_tokens, response
    format, samples), by module path: they change its replies as much as its prompt."""
    calls = {}
    for path, part in module.named_modules():
        if part._calls_llm:
            schema = getattr(part, "response_format", None)
            settings = [
                part.alias,
                getattr(part, "temperature", None),
                getattr(part, "max_tokens", None),
                canonical_schema_json(schema) if schema is not None else None,
                *([part.n] if getattr(part, "n", 1) != 1 else []),
                # A cascade's tiers and what keeps an answer (absent unless set).
                *_cascade_of(part),
                # What a reply must pass (absent unless set: earlier hashes hold).
                *reply_checks(
                    getattr(part, "validate", None),
                    getattr(part, "max_reasks", 1),
                    getattr(part, "max_tokens_per_call", None),
                ),
            ]
            calls[path or "(root)"] = json_digest(settings, size=8)
    return calls


def _cascade_of(call: Any) -> list[Any]:
    tiers = getattr(call, "escalate_to", ())
    if not tiers:
        return []
    accept = call.accept
    judged = accept if not callable(accept) else getattr(accept, "__qualname__", repr(accept))
    return [f"escalate_to={list(tiers)}", f"accept={judged}"]


def code_of(module: Any, *functions: Any) -> dict[str, str]:
    """A hash of the user source the pipeline runs, by Python module.

    A finished output is only as current as the code that computed it: an edited
    ``forward`` (a prefixed prompt, a new post-processing step) must not be answered
    with outputs of the old one. The whole source file of each class outside plait
    is hashed, not the class alone, so prompt templates and helper functions kept
    beside it count too, and so are the user files those import, transitively (a
    ``fmt`` helper in another file is as much the pipeline's code); what lives in
    the Python installation (stdlib, site-packages) and plait itself is not. An
    edit that changes nothing a call sends costs nothing, since the calls
    themselves are keyed by their requests. A class whose source cannot be found
    (defined in an interactive session) is keyed by its name, and a warning says
    that changes to it go unnoticed.

    ``functions`` (an evaluation metric, say; classes too) are code the run depends
    on as well: their files, and what those import, are hashed the same way. With
    ``module`` None, only they are.
    """
    import inspect
    import sys
    import warnings

    found: dict[str, str] = {}
    # (module name, its package, its source) still to scan for the user files it imports.
    pending: list[tuple[str, str | None, str]] = []
    modules = [] if module is None else module.modules()
    definitions = [cls for part in modules for cls in type(part).__mro__]
    for cls in [*definitions, *functions]:
        if cls is object:
            continue
        name = cls.__module__
        qualified = f"{name}.{cls.__qualname__}"
        if _is_plait(name):
            continue
        if name in found or qualified in found:
            continue
        # The file, else the class alone (a notebook cell), under a key of its own.
        for owner, key in ((sys.modules.get(name), name), (cls, qualified)):
            if owner is None:
                continue
            try:
                source = inspect.getsource(owner)
            except (OSError, TypeError):
                continue
            found[key] = hex_digest(source, size=8)
            if key == name:
                pending.append((name, getattr(owner, "__package__", None), source))
            break
        else:
            warnings.warn(
                f"plait: no source found for {qualified}; a checkpoint keys its finished "
                "outputs by the class's name only, so a resume after changing its code "
                "would serve outputs of the old code. Define it in a file, or start such "
                "a run over (--fresh / a new checkpoint_dir)",
                stacklevel=2,
            )
            found[qualified] = "no source"
    for imported, _path, data in _imported_user_files(pending, set(found)):
        found[imported] = hex_digest(data, size=8)
    return dict(sorted(found.items()))


def imported_user_files(path: str, package: str | None) -> list[Path]:
    """The user files the Python file ``path`` imports, transitively, as `code_of`
    finds them (outside the installation and plait; nothing is imported): the code a
    command must never write over besides the target's own file."""
    try:
        source = Path(path).read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return []
    return [found for _name, found, _data in _imported_user_files([("", package, source)], set())]


def _imported_user_files(
    pending: list[tuple[str, str | None, str]], seen: set[str]
) -> Iterator[tuple[str, Path, bytes]]:
    """(module name, file, bytes) of each user file the sources in ``pending`` (name,
    package, source) import, transitively, skipping the names in ``seen``."""
    installed = _installed_roots()
    while pending:
        _name, package, source = pending.pop()
        for imported in _imports_of(source, package):
            if imported in seen or _is_plait(imported):
                continue
            path = _user_file(imported, installed)
            if path is None:
                continue
            try:
                data = path.read_bytes()
            except OSError:
                continue
            seen.add(imported)
            yield imported, path, data
            own_package = imported if path.name == "__init__.py" else imported.rpartition(".")[0]
            pending.append((imported, own_package, data.decode("utf-8", "surrogateescape")))


def _is_plait(name: str) -> bool:
    return name == "plait" or name.startswith("plait.")


def _installed_roots() -> tuple[str, ...]:
    """Directories of the Python installation, whose files are not the pipeline's code."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots)


#: Held around `ast.parse`: in CPython 3.11 two threads parsing at once can fail with
#: "AST constructor recursion depth mismatch" (two Ray passes made their specs at once).
_parse_lock = threading.Lock()


def _imports_of(source: str, package: str | None) -> list[str]:
    """The absolute names of the modules a source file imports, anywhere in it.

    Read from the text rather than from what is loaded, so the answer is the same in
    every process whatever else it happens to have imported, and an import inside a
    function (run by ``forward`` later) counts too. ``from a import b`` names both
    ``a`` and ``a.b``, since ``b`` may be a submodule.
    """
    import ast
    import importlib.util

    try:
        with _parse_lock:  # CPython 3.11's parser is not safe from several threads at once
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                names.extend(".".join(parts[: i + 1]) for i in range(len(parts)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if not package:
                    continue
                try:
                    base = importlib.util.resolve_name("." * node.level + base, package)
                except (ImportError, ValueError):
                    continue
            if not base:
                continue
            parts = base.split(".")
            names.extend(".".join(parts[: i + 1]) for i in range(len(parts)))
            names.extend(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return list(dict.fromkeys(names))


def _user_file(name: str, installed: tuple[str, ...]) -> Path | None:
    """The source file of module ``name`` if it is user code, without importing it.

    A dotted name is found through its parent package's locations, so a package the
    pipeline only imports lazily is located without running it.
    """
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError, AttributeError):
        return None
    for depth in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return None
        if spec.origin and os.path.realpath(spec.origin).startswith(installed):
            return None  # a module of an installed package is installed too
        locations = [str(location) for location in spec.submodule_search_locations]
        if all(os.path.join(os.path.realpath(p), "").startswith(installed) for p in locations):
            return None  # an installed namespace package (no origin of its own)
        dotted = ".".join(parts[: depth + 1])
        try:
            spec = importlib.machinery.PathFinder.find_spec(dotted, locations)
        except KeyError:
            # A namespace subpackage whose parent is not imported: importlib looks the
            # parent up in sys.modules to track its path. Its portions are the
            # directories of that name, which is all the next step needs.
            spec = importlib.machinery.ModuleSpec(dotted, None, is_package=True)
            spec.submodule_search_locations = [
                found
                for found in (os.path.join(where, parts[depth]) for where in locations)
                if os.path.isdir(found)
            ]
    if spec is None or not spec.has_location or not spec.origin:
        return None
    if not spec.origin.endswith(".py"):
        return None
    origin = os.path.realpath(spec.origin)
    if origin.startswith(installed):
        return None
    return Path(origin)


def _differences(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What changed in the endpoints of the aliases both producers use: a call's key
    names its alias, not the model behind it, so its logged reply must not answer for
    another. An alias only one of them uses has no calls the other could be answered
    with (an edit that moves a call to a new alias changes that call's requests)."""
    found: list[str] = []
    old_ends, new_ends = before.get("endpoints", {}), now.get("endpoints", {})
    for alias in sorted(set(old_ends) & set(new_ends)):
        was, is_ = old_ends[alias], new_ends[alias]
        if was == is_:
            continue
        for key in ("provider", "model", "url"):
            if was.get(key) != is_.get(key):
                what = "base_url" if key == "url" else key
                shown = "" if key == "url" else f" {was.get(key)!r} -> {is_.get(key)!r}"
                found.append(f"alias {alias!r}: {what} changed{shown}")
    return found


def _seed_changed(before: dict[str, Any], now: dict[str, Any]) -> str | None:
    if before.get("seed") == now.get("seed"):
        return None
    return (
        f"the run seed changed ({before.get('seed')!r} -> {now.get('seed')!r}; an Rng "
        "draws a new one for each run: restore its counter, or pass the same seed=)"
    )


class Checkpoint:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        pipeline: str,
        producer: dict[str, Any] | None = None,
        target: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.pipeline = pipeline
        #: How the command that made the pipeline named it (``review.py:Review``), if
        #: one did: what `plait status` and refusals call it (`shown_pipeline`).
        self.target = target
        #: What produced the outputs (see `producer_identity`); resuming under another is refused.
        self.producer = producer
        #: Set when a run with no resources resumes a checkpoint made on endpoints.
        self.mismatch: str | None = None
        #: Where each completed call's record is: (file, offset, length), file 0 being the
        #: one this process appends to.  An index, not the data: a long run's replies stay
        #: on disk until a resume asks for one.
        self.calls: dict[tuple[int, str, str], tuple[int, int, int]] = {}
        #: Per finished input: (input hash, offset, length) of its output record.
        self.outputs: dict[int, tuple[str, int, int]] = {}
        #: The version of the pipeline (`version_of`) the log's next output records were
        #: made by: the manifest's, then that of the latest ``code`` record. Outputs of
        #: another version are not served (their calls are: a call is keyed by its request).
        self._log_version: Any = None
        #: The manifest's version, which a ``code`` record without settings of its own
        #: (written before they were recorded) shares.
        self._first_version: dict[str, Any] = {}
        #: What changed in the pipeline (`version_changes`) since the checkpoint's latest
        #: outputs were made; empty when they are current.
        self.changes: list[str] = []
        self._fd: int | None = None
        #: The logs read, the first being the one written: ``log.jsonl``, or for a worker
        #: of a multi-process run (`open_for_worker`) a file of its own under ``workers/``.
        self._paths: list[Path] = [self.log_path]
        self._readers: dict[int, int] = {}
        #: How far each log has been indexed (see `refresh`).
        self._indexed: dict[int, int] = {}
        self._worker = False
        self._size = 0
        self._pending: list[bytes] = []
        #: Per input still running: the text of its latest logged reply (see `record_output`).
        self._last_reply: dict[int, tuple[str, str, str]] = {}
        #: Per input still running: (node, request hash) of each call it made or was
        #: answered from the log, which its output record keeps (`output_calls`).
        self._used: dict[int, dict[tuple[str, str], None]] = {}
        #: The logged calls' keys by input, made when first asked (`output_calls`).
        self._by_input: dict[int, list[tuple[int, str, str]]] | None = None
        self._flush_scheduled = False
        self._lock: int | None = None

    @classmethod
    def of_run(
        cls,
        directory: str | os.PathLike[str],
        module: Any,
        resources: Any,
        seed: int | None,
        arguments: Iterable[str] = (),
        target: str | None = None,
    ) -> Checkpoint:
        """The checkpoint of a run of ``module`` on ``resources`` with run seed ``seed``
        (not opened yet): named by the pipeline's class, keyed by `producer_identity`
        and the command-line ``key=value`` ``arguments`` the module was built with
        (from the command line's ``target``, which names it to the user).
        Every place a run starts (one process, Ray workers, ``plait run``) opens its
        checkpoint through this, so a resume means the same thing everywhere."""
        producer = producer_identity(module, resources, seed)
        given = arguments_of(arguments)
        if given:
            producer["arguments"] = given
        return cls(directory, pipeline_name(module), producer, target)

    @property
    def code_changed(self) -> bool:
        """Whether the pipeline changed since the checkpoint's latest outputs were made
        (`changes` says how): its inputs run again, reusing the calls that did not."""
        return bool(self.changes)

    @property
    def log_path(self) -> Path:
        return self.directory / "log.jsonl"

    @property
    def manifest_path(self) -> Path:
        return self.directory / "manifest.json"

    def open(self) -> Checkpoint:
        if self.directory.exists() and not self.directory.is_dir():
            raise CheckpointError(f"checkpoint_dir {self.directory} exists and is not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            error = CheckpointError(
                f"cannot create the checkpoint directory {self.directory} "
                f"({exc.strerror or exc}); choose a path you can write to"
            )
            error.fresh_helps = False
            raise error from None
        try:
            self._lock = hold(self.directory / "lock")
        except Busy as exc:
            raise CheckpointBusy(
                f"{self.directory} is in use by {exc.holder}: one run at a time per "
                "checkpoint (two would both pay for every call). Wait for it to finish, "
                "or give this run another checkpoint directory",
                exc.holder,
            ) from None
        try:
            return self._open_locked()
        except BaseException:
            self._release_lock()
            raise

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops the lock
            self._lock = None

    def _open_locked(self) -> Checkpoint:
        if self.manifest_path.exists():
            self._first_version = version_of(self._check_manifest())
            self._log_version = self._first_version
            self._note_new_aliases()
        else:
            if self.log_path.exists():
                raise CheckpointError(
                    f"{self.directory} has a log but no manifest.json; it was not written by "
                    "plait (or was damaged): use an empty checkpoint_dir"
                )
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "pipeline": self.pipeline,
                "producer": self.producer,
                "created": time.time(),
                **({"target": self.target} if self.target else {}),
            }
            write_atomic(self.manifest_path, json.dumps(manifest))
            self._log_version = self._first_version = self._version
        self._load_log()
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        if not self._outputs_current():
            # Outputs recorded from here on are this version's; earlier ones are not
            # served (and come back into use if the pipeline returns to what made them).
            self.changes = version_changes(self._log_version, self._version) or [
                "the pipeline's code"
            ]
            self._log_version = self._version
            settings = {key: self._version[key] for key in SETTINGS}
            self._append(json_line({"t": "code", "c": self._version["code"], "s": settings}))
        return self

    def _note_new_aliases(self) -> None:
        """Add the endpoints of aliases this run uses and the manifest does not name yet
        (an edit moved a call to one): a later run on another model behind them is then
        refused as for the first aliases."""
        manifest = json.loads(self.manifest_path.read_text())
        recorded = manifest.get("producer")
        if self.producer is None or not isinstance(recorded, dict):
            return
        endpoints = recorded.setdefault("endpoints", {})
        added = {
            alias: endpoint
            for alias, endpoint in (self.producer.get("endpoints") or {}).items()
            if alias not in endpoints
        }
        if added:
            endpoints.update(added)
            write_atomic(self.manifest_path, json.dumps(manifest))

    @property
    def _version(self) -> dict[str, Any]:
        return version_of(self.producer or {})

    def _outputs_current(self) -> bool:
        """Whether the output records being indexed were made by this run's version."""
        return self.producer is None or self._log_version == self._version

    def open_for_worker(self, name: str) -> Checkpoint:
        """Open as one worker process of a multi-process run (`plait.ray`).

        The driver holds the checkpoint (its lock, manifest and outputs); a worker
        logs the calls it completes to ``workers/<name>-<id>.jsonl``, a file no other
        process writes, and answers from every log in the directory, so an input
        rerun after its worker died pays for none of the calls the dead one finished.
        """
        if not self.manifest_path.exists():
            raise CheckpointError(
                f"{self.directory} has no manifest.json: the driver opens the checkpoint "
                "before it starts workers"
            )
        self._check_manifest()
        workers = self.directory / "workers"
        workers.mkdir(exist_ok=True)
        self._worker = True
        own = workers / f"{name}-{os.getpid()}-{os.urandom(3).hex()}.jsonl"
        self._paths = [own]
        self._load_log()
        self._fd = os.open(own, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        return self

    def __reduce__(self) -> Any:
        """Refuse to be pickled: an open checkpoint holds this process's file descriptors,
        and a copy in another process would write its records into whatever those
        numbers are there (a worker once wrote call records into an HTTP connection and
        into its event loop's signal pipe).  Another process opens the checkpoint's
        directory itself (`open_for_worker`)."""
        raise TypeError(
            f"a Checkpoint ({self.directory}) cannot be pickled or sent to another process: "
            "send its directory and open it there (Checkpoint.open_for_worker)"
        )

    def close(self) -> None:
        for reader in self._readers.values():
            os.close(reader)
        self._readers.clear()
        try:
            if self._fd is not None:
                try:
                    self._flush()
                    os.fsync(self._fd)
                finally:
                    os.close(self._fd)
                    self._fd = None
        finally:
            self._release_lock()

    def _check_manifest(self) -> dict[str, Any]:
        """Refuse a checkpoint this run must not resume; return its recorded producer."""
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(
                f"{self.manifest_path} is unreadable or corrupt ({exc}); delete {self.directory} "
                "to start over"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CheckpointError(
                f"{self.directory} is not a plait checkpoint (its manifest.json has no "
                f"'format': {FORMAT!r}); use an empty directory"
            )
        if manifest.get("version") != VERSION:
            raise CheckpointError(
                f"{self.directory} was written by checkpoint format version "
                f"{manifest.get('version')!r}; this plait reads version {VERSION}"
            )
        if manifest.get("pipeline") != self.pipeline:
            theirs = manifest.get("pipeline")
            if isinstance(theirs, str):
                theirs = shown_pipeline(theirs, manifest.get("target"))
            raise CheckpointError(
                f"{self.directory} belongs to pipeline {theirs!r}, not "
                f"{shown_pipeline(self.pipeline, self.target)!r}; use a different "
                "checkpoint_dir for this pipeline"
            )
        recorded = manifest.get("producer")
        if not isinstance(recorded, dict):
            return {}
        if self.producer is None:
            return recorded
        endpoints = _differences(recorded, self.producer)
        seed = _seed_changed(recorded, self.producer)
        if not endpoints and seed is None:
            return recorded
        why = (
            "a logged reply would answer for an endpoint that did not make it"
            if endpoints
            else "every request carries the seed, so a rerun would reuse none of its calls"
        )
        message = (
            f"{self.directory} holds calls made with other settings "
            f"({'; '.join([*endpoints, *([seed] if seed else [])])}): {why}. Run with the "
            "original settings, or start over (--fresh, or a new checkpoint_dir)"
        )
        if seed is not None or self.producer.get("configured"):
            raise CheckpointError(message)
        # No resources at all (an offline resume): what the checkpoint answers is fine;
        # the first call it cannot answer, which would go to another endpoint, fails.
        self.mismatch = message
        return recorded

    def _load_log(self) -> None:
        """Index the logs by streaming them (their size does not matter): the one this
        process writes, whose torn last line (left by a process killed mid-write) is
        cut off, then those of the workers of multi-process runs (`open_for_worker`)."""
        others = sorted((self.directory / "workers").glob("*.jsonl"))
        if self._worker:
            others.insert(0, self.log_path)
        self._paths += [path for path in others if path != self._paths[0]]
        for file, path in enumerate(self._paths):
            if path.exists():
                self._index(file, path)

    def refresh(self) -> None:
        """Index what other processes logged since: new worker logs, and what the known
        ones gained (a worker rerunning a dead one's inputs needs its latest calls)."""
        known = set(self._paths)
        others = sorted((self.directory / "workers").glob("*.jsonl"))
        self._paths += [path for path in others if path not in known]
        for file, path in enumerate(self._paths):
            if file and path.exists():
                self._index(file, path)

    def _index(self, file: int, path: Path) -> None:
        offset = start = self._indexed.get(file, 0)
        with open(path, "rb") as log:
            log.seek(start)
            for number, line in enumerate(log, start=1):
                if not line.endswith(b"\n"):
                    break  # torn: cut below
                try:
                    record = loads(line)
                    kind = record["t"]
                    if kind == "call":
                        self.calls[(record["i"], record["n"], record["h"])] = (
                            file,
                            offset,
                            len(line),
                        )
                    elif kind == "out":
                        if file == 0 and not self._worker and self._outputs_current():
                            self.outputs[record["i"]] = (record["h"], offset, len(line))
                    elif kind == "code":
                        if file == 0 and not self._worker:
                            self._log_version = self._recorded_version(record)
                    else:
                        raise ValueError(f"unknown record type {kind!r}")
                except (ValueError, KeyError, TypeError) as exc:
                    raise CheckpointError(
                        f"{path} line {number} is corrupt ({exc}); delete "
                        f"{self.directory} to start over, or remove that line to keep the rest"
                    ) from None
                offset += len(line)
        self._indexed[file] = offset
        if file == 0 and offset < path.stat().st_size:
            with open(path, "r+b") as log:
                log.truncate(offset)

    def _recorded_version(self, record: dict[str, Any]) -> dict[str, Any]:
        """The version a ``code`` record starts; one with no settings (written before
        they were recorded, when a change of them was refused) kept the manifest's."""
        settings = record.get("s")
        if settings is None:
            settings = {key: self._first_version.get(key) or {} for key in SETTINGS}
        elif not isinstance(settings, dict):
            raise TypeError(f"its settings are a {type(settings).__name__}, not an object")
        return {"code": record["c"], **{key: settings.get(key) or {} for key in SETTINGS}}

    def _append(self, data: bytes) -> tuple[int, int]:
        """Queue one record; it reaches the log at the start of the loop's next turn.

        Records made in one turn of the event loop go out as one ``write``: a busy run
        completes many calls per turn, and a syscall each was a fifth of a checkpointed
        run's cost.  A process killed before the flush loses at most that turn's
        records, whose calls a resume then pays for again (they were never acknowledged
        anywhere: outputs files are rewritten from the checkpoint on resume).
        """
        if self._fd is None:
            raise CheckpointError("checkpoint is not open")
        where = (self._size, len(data))
        self._size += len(data)
        self._pending.append(data)
        if not self._flush_scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._flush()
            else:
                self._flush_scheduled = True
                loop.call_soon(self._flush)
        return where

    def _flush(self) -> None:
        """Write every queued record, in order, with as few ``write`` calls as it takes."""
        self._flush_scheduled = False
        if not self._pending or self._fd is None:
            return
        data = memoryview(b"".join(self._pending))
        self._pending.clear()
        while data:  # O_APPEND: a short write (disk nearly full) continues where it stopped
            data = data[os.write(self._fd, data) :]

    def _read(self, file: int, offset: int, length: int) -> Any:
        if file == 0 and self._pending:
            self._flush()
        reader = self._readers.get(file)
        if reader is None:
            reader = self._readers[file] = os.open(self._paths[file], os.O_RDONLY)
        return loads(os.pread(reader, length, offset))

    def stored_call(self, key: tuple[int, str, str]) -> Any:
        """The reply a finished call got, or None."""
        where = self.calls.get(key)
        return None if where is None else self._read(*where)["v"]

    def record_call(
        self,
        index: int,
        node: str,
        request_hash: str,
        value: Any,
        timing: tuple[int, int] | None = None,
    ) -> None:
        """Log a finished call's answer: an LLM reply's JSON form, or ``{"value": ...}``;
        ``timing``: when it started (microseconds since the epoch) and how long it took
        (microseconds), which a profile of a rerun draws it with (`output_calls`)."""
        record = {"t": "call", "i": index, "n": node, "h": request_hash, "v": value}
        if timing is not None:
            record["at"], record["us"] = timing
        text = value.get("text")
        # A reply holds text, integers and None only: the fast writer is exact for it.
        data = text_line(record) if isinstance(text, str) else json_line(record)
        key = (index, node, request_hash)
        self.calls[key] = (0, *self._append(data))
        if self._by_input is not None:
            self._by_input.setdefault(index, []).append(key)
        self.note_call(key)
        if isinstance(text, str):
            self._last_reply[index] = (text, node, request_hash)

    def note_call(self, key: tuple[int, str, str]) -> None:
        """A call of a running input was made, or answered from the log: its output
        record names it (`output_calls`)."""
        if not self._worker:  # a worker records no outputs
            self._used.setdefault(key[0], {})[key[1:]] = None

    def record_output(self, index: int, input_hash: str, payload: Any) -> None:
        last = self._last_reply.pop(index, None)
        used = self._used.pop(index, None)
        if self._worker:
            return  # the driver records outputs
        record: dict[str, Any] = {"t": "out", "i": index, "h": input_hash}
        if used:
            # Which calls made it (a prefix of each request hash tells an input's calls
            # apart), for a profile of a rerun that restores it (`output_calls`).
            record["k"] = [[node, request_hash[:_SHORT_HASH]] for node, request_hash in used]
        if last is not None and type(payload) is str and (last[0] is payload or last[0] == payload):
            # The output is the text of a reply logged just before: point at that record
            # instead of writing the same text again (half the log of a one-call pipeline).
            record["c"] = [last[1], last[2]]
            data = text_line(record)
        else:
            try:
                record["v"] = encode(payload)
                data = text_line(record) if type(payload) is str else json_line(record)
            except RecursionError:
                raise ValueError(
                    f"the output ({type(payload).__name__}) contains itself, or is nested "
                    "too deeply, so it cannot be kept in a checkpoint"
                ) from None
        where = self._append(data)
        self.outputs[index] = (input_hash, *where)

    def forget(self, index: int) -> None:
        """An input has ended (finished or failed): drop what was kept for its output."""
        self._last_reply.pop(index, None)
        self._used.pop(index, None)

    def output_calls(self, index: int) -> list[dict[str, Any]]:
        """The calls that made input ``index``'s finished output, as the log has them:
        ``{"node", "at", "us", "usage", "model"}`` each (``at``/``us``: when it started,
        microseconds since the epoch, and how long it took; None when not logged).  A
        profile of a rerun that restores the output draws them (`restored_output`).

        An output logged without naming its calls (by an earlier plait, or by a Ray
        run, whose workers log the calls) gets every call logged for its input before
        it, and those of the workers' logs.
        """
        found = self.outputs.get(index)
        if found is None:
            return []
        if self._by_input is None:
            self._by_input = {}
            for key in self.calls:
                self._by_input.setdefault(key[0], []).append(key)
        mine = self._by_input.get(index, [])
        named = self._read(0, found[1], found[2]).get("k")
        if isinstance(named, list):
            chosen = [
                key
                for node, short in named
                for key in mine
                if key[1] == node and key[2].startswith(short)
            ]
        else:
            chosen = [key for key in mine if self.calls[key][0] or self.calls[key][1] < found[1]]
        calls = []
        for key in dict.fromkeys(chosen):
            record = self._read(*self.calls[key])
            reply = record.get("v") if isinstance(record.get("v"), dict) else {}
            calls.append(
                {
                    "node": key[1],
                    "at": record.get("at"),
                    "us": record.get("us"),
                    "usage": reply.get("usage"),
                    "model": reply.get("model"),
                }
            )
        return calls

    def finished_output(self, index: int, input_hash: str) -> tuple[bool, Any]:
        found = self.outputs.get(index)
        if found is None:
            return False, None
        if found[0] != input_hash:
            raise CheckpointError(
                f"input #{index} differs from the input this checkpoint recorded at that "
                f"position in {self.directory}; resume with the same inputs in the same order, "
                "or use a new checkpoint_dir"
            )
        record = self._read(0, found[1], found[2])
        if "c" not in record:
            return True, decode(record["v"])
        node, request_hash = record["c"]
        reply = self.stored_call((index, node, request_hash))
        if reply is None or not isinstance(reply.get("text"), str):
            raise CheckpointError(
                f"{self.log_path}: the output of input #{index} points at a reply the log does "
                f"not hold; delete {self.directory} to start over"
            )
        return True, reply["text"]


class CheckpointHandler(Handler):
    """Answers LLM calls that a killed run had completed; records new ones."""

    def __init__(self, checkpoint: Checkpoint, index_offset: int = 0) -> None:
        self.checkpoint = checkpoint
        #: Added to every input index in the keys: separate passes over inputs numbered
        #: from 0 (a trainer's passes on Ray workers) log to one directory apart.
        self.index_offset = index_offset

    def process_llm(self, msg: Message) -> None:
        if msg.input_index is None or msg.node_id is None:
            return
        request: LLMRequest = msg.kwargs["request"]
        key = self.key(msg, request)
        msg.meta["checkpoint_key"] = key
        stored = self.checkpoint.stored_call(key)
        if stored is not None:
            msg.value = _restore(stored, request)
            msg.done = True
            msg.meta["checkpoint"] = "hit"
            self.checkpoint.note_call(key)
        elif not msg.done and self.checkpoint.mismatch is not None:
            raise CheckpointError(self.checkpoint.mismatch)
        else:
            msg.meta["checkpoint_started"] = (time.time(), time.monotonic())

    def key(self, msg: Message, request: LLMRequest) -> tuple[int, str, str]:
        """Where the call's reply is logged: (input, graph node, request hash)."""
        assert msg.input_index is not None and msg.node_id is not None
        return (msg.input_index + self.index_offset, msg.node_id, request.fingerprint())

    def postprocess_llm(self, msg: Message) -> None:
        key = msg.meta.get("checkpoint_key")
        if key is None or msg.meta.get("checkpoint") == "hit" or msg.error is not None:
            return
        value = msg.value
        if isinstance(value, LLMResponse):
            stored: Any = response_to_json(value)
        else:
            try:
                stored = {"value": encode(value)}
            except TypeError:
                return  # a handler's answer with no JSON form: asked again on resume

        index, node, request_hash = key
        timing = None
        started = msg.meta.get("checkpoint_started")
        if started is not None:
            wall, mono = started
            timing = (round(wall * 1e6), round((time.monotonic() - mono) * 1e6))
        self.checkpoint.record_call(index, node, request_hash, stored, timing)


def restored_output(index: int, payload: Any, checkpoint: Checkpoint | None = None) -> Value:
    """Input ``index``'s output, answered from ``checkpoint`` instead of being run.

    The active handlers that keep an account of a run (a profiler) are told, with the
    calls that made it (`Checkpoint.output_calls`), so a rerun of a finished run
    leaves a trace that says where its outputs came from and what they took.
    """
    from plait.values import Value, kind_of

    notes: list[Callable[..., Any]] = []
    for handler in current_stack():
        note = getattr(handler, "note_restored", None)
        if callable(note):
            notes.append(note)
    if notes:
        calls = checkpoint.output_calls(index) if checkpoint is not None else []
        for note in notes:
            note(index, calls)
    return Value(kind_of(payload), payload, meta={"checkpoint": "hit"})


def _restore(stored: dict[str, Any], request: LLMRequest) -> Any:
    if "text" not in stored:
        return decode(stored["value"])
    return response_from_json(stored, request)
