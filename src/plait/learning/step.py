"""`TrainingStep`: a model and its loss, traced as one graph so backward can reach both.

Seed 000 composes the two so the loss's feedback starts at the end of the same
graph that produced the output: ``loss.backward()`` then walks back through the
loss node into the model's nodes and parameters.
"""

from __future__ import annotations

from typing import Any, ClassVar

from plait.module import Module

__all__ = ["Inputs", "TrainingStep", "loss_call", "model_call"]


class Inputs(dict[str, Any]):
    """An example's input that is several keyword arguments of ``forward`` (the
    fields of a record named like its parameters): the step spreads it into the
    call, ``model(**inputs)``, where any other input is the one argument.

    A dict, so it hashes, pickles and prints as the record's fields do.
    """


def model_call(model: Module, input: Any) -> Any:
    """``model`` called on an example's input: spread when it is `Inputs`."""
    if isinstance(input, Inputs):
        return model(**input)
    return model(input)


def loss_call(loss_fn: Module, output: Any, target: Any, input: Any) -> Any:
    """``loss_fn`` called on an example's output and target, and on its input as well
    when the loss reads it (``reads_input``: a metric is shown the whole example)."""
    if getattr(loss_fn, "reads_input", False):
        return loss_fn(output, target, input)
    return loss_fn(output, target)


class TrainingStep(Module):
    """``forward(input, target)`` is ``loss_fn(model(input), target)``.

    ``loss_fn`` is a loss module (see `plait.learning.losses`), which receives the
    model's real output and the target at run time.  Put the step in ``train()``
    mode and each call returns a `Value` whose payload is the loss's `Feedback`;
    ``await value.backward()`` sends it to every learnable parameter.
    """

    #: The step wraps the user's pipeline without owning it: the pipeline's
    #: parameters keep the names ``pipeline.state_dict()`` gives them.
    _adopts_children: ClassVar[bool] = False

    def __init__(self, model: Module, loss_fn: Module) -> None:
        super().__init__()
        if not isinstance(model, Module) or not isinstance(loss_fn, Module):
            raise TypeError(
                "TrainingStep(model, loss_fn) takes two plait Modules; wrap a plain loss "
                "function with plait.learning.FunctionLoss(fn)"
            )
        self.model = model
        self.loss_fn = loss_fn

    def _binding(self) -> tuple[Any, dict[str, Any]]:
        """The step's own `bind()`, else the wrapped model's, name by name: a bound
        pipeline trains on the resources it was bound to."""
        resources, config = super()._binding()
        model_resources, model_config = self.model._binding()
        return (resources if resources is not None else model_resources), {
            **model_config,
            **config,
        }

    def forward(self, input: Any, target: Any = None) -> Any:
        return loss_call(self.loss_fn, model_call(self.model, input), target, input)
