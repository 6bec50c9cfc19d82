"""Where things are, for every test wherever it sits in the tree."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent  # the checkout
DATA = TESTS / "data"
PLUGINS = TESTS / "plugins"  # plugin modules of the tests' own, put on the path by fixtures
