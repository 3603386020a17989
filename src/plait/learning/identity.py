"""A training run's identity: what must match for a checkpoint to be resumed.

A checkpoint holds a position in the data and the best validation score so far.
Both mean something only for the run that wrote them: the same batches (model,
data, batch size, seed), scored by the same loss on the same models, through the
same pipeline.  `run_identity` describes a run as plain data, saved with every
checkpoint; `check_resume` compares a checkpoint's with the run's and refuses,
in one line naming what changed, to resume on scores measured by something else.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

from plait.learning.data import Example
from plait.learning.failures import TrainerError
from plait.module import Module
from plait.parameter import Parameter

__all__ = ["check_resume", "describe_loss", "loss_changes", "run_identity"]

#: How a resume refused for changed data names each set.
_DATA_NAMES = {
    "train": "the training data (--data)",
    "val": "the validation data (--val)",
    "test": "the held-out test data (--test)",
}
#: How a refusal says to start over: in the same directory (``--fresh``) or another...
_START_FRESH = "--fresh, or another checkpoint directory"
#: ...or, where the refusal predates ``--fresh``, by deleting it.
_START_ELSEWHERE = "delete the directory or choose another"


def run_identity(
    model: Module,
    loss_fn: Module,
    resources: Any,
    *,
    train: list[Example],
    val: list[Example] | None,
    test: list[Example] | None,
    batch_size: int,
    seed: int,
    shuffle: bool,
) -> dict[str, Any]:
    """What must match for a checkpoint's position to mean the same batches, and its
    scores the same measure (JSON-ready; `check_resume` reads it back)."""
    return {
        "model": f"{type(model).__module__}.{type(model).__qualname__}",
        "train_size": len(train),
        "batch_size": batch_size,
        "seed": seed,
        "shuffle": shuffle,
        "data": _data_digests({"train": train, "val": val, "test": test}),
        "loss": describe_loss(loss_fn),
        "scored_by": _scored_by(model, loss_fn, resources),
        "pipeline": _pipeline_identity(model),
    }


def _pipeline_identity(model: Module) -> dict[str, Any]:
    """The pipeline's code and its calls' settings (``key=value`` arguments such as
    ``llm.temperature=0.3`` included): the steps a checkpoint kept were measured on
    them, and its parameters learned for them."""
    from plait.execution.checkpoint import call_settings_of, code_of

    return {"code": code_of(model), "calls": call_settings_of(model)}


def _scored_by(model: Module, loss_fn: Module, resources: Any) -> dict[str, str]:
    """The model behind each alias the pipeline and the loss call ("provider/model"):
    a validation score kept from one model means nothing next to another's.  The
    URL is left out: the same model moved to another server scores the same."""
    from plait.resources.manager import ResourceManager

    try:
        manager = ResourceManager.coerce(resources)
    except Exception:  # reported where the run uses the resources
        return {}
    found: dict[str, str] = {}
    for module in (*model.modules(), *loss_fn.modules()):
        alias = getattr(module, "alias", None)
        if not getattr(module, "_calls_llm", False) or not isinstance(alias, str):
            continue
        try:
            config = manager.config_for(alias)
        except Exception:  # a missing alias: refused before the first call
            continue
        found[alias] = f"{config.provider}/{config.model or 'default'}"
    return found


def _data_digests(sets: dict[str, list[Example] | None]) -> dict[str, str | None]:
    """A digest of each data set's examples as loaded (train, val, test).

    The data are part of what a checkpoint's scores mean: a validation score
    kept from one file compared with scores on another would keep or roll back
    updates, and report a held-out test, on nothing.
    """
    from plait._digest import digest

    return {name: None if examples is None else digest(examples) for name, examples in sets.items()}


def describe_loss(loss: Module) -> dict[str, Any]:
    """What a loss scores by, as plain data: each of its modules' class, its settings
    (plain attributes: a judge's criteria and alias, a match's normalisation) and its
    parameters' values.  Part of a training run's identity: a resumed run compares
    its validation scores with the best the checkpoint kept, which means nothing if
    the loss changed in between."""
    from plait.execution.checkpoint import code_of

    described: dict[str, Any] = {}
    for path, part in loss.named_modules():
        cls = type(part)
        entry: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}"}
        functions = []
        for key, value in sorted(vars(part).items()):
            if key.startswith("_") or isinstance(value, Module | Parameter):
                continue
            shown = _plain(value)
            if shown is not None:
                entry[key] = shown
            if inspect.isfunction(value) or inspect.ismethod(value):
                functions.append(value)
        # A metric's (or a loss class's own) code scores as much as its settings: an
        # edited metric must not be compared with the scores the old one kept.
        code = code_of(None, *cls.__mro__, *functions)
        if code:
            entry["code"] = code
        entry["parameters"] = {
            name: _plain(param.value) for name, param in part._parameters.items()
        }
        described[path or "(loss)"] = entry
    return described


def _plain(value: Any) -> Any:
    """``value`` as JSON-ready data (a function by its qualified name), or None."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if callable(value):
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return f"{getattr(value, '__module__', '')}.{name}"
    return None


def loss_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two `describe_loss` results, in words."""

    def short(value: Any) -> str:
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + "..."

    def name(entry: Any) -> str:
        found = entry.get("class", "?") if isinstance(entry, dict) else "none"
        return str(found).rsplit(".", 1)[-1]

    changes: list[str] = []
    for path in sorted(set(before) | set(now)):
        was, is_ = before.get(path), now.get(path)
        where = "the loss" if path == "(loss)" else f"the loss's {path}"
        if (
            not isinstance(was, dict)
            or not isinstance(is_, dict)
            or was.get("class") != is_.get("class")
        ):
            changes.append(f"{where} was {name(was)}, now {name(is_)}")
            continue
        for key in sorted(set(was) | set(is_)):
            if key == "code" and was.get(key) != is_.get(key):
                files = sorted(
                    set(was.get(key) or {}).symmetric_difference(is_.get(key) or {})
                    | {
                        name
                        for name, hashed in (is_.get(key) or {}).items()
                        if (was.get(key) or {}).get(name) not in (None, hashed)
                    }
                )
                shown = ", ".join(_source_name(name) for name in files)
                changes.append(f"{where}'s code changed ({shown})")
            elif key != "class" and was.get(key) != is_.get(key):
                changes.append(
                    f"{where} {key} was {short(was.get(key))}, now {short(is_.get(key))}"
                )
    return changes or ["its settings changed"]


def _source_name(module: str) -> str:
    """A Python module as its user knows it: its file's name when it is loaded (a
    metric loaded from ``metrics.py`` runs under a name plait made up), else its name."""
    import sys

    file = getattr(sys.modules.get(module), "__file__", None)
    return Path(file).name if file else module


def check_resume(
    checkpoint_dir: Path, state: dict[str, Any], identity: dict[str, Any], optimizers: list[Any]
) -> list[Any]:
    """The checkpoint's optimizer states, one per optimizer in order, if ``state`` (a
    checkpoint) was written by the run ``identity`` (`run_identity`) describes, with
    the same optimizers; else a `TrainerError` naming what changed.

    The pipeline, the models, the loss and the data are checked first, each refused
    in its own words, since they are what a user edits between runs; then the rest
    (model class, batch size, seed), then the optimizers.
    """
    identity = dict(identity)
    data = identity.pop("data")
    loss = identity.pop("loss")
    scoring = identity.pop("scored_by")
    pipeline = identity.pop("pipeline")
    saved_pipeline = state.get("pipeline")
    if isinstance(saved_pipeline, dict) and saved_pipeline != pipeline:
        changed = [
            f"the settings of {path}"
            for path in sorted(set(pipeline["calls"]) | set(saved_pipeline.get("calls", {})))
            if pipeline["calls"].get(path) != saved_pipeline.get("calls", {}).get(path)
        ]
        if saved_pipeline.get("code") != pipeline["code"]:
            changed.insert(0, "the pipeline's code")
        raise _refusal(
            checkpoint_dir,
            f"was trained with another pipeline: {', '.join(changed) or 'its definition'} "
            "changed since it was written; its steps and scores were measured on the old one.",
            "Resume with the same code and settings",
        )
    saved_models = state.get("scored_by")
    if isinstance(saved_models, dict):
        moved = [
            f"alias {alias!r} was {saved_models[alias]}, now {model}"
            for alias, model in sorted(scoring.items())
            if alias in saved_models and saved_models[alias] != model
        ]
        if moved:
            raise _refusal(
                checkpoint_dir,
                f"was scored on other models: {'; '.join(moved)}; its scores would not "
                "compare with this run's.",
                "Resume with the same provider and model for these aliases",
            )
    saved_loss = state.get("loss")
    if isinstance(saved_loss, dict) and saved_loss != loss:
        raise _refusal(
            checkpoint_dir,
            f"was scored with another loss: {'; '.join(loss_changes(saved_loss, loss))}; its "
            "scores would not compare with this run's.",
            "Resume with the same loss settings (--loss or --metric, --criteria, --judge-alias)",
        )
    saved_data = state.get("data")
    if isinstance(saved_data, dict) and saved_data != data:
        named = [_DATA_NAMES[name] for name in data if saved_data.get(name) != data[name]]
        raise _refusal(
            checkpoint_dir,
            f"was trained on other data: {', '.join(named)} changed since it was written;",
            "resume with the same files",
        )
    mismatched = {
        key: (state.get(key), value) for key, value in identity.items() if state.get(key) != value
    }
    if mismatched:
        shown = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in mismatched.items())
        raise _refusal(
            checkpoint_dir,
            f"belongs to another run ({shown});",
            "resume with the same model, data, batch size and seed",
            _START_ELSEWHERE,
        )
    states: list[Any] = state.get("optimizers", [state.get("optimizer")])
    if len(states) != len(optimizers):
        raise _refusal(
            checkpoint_dir,
            f"was written with {len(states)} optimizer(s), this run has {len(optimizers)};",
            "resume with the same optimizers",
            _START_ELSEWHERE,
        )
    saved_kinds = [s.get("type") if isinstance(s, dict) else None for s in states]
    kinds = [type(optimizer).__name__ for optimizer in optimizers]
    if any(a is not None and a != b for a, b in zip(saved_kinds, kinds, strict=True)):
        # Each optimizer's state is saved at its place in the list: loaded in another
        # order, each would get another's state (or refuse it with a bare ValueError).
        raise _refusal(
            checkpoint_dir,
            f"was written by the optimizers {', '.join(str(k) for k in saved_kinds)} (in that "
            f"order), this run has {', '.join(kinds)};",
            "resume with the same optimizers in the same order (--optimizer)",
        )
    for saved, optimizer in zip(states, optimizers, strict=True):
        differ = _changed_settings(saved, optimizer)
        if differ:
            raise _refusal(
                checkpoint_dir,
                f"was written with other {type(optimizer).__name__} settings ({differ}); its "
                "choices so far were made under them.",
                "Resume with the same settings",
            )
    return states


def _changed_settings(saved: Any, optimizer: Any) -> str:
    """The optimizer settings that differ between a checkpoint and this run, as
    ``name: was, now`` (empty when they agree, or when either side records none:
    checkpoints made before settings were recorded, optimizers that keep none)."""
    settings = getattr(optimizer, "settings", None)
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        return ""
    if not callable(settings):
        return ""
    before, now = saved["settings"], json.loads(json.dumps(settings()))
    names = sorted(set(before) | set(now))
    return "; ".join(
        f"{name} was {before.get(name)!r}, now {now.get(name)!r}"
        for name in names
        if before.get(name) != now.get(name)
    )


def _refusal(
    checkpoint_dir: Path, finding: str, remedy: str, start_fresh: str = _START_FRESH
) -> TrainerError:
    """A refused resume, in the shape every refusal shares: which checkpoint, what it
    was made with that this run is not (``finding``, with its closing punctuation),
    how to resume after all, and how to start over instead."""
    return TrainerError(
        f"the checkpoint in {checkpoint_dir} {finding} {remedy}, or start fresh ({start_fresh})"
    )
