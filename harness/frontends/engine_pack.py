"""`fence-harness engine-pack`: SGLang releases packed for a GPU host with no package index
(`make engine-pack`).

Writes `.engines/carry/` (git-ignored, for a device call's `carry`):

- `sglang-VERSION/`: each release's own files, only those the adapter's modules import
  on a CUDA host (listed in a child process that imports them with torch's CUDA checks
  answering yes, so the modules' CUDA branches are followed) and in a simulator run;
  everything else in the wheel (kernels' sources, configs, other subsystems) is left out.
- `stubs/`: `sgl_kernel` and `flashinfer`, which those CUDA branches import and whose
  compiled wheels are far over what a call can carry. Every name imports; calling one
  raises, so an op the run needed fails loudly, never passes silently. The adapter's
  path calls none of them.
- `wheels/`: the pure-Python and compiled (CPython 3.12, manylinux) wheels of the
  imported third-party packages that the GPU image lacks, at this environment's versions.

`make engine-from-pack` on the GPU host installs the wheels into a temporary folder
(`pip install --no-index --no-deps --target`) and runs `fence-harness engine-matrix` on
each release of the pack with the stubs on the path, on that host's own torch.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from harness.frontends.engine_matrix import ROOT, install

# Imported by the engine's modules and missing from the GPU image (its package list:
# torch 2.11, transformers, triton, numpy, pandas, pyarrow, aiohttp, requests, rich ...).
GPU_MISSING = (
    "ipython", "traitlets", "annotated-types", "compressed-tensors", "datasets", "dill", "distro", "gguf",
    "loguru", "msgspec", "multiprocess", "openai", "orjson", "partial-json-parser", "pybase64", "pydantic",
    "pydantic-core", "sniffio", "starlette", "apache-tvm-ffi", "typing-inspection", "xgrammar", "pyzmq",
    "zstandard", "jiter",
)
STUBBED = ("sgl_kernel", "flashinfer")
# Folders a release checks for at import on CUDA (the JIT kernels' sources), copied whole.
DATA_DIRS = ("sglang/kernels/jit/include", "sglang/kernels/jit/csrc")

STUB = '''"""A stand-in for {name} (compiled CUDA kernels, not carried to this host).

Every name imports; calling one raises, so an op a run needed fails loudly, never passes."""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+stub"


class _Missing:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{name}.{{self._name}} is a stub on this host: its compiled kernel is not here")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{{self._name}}.{{attr}}")

    def __bool__(self):
        return False

    def __mro_entries__(self, bases):
        return (object,)  # a stub class as a base class: the subclass stands on object


def _named(name, prefix=""):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing(prefix + name)


def __getattr__(name):
    return _named(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("{name}."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        prefix = spec.name[len("{name}."):] + "."
        module.__getattr__ = lambda name: _named(name, prefix)
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
'''


def write_stubs(folder: Path) -> None:
    for name in STUBBED:
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "__init__.py").write_text(STUB.format(name=name))


def imported_files(target: Path, stubs: Path, cuda_branches: bool) -> list[str]:
    """The release's files that the adapter's modules import, from a child process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(stubs), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "harness", "engine-pack", "--list",
                          *(["--cuda-branches"] if cuda_branches else [])],
                         env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def follow_cuda() -> None:
    """Follow the modules' CUDA branches (they import more there) without a GPU here: torch's CUDA
    checks answer as an H200 host's do."""
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"


def print_imported(cuda_branches: bool) -> None:
    """What `engine-pack --list` prints, in the process `imported_files` starts: the release's files
    this process imports, as a JSON list (the last line)."""
    if cuda_branches:
        follow_cuda()
    from harness.engines import sglang as adapter

    for name in (*adapter.NEEDED, adapter.TEST_UTILS):
        importlib.import_module(name)
    if not cuda_branches:  # what a run imports lazily, on the simulator
        import dataclasses

        from harness.devices.sim import SimDevice
        from harness.frontends.engine_matrix import FILES, SMALL
        from harness.input.scenario_file import load_file
        from harness.run.pipeline import run_scenario

        for s in load_file(FILES[0]):
            run_scenario(s.with_overrides(model=dataclasses.replace(s.model, **SMALL)), SimDevice(), replays=1)
    files = sorted({str(m.__file__) for name, m in list(sys.modules.items())
                    if name.split(".")[0] == "sglang" and getattr(m, "__file__", None)})
    print(json.dumps(files))


def siblings(files: set[str]) -> set[str]:
    """The other modules of each package a recorded file is in: code that imports inside a function,
    on a path this machine cannot take, mostly imports a sibling (on CUDA, MambaPool's constructor
    imports mem_cache.mamba_slot_fused), and the recording above sees only what ran here."""
    return {str(f) for d in {Path(x).parent for x in files} for f in d.glob("*.py")}


def pack(releases: list[str], engines_dir: Path, out: Path, wheels: bool) -> None:
    stubs = out / "stubs"
    write_stubs(stubs)
    for version in releases:
        target = install(version, engines_dir).resolve()
        files = set(imported_files(target, stubs, True)) | set(imported_files(target, stubs, False))
        files |= siblings(files)
        dest = out / f"sglang-{version}"
        shutil.rmtree(dest, ignore_errors=True)
        size = 0
        for f in sorted(files):
            rel = Path(f).resolve().relative_to(target)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)
            size += (dest / rel).stat().st_size
        for data in DATA_DIRS:
            if (target / data).is_dir():
                shutil.copytree(target / data, dest / data, dirs_exist_ok=True)
                size += sum(p.stat().st_size for p in (dest / data).rglob("*") if p.is_file())
        print(f"sglang {version}: {len(files)} files, {size / 2**20:.1f} MiB -> {dest}")
    if wheels:
        folder = out / "wheels"
        folder.mkdir(parents=True, exist_ok=True)
        pins = [f"{name}=={metadata.version(name)}" for name in GPU_MISSING]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64",
                        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                        "-d", str(folder), *pins], check=True)
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(f"wheels: {len(list(folder.iterdir()))} files, {size / 2**20:.1f} MiB -> {folder}")
