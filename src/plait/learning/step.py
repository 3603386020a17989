"""`TrainingStep`: a model and its loss, traced as one graph so backward can reach both.

The two are composed so the loss's feedback starts at the end of the same graph
that produced the output: ``loss.backward()`` then walks back through the loss
node into the model's nodes and parameters.
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
    """A pipeline and its loss as one module, so the loss's feedback can flow back into it.

    ``forward(input, target)`` is ``loss_fn(model(input), target)``.  Put the step
    in ``train()`` mode and each call returns a `Value` whose payload is the
    loss's `Feedback`; ``await value.backward()`` sends its text to every
    learnable parameter that shaped the output, and an optimizer's ``step()``
    rewrites them.  `Trainer` runs this loop for you; use the step directly to
    write a loop of your own.

    Args:
        model: The pipeline to train.
        loss_fn: A loss module (see `plait.learning.losses`); it receives the
            model's real output and the target when the step runs.

    Raises:
        TypeError: ``model`` or ``loss_fn`` is not a plait `Module` (wrap a plain
            function with `FunctionLoss`).

    Examples:
        ```python
        import asyncio

        import plait
        from plait.handlers import mock
        from plait.learning import Contains, SFAOptimizer, TrainingStep


        class Reply(plait.Module):
            def __init__(self) -> None:
                super().__init__()
                self.llm = plait.LLMInference(
                    "fast",
                    plait.Parameter("Answer the customer.", description="how to answer"),
                )

            def forward(self, message: str) -> str:
                return self.llm(message)


        async def main() -> None:
            pipeline = Reply()
            step = TrainingStep(pipeline, Contains()).train()
            optimizer = SFAOptimizer(pipeline.parameters())
            optimizer.zero_feedback()
            loss = await step("Where is my parcel?", target="tracking")
            print(loss.payload)
            await loss.backward()
            print(await optimizer.step())


        # Stand-ins for the models, so the example runs anywhere.
        with mock({"fast": "Sorry.", "optimizer": "Answer and give the tracking link."}):
            asyncio.run(main())
        ```
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
        """Run the pipeline on ``input`` and grade its output with the loss.

        Args:
            input: The example's input (`Inputs` are spread into keyword arguments).
            target: The example's target, passed to the loss.

        Returns:
            The loss's result: a `Feedback` (a `Value` holding it in ``train()`` mode).
        """
        return loss_call(self.loss_fn, model_call(self.model, input), target, input)
