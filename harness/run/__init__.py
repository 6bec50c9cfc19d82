"""The run: a scenario's testbed, ground truth, the one replay loop, the oracle, the verdict, and
what builds on them (scenario files, plugins, the kill matrix, the benchmark)."""
