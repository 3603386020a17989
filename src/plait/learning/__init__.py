"""Learning: prompts and demonstrations as `Parameter`s that improve from feedback.

A loss grades an output and says in words what to improve (a `Feedback`);
``await value.backward()`` sends that text back through the recorded graph to
every learnable `Parameter` that shaped the output; an optimizer's
``await step()`` rewrites each parameter from the feedback it accumulated.
`Trainer` runs that loop over minibatches and keeps an update only when the
validation score improves.

* Losses: `ExactMatch`, `Contains`, `FunctionLoss`, `VerifierLoss`, `MetricLoss`
  (an evaluation metric written as DSPy writes them), `LLMJudge`, `RubricJudge`,
  `CompositeLoss`; subclass `Loss` for your own.
* Optimizers: `SFAOptimizer` and `TextGradOptimizer` rewrite prompts from
  feedback; `BootstrapFewShot` learns demonstrations from the runs that passed;
  `DemoSearch` searches many demonstration sets (and instructions) on validation;
  `RecipeSearch` chooses the recipe (lists or pools, ``k``, the label method,
  instructions) per task by cross-validation.
  `ReflectiveSearch` rewrites instructions from the failures it reads, keeping a
  Pareto frontier of candidates within a budget of metric calls.
* State: `snapshot` freezes every value as a `ParameterState` so a step can be
  kept or rolled back; `save_parameters` and `load_parameters` write and read the
  ``parameters.json`` that ``plait train`` produces.
"""

from plait.learning.backward import backward
from plait.learning.bootstrap import BootstrapFewShot
from plait.learning.feedback import Feedback
from plait.learning.history import Judgement
from plait.learning.losses import (
    CompositeLoss,
    Contains,
    ExactMatch,
    FunctionLoss,
    LLMJudge,
    Loss,
    MetricLoss,
    RubricJudge,
    VerifierLoss,
    aggregate,
)
from plait.learning.optimizers import (
    Optimizer,
    OptimizerStepError,
    SFAOptimizer,
    TextGradOptimizer,
)
from plait.learning.recipes import RecipeSearch
from plait.learning.reflective import ReflectiveSearch
from plait.learning.search import DemoSearch
from plait.learning.state import (
    ParameterState,
    StructureLockedError,
    load_parameters,
    lock,
    merge,
    save_parameters,
    snapshot,
)
from plait.learning.step import TrainingStep
from plait.learning.trainer import Trainer, TrainerError, TrainingEvent, TrainingHistory

__all__ = [
    "BootstrapFewShot",
    "CompositeLoss",
    "Contains",
    "DemoSearch",
    "ExactMatch",
    "Feedback",
    "FunctionLoss",
    "Judgement",
    "LLMJudge",
    "Loss",
    "MetricLoss",
    "Optimizer",
    "OptimizerStepError",
    "ParameterState",
    "RecipeSearch",
    "ReflectiveSearch",
    "RubricJudge",
    "SFAOptimizer",
    "StructureLockedError",
    "TextGradOptimizer",
    "Trainer",
    "TrainerError",
    "TrainingEvent",
    "TrainingHistory",
    "TrainingStep",
    "VerifierLoss",
    "aggregate",
    "backward",
    "load_parameters",
    "lock",
    "merge",
    "save_parameters",
    "snapshot",
]
