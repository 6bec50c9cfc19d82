"""A fault of a project's own, in one module: importing it registers the `stall` fault."""

from harness.api import US, Fault, FaultStrategy, register_fault


@register_fault
class Stall(FaultStrategy):
    """A spin of `us` before layer 0's first copy only, whatever `where` says."""

    name = "stall"
    keys = (US.needed(),)

    def describe(self, fault: Fault) -> str:
        return f"stall {fault.us:g}us"

    def pause_us(self, fault: Fault, replay: int, layer: int, chunk: int) -> float:
        return fault.us if layer == 0 and chunk == 0 else 0.0
