"""harness.sanitizer against PyTorch's CUDA sanitizer and against the data, on a GPU.

    fence-harness sanitizer compare [--replays N] [--log FILE]

Cases: the plain-PyTorch example (`harness.examples.h2d_graph_race`, each fence) and the
default set's full-graph scenarios (attention, mamba, hybrid; no fence and the final-event
fence; and attention with per-layer external waits captured in the graph). For each: the
stale replays with no sanitizer (the data), the races `harness.sanitizer` reports (and the
stale replays while it watched; the run's wall time without it and with it), and whether
`torch.cuda._sanitizer` flags anything: that one runs in a process of its own per case,
since it cannot be turned off. Prints a Markdown table, row by row; exit 1 when
harness.sanitizer's verdict differs from what the case is (a race for no fence, none with
one), 0 otherwise.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.studies.children import answer, ask_child

if TYPE_CHECKING:
    from harness.records.scenario import Scenario

EXAMPLE_FENCES = ("none", "wait_stream", "event", "in_graph")
SCENARIOS = [f"{m}-full-{f}" for m in ("attention", "mamba", "hybrid") for f in ("none", "final_event")]
SCENARIOS.append("attention-full-layerwise_graph")


@dataclass(frozen=True)
class Case:
    name: str  # "example:none" or a scenario name

    @property
    def racy(self) -> bool:
        """What the case is: unfenced (a race) or fenced (none)."""
        return self.name.endswith("none")


CASES = [Case(f"example:{f}") for f in EXAMPLE_FENCES] + [Case(n) for n in SCENARIOS]


def scenario_named(name: str) -> Scenario:
    """A default-set scenario by name; `<model>-full-layerwise_graph` is the final-event one with
    per-layer external waits captured in the graph instead."""
    from harness.input.scenario_file import bundled_files, load_files

    scenarios = {s.name: s for s in load_files(bundled_files())}
    if name not in scenarios and name.endswith("layerwise_graph"):
        base = scenarios[name.replace("layerwise_graph", "final_event")]
        return base.with_overrides(name=name, fence="layerwise_graph")
    return scenarios[name]


def _run(case: Case, replays: int, example_replays: int) -> int:
    """Run the case once; its stale replays."""
    if case.name.startswith("example:"):
        from harness.examples.h2d_graph_race import run

        return run(case.name.split(":", 1)[1], example_replays)
    from harness.devices.cuda import CudaDevice
    from harness.run.pipeline import run_scenario

    result = run_scenario(scenario_named(case.name), CudaDevice(), replays=replays)
    if result.error:
        raise RuntimeError(result.error)
    return result.tally.stale_replays


def _torch_one(case: Case, replays: int, example_replays: int) -> dict:
    import torch.cuda._sanitizer as csan

    csan.enable_cuda_sanitizer()
    try:
        stale = _run(case, replays, example_replays)
    except Exception as e:  # noqa: BLE001 - CUDASanitizerErrors: its verdict; anything else: say so
        if type(e).__name__ != "CUDASanitizerErrors":
            return {"torch": f"error: {type(e).__name__}: {str(e).splitlines()[:1]}"}
        return {"torch": f"flags ({len(getattr(e, 'errors', []))})", "torch_stale": None}
    return {"torch": "silent", "torch_stale": stale}


def _torch_in_process(case: Case, replays: int, example_replays: int) -> dict:
    got = ask_child(["sanitizer", "compare", "--torch-one", case.name, "--replays", str(replays),
                     "--example-replays", str(example_replays)], timeout=90)
    return got.value if got.value is not None else {"torch": got.error}


def _ours(case: Case, replays: int, example_replays: int, log) -> dict:
    from harness.sanitizer.session import sanitize

    row: dict = {}
    try:
        t0 = time.perf_counter()
        row["stale"] = _run(case, replays, example_replays)
        row["plain_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        with sanitize() as s:
            row["ours_stale"] = _run(case, replays, example_replays)
        row["ours_s"] = round(time.perf_counter() - t0, 1)
        row["races"] = len(s.races)
        log.write(f"==== {case.name}: {len(s.races)} races\n")
        for r in s.races[:4]:
            log.write(r.describe() + "\n")
        log.flush()
    except Exception as e:  # noqa: BLE001 - one case's failure is its row, the table goes on
        row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"
        log.write(f"==== {case.name}: error {row['error']}\n")
    return row


def _row(c: Case, r: dict, n: int) -> bool:
    """Print the case's row; whether harness.sanitizer's verdict is what the case is."""
    if "error" in r:
        verdict, ok = f"error: {r['error']}", False
    else:
        verdict, ok = str(r["races"]), (r["races"] > 0) == c.racy
    print(f"| {c.name} | {'race' if c.racy else 'fenced'} | {r.get('stale', '-')}/{n} | {verdict} "
          f"| {r.get('ours_stale', '-')}/{n} | {r.get('plain_s', '-')} / {r.get('ours_s', '-')} "
          f"| {r.get('torch', '-')} "
          f"| {'yes' if ok else 'NO'} |", flush=True)
    return ok


def torch_one(name: str, replays: int, example_replays: int) -> None:
    """The child's side: one case under PyTorch's sanitizer, its verdict as the answer."""
    answer(_torch_one(Case(name), replays, example_replays))


def run(replays: int, example_replays: int, log_path: str) -> int:
    """Every case: prints the table row by row; exit 1 where harness.sanitizer's verdict is wrong."""
    print("| case | is | stale, no sanitizer | harness.sanitizer races | stale under it | time s, plain / under it "
          "| torch.cuda._sanitizer | agrees |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    wrong = 0
    # PyTorch's sanitizer runs in processes of its own, two at a time, beside this one's cases; each
    # row prints as soon as both sides of it are done, so a run cut short keeps the rows it has.
    with ThreadPoolExecutor(max_workers=2) as pool, open(log_path, "w") as log:
        theirs = {c.name: pool.submit(_torch_in_process, c, replays, example_replays) for c in CASES}
        for c in CASES:
            r = {**_ours(c, replays, example_replays, log), **theirs[c.name].result()}
            wrong += not _row(c, r, example_replays if c.name.startswith("example:") else replays)
    return 1 if wrong else 0
