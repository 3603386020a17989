"""Learning: prompts as Parameters that improve from feedback (seeds 000, 001 and 002).

``TrainingStep(model, loss)`` in ``train()`` mode returns the loss as a `Value`;
``await loss.backward()`` walks the recorded graph back into every learnable
`Parameter`; an optimizer's ``await step()`` rewrites each parameter from the
feedback it accumulated; ``snapshot(module)`` freezes every value so a step can
be kept or rolled back.  `BootstrapFewShot` learns demonstrations
(``LLMInference(..., demos=[])``) from the runs that passed instead of from feedback;
`DemoSearch` searches many demonstration sets by successive halving on validation.
"""

from plait.learning.backward import backward
from plait.learning.bootstrap import BootstrapFewShot
from plait.learning.feedback import Feedback
from plait.learning.losses import (
    CompositeLoss,
    Contains,
    ExactMatch,
    FunctionLoss,
    LLMJudge,
    Loss,
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
from plait.learning.search import DemoSearch
from plait.learning.state import ParameterState, StructureLockedError, lock, merge, snapshot
from plait.learning.step import TrainingStep
from plait.learning.trainer import Trainer, TrainingEvent

__all__ = [
    "BootstrapFewShot",
    "CompositeLoss",
    "Contains",
    "DemoSearch",
    "ExactMatch",
    "Feedback",
    "FunctionLoss",
    "LLMJudge",
    "Loss",
    "Optimizer",
    "OptimizerStepError",
    "ParameterState",
    "RubricJudge",
    "SFAOptimizer",
    "StructureLockedError",
    "TextGradOptimizer",
    "Trainer",
    "TrainingEvent",
    "TrainingStep",
    "VerifierLoss",
    "aggregate",
    "backward",
    "lock",
    "merge",
    "snapshot",
]
