"""A persistent, content-addressed cache of LLM replies: pay for each distinct call once.

Why SQLite in WAL mode: a cache is most useful when it is shared (a notebook, a
test suite and a batch job on one machine, or several workers of one job), and
WAL lets any number of processes read while one writes, with the busy timeout
turning a collision between writers into a short wait instead of an error.
Each lookup and each insert is one short statement on a file on local disk, so
it runs inline on plait's event loop; a thread hop per call would cost more
than the statement.

Why the key is `request_key`: it changes exactly when the reply could (model,
endpoint, messages, sampling settings, schema, extra fields) and never with
local names or credentials, so an alias renamed or an API key rotated still
hits, while a changed temperature or model misses.

Why only successful replies that the endpoint itself produced are stored: a
failure is not an answer, and a reply invented by another handler (a mock, a
replay) must not leak into a cache that outlives the test that made it.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from plait.effects import Handler, Message
from plait.handlers.llm import (
    answer,
    request_key,
    request_of,
    response_from_json,
    response_to_json,
)
from plait.providers.base import LLMResponse

__all__ = ["Cache", "CacheError", "bypass", "cache"]

FORMAT = "plait-cache"
VERSION = 1

#: How long a write waits for another process's write to finish before failing.
BUSY_TIMEOUT_S = 30.0

_META_TABLE = "plait_cache_meta"
_REPLIES_TABLE = "plait_cache_replies"


class CacheError(RuntimeError):
    """The cache file cannot be used (not a cache, damaged, not writable).

    The message says why and what to do.
    """


class _Everything:
    """Stands for "every cache" in the bypass context variable."""

    def __repr__(self) -> str:
        return "<every cache>"


_EVERY = _Everything()

# Which caches calls in the current context must neither read nor write.  A context
# variable, so a bypass around `run_sync` reaches plait's loop and never leaks into
# concurrent runs.
_bypassed: ContextVar[tuple[object, ...]] = ContextVar("plait_cache_bypass", default=())


@contextlib.contextmanager
def _bypassing(target: object) -> Iterator[None]:
    token = _bypassed.set((*_bypassed.get(), target))
    try:
        yield
    finally:
        _bypassed.reset(token)


def bypass() -> contextlib.AbstractContextManager[None]:
    """Calls made inside the block go to the endpoint and are not stored, in every cache.

    For the calls whose freshness matters (a live demo, measuring the endpoint)
    inside a pipeline that otherwise runs cached.  Also reachable as
    ``plait.handlers.cache.bypass()``.

    Returns:
        A context manager.
    """
    return _bypassing(_EVERY)


class Cache(Handler):
    """Answers an LLM call from the cache file when the same call was made before.

    The lookup uses the request as it reaches this handler; the reply is stored
    under the request that was actually sent.  So a handler that rewrites requests
    (an override of the temperature, say) should sit inside the cache
    (``with cache(path), override(...):``) for reruns to hit; the other way round
    the cache is never wrong, it only misses.  Made by `cache`.

    Args:
        path: The SQLite file (created if missing, its folder too).
        namespace: Keeps separate caches in one file: a call cached under one
            namespace misses under another.

    Raises:
        CacheError: When the file is not a plait cache, is damaged or cannot be
            written.

    Examples:
        ```python
        import plait
        from plait.handlers import cache

        fast = {"provider": "openai", "model": "gpt-4o-mini", "api_key_env": "OPENAI_API_KEY"}
        resources = plait.ResourceConfig({"fast": fast})
        summarize = plait.LLMInference("fast", system_prompt="Summarize.").bind(resources=resources)

        with cache("calls.db") as calls:
            summarize.run_sync("A long text.")  # sent, then stored
            summarize.run_sync("A long text.")  # answered from calls.db
        print(calls.stats()["hits"], calls.stats()["stores"])
        ```
    """

    def __init__(self, path: str | os.PathLike[str], namespace: str = "") -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.hits = 0
        self.misses = 0
        self.stores = 0
        # One connection shared by every thread that runs this handler, behind a lock:
        # the statements are short, and a connection must not be used concurrently.
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._pid = os.getpid()
        # Per-handler name for the note a missed call carries from process to postprocess.
        self._pending_key = f"cache.pending.{id(self):x}"
        with self._lock:
            self._connection()  # a bad path or a foreign file fails here, not mid-run

    def __repr__(self) -> str:
        return (
            f"Cache({str(self.path)!r}, namespace={self.namespace!r}, "
            f"hits={self.hits}, misses={self.misses})"
        )

    # -- the hooks ----------------------------------------------------------------------
    def process_llm(self, msg: Message) -> None:
        """Answer the call from the file when the same request was stored before.

        Args:
            msg: The LLM call's message.
        """
        if not self._applies(msg):
            return
        response = self._lookup(request_key(msg, self.namespace), msg)
        if response is not None:
            with self._lock:
                self.hits += 1
            answer(msg, response)
            msg.meta["cache"] = "hit"
            return
        with self._lock:
            self.misses += 1
        msg.meta.setdefault("cache", "miss")
        sent: list[bool] = [False]
        msg.meta[self._pending_key] = sent
        msg.fn = _marking(msg.fn, sent)

    def postprocess_llm(self, msg: Message) -> None:
        """Store a successful reply the endpoint itself produced.

        Args:
            msg: The LLM call's message.
        """
        sent = msg.meta.pop(self._pending_key, None)
        if not sent or not sent[0] or msg.error is not None:
            return
        if not isinstance(msg.value, LLMResponse):
            return
        key = request_key(msg, self.namespace)
        reply = json.dumps(response_to_json(msg.value), separators=(",", ":"))
        with self._lock:
            self._execute(
                f"INSERT OR REPLACE INTO {_REPLIES_TABLE} (namespace, key, reply, created) "
                "VALUES (?, ?, ?, ?)",
                (self.namespace, key, reply, time.time()),
            )
            self.stores += 1

    def _lookup(self, key: str, msg: Message) -> LLMResponse | None:
        with self._lock:
            row = self._fetch_one(
                f"SELECT reply FROM {_REPLIES_TABLE} WHERE namespace = ? AND key = ?",
                (self.namespace, key),
            )
        if row is None:
            return None
        try:
            return response_from_json(json.loads(row[0]), request_of(msg))
        except (ValueError, KeyError, TypeError):
            # A stored reply the response type no longer accepts (or a damaged row) is a
            # miss; the fresh reply replaces it.
            return None

    def _applies(self, msg: Message) -> bool:
        if msg.done:
            return False
        skipped = _bypassed.get()
        return not (skipped and (_EVERY in skipped or self in skipped))

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if not self.entered:
            # The last block using the cache is over: closing folds the WAL back into the
            # file, which is then complete on its own (to copy, or to commit with tests).
            self.close()

    # -- for users ----------------------------------------------------------------------
    def bypass(self) -> contextlib.AbstractContextManager[None]:
        """Calls made inside the block skip this cache only (others still apply).

        Returns:
            A context manager.
        """
        return _bypassing(self)

    def stats(self) -> dict[str, Any]:
        """This handler's hits, misses and stores, and the entries its namespace holds.

        Returns:
            ``{"hits", "misses", "stores", "hit_rate", "entries"}``.
        """
        with self._lock:
            entries = self._fetch_one(
                f"SELECT COUNT(*) FROM {_REPLIES_TABLE} WHERE namespace = ?", (self.namespace,)
            )[0]
            looked_up = self.hits + self.misses
            return {
                "hits": self.hits,
                "misses": self.misses,
                "stores": self.stores,
                "hit_rate": self.hits / looked_up if looked_up else 0.0,
                "entries": int(entries),
            }

    def clear(self) -> int:
        """Delete this namespace's entries (other namespaces in the file stay).

        Returns:
            How many entries were deleted.
        """
        with self._lock:
            cursor = self._execute(
                f"DELETE FROM {_REPLIES_TABLE} WHERE namespace = ?", (self.namespace,)
            )
            return int(cursor.rowcount)

    def close(self) -> None:
        """Close the file; the handler reopens it if it is used again."""
        with self._lock:
            if self._db is not None and self._pid == os.getpid():
                self._db.close()
            self._db = None

    # -- the file -----------------------------------------------------------------------
    def _execute(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        """One statement (caller holds the lock); a damaged file is named, with the fix."""
        try:
            return self._connection().execute(sql, params)
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def _fetch_one(self, sql: str, params: tuple[Any, ...]) -> Any:
        """The first row of a query (caller holds the lock): reading a row can meet
        damage the statement itself did not, so it is judged the same way."""
        cursor = self._execute(sql, params)
        try:
            return cursor.fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: sqlite3.DatabaseError) -> Exception:
        """A damaged file, named with the fix; never the stored text (a prompt, a reply)."""
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return exc
        what = str(exc)
        if "decode" in what.lower() or " with text " in what:
            what = "a stored row is not valid UTF-8 text"
        return CacheError(
            f"the cache {self.path} is damaged ({what}); delete it (the next run starts a "
            "new one) or give cache() another file"
        )

    def _connection(self) -> sqlite3.Connection:
        """The open connection (caller holds the lock); a forked child opens its own."""
        if self._db is not None and self._pid == os.getpid():
            return self._db
        if self._db is not None:
            # Inherited through a fork: never closed here, since closing a connection the
            # parent still uses could checkpoint the file under it.
            _inherited.append(self._db)
        self._db = _open(self.path)
        self._pid = os.getpid()
        return self._db


_inherited: list[sqlite3.Connection] = []


def _marking(fn: Callable[..., Any] | None, sent: list[bool]) -> Callable[..., Any] | None:
    """``fn`` that also notes it ran to completion: only then is the reply the endpoint's."""
    if fn is None:
        return None

    async def send(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        sent[0] = True
        return result

    return send


def _open(path: Path) -> sqlite3.Connection:
    if path.is_dir():
        raise CacheError(
            f"cache path {path} is a directory; give a file, such as {path / 'llm-cache.db'}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot create the folder for cache {path}: {exc}") from None
    try:
        db = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise CacheError(f"cannot open cache {path}: {exc}") from None
    try:
        _prepare(db, path)
    except sqlite3.DatabaseError as exc:
        db.close()
        if getattr(exc, "sqlite_errorname", "") == "SQLITE_NOTADB":
            raise CacheError(
                f"{path} is not a plait cache (it is not an SQLite database); "
                "give a new file path, or delete this file if it is a damaged cache"
            ) from None
        raise CacheError(
            f"cannot use {path} as a plait cache ({exc}); if the file is damaged, delete it "
            "(the next run starts a new one) or give cache() another file"
        ) from None
    except BaseException:
        db.close()
        raise
    return db


def _switch_to_wal(db: sqlite3.Connection) -> str:
    """Turn WAL on; retried, because SQLite answers "locked" at once (without waiting out
    the busy timeout) when two processes switch a new file's journal mode together."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            return str(db.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def _prepare(db: sqlite3.Connection, path: Path) -> None:
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    mode = _switch_to_wal(db)
    if str(mode).lower() != "wal":
        raise CacheError(
            f"cannot switch {path} to SQLite's WAL mode (it stays in {mode!r} mode), which "
            "processes sharing the cache rely on; put the cache on a local disk"
        )
    # WAL with synchronous=NORMAL never corrupts the file; a power cut may lose the
    # last replies, which a cache can afford, and commits skip an fsync each.
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("BEGIN IMMEDIATE")  # two processes creating the same new cache take turns
    try:
        tables = {
            row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if not tables:
            db.execute(f"CREATE TABLE {_META_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
            db.execute(
                f"CREATE TABLE {_REPLIES_TABLE} (namespace TEXT NOT NULL, key TEXT NOT NULL, "
                "reply TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (namespace, key)) "
                "WITHOUT ROWID"
            )
            db.executemany(
                f"INSERT INTO {_META_TABLE} (name, value) VALUES (?, ?)",
                [("format", FORMAT), ("version", str(VERSION))],
            )
        elif _META_TABLE not in tables or _REPLIES_TABLE not in tables:
            raise CacheError(
                f"{path} is an SQLite database but not a plait cache (its tables: "
                f"{', '.join(sorted(tables))}); give a new file path for the cache"
            )
        else:
            meta = dict(db.execute(f"SELECT name, value FROM {_META_TABLE}").fetchall())
            if meta.get("format") != FORMAT:
                raise CacheError(f"{path} is not a plait cache (format {meta.get('format')!r})")
            if meta.get("version") != str(VERSION):
                raise CacheError(
                    f"{path} was written by plait cache format version {meta.get('version')}; "
                    f"this plait reads version {VERSION}: give a new file path for the cache"
                )
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


class _CacheFactory:
    """``cache(path)`` makes a `Cache`; ``cache.bypass()`` skips every cache for a block.

    An object rather than a function so that the documented spelling
    ``plait.handlers.cache.bypass()`` works on the factory users already hold.
    """

    def __call__(self, path: str | os.PathLike[str], namespace: str = "") -> Cache:
        """A cache in the SQLite file at ``path`` (created if missing; its folder too).

        ``namespace`` keeps separate caches in one file: a call cached under one
        namespace misses under another.
        """
        return Cache(path, namespace)

    @staticmethod
    def bypass() -> contextlib.AbstractContextManager[None]:
        """Calls made inside the block go to the endpoint and are not stored, in every cache."""
        return bypass()

    def __repr__(self) -> str:
        return "plait.handlers.cache"


cache = _CacheFactory()
"""Pay for each distinct LLM call once: answer repeated calls from a SQLite file.

``cache(path, namespace="")`` returns a `Cache` handler; enter it with ``with``.
``path`` is the SQLite file (created if missing, its folder too); a ``namespace``
keeps separate caches in one file (a call cached under one misses under another).
The key is the request as the endpoint would receive it (model, messages,
sampling settings, schema, provider fields), never the alias or the key, so a
changed prompt or temperature misses and a renamed alias still hits.  Only
successful replies the endpoint itself produced are stored.  ``cache.bypass()``
makes the calls inside its block skip every cache.  `Cache` has an example.
"""
