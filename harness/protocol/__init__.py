"""The engine's protocol, mirrored: pool layout and pools with their waiting accessors, the
load-back bookkeeping and schedules, fence strategies and hazards. Built on records and devices."""
