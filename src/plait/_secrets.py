"""Keeping credentials out of everything plait prints or writes.

Keys come from the environment or a config reference and are sent only in request
headers.  A URL can carry credentials too (``http://user:SECRET@host/v1``, or a
``?api_key=`` parameter); `redact_url` hides them wherever a URL is shown.  Every
credential a configuration holds is also registered here, so `scrub` can remove
it from text plait did not write itself (an exception's message, a traceback)
before that text reaches an error value, a log line or a file.
"""

from __future__ import annotations

import re
import threading

__all__ = [
    "REDACTED",
    "looks_like_variable_name",
    "redact_url",
    "register",
    "scrub",
    "unset_variable",
]

REDACTED = "***"
_SECRET_PARAMS = re.compile(r"key|token|secret|password|passwd|auth|sig", re.IGNORECASE)
_secrets: set[str] = set()
_lock = threading.Lock()
_pattern: re.Pattern[str] | None = None


def register(secret: str | None) -> None:
    """Remember a credential so `scrub` removes it from any text (short ones are skipped:
    removing every "a" from a message would hide more than it protects)."""
    global _pattern
    if not secret or len(secret) < 6:
        return
    with _lock:
        if secret in _secrets:
            return
        _secrets.add(secret)
        ordered = sorted(_secrets, key=len, reverse=True)
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def scrub(text: str) -> str:
    """``text`` with every registered credential replaced by ``***``."""
    pattern = _pattern
    if pattern is None or not text:
        return text
    return pattern.sub(REDACTED, text)


def redact_url(url: str) -> str:
    """``url`` with any password (and the user name beside it) and any key-like query
    parameter replaced by ``***``; registers what it hid, for `scrub`."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return scrub(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        for piece in userinfo.split(":"):
            register(piece)
        netloc = f"{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        hidden = []
        for name, value in pairs:
            if _SECRET_PARAMS.search(name):
                register(value)
                value = REDACTED
            hidden.append((name, value))
        query = urlencode(hidden, safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def looks_like_variable_name(name: str) -> bool:
    return bool(_VARIABLE.fullmatch(name))


_CONVENTIONAL = re.compile(r"[A-Z_][A-Z0-9_]*")


def unset_variable(name: str) -> str:
    """How to mention an ``api_key_env`` variable that is not set.

    A conventional name (upper case, digits, ``_``: ``OPENAI_API_KEY``) is shown, so the
    user knows what to export.  Anything else may be a key pasted where its variable's
    name belongs (``hf_...``, ``gsk_...`` look like names too): it is never shown, only
    its length, and it is registered so no other message shows it either.
    """
    if _CONVENTIONAL.fullmatch(name):
        return f"names the environment variable {name!r}, which is not set"
    register(name)
    return (
        f"names a variable that is not set ({len(name)} characters, not shown: a variable "
        "name is usually upper case, like OPENAI_API_KEY, and this may be a key pasted in "
        "its place)"
    )
