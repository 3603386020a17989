"""Recording a `forward()` into one flat graph of leaf calls."""

from plait.tracing.graph import Graph, Node
from plait.tracing.tracer import TracedValue, Tracer, TracingError, trace

__all__ = ["Graph", "Node", "TracedValue", "Tracer", "TracingError", "trace"]
