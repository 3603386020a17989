"""Where `Handler`, `Message` and `apply_stack` were first defined; they live in
`plait.effects` now (the core's one mechanism) and are importable from here too."""

from __future__ import annotations

from plait.effects import (
    Handler,
    Message,
    apply_stack,
    apply_stack_sync,
    current_stack,
    postprocess_stack,
    process_stack,
)

__all__ = [
    "Handler",
    "Message",
    "apply_stack",
    "apply_stack_sync",
    "current_stack",
    "postprocess_stack",
    "process_stack",
]
