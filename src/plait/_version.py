"""plait's version, kept apart so that any layer can name it without importing plait."""

__version__ = "0.1.0"
