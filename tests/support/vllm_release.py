"""Importing an installed vLLM release's modules in a test module: skip where none is installed,
but fail under `make test-vllm` (FENCE_HARNESS_VLLM_TEST=required), which installs each release,
so a module its import chain cannot reach (a package the `.[vllm]` extra lacks) is an error there,
never a green run that tested nothing."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

REQUIRED = os.environ.get("FENCE_HARNESS_VLLM_TEST") == "required"


def need(module: str, why: str) -> ModuleType:
    """`module` imported, or the calling test module skipped (failed where required) saying `why`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if REQUIRED:
            pytest.fail(f"{why} ({e}); make test-vllm needs it importable", pytrace=False)
        pytest.skip(f"{why} ({e})", allow_module_level=True)
