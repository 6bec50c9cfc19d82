"""The fault injector: what a fault does to one replay's load op, and the pressure fault's contention."""
