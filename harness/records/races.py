"""One vocabulary for races, shared by every checker (the happens-before analyser, the graph check
and the stream sanitizer): what kind of race a pair of accesses makes, and how the host's own
work is named where it takes part in one."""

from __future__ import annotations

import enum

__all__ = ["RaceKind", "HOST", "HOST_NAME"]


class RaceKind(enum.Enum):
    READ_AFTER_WRITE = "read-after-write"  # a read unordered with an earlier write (a copy) to it
    WRITE_AFTER_WRITE = "write-after-write"  # two writes (a copy and a kernel's) to it, unordered
    WRITE_AFTER_READ = "write-after-read"  # a write (a copy) unordered with an earlier read of it
    STORE_BEFORE_COMPUTE = "store-before-compute"  # a D2H copy unordered with an earlier write of what it reads
    REUSE_BEFORE_BACKUP = "reuse-before-backup"  # a write unordered with an earlier D2H copy of that region
    STAGING_OVERWRITE = "staging-overwrite"  # the host rewrites memory an earlier H2D copy may still read


# The host's own work (a write to pinned memory, a synchronize) as a stream: an id below every real
# stream's (the simulator's and torch's stream ids are never negative), and its name in findings.
HOST = -1
HOST_NAME = "host"
