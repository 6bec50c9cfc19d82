"""Several GPUs under pytest-xdist: one GPU per worker, one results.json per run.

Pinning: a worker sets CUDA_VISIBLE_DEVICES to the UUID of GPU number
(worker index % GPU count) before anything initialises CUDA, so every worker
sees exactly one GPU as cuda:0. The GPUs are listed through NVML, which numbers
every GPU of the host whatever CUDA_VISIBLE_DEVICES says; where the caller
already narrowed CUDA_VISIBLE_DEVICES, only those GPUs are shared out. A worker
is known by PYTEST_XDIST_WORKER, which xdist sets before the worker's pytest
starts (a pytest started inside a worker inherits it, and pins the same way).

Merging: each worker writes its part of the run (a results.json document of the
scenarios it ran, plus its worker id and GPU UUID) into a folder the controller
made; the controller merges the parts into one document.

    fence-harness gpu-workers count        the number of usable GPUs (1 when none)
    fence-harness gpu-workers check RESULTS.json
                                           which worker ran on which GPU; exit 1 if two
                                           workers shared a GPU or a scenario is not on its
                                           worker's GPU, 2 if the file is not a valid
                                           results.json (a scenario named twice is not)
"""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Iterable, MutableMapping
from pathlib import Path

from harness.devices import nvml

VISIBLE = "CUDA_VISIBLE_DEVICES"
WORKER = "PYTEST_XDIST_WORKER"
PART_GLOB = "part-*.json"


def visible_gpus(uuids: list[str], spec: str | None) -> list[str]:
    """The GPUs of `uuids` that a CUDA_VISIBLE_DEVICES value `spec` leaves visible.

    Entries are NVML indices (the same order as CUDA's on a host of one GPU
    model) or UUIDs, which CUDA also accepts by unique prefix. Like CUDA, stop at
    the first entry that names no GPU; a MIG instance is such an entry here, so
    MIG set-ups are left alone.
    """
    if spec is None:
        return list(uuids)
    chosen: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        if entry.isdigit() and int(entry) < len(uuids):
            chosen.append(uuids[int(entry)])
            continue
        matches = [u for u in uuids if entry.startswith("GPU-") and u.startswith(entry)]
        if len(matches) != 1:
            break
        chosen.append(matches[0])
    return chosen


def gpu_count(environ: MutableMapping[str, str] | None = None,
              list_uuids: Callable[[], list[str]] | None = None) -> int:
    """GPUs the workers can be spread over (0 when none)."""
    environ = os.environ if environ is None else environ
    return len(visible_gpus((list_uuids or nvml.gpu_uuids)(), environ.get(VISIBLE)))


def worker_index(worker_id: str | None) -> int | None:
    """3 for xdist's 'gw3'; None outside an xdist worker."""
    m = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(m.group(1)) if m else None


def pin_worker(environ: MutableMapping[str, str] | None = None,
               list_uuids: Callable[[], list[str]] | None = None) -> str | None:
    """Point this xdist worker at one GPU; return its UUID, or None when nothing was done.

    Calling it again is harmless: once pinned, the one visible GPU is the same one.
    """
    environ = os.environ if environ is None else environ
    index = worker_index(environ.get(WORKER))
    if index is None:
        return None
    gpus = visible_gpus((list_uuids or nvml.gpu_uuids)(), environ.get(VISIBLE))
    if not gpus:
        return None
    chosen = gpus[index % len(gpus)]
    if environ.get(VISIBLE) != chosen and _cuda_initialised():
        # CUDA reads the variable once, when first used: setting it now would pin nothing.
        # (A bare device count also fixes it without showing here: pin before anything asks.)
        raise RuntimeError(
            f"worker {environ[WORKER]}: CUDA was initialised before the worker could pin "
            f"itself to {chosen}; load the fence-harness pytest plugin with -p or its entry point"
        )
    environ[VISIBLE] = chosen
    return chosen


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


# ---------------------------------------------------------------- partial results


def write_part(folder: Path, worker: str, gpu_uuid: str | None, doc: dict) -> Path:
    """One worker's results.json document, tagged with the worker and its GPU."""
    path = Path(folder) / f"part-{worker}.json"
    tmp = path.with_suffix(".tmp")  # renamed into place: the controller never reads half a part
    tmp.write_text(json.dumps({**doc, "worker": worker, "gpu_uuid": gpu_uuid}), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_parts(folder: Path) -> list[dict]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(Path(folder).glob(PART_GLOB))]


def merge(parts: list[dict], order: Iterable[str] = (), command: list[str] | None = None) -> dict:
    """One results.json document from the parts: every scenario once, in `order` first.

    Each scenario entry keeps the worker that ran it and that worker's GPU UUID;
    the environment is the first part's, plus the workers and the GPUs used.
    """
    from harness.report.pairs import pairs
    from harness.report.results import STATISTICS

    if not parts:
        raise ValueError("no parts to merge")
    parts = sorted(parts, key=lambda p: (worker_index(p["worker"]) is None, worker_index(p["worker"]) or 0))
    entries: dict[str, dict] = {}
    for part in parts:
        for entry in part["scenarios"]:
            # setdefault: a scenario reported twice keeps its first run.
            entries.setdefault(entry["name"], {**entry, "worker": part["worker"], "gpu_uuid": part["gpu_uuid"]})
    rank = {name: i for i, name in enumerate(order)}

    def by_rank(e: dict) -> int:
        return rank.get(e["name"], len(rank))

    scenarios = sorted(entries.values(), key=by_rank)
    matrix: dict[str, dict] = {}
    for part in parts:
        for row in (part.get("mutants") or {}).get("matrix", []):
            matrix.setdefault(row["name"], row)
    skipped = {s["name"]: s for part in parts for s in part.get("skipped") or []}
    first = parts[0]
    workers = {p["worker"]: p["gpu_uuid"] for p in parts}
    return {
        "schema_version": first["schema_version"],
        "run_id": uuid.uuid4().hex[:12],
        "git_commit": next((p["git_commit"] for p in parts if p.get("git_commit")), None),
        "started": min(p["started"] for p in parts),  # ISO 8601 UTC: text order is time order
        "finished": max(p["finished"] for p in parts),
        "command": command if command is not None else first["command"],
        "environment": {**first["environment"], "workers": workers,
                        "gpus": sorted({u for u in workers.values() if u})},
        "summary": {
            "scenarios": len(scenarios),
            "met": sum(bool(e["met"]) for e in scenarios),
            "errors": sum(e["error"] is not None for e in scenarios),
        },
        "statistics": STATISTICS,
        "scenarios": scenarios,
        "pairs": pairs(scenarios),  # across workers: a pair's two scenarios may have run apart
        **({"mutants": {"matrix": sorted(matrix.values(), key=by_rank)}} if matrix else {}),
        **({"skipped": sorted(skipped.values(), key=by_rank)} if skipped else {}),
    }


def spread_problems(doc: dict) -> list[str]:
    """What is wrong with how a merged run was spread over its GPUs ([] when nothing is).

    Every scenario once, each run by a worker of the run on that worker's GPU, and no GPU
    shared by two workers: what `make gpu-test` promises on a host of several GPUs.
    """
    problems = []
    workers: dict = doc["environment"].get("workers") or {}
    seen: dict[str, int] = {}
    for e in doc["scenarios"]:
        seen[e["name"]] = seen.get(e["name"], 0) + 1
        if e.get("worker") not in workers:
            problems.append(f"{e['name']}: run by {e.get('worker')!r}, not a worker of this run")
        elif e.get("gpu_uuid") != workers[e["worker"]]:
            problems.append(f"{e['name']}: GPU {e.get('gpu_uuid')} is not its worker's ({workers[e['worker']]})")
    problems += [f"{name}: reported {n} times" for name, n in seen.items() if n > 1]
    owners: dict[str, list[str]] = {}
    for worker, gpu in workers.items():
        owners.setdefault(gpu or "no GPU", []).append(worker)
    problems += [f"GPU {gpu} shared by workers {', '.join(sorted(ws))}" for gpu, ws in owners.items() if len(ws) > 1]
    return problems


def check(path: Path) -> int:
    """Print which worker of a merged run ran on which GPU; 1 when the spread is wrong."""
    from harness.report.schema import load

    doc = load(path)  # InputError (exit 2) when it is not a valid results.json
    workers = doc["environment"].get("workers") or {}
    for worker, gpu in sorted(workers.items(), key=lambda w: worker_index(w[0]) or 0):
        ran = [e["name"] for e in doc["scenarios"] if e.get("worker") == worker]
        print(f"{worker}: GPU {gpu or 'none'}, {len(ran)} scenarios")
    problems = spread_problems(doc) if workers else [f"{path}: no workers recorded (not a merged run)"]
    for p in problems:
        print(f"  problem: {p}")
    print(f"{len(doc['scenarios'])} scenarios, {len(workers)} workers, "
          f"{len(set(workers.values()))} GPUs: {'ok' if not problems else 'NOT ok'}")
    return 1 if problems else 0
