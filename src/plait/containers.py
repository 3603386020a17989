"""Containers: hold modules or parameters so they register, as in ``torch.nn``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, ClassVar, overload

from plait.module import Module
from plait.parameter import Parameter

__all__ = ["ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"]


def _check_module(value: Any, where: str) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{where} holds Modules, got {type(value).__name__}")
    return value


def _check_parameter(value: Any, where: str) -> Parameter:
    if not isinstance(value, Parameter):
        raise TypeError(
            f"{where} holds Parameters, got {type(value).__name__}; wrap values as "
            "Parameter(value, description=...)"
        )
    return value


class Sequential(Module):
    """Modules applied one after another: each output is the next module's input."""

    def __init__(self, *modules: Module | Mapping[str, Module]) -> None:
        super().__init__()
        first = modules[0] if len(modules) == 1 else None
        if isinstance(first, Mapping):
            for name, child in first.items():
                setattr(self, name, _check_module(child, "Sequential"))
        else:
            for i, step in enumerate(modules):
                setattr(self, str(i), _check_module(step, "Sequential"))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self._children:
            raise ValueError("an empty Sequential has nothing to run")
        steps = iter(self._children.values())
        out = next(steps)(*args, **kwargs)
        for module in steps:
            out = module(out)
        return out

    def __getitem__(self, index: int) -> Module:
        return list(self._children.values())[index]

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._children.values())


class ModuleList(Module):
    """A list of modules, indexable and iterable; children are named ``0``, ``1``, ..."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        self.extend(modules)

    def _items(self) -> list[Module]:
        return list(self._children.values())

    def _rebuild(self, items: list[Module]) -> None:
        for name in list(self._children):
            delattr(self, name)
        for i, module in enumerate(items):
            setattr(self, str(i), module)

    @overload
    def __getitem__(self, index: int) -> Module: ...
    @overload
    def __getitem__(self, index: slice) -> ModuleList: ...
    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        if isinstance(index, slice):
            return ModuleList(self._items()[index])
        return self._items()[index]

    def __setitem__(self, index: int, module: Module) -> None:
        items = self._items()
        items[index] = _check_module(module, "ModuleList")
        self._rebuild(items)

    def __delitem__(self, index: int) -> None:
        items = self._items()
        del items[index]
        self._rebuild(items)

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items())

    def append(self, module: Module) -> ModuleList:
        setattr(self, str(len(self._children)), _check_module(module, "ModuleList"))
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        items = self._items()
        items.insert(index, _check_module(module, "ModuleList"))
        self._rebuild(items)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ModuleList has no forward(); iterate over it inside your own module's forward"
        )


class ModuleDict(Module):
    """Modules by name, in insertion order."""

    def __init__(self, modules: Mapping[str, Module] | None = None) -> None:
        super().__init__()
        if modules:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._children[key]

    def __setitem__(self, key: str, module: Module) -> None:
        setattr(self, key, _check_module(module, "ModuleDict"))

    def __delitem__(self, key: str) -> None:
        delattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._children

    def __len__(self) -> int:
        return len(self._children)

    def __iter__(self) -> Iterator[str]:
        return iter(self._children)

    def keys(self) -> Iterable[str]:
        return self._children.keys()

    def values(self) -> Iterable[Module]:
        return self._children.values()

    def items(self) -> Iterable[tuple[str, Module]]:
        return self._children.items()

    def update(self, modules: Mapping[str, Module]) -> None:
        for key, module in modules.items():
            self[key] = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "ModuleDict has no forward(); index it inside your own module's forward"
        )


class ParameterList(Module):
    """A list of parameters (for example few-shot examples), each learnable on its own."""

    _holds_only_parameters: ClassVar[bool] = True

    def __init__(self, parameters: Iterable[Parameter] = ()) -> None:
        super().__init__()
        for param in parameters:
            self.append(param)

    def __getitem__(self, index: int) -> Parameter:
        return list(self._parameters.values())[index]

    def __setitem__(self, index: int, param: Parameter) -> None:
        name = list(self._parameters)[index]
        setattr(self, name, _check_parameter(param, "ParameterList"))

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[Parameter]:
        return iter(list(self._parameters.values()))

    def append(self, param: Parameter) -> ParameterList:
        setattr(self, str(len(self._parameters)), _check_parameter(param, "ParameterList"))
        return self

    def extend(self, parameters: Iterable[Parameter]) -> ParameterList:
        for param in parameters:
            self.append(param)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ParameterList holds parameters; it has no forward()")


class ParameterDict(Module):
    """Parameters by name, in insertion order."""

    _holds_only_parameters: ClassVar[bool] = True

    def __init__(self, parameters: Mapping[str, Parameter] | None = None) -> None:
        super().__init__()
        for key, param in (parameters or OrderedDict()).items():
            self[key] = param

    def __getitem__(self, key: str) -> Parameter:
        return self._parameters[key]

    def __setitem__(self, key: str, param: Parameter) -> None:
        setattr(self, key, _check_parameter(param, "ParameterDict"))

    def __contains__(self, key: object) -> bool:
        return key in self._parameters

    def __len__(self) -> int:
        return len(self._parameters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def keys(self) -> Iterable[str]:
        return self._parameters.keys()

    def values(self) -> Iterable[Parameter]:
        return self._parameters.values()

    def items(self) -> Iterable[tuple[str, Parameter]]:
        return self._parameters.items()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("ParameterDict holds parameters; it has no forward()")
