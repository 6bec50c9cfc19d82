"""The race checkers over the recorded op list: stream vector clocks, the happens-before analyser and
the graph check. Pure logic: they read records (`harness.records`) and touch no device."""
