"""Records and ordering: errors, scenarios, faults, device settings, the op list, stream clocks and
the happens-before analyser over them. Pure logic: nothing here touches a device, and nothing here
imports another layer."""
