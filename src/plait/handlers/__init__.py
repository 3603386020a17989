"""The effect-handler stack every module call and LLM call passes through (seed 004).

A call builds a `Message` and hands it to `apply_stack`: each active `Handler`
sees it bottom-to-top in ``process`` (innermost ``with`` first), then, unless a
handler marked it ``done``, the default action runs (the real call), then the
handlers see it top-to-bottom in ``postprocess``.  A handler that sets ``stop``
hides the message from the handlers outside it.  The stack lives in a ContextVar,
so concurrent runs and tasks never see each other's handlers.
"""

from plait.handlers.stack import (
    Handler,
    Message,
    apply_stack,
    apply_stack_sync,
    current_stack,
)

__all__ = ["Handler", "Message", "apply_stack", "apply_stack_sync", "current_stack"]
