"""`fence-harness engine-pack --engine vllm` (harness/frontends/engine_pack_vllm.py) and what
`make engine-from-pack` asks of it on the GPU host.

The parts that need no vLLM run everywhere: the Transformers range a release declares, which wheels a
host installs, the wheels built from imported files, the command line. The rest needs a vLLM release
folder (`make test-vllm`: PYTHONPATH=.engines/vllm-VERSION; skipped elsewhere, failed there where
it cannot import): the listing as on a CUDA host, a release's folder in the pack, and, on 0.17.0, a
GPU host simulated on this CPU: a fresh folder with only the pack's wheels installed (`pip install
--no-index --no-deps --target`, wheels of this interpreter's CPython, at the same pins), every
package of this environment that the GPU image lacks hidden, and `engine-matrix --engine vllm
--device sim` run from the pack's release folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from base64 import urlsafe_b64encode
from importlib import metadata
from pathlib import Path

import pytest

from harness.frontends import engine_pack_vllm as pv
from harness.frontends.cli import _parser as build_parser
from harness.records.errors import InputError
from tests.support.paths import ROOT
from tests.support.vllm_release import REQUIRED, need

DECLARES = "Requires-Dist: regex\nRequires-Dist: transformers<5,>=4.56.0\nRequires-Dist: pytest; extra == \"dev\"\n"


def fake_pack(tmp_path: Path, declares: str = DECLARES) -> Path:
    pack = tmp_path / "carry"
    for release in ("0.16.0", "0.17.0"):
        info = pack / f"vllm-{release}" / f"vllm-{release}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n{declares}")
    for folder, wheels in (("wheels-vllm", ("pydantic-2.14.4-py3-none-any.whl",)),
                           ("wheels-vllm-transformers", ("transformers-4.57.6-0imported-py3-none-any.whl",
                                                         "tokenizers-0.22.2-cp39-abi3-manylinux2014_x86_64.whl"))):
        (pack / folder).mkdir()
        for w in wheels:
            (pack / folder / w).write_bytes(b"")
    return pack


def test_the_transformers_range_is_the_releases_unconditional_requirement(tmp_path):
    meta = tmp_path / "METADATA"
    meta.write_text(DECLARES)
    assert pv.transformers_range(meta) == "<5,>=4.56.0"
    meta.write_text("Requires-Dist: transformers[torch] (>=4.40); python_version > \"3.8\"\n")
    assert pv.transformers_range(meta) == ">=4.40"
    meta.write_text("Requires-Dist: transformers>=9; extra == \"dev\"\n")
    assert pv.transformers_range(meta) == ""


@pytest.mark.parametrize("own, carried", [("4.57.1", False), ("5.19.0", True), (None, True)])
def test_the_host_installs_the_carried_transformers_only_outside_the_releases_range(tmp_path, monkeypatch, own,
                                                                                     carried):
    pack = fake_pack(tmp_path)

    def version(name):
        if name != "transformers" or own is None:
            raise metadata.PackageNotFoundError(name)
        return own

    monkeypatch.setattr(pv.metadata, "version", version)
    wheels, why = pv.host_wheels(pack)
    names = [w.name.split("-")[0] for w in wheels]
    assert names == (["pydantic", "tokenizers", "transformers"] if carried else ["pydantic"])
    if carried:
        assert why.startswith("the pack's tokenizers 0.22.2, transformers 4.57.6: this host's transformers")
        assert "vllm-0.16.0 (<5,>=4.56.0)" in why
    else:
        assert why == "transformers 4.57.1 of this host, within every packed release's range"


def test_a_pack_without_the_transformers_folder_says_what_may_fail(tmp_path, monkeypatch):
    pack = fake_pack(tmp_path)
    for w in (pack / "wheels-vllm-transformers").iterdir():
        w.unlink()
    monkeypatch.setattr(pv.metadata, "version", lambda name: "5.19.0")
    wheels, why = pv.host_wheels(pack)
    assert [w.name for w in wheels] == ["pydantic-2.14.4-py3-none-any.whl"]
    assert "outside vllm-0.16.0 (<5,>=4.56.0), vllm-0.17.0 (<5,>=4.56.0), and the pack carries none" in why


def test_a_wheel_of_the_imported_files_holds_them_its_metadata_and_a_true_record(tmp_path):
    dist = metadata.distribution("iniconfig")  # pytest's: in every environment the tests run in
    imported = [Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith("__init__.py")]
    assert imported
    wheel = pv.imported_wheel("iniconfig", dist.version, {str(f) for f in imported}, tmp_path)
    assert wheel.name == f"iniconfig-{dist.version}-{pv.TRIMMED_TAG}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"iniconfig-{dist.version}.dist-info"
        assert {f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD", "iniconfig/__init__.py"} <= names
        assert not [n for n in names if n.endswith(".py") and n != "iniconfig/__init__.py"]
        for line in z.read(f"{info}/RECORD").decode().splitlines():
            arc, digest, size = line.split(",")
            if arc.endswith("RECORD"):
                continue
            data = z.read(arc)
            assert size == str(len(data))
            assert digest == "sha256=" + urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with pytest.raises(InputError, match="installed .*, the pin is 0.0.0"):
        pv.imported_wheel("iniconfig", "0.0.0", set(), tmp_path)


def test_the_wheels_are_for_the_gpu_images_cpython_on_manylinux_up_to_glibc_2_35():
    args = pv.platform_args("3.12")
    assert args[:2] == ["--python-version", "3.12"]
    tags = args[3::2]
    assert "manylinux2014_x86_64" in tags and "manylinux_2_31_x86_64" in tags and tags[-1] == "manylinux_2_35_x86_64"
    assert {"torch", "transformers", "tokenizers", "huggingface-hub", "triton", "numpy"} <= pv.GPU_IMAGE


def test_the_command_line_keeps_sglang_the_default_and_packs_vllms_releases_on_asking():
    parser = build_parser()
    plain = parser.parse_args(["engine-pack"])
    assert plain.engine == "sglang" and plain.releases is None and plain.python_version == "3.12"
    assert parser.parse_args(["engine-pack", "--engine", "vllm"]).engine == "vllm"
    from harness.frontends.gpu_host_commands import RELEASES

    assert RELEASES == {"sglang": "0.5.22,0.5.23", "vllm": "0.16.0,0.17.0"}


def test_the_host_wheels_option_prints_one_wheel_a_line_and_the_reason_on_stderr(tmp_path, monkeypatch, capsys):
    from harness.frontends.cli import main

    pack = fake_pack(tmp_path)
    monkeypatch.setattr(pv.metadata, "version", lambda name: "4.57.6")
    assert main(["engine-pack", "--engine", "vllm", "--host-wheels", str(pack)]) == 0
    out, err = capsys.readouterr()
    assert out.split() == [str(pack / "wheels-vllm" / "pydantic-2.14.4-py3-none-any.whl")]
    assert "vllm: transformers 4.57.6 of this host" in err


# ---------------------------------------------------------------- with a vLLM release folder


def _release() -> tuple[str, Path]:
    """This release's version and its folder (`.engines/vllm-VERSION`, as make test-vllm has it)."""
    vllm = need("vllm", "vllm is not importable here; `make test-vllm` installs each release "
                        "(PYTHONPATH=.engines/vllm-VERSION)")
    version = str(vllm.__version__)
    folder = Path(str(vllm.__file__)).resolve().parent.parent
    if folder.name != f"vllm-{version}":
        pytest.skip(f"vllm {version} is not installed as a release folder (.engines/vllm-{version}, "
                    "as make test-vllm installs it)")
    return version, folder


def test_the_listing_as_on_a_cuda_host_imports_no_cuda_platform_and_no_compiled_module():
    version, folder = _release()
    found = pv.listing(folder, cuda_branches=True)
    files = {Path(f).relative_to(folder).as_posix() for f in found["files"]}
    assert {"vllm/config/vllm.py", "vllm/forward_context.py", "vllm/platforms/interface.py",
            "vllm/distributed/kv_transfer/kv_connector/v1/base.py"} <= files
    assert "vllm/platforms/cuda.py" not in files and not [f for f in files if f.endswith(".so")]
    assert {"pydantic", "transformers", "torch"} <= set(found["dists"]) and found["stubbed"] == []
    assert all(Path(f).is_file() for fs in found["dist_files"].values() for f in fs)


def test_without_the_harness_platform_first_a_cuda_host_would_take_vllms_cuda_platform_and_fail():
    # The listing's teeth: vLLM's detection answering CUDA, and vLLM imported before the adapter set its
    # platform, reaches vllm.platforms.cuda, whose compiled vllm._C is missing (from a pack) or built
    # for another torch; the adapter's own load, in the same setting, runs.
    version, folder = _release()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]))
    setup = "from harness.frontends import engine_pack_vllm as p; p.follow_cuda(); p.detect_cuda(); "
    bare = subprocess.run([sys.executable, "-c", setup + "import vllm.config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert bare.returncode != 0 and "vllm/platforms/cuda.py" in bare.stderr, bare.stderr[-2000:]
    ours = subprocess.run([sys.executable, "-c", setup + "p.run_cuda_path()"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert f"vllm {version} as on a CUDA host: FULL asked, the connector declaring False -> FULL" in ours.stderr


def test_a_releases_folder_in_the_pack_holds_only_what_the_adapter_imports(tmp_path):
    version, folder = _release()
    sizes = pv.pack([version], folder.parent, tmp_path, wheels=False)
    dest = tmp_path / f"vllm-{version}"
    files = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()}
    assert f"vllm-{version}.dist-info/METADATA" in files and "vllm/config/vllm.py" in files
    assert "vllm/platforms/cuda.py" not in files and not [f for f in files if f.endswith(".so")]
    everything = [p for p in (folder / "vllm").rglob("*.py")]
    assert len(files) < len(everything) / 4  # the wheel holds thousands of modules; the adapter imports a few hundred
    assert sizes[dest.name] == sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) < 10 * 2**20
    assert sizes["stubs-vllm"] == 0 and not list((tmp_path / "stubs-vllm").iterdir())
    assert not (tmp_path / "wheels-vllm").exists()


SITECUSTOMIZE = '''"""The GPU image's packages, simulated: a top-level module found in this environment's site-packages
is not found unless the image has its distribution (vendored copies inside a package stay)."""
import importlib.machinery
import os
import sys

_SITE = os.environ["FENCE_HARNESS_IMAGE_SITE"]
_ALLOWED = frozenset(os.environ["FENCE_HARNESS_IMAGE_MODULES"].split(","))


class _ImagePathFinder(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        spec = super().find_spec(name, path, target)
        if spec is None or path is not None or name in _ALLOWED:
            return spec
        places = [spec.origin or "", *(spec.submodule_search_locations or [])]
        hidden = any(str(p).startswith(_SITE) and "/_vendor/" not in str(p) for p in places)
        return None if hidden else spec


sys.meta_path[:] = [_ImagePathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
'''


def test_a_gpu_host_simulated_runs_the_vllm_matrix_from_the_pack_alone(tmp_path, monkeypatch):
    version, folder = _release()
    if version != "0.17.0":
        pytest.skip(f"the simulated GPU host runs on 0.17.0 (make test-vllm's last release), not {version}")
    pack = tmp_path / "carry"
    here = f"{sys.version_info.major}.{sys.version_info.minor}"  # this interpreter's wheels, the same pins
    try:
        sizes = pv.pack([version], folder.parent, pack, wheels=True, python_version=here)
    except InputError as e:
        if REQUIRED or "pip download" not in str(e):
            raise
        pytest.skip(f"no package index here for the pack's wheels ({e})")
    assert set(sizes) == {f"vllm-{version}", "stubs-vllm", "wheels-vllm", "wheels-vllm-transformers"}
    # The host's Transformers outside the release's range: the pack's own is installed and used.
    monkeypatch.setattr(pv.metadata, "version", lambda name: "5.19.0")
    wheels, why = pv.host_wheels(pack)
    monkeypatch.undo()
    assert "the pack's" in why and any(w.parent.name == "wheels-vllm-transformers" for w in wheels)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                    *map(str, wheels)], check=True)
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text(SITECUSTOMIZE)
    owners = metadata.packages_distributions()
    on_image = pv.GPU_IMAGE - set(pv.TRANSFORMERS)
    allowed = sorted(top for top, dists in owners.items() if any(pv.normalized(d) in on_image for d in dists))
    site_packages = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(image), str(site), str(pack / "stubs-vllm")]),
               FENCE_HARNESS_IMAGE_SITE=site_packages, FENCE_HARNESS_IMAGE_MODULES=",".join(allowed))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "harness", "engine-matrix", "--engine", "vllm", "--releases",
                           version, "--engines-dir", str(pack), "--device", "sim", "--replays", "1", "--out",
                           str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "skipped on sim: scenarios/engine/vllm_serving.toml" in done.stdout
    assert f"({pack / f'vllm-{version}'})" in done.stdout  # the release ran from the pack's folder
    doc = json.loads((out / "vllm" / "results.json").read_text())
    rows = doc["engine_matrix"]["rows"]
    assert len(rows) == 9 and all(r["met"] for r in rows), rows
    # The image filter has teeth: with the pack's wheels left out, vLLM cannot import.
    env["PYTHONPATH"] = os.pathsep.join([str(image), str(pack / f"vllm-{version}")])
    bare = subprocess.run([sys.executable, "-c", "import vllm.config"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr
