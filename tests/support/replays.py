"""How many replays a GPU test item makes, by what it must show (one rule for every GPU test).

- A race under the gate shows in every replay (the load cannot land before the host opens it), so a
  test that asserts "stale in every replay" needs only a few, and each one is a full witness.
- A clean expectation claims that a missed wait would have shown: with a per-replay miss rate of
  10% or more, 29 clean replays happen by chance with probability under 5% ((1 - 0.1) ** 29 < 0.05).
  So GATE_REPLAYS = 30 bounds a missed wait's rate below 10% at 95% confidence, and the happens-before
  analysis and the graph check prove the ordering on every replay whatever the timing.
- SOAK_REPLAYS, the nightly soaks: 1,000 clean replays bound it below 0.3% (rule of three).
"""

GATE_REPLAYS = 30
SOAK_REPLAYS = 1000
