"""The run: a scenario's testbed, ground truth, the one replay loop, the oracle, the verdict and the
kill matrix. Scenario files and plugins are read in `harness.input`; the studies are `harness.studies`."""
