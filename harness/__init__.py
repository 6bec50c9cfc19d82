"""A GPU race harness for hierarchical-cache load-back and CUDA-graph prefill."""

from harness.records.version import __version__

__all__ = ["__version__"]
