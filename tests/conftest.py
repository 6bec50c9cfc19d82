import pytest
import torch

from tests.support.paths import PLUGINS


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; torch sees none here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def stuck_gate(monkeypatch) -> str:
    """The plugin path of a schedule that holds the gate where nothing will open it."""

    monkeypatch.syspath_prepend(str(PLUGINS))
    return "stuck_gate:schedule"


@pytest.fixture
def wayward(monkeypatch) -> str:
    """The module name of tests/plugins/wayward.py, importable: plugins right and wrong."""

    monkeypatch.syspath_prepend(str(PLUGINS))
    return "wayward"
