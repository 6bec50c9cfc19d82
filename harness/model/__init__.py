"""The model under test: a small transformer stack over the protocol's pools, its probe arena,
the runners that run it (eager, breakable, full graph) and a float64 reference for tests."""
