"""Records: errors, scenarios, device settings, the op list (trace), the graph model, race kinds,
rates and releases; plain data and the parsing of it. Pure logic: nothing here touches a device, and
nothing here imports another layer. The checkers over these records are in `harness.checkers`."""
