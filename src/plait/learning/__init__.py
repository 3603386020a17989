"""Learning: prompts as Parameters that improve from feedback (seeds 000 and 002).

``TrainingStep(model, loss)`` in ``train()`` mode returns the loss as a `Value`;
``await loss.backward()`` walks the recorded graph back into every learnable
`Parameter`; an optimizer's ``await step()`` rewrites each parameter from the
feedback it accumulated.
"""

from plait.learning.backward import backward
from plait.learning.feedback import Feedback
from plait.learning.step import TrainingStep

__all__ = ["Feedback", "TrainingStep", "backward"]
