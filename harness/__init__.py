"""A GPU race harness for hierarchical-cache load-back and CUDA-graph prefill."""

__version__ = "0.2.0"
