"""The HTTP shapes of a pipeline, read from its ``forward``: what a request carries and
what a reply holds, as pydantic models.

FastAPI validates request bodies against these models (a bad body is a 422 naming
the field and what it expected) and puts them in the OpenAPI schema, so a client
generated from ``/openapi.json`` knows the pipeline's parameters and output type.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator

from plait._signature import forward_shape
from plait.module import Module
from plait.serve.strict import problem

__all__ = ["ErrorBody", "Schemas", "schemas_of"]


class ErrorBody(BaseModel):
    """A failure inside the pipeline (its `Value` of kind ERROR), as a client sees it."""

    kind: Literal["ERROR"] = "ERROR"
    type: str = Field(description="the exception's class, e.g. ProviderError, ValueError")
    message: str = Field(description="what went wrong (secrets scrubbed)")
    module_path: str | None = Field(None, description="the module whose call failed")
    traceback: str | None = Field(None, description="where it was raised (secrets scrubbed)")


class Failure(BaseModel):
    """The reply to an invoke whose pipeline failed."""

    error: ErrorBody


class JobCounts(BaseModel):
    total: int
    done: int
    failed: int
    pending: int


class JobCalls(BaseModel):
    """A job's LLM calls so far (this server's: a resumed job counts again from 0)."""

    done: int = Field(description="answered (by the endpoint, or by the job's checkpoint)")
    failed: int = Field(description="failed, after their retries")
    in_flight: int = Field(description="started and not answered: waiting for a slot, or sent")


#: A job's states: ``running`` (or waiting to be resumed), then one of the others.
JobState = Literal["running", "done", "cancelled", "failed"]


class JobStatus(BaseModel):
    id: str
    state: JobState
    counts: JobCounts
    calls: JobCalls
    created: float
    error: str | None = Field(None, description="why a failed job could not run")


class Problem(BaseModel):
    """A request plait refuses or cannot answer (an unknown job, a server shutting down)."""

    detail: str


@dataclass(frozen=True)
class Schemas:
    """The models of one pipeline's endpoints."""

    #: One input: an object whose fields are ``forward``'s parameters.
    input: type[BaseModel]
    #: ``{"output": ...}``, typed by ``forward``'s return annotation.
    output: type[BaseModel]
    #: ``{"inputs": [input, ...]}``.
    batch: type[BaseModel]
    #: One input's row of a batch, a stream or a job: ``index`` and ``output`` or ``error``.
    row: type[BaseModel]
    #: ``{"rows": [row, ...]}``.
    rows: type[BaseModel]
    #: An ended job's result: its state and the rows of the inputs that finished.
    result: type[BaseModel]
    #: The names passed by position (positional-only parameters), in order.
    positional: tuple[str, ...]


def schemas_of(module: Module) -> Schemas:
    """The request and reply models of ``module``'s endpoints, from ``forward``.

    Each parameter that can be passed by name becomes a field, typed by its annotation
    (``Any`` without one) and required unless it has a default; positional-only ones
    too (passed by position).  ``*args`` and ``**kwargs`` cannot be named in a JSON
    object, so a ``forward`` that takes them only through those is refused here; so is
    a parameter named with a leading underscore, which a pydantic model cannot have as
    a field.  Every field refuses a value strict JSON cannot carry (`strict.problem`),
    so such an input is a 422 before any call is made.
    """
    cls = type(module)
    shape = forward_shape(cls)
    hints = _hints(cls.forward)
    name = cls.__name__
    fields: dict[str, Any] = {}
    positional: list[str] = []
    for param in shape.parameters:
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.name.startswith("_"):
            raise TypeError(
                f"{name}.forward's parameter {param.name!r} starts with an underscore, which "
                "an HTTP input cannot carry (such names are private to the request model): "
                f"rename it, e.g. {param.name.lstrip('_') or 'value'!r}"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            positional.append(param.name)
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    if not fields:
        raise TypeError(
            f"{name}.forward takes no named parameters ({shape.signature}), so an HTTP "
            "request has no field to fill: give forward named parameters, e.g. "
            "`def forward(self, text: str)`"
        )
    forbid = ConfigDict(extra="forbid")
    strict = {"strict_json": field_validator("*", mode="before")(_strict_json)}
    input_model = create_model(
        f"{name}Input",
        __config__=forbid,
        __validators__=strict,
        **fields,
    )
    returns = hints.get("return", Any)
    output_model = create_model(f"{name}Output", output=(returns, ...))
    batch_model = create_model(
        f"{name}Batch",
        __config__=forbid,
        inputs=(list[input_model], ...),  # type: ignore[valid-type]
    )
    row_model = create_model(
        f"{name}Row",
        index=(int, ...),
        output=(typing.Optional[returns], None),  # noqa: UP045 (returns may be Any)
        error=(ErrorBody | None, None),
    )
    rows_model = create_model(f"{name}Rows", rows=(list[row_model], ...))  # type: ignore[valid-type]
    result_model = create_model(
        f"{name}JobResult",
        state=(JobState, ...),
        rows=(list[row_model], Field(description="the finished inputs' rows, in input order")),  # type: ignore[valid-type]
        error=(str | None, Field(None, description="why a failed job stopped")),
    )
    return Schemas(
        input_model,
        output_model,
        batch_model,
        row_model,
        rows_model,
        result_model,
        tuple(positional),
    )


def _strict_json(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """A field's value as the request sent it, refused if strict JSON cannot carry it
    (a NaN, a lone surrogate): the pipeline could not pass it on, nor its reply quote it."""
    found = problem(value, info.field_name or "")
    if found is not None:
        raise ValueError(f"{found}; send strict JSON (whole UTF-8 text, finite numbers)")
    return value


def _hints(fn: Any) -> dict[str, Any]:
    """``fn``'s annotations, resolved (``from __future__ import annotations`` makes them
    text); one that cannot be resolved is ``Any``, never a refusal to serve."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        raw = getattr(fn, "__annotations__", {})
        return {key: value for key, value in raw.items() if not isinstance(value, str)}
