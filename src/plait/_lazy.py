"""Names a package exports without importing their modules until first use.

Keeps ``import plait`` fast: pydantic, the execution engine and the handler
catalogue load only when a program touches them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``table[name]`` and caches the attribute.

    An entry naming the package's own submodule (``"functional": "plait.functional"``)
    exports that module itself.
    """

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = importlib.import_module(module)
        if module != f"{package}.{name}":
            value = getattr(value, name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
