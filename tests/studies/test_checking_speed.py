"""The checking-speed benchmark (`fence-harness checking`): its arithmetic, and a run on the simulator."""

from __future__ import annotations

import json
import math

from harness.frontends.cli import main
from harness.studies.checking_speed import CheckingPoint, attention, default_shapes


def test_overhead_is_the_checked_time_past_the_device_time_as_a_fraction_of_it():
    p = CheckingPoint("x", device_ms=2.0, device_p10_ms=1.9, device_p90_ms=2.1, replays=100,
                      replays_per_s=400.0, stale_replays=0, poison_ms=0.1, look_ms=0.3, idle_ms=0.1)
    assert math.isclose(p.per_replay_ms, 2.5)
    assert math.isclose(p.overhead, 0.25) and not p.within
    assert math.isclose(p.harness_ms, 0.4)
    row = p.row()
    assert row["device_bound_replays_per_s"] == 500.0 and row["within_target"] is False
    fast = CheckingPoint("y", 2.0, 1.9, 2.1, 100, 460.0, 0)
    assert fast.overhead < 0.10 and fast.within


def test_the_shapes_are_the_natural_races_ones():
    names = [s.name for s in default_shapes()]
    assert names[:2] == ["tiny-hybrid-none", "tiny-hybrid-final_event"]
    assert {n.split("-")[2] for n in names[2:]} == {"2048", "8192", "32768"}
    s = attention(8192).scenario
    assert (s.model.hidden, s.model.heads, s.model.kv_heads, s.model.head_dim) == (1024, 8, 8, 128)
    assert s.fault.kind.value == "none" and s.batch[0].prefix == 8192


def test_checking_on_the_simulator_writes_its_section(tmp_path, capsys):
    assert main(["checking", "--device", "sim", "--replays", "2", "--runs", "1", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    points = doc["checking"]["points"]
    assert [p["shape"] for p in points] == ["tiny-hybrid-none", "tiny-hybrid-final_event"]
    assert all(p["replays"] == 20 and p["replays_per_s"] > 0 and p["device_ms"] > 0 for p in points)
    # The device bound and the harness's share come from the same run's marks (virtual time here).
    assert all(p["poison_ms"] > 0 and p["look_ms"] > 0 and p["idle_ms"] >= 0 for p in points)
    assert doc["checking"]["clock"] == "virtual"
    assert "means nothing" in capsys.readouterr().out
