"""`fence-harness engine-pack --engine vllm`: vLLM releases packed for a GPU host with no package index
(`make engine-pack`), beside SGLang's part of `.engines/carry/`:

- `vllm-VERSION/`: the release's own files that the vLLM adapter's modules import, listed in two
  child processes: one as on a CUDA host (torch's CUDA checks and Triton's NVIDIA driver answering
  yes, vLLM's own platform detection answering CUDA), importing every module the adapter and
  `connector-check` use and constructing the VllmConfig of each graph-mode question the fences ask;
  one running the vLLM engine scenarios on the simulator (the imports inside functions). Also the
  files those imports open in the release, and its `dist-info/METADATA` (vLLM reads its version
  there; `engine-from-pack` reads its Transformers range). Nothing compiled: the one compiled module
  of vLLM's that the chain tries, `vllm._C`, is imported under vLLM's own guard
  (`Platform.import_kernels` logs a warning where it is missing) and the harness calls none of its
  ops, so it is left out, not stubbed.
- `stubs-vllm/`: stand-ins (harness.frontends.engine_pack's `STUB`) for the compiled packages of
  `STUBBED` that the listing saw imported; empty where it saw none.
- `wheels-vllm/`: CPython 3.12 manylinux x86_64 wheels, at this environment's versions, of the
  third-party packages the listing saw imported that the GPU image lacks (`GPU_IMAGE`). A
  pure-Python package whose wheel is over `TRIM_OVER` (mistral-common's and pycountry's are mostly
  tokenizer files and locales) travels as a wheel built here from the files the listing saw it
  import or open, its own metadata, build tag `0imported`.
- `wheels-vllm-transformers/`: Transformers (imported and opened files, as above: it reads every
  model's source when imported, to list its lazy names), huggingface-hub and tokenizers at this
  environment's versions, inside the range every packed release declares. `make engine-from-pack`
  installs them only where the host's own Transformers is outside a packed release's range
  (`host_wheels`): the image's own is used wherever the releases accept it. A folder of its own, so
  a run on a host whose Transformers is known to fit can leave it behind.

Each part's size is printed. `make engine-from-pack` installs what `host_wheels` names into a
temporary folder (`pip install --no-index --no-deps --target`) and runs `fence-harness engine-matrix
--engine vllm` on the pack's release folders, on the host's own torch.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections import defaultdict
from importlib import metadata
from pathlib import Path

from harness.frontends.engine_matrix import ROOT, install
from harness.records.errors import InputError

# The GPU host's image (Python 3.12, torch 2.11.0+cu130): its packages, by their normalized names.
GPU_IMAGE = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi
charset-normalizer click cloudpickle cmake colorama contourpy cuda-bindings cuda-core cuda-pathfinder
cupy-cuda13x cycler cython einops filelock fonttools frozenlist fsspec h11 h5py hf-xet httpcore httpx
huggingface-hub idna iniconfig jinja2 joblib kiwisolver lxml markdown markupsafe matplotlib mdurl
ml-dtypes mpmath msgpack multidict networkx ninja numba numpy nvidia-ml-py packaging pandas pillow pip
pluggy prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pytest
pytest-xdist python-dateutil pyyaml regex requests rich safetensors scipy sentencepiece setuptools six
sympy tabulate tiktoken tokenizers torch tqdm transformers triton typer typing-extensions urllib3 uvloop
wheel wrapt xxhash yarl zipp
""".split())
# Carried apart, installed only where the host's own Transformers is outside a release's range:
# Transformers checks the other two's versions when it is imported.
TRANSFORMERS = ("transformers", "huggingface-hub", "tokenizers")
# Not the engine's: the harness's own, and the test runner's.
NOT_ENGINE = frozenset({"fence-harness", "pytest", "pluggy", "iniconfig", "execnet", "pytest-xdist"})
# Compiled packages outside vLLM that cannot travel; stubbed where the listing sees them imported.
STUBBED = ("flashinfer", "deep_gemm", "flash_attn", "vllm_flash_attn")
# A pure-Python wheel over this travels as the files the listing saw it import or open.
TRIM_OVER = 2**20
PYTHON = "3.12"
TRIMMED_TAG = "0imported"


def platform_args(python_version: str) -> list[str]:
    """pip's target for the wheels: CPython `python_version` on x86_64 Linux with glibc 2.35 or newer,
    every manylinux tag up to that named (pip does not widen a --platform to the older ones);
    llguidance, for one, ships manylinux_2_31 only."""
    tags = ["manylinux2014_x86_64", *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 36))]
    return ["--python-version", python_version, *(a for t in tags for a in ("--platform", t))]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- the listing (a child process)


def follow_cuda() -> None:
    """This process as on a CUDA host, to follow the modules' CUDA branches: torch's CUDA checks, and
    Triton's NVIDIA driver (vLLM takes the real Triton only where a driver is active), answer yes."""
    from harness.frontends import engine_pack

    engine_pack.follow_cuda()
    try:
        from triton.backends import backends
    except ImportError:
        return
    if "nvidia" in backends and backends["nvidia"].driver is not None:
        backends["nvidia"].driver.is_active = staticmethod(lambda: True)


def detect_cuda() -> None:
    """vLLM's own platform detection answering CUDA, as NVML makes it answer on a GPU host: a read of
    `vllm.platforms.current_platform` before the harness's platform is set would import vLLM's CUDA
    platform, and the adapter's platform check then fails the listing."""
    platforms = importlib.import_module("vllm.platforms")
    plugins = getattr(platforms, "builtin_platform_plugins", None)
    if isinstance(plugins, dict) and "cuda" in plugins:
        plugins["cuda"] = lambda: "vllm.platforms.cuda.CudaPlatform"


def run_cuda_path() -> dict[bool, str]:
    """Every module the adapter and connector-check import, then the VllmConfig of each question the
    fences ask (FULL, the connector declaring False and True), then the platform check; the modes
    vLLM settled on."""
    from harness.engines import vllm as adapter
    from harness.engines import vllm_offload

    eng = adapter.load("engine-pack", "--list")
    eng.modules.update(adapter.import_needed(eng.version, vllm_offload.NEEDED))
    for name in ("vllm_connector", "vllm_graphs", "vllm_load", "vllm_pools", "vllm_reference_connectors"):
        importlib.import_module(f"harness.engines.{name}")
    from harness.engines.vllm_connector import LayerwiseConnector

    modes = {declares: eng.decided_mode(eng.connector_config(LayerwiseConnector, {"requires_piecewise": declares}))
             for declares in (False, True)}
    adapter.check_platform()
    print(f"vllm {eng.version} as on a CUDA host: FULL asked, the connector declaring False -> {modes[False]}, "
          f"True -> {modes[True]}", file=sys.stderr)
    return modes


def run_simulator() -> None:
    """The vLLM engine scenarios on the simulator, one replay each, the models shrunk."""
    import dataclasses

    from harness.devices.sim import SimDevice
    from harness.frontends.engine_matrix import MATRIX, SMALL
    from harness.input.scenario_file import load_files
    from harness.run.pipeline import run_scenario

    part = MATRIX["vllm"]
    version = str(importlib.import_module("vllm").__version__)
    for s in load_files(part.files_for(version, list(part.files))):
        r = run_scenario(s.with_overrides(model=dataclasses.replace(s.model, **SMALL)), SimDevice(), replays=1)
        if r.error:
            raise RuntimeError(f"{s.name}: {r.error}")


def print_imported(cuda_branches: bool) -> None:
    """What `engine-pack --engine vllm --list` prints, in the process `listing` starts, as JSON (the
    last line): `files`, the release's files this process imported or opened; `dists`, the
    third-party distributions it imported (name: version); `dist_files`, each one's files it
    imported or opened; `stubbed`, the packages of `STUBBED` it imported."""
    opened: set[str] = set()

    def audit(event: str, args: tuple) -> None:
        if event == "open" and args and isinstance(args[0], str):
            opened.add(args[0])

    sys.addaudithook(audit)
    if cuda_branches:
        follow_cuda()
        detect_cuda()
        run_cuda_path()
    else:
        run_simulator()
    release = Path(importlib.import_module("vllm").__file__ or "").resolve().parent.parent
    files = {str(Path(f).resolve()) for name, m in list(sys.modules.items())
             if name.split(".")[0] == "vllm" and (f := getattr(m, "__file__", None))}
    data = {str(p) for p in map(lambda f: Path(f).resolve(), opened) if p.is_file() and "__pycache__" not in p.parts}
    files |= {f for f in data if _under(Path(f), release)}
    versions, dist_files = imported_distributions(release, data)
    print(json.dumps({"files": sorted(files), "dists": versions, "dist_files": dist_files,
                      "stubbed": sorted(n for n in STUBBED if n in sys.modules)}))


def _under(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def imported_distributions(release: Path, opened: set[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The installed distributions (normalized name: version) of the modules this process imported
    from outside the standard library, the release's folder and the harness's checkout, and each
    one's files it imported or opened (`opened`: resolved paths)."""
    owners = metadata.packages_distributions()
    versions: dict[str, str] = {}
    files: dict[str, set[str]] = defaultdict(set)
    folders: dict[Path, list[str]] = {}
    for name, module in list(sys.modules.items()):
        top = name.split(".")[0]
        where = getattr(module, "__file__", None)
        if not where or top in sys.stdlib_module_names or top not in owners:
            continue
        path = Path(where).resolve()
        if not Path(where).is_absolute() or not path.is_file():
            continue  # a module that names no file of its own (torch's `_classes`, `_ops`: a bare name)
        if _under(path, release) or _under(path, ROOT / "harness") or "_vendor" in path.parts:
            # The release's, the harness's, or vendored inside another package (setuptools'). Not the
            # whole checkout: `make test-vllm`'s venv lives in it.
            continue
        dists = {normalized(d): d for d in owners[top] if normalized(d) not in NOT_ENGINE}
        for key, dist in dists.items():
            versions[key] = metadata.version(dist)
            files[key].add(str(path))
        top_file = getattr(sys.modules.get(top), "__file__", None)
        if dists and top_file and getattr(sys.modules.get(top), "__path__", None):
            folders[Path(top_file).resolve().parent] = list(dists)
    # Sources opened but not imported stay: Transformers reads every model's source when it is imported,
    # to list the names its lazy module offers, and vLLM imports names it lists that way.
    for f in opened:
        for folder, keys in folders.items():
            if _under(Path(f), folder):
                for key in keys:
                    files[key].add(f)
    return dict(sorted(versions.items())), {k: sorted(v) for k, v in sorted(files.items())}


def listing(target: Path, cuda_branches: bool) -> dict:
    """`print_imported`'s answer for the release installed in `target`, from a child process; an
    InputError with the child's last lines where it fails."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(ROOT)]))
    done = subprocess.run([sys.executable, "-m", "harness", "engine-pack", "--engine", "vllm", "--list",
                           *(["--cuda-branches"] if cuda_branches else [])],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise InputError("engine-pack", str(target), f"listing what the adapter imports "
                         f"({'as on a CUDA host' if cuda_branches else 'on the simulator'}) failed: {tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the pack


def dist_info(target: Path, version: str) -> Path:
    found = sorted(target.glob(f"vllm-{version}.dist-info"))
    if not found:
        raise InputError("engine-pack", str(target), f"holds no vllm-{version}.dist-info")
    return found[0]


def transformers_range(metadata_file: Path) -> str:
    """The Transformers range a release declares (its METADATA's unconditional Requires-Dist), or ""."""
    for line in metadata_file.read_text(encoding="utf-8").splitlines():
        if line.startswith("Requires-Dist:") and "extra ==" not in line:
            spec = line.split(":", 1)[1].split(";")[0].strip()
            m = re.match(r"([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)", spec)
            if m and normalized(m.group(1)) == "transformers":
                return m.group(2).strip().strip("()")
    return ""


def size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def pack(releases: list[str], engines_dir: Path, out: Path, wheels: bool,
         python_version: str = PYTHON) -> dict[str, int]:
    """Writes the vLLM part of the pack into `out`; returns each part's size in bytes (by folder name:
    `vllm-VERSION`, `stubs-vllm`, `wheels-vllm`, `wheels-vllm-transformers`)."""
    from harness.frontends import engine_pack

    out.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}
    versions: dict[str, str] = {}
    dist_files: dict[str, set[str]] = defaultdict(set)
    stubbed: set[str] = set()
    ranges: dict[str, str] = {}
    for version in releases:
        target = install(version, engines_dir, "vllm").resolve()
        found = [listing(target, True), listing(target, False)]
        files = {f for part in found for f in part["files"]}
        for part in found:
            versions.update(part["dists"])
            stubbed.update(part["stubbed"])
            for name, fs in part["dist_files"].items():
                dist_files[name].update(fs)
        info = dist_info(target, version)
        files.add(str(info / "METADATA"))
        ranges[version] = transformers_range(info / "METADATA")
        dest = out / f"vllm-{version}"
        shutil.rmtree(dest, ignore_errors=True)
        for f in sorted(files):
            rel = Path(f).resolve().relative_to(target)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)
        sizes[dest.name] = size_of(dest)
        print(f"vllm {version}: {len(files)} files, {mib(sizes[dest.name])} -> {dest}", flush=True)
    stubs = out / "stubs-vllm"
    shutil.rmtree(stubs, ignore_errors=True)
    stubs.mkdir(parents=True)
    for name in sorted(stubbed):
        (stubs / name).mkdir()
        (stubs / name / "__init__.py").write_text(engine_pack.STUB.format(name=name))
    sizes[stubs.name] = size_of(stubs)
    print(f"stubs-vllm: {', '.join(sorted(stubbed)) or 'none imported'}, {mib(sizes[stubs.name])} -> {stubs}")
    if not wheels:
        return _total(sizes)
    folder, extra = out / "wheels-vllm", out / "wheels-vllm-transformers"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(extra, ignore_errors=True)
    missing = {n: v for n, v in versions.items()
               if n not in GPU_IMAGE and n not in TRANSFORMERS and not n.startswith("nvidia-")}
    trimmed = download(folder, missing, dist_files, python_version)
    pins = {n: versions.get(n) or metadata.version(n) for n in TRANSFORMERS}
    refused = [f"vllm {v} ({r})" for v, r in ranges.items() if r and not _satisfies(pins["transformers"], r)]
    if refused:
        raise InputError("engine-pack", "transformers", f"{pins['transformers']} here is outside what "
                         f"{', '.join(refused)} declares: pack from an environment with a Transformers they accept")
    trimmed += download(extra, pins, dist_files, python_version)
    sizes[folder.name], sizes[extra.name] = size_of(folder), size_of(extra)
    print(f"wheels-vllm: {len(missing)} packages the GPU image lacks ({', '.join(sorted(missing))}), "
          f"{mib(sizes[folder.name])} -> {folder}")
    print(f"wheels-vllm-transformers: {', '.join(f'{k} {v}' for k, v in pins.items())}, for a host whose own "
          f"Transformers is outside {'; '.join(sorted(set(r for r in ranges.values() if r))) or '(no range)'}, "
          f"{mib(sizes[extra.name])} -> {extra}")
    if trimmed:
        print(f"built from the files imported or opened (wheels over {mib(TRIM_OVER)}): {', '.join(trimmed)}")
    return _total(sizes)


def _total(sizes: dict[str, int]) -> dict[str, int]:
    print(f"vllm part: {mib(sum(sizes.values()))} ({', '.join(f'{k} {mib(v)}' for k, v in sizes.items())})")
    return sizes


def download(folder: Path, pins: dict[str, str], dist_files: dict[str, set[str]], python_version: str) -> list[str]:
    """The wheels of `pins` into `folder`; a pure-Python one over TRIM_OVER replaced by a wheel of the
    files the listing saw its package import or open. The names of those rebuilt."""
    folder.mkdir(parents=True, exist_ok=True)
    if not pins:
        return []
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                           *platform_args(python_version), "-d", str(folder),
                           *(f"{n}=={v}" for n, v in sorted(pins.items()))], capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()
        raise InputError("engine-pack", "pip download", " | ".join(errors[-2:]))
    rebuilt = []
    for wheel in sorted(folder.glob("*-none-any.whl")):
        name = normalized(wheel.name.split("-")[0])
        if wheel.stat().st_size > TRIM_OVER and dist_files.get(name):
            built = imported_wheel(name, pins[name], dist_files[name], folder)
            if built.stat().st_size < wheel.stat().st_size:
                wheel.unlink()
                rebuilt.append(f"{name} {mib(size_of(built))}")
            else:
                built.unlink()
    return rebuilt


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def imported_wheel(name: str, version: str, files: set[str], folder: Path) -> Path:
    """A wheel of the installed distribution `name` holding only `files` (paths under its
    installation), its own METADATA (and entry points, where it has them), build tag `0imported`."""
    dist = metadata.distribution(name)
    if dist.version != version:
        raise InputError("engine-pack", name, f"installed {dist.version}, the pin is {version}")
    root = Path(str(dist.locate_file(""))).resolve()
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info = f"{stem}.dist-info"
    entries: dict[str, bytes] = {}
    for f in sorted(files):
        entries[Path(f).resolve().relative_to(root).as_posix()] = Path(f).read_bytes()
    for extra in ("METADATA", "entry_points.txt"):
        text = dist.read_text(extra)
        if text is not None:
            entries[f"{info}/{extra}"] = text.encode()
    entries[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: fence-harness engine-pack (the files the vLLM "
                                b"adapter imports)\nRoot-Is-Purelib: true\nTag: py3-none-any\nBuild: "
                                + TRIMMED_TAG.encode() + b"\n")
    record = [f"{arc},{_record_hash(data)},{len(data)}" for arc, data in entries.items()]
    entries[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{stem}-{TRIMMED_TAG}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data in entries.items():
            z.writestr(arc, data)
    return path


def _satisfies(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return not spec or SpecifierSet(spec).contains(version, prereleases=True)


# ---------------------------------------------------------------- on the GPU host


def host_wheels(pack_dir: Path) -> tuple[list[Path], str]:
    """What the host installs for the vLLM part (`engine-pack --engine vllm --host-wheels PACK`): the
    pack's wheels, and the carried Transformers where the host's own is outside the range a packed
    release declares; with a line saying which Transformers runs, and why."""
    folder = pack_dir / "wheels-vllm"
    chosen = sorted(folder.glob("*.whl"))
    ranges = {meta.parent.parent.name: transformers_range(meta)
              for meta in sorted(pack_dir.glob("vllm-*/vllm-*.dist-info/METADATA"))}
    try:
        own = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        own = ""
    outside = [f"{name} ({r})" for name, r in sorted(ranges.items()) if r and not (own and _satisfies(own, r))]
    if not outside:
        return chosen, f"transformers {own or '(none)'} of this host, within every packed release's range"
    carried = sorted((pack_dir / "wheels-vllm-transformers").glob("*.whl"))
    if not carried:
        return chosen, (f"this host's transformers {own or '(none)'} is outside {', '.join(outside)}, and the pack "
                        "carries none: the releases' imports may fail")
    names = ", ".join(" ".join(w.name.split("-")[:2]) for w in carried)
    return chosen + carried, f"the pack's {names}: this host's transformers {own or '(none)'} is outside " \
                             f"{', '.join(outside)}"
