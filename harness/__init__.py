"""A GPU race harness for hierarchical-cache load-back and CUDA-graph prefill."""

# The built-in faults register here, so that every fault reads in words (`Fault.describe`) however
# the package is entered; the registry imports no torch.
import harness.faults.registry  # noqa: F401
from harness.records.version import __version__

__all__ = ["__version__"]
