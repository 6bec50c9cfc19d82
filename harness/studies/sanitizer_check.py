"""Cross-check the analyser against PyTorch's CUDA sanitizer, on a GPU.

    fence-harness sanitizer check [--replays N]

`torch.cuda._sanitizer` watches kernels launched from Python, so it sees the
eager and breakable races and cannot see inside a graph replay. Each case runs in
its own process, because the sanitizer cannot be turned off once it is on: first
without it (the harness's verdict and the analyser's findings on the CUDA trace),
then with it. Prints a Markdown table; exit 1 if the two disagree on a case the
sanitizer can see (no graph replay), 0 otherwise.
"""

from __future__ import annotations

import sys

from harness.studies.children import answer, ask_child

# (scenario of the default set, accessor waits on?)
CASES = [
    (f"{kind}-{variant}", waits)
    for kind in ("attention", "mamba", "hybrid")
    for variant, waits in (("eager-nowaits", True), ("eager-nowaits", False), ("breakable-none", True),
                           ("breakable-none", False), ("full-none", True), ("full-final_event", True))
]


def _one(name: str, waits: bool, replays: int) -> dict:
    from harness.devices.cuda import CudaDevice
    from harness.input.scenario_file import bundled_files, load_files
    from harness.records.scenario import DelayWhere, Fault, FaultKind
    from harness.run.pipeline import run_scenario

    scenarios = {s.name: s for s in load_files(bundled_files())}
    scenario = scenarios[name].with_overrides(accessor="per_layer" if waits else "none")
    if not waits:  # outlast the eager ops' host launch time, as the eager controls do
        scenario = scenario.with_overrides(fault=Fault(FaultKind.DELAY, 10_000.0, DelayWhere.FIRST))
    dev = CudaDevice()
    plain = run_scenario(scenario, dev, replays=replays)
    import torch.cuda._sanitizer as sanitizer

    sanitizer.enable_cuda_sanitizer()
    try:
        run_scenario(scenario, dev, replays=replays)
        flagged = False
    except Exception as e:  # noqa: BLE001 - CUDASanitizerErrors: the sanitizer's verdict
        flagged = type(e).__name__ == "CUDASanitizerErrors"
        if not flagged:
            raise
    return {
        "name": name, "waits": waits, "backend": scenario.backend.value,
        "stale": f"{plain.tally.stale_replays}/{plain.tally.replays}",
        "findings": len(plain.findings), "sanitizer_flags": flagged, "error": plain.error,
    }


def one(name: str, waits: bool, replays: int) -> None:
    """The child's side: run one case and print its row as the answer."""
    answer(_one(name, waits, replays))


def run(replays: int) -> int:
    """Every case, each in a child process; prints the table row by row; the exit code."""
    # Each row prints as soon as its case is done, so a run cut short keeps the rows it has.
    print("| scenario | accessor waits | harness stale | analyser findings | sanitizer | agree |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    disagree = 0
    for name, waits in CASES:
        got = ask_child(["sanitizer", "check", "--replays", str(replays), "--one", name, "on" if waits else "off"])
        if got.value is None:
            print(f"{name} waits={waits}: {got.error}", file=sys.stderr)
            return 2
        r = got.value
        sees = r["backend"] != "full"  # the sanitizer cannot see into a graph replay
        agree = (r["findings"] > 0) == r["sanitizer_flags"]
        disagree += sees and not agree
        verdict = "flags" if r["sanitizer_flags"] else "silent"
        print(f"| {r['name']} | {'on' if r['waits'] else 'off'} | {r['stale']} | {r['findings']} | {verdict} "
              f"| {'yes' if agree else ('no' if sees else 'no (cannot see replays)')} |", flush=True)
    return 1 if disagree else 0
