"""What a scenario expects on each release of an engine: version ranges to expectations (pure).

A scenario file's `expect_by_release = { "<0.5.23" = "race", ">=0.5.23" = "clean" }`
maps PEP 440 version specifiers (`packaging.specifiers`, comma-joined for a range:
">=0.5.20,<0.5.23") to what the scenario must show on a release in that range. The
ranges must not overlap, so a release gets one expectation; a release no range covers
has none, and the scenario cannot run there. A newer release needs no change to the
adapter: an open range (">=0.5.23") already covers it.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from harness.records.scenario import Expect


@dataclass(frozen=True)
class ReleaseExpectations:
    ranges: tuple[tuple[str, Expect], ...]  # (specifier, expectation), in file order

    @classmethod
    def parse(cls, table: dict[str, str]) -> ReleaseExpectations:
        """From {specifier: "race" | "clean"}; ValueError naming the bad entry."""
        ranges = []
        for spec, value in table.items():
            try:
                SpecifierSet(spec)
            except InvalidSpecifier:
                raise ValueError(f"{spec!r} is not a version range; write e.g. \"<0.5.23\" or "
                                 "\">=0.5.20,<0.5.23\"") from None
            if value not in Expect.names():
                raise ValueError(f"{spec!r} = {value!r}: valid: {', '.join(Expect.names())}")
            ranges.append((spec, Expect(value)))
        if not ranges:
            raise ValueError("no ranges; give at least one, e.g. { \">=0.5.23\" = \"clean\" }")
        return cls(tuple(ranges))

    def expect_for(self, version: str) -> Expect:
        """The expectation on `version`; ValueError when no range, or more than one, covers it."""
        try:
            v = Version(version)
        except InvalidVersion:
            raise ValueError(f"release {version!r} is not a version number") from None
        hits = [(spec, e) for spec, e in self.ranges if v in SpecifierSet(spec, prereleases=True)]
        if len(hits) != 1:
            covering = ", ".join(s for s, _ in hits)
            which = f"{len(hits)} ranges cover it ({covering})" if hits else "no range covers it"
            raise ValueError(f"release {version}: {which}; ranges: {', '.join(s for s, _ in self.ranges)}")
        return hits[0][1]

    def as_dict(self) -> dict[str, str]:
        return {spec: e.value for spec, e in self.ranges}
