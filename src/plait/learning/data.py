"""Training data: examples as ``(input, target)`` pairs, from pairs, mappings or a file.

The trainer, ``plait train`` and ``plait eval`` read their data here, so a data
file means the same examples to each of them, and the same inputs ``plait run``
would pass for the same records (the field mapping is `plait.inputs`').
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from plait.learning.failures import TrainerError
from plait.learning.step import Inputs

__all__ = ["Example", "input_field_name", "load_examples"]

#: One training example: the pipeline's input and the target its loss compares with.
Example = tuple[Any, Any]


def load_examples(
    data: str | os.PathLike[str] | Iterable[Any],
    input_field: str | None = None,
    target_field: str = "target",
    *,
    forward: Callable[..., Any] | None = None,
    require_target: bool = False,
    on_unused: Callable[[str], None] | None = None,
) -> list[Example]:
    """``(input, target)`` pairs from pairs, mappings, or a data file of mappings.

    A file is read as ``plait run`` reads its inputs (JSONL or CSV by suffix, a
    UTF-8 BOM dropped).  A mapping's input is its ``input_field``; without one,
    the fields named like ``forward``'s parameters (when they include every
    required one, the target field aside), else the field ``input``
    (`plait.inputs.map_record`, the rule ``plait run`` follows too).  A
    mapping that gives no input is an error naming the fields it has, since
    passing the whole record would put the target inside the prompt.  A mapping
    without the target field gives a target of None (a loss that needs no
    reference, such as a judge, can still score it) unless ``require_target``.
    """
    from plait.inputs import CallShape, map_record

    records = _records(data)
    shape = CallShape.of(forward) if forward is not None else None
    examples: list[Example] = []
    for where, record in records:
        if isinstance(record, Mapping):
            fields = dict(record)
            if require_target and target_field not in fields:
                raise TrainerError(
                    f"{where} has no target field {target_field!r} (its fields: "
                    f"{', '.join(map(str, fields)) or 'none'}); name the target field "
                    "(--target-field NAME, or target_field=...)"
                )
            mapped = map_record(
                fields,
                shape,
                input_field,
                where,
                field_flag="--input-field",
                skip=frozenset({target_field}),
                fallback_field="input",
            )
            if mapped.problem is not None:
                raise TrainerError(mapped.problem)
            if mapped.kwargs:
                # Several parameters filled by name: the example's input is all of them,
                # passed by name (`Inputs`); one is that field's value, as before.
                names = ", ".join(map(repr, mapped.kwargs))
                if on_unused is not None and mapped.unused:
                    on_unused(
                        f"the input is the field(s) {names}; the field(s) "
                        f"{', '.join(mapped.unused)} are not passed to the pipeline"
                    )
                    on_unused = None  # once, not per example
                value = (
                    Inputs(mapped.kwargs)
                    if len(mapped.kwargs) > 1
                    else next(iter(mapped.kwargs.values()))
                )
                examples.append((value, fields.get(target_field)))
            else:
                examples.append((mapped.args[0], fields.get(target_field)))
        elif isinstance(record, tuple | list) and len(record) == 2:
            examples.append((record[0], record[1]))
        else:
            raise TrainerError(
                f"{where} is a {type(record).__name__}; expected an (input, target) pair or "
                f"an object with {input_field or 'input'!r} and {target_field!r}"
            )
    return examples


def _records(data: str | os.PathLike[str] | Iterable[Any]) -> list[tuple[str, Any]]:
    """Each record of ``data`` with where it is (a file's line), for messages."""
    from plait.inputs import InputError, read_records

    if not isinstance(data, str | os.PathLike):
        return [(f"the dataset, record {n}", record) for n, record in enumerate(data, 1)]
    path = Path(data)
    if path.is_dir():
        raise TrainerError(f"the dataset {path} is a directory; give a JSONL or CSV file")
    try:
        read = read_records(str(path))
    except InputError as exc:
        raise TrainerError(f"cannot read the dataset {path}: {exc}") from None
    bad = next((record for record in read if record.problem is not None), None)
    if bad is not None:
        raise TrainerError(str(bad.problem))
    return [(record.where, record.value) for record in read]


def input_field_name(
    data: str | os.PathLike[str] | Iterable[Any],
    input_field: str | None = None,
    target_field: str = "target",
    *,
    forward: Callable[..., Any] | None = None,
) -> str | None:
    """The field of the data's records that an example's input is, by the rule
    `load_examples` follows (its first record decides): ``input_field`` when given, the
    one field named like a parameter of ``forward``, else ``input``.  None when the
    input is no one field (several fields passed by name, the record passed whole):
    it then keeps its fields' own names where a metric is shown the example."""
    from plait.inputs import CallShape, map_record

    if input_field is not None:
        return input_field
    first = next((record for _, record in _records(data) if isinstance(record, Mapping)), None)
    if first is None:
        return "input"
    shape = CallShape.of(forward) if forward is not None else None
    mapped = map_record(
        dict(first), shape, None, "", skip=frozenset({target_field}), fallback_field="input"
    )
    if mapped.kwargs:
        return next(iter(mapped.kwargs)) if len(mapped.kwargs) == 1 else None
    return "input" if "input" in first else None
