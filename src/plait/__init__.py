"""plait: the PyTorch programming model for LLM pipelines."""

__version__ = "0.1.0"
