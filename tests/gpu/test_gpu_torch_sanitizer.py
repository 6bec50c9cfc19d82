"""PyTorch's CUDA sanitizer (`torch.cuda._sanitizer`) on the harness's own replay loop, on a GPU.

The cross-checks against it (`harness.studies.sanitizer_check`, `harness.studies.sanitizer_compare`)
mean something only where the harness's own work is ordered in a way it understands: a report
there on a fenced scenario would be the harness's, not the scenario's. Each case runs in a process
of its own (the sanitizer cannot be turned off), through sanitizer_check's `--one`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A study of PyTorch's sanitizer (a process per case): nightly, beside `fence-harness sanitizer check`.
pytestmark = [pytest.mark.gpu, pytest.mark.nightly]


def flags(name: str, waits: bool) -> bool:
    proc = subprocess.run([sys.executable, "-m", "harness", "sanitizer", "check", "--replays", "3",
                           "--one", name, "on" if waits else "off"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])["sanitizer_flags"]


@pytest.mark.parametrize("name", ["attention-full-final_event", "hybrid-eager-nowaits"])
def test_pytorchs_sanitizer_is_silent_on_the_harness_where_the_scenario_is_ordered(name):
    # attention-full-final_event: a batch's read of the row cursor to the host, then the next
    # batch's reset of it, each replay's poisoning, look and join: all of the harness's own work.
    assert not flags(name, waits=True)


def test_and_flags_the_eager_race_with_the_accessor_waits_off():
    assert flags("hybrid-eager-nowaits", waits=False)
