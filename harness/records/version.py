"""The package's version, in the bottom layer so that any layer may print it (pyproject.toml states
the same string; tests/test_packaging.py checks they agree)."""

__version__ = "0.2.0"
