"""plait's version, kept apart so that any layer can name it without importing plait.

This is its one source: the build reads it (``[tool.setuptools.dynamic]`` in
pyproject.toml), and ``plait.__version__`` and ``plait --version`` print it.
"""

__version__ = "0.1.0"
