"""The one-step install (issues 32, 42): `pip wheel` of this checkout into a fresh venv with stock Pillow,
beside Hugging Face's `datasets`.

As in a user's training environment, torch 2.13.0 (the CPU wheel in /opt/wheels) and torchvision 0.28.0
are installed first (--no-deps), then Hugging Face's `datasets` with its dependencies (as most ready-made ML
environments have it; it was the name this library took before 0.2.0), then the project's wheel, which pulls
stock Pillow and the rest. pip's
cache is reused, and pip installs with --no-compile: byte-compiling every file of torch, sympy and numpy
up front was over half of the venv's build (about a minute of two), and what the commands import is
compiled once, on first import, into the venv's own __pycache__ (PYTHONDONTWRITEBYTECODE is dropped for
the venv's commands). One venv per test process (module fixture).

  * with libjpeg-turbo's headers the wheel carries `imagenet_shards._jpeg_crop`, the loader's decode path is
    "crop", and the installed commands run the smoke path: sample -> convert -> validate -> get_data -> --compare;
  * Hugging Face's `datasets` and the library import in one interpreter, each its own; `pip uninstall` of the
    library leaves every file of theirs as their RECORD lists it;
  * with the headers hidden (an include directory first on the path whose jpeglib.h stops the compiler,
    as a missing header does) the build still succeeds without `_jpeg_crop`, says so in one line, and
    the loader says once, in one line, that it decodes with PIL.
"""

import base64
import csv
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TORCH_WHEELS = sorted(glob.glob("/opt/wheels/torch-2.13.0+cpu-*.whl"))
PIL_NOTE = "JPEGs are decoded whole with PIL"
BUILD_NOTE = "_jpeg_crop (native JPEG region decoder) not built"
HUGGING_FACE = "datasets"  # the distribution and import name the library had before 0.2.0 (issue 42)
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", "demo-output",
                                     "benchmark-output", ".pytest_cache")

# The module's venv is built inside its first test's time: 600 s, not pytest.ini's 300, on a loaded host.
pytestmark = [pytest.mark.skipif(not TORCH_WHEELS, reason="needs the torch 2.13.0 CPU wheel in /opt/wheels"),
              pytest.mark.timeout(600)]


def run(command, cwd, env=None, timeout=600):
    """Run outside the checkout, without PYTHONPATH: what is imported is what was installed. Bytecode is
    written (the venvs are installed with --no-compile; see the module's docstring)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    full_env.update(env or {})
    result = subprocess.run([str(c) for c in command], cwd=cwd, env=full_env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def build_wheel(tmp: Path, name: str, env=None) -> tuple:
    """`pip wheel --no-deps` of a fresh copy of the checkout (an in-tree build leaves build/ behind, and a
    second build must not reuse the first one's objects) -> (wheel path, pip's output)."""
    copy = tmp / f"{name}-checkout"
    shutil.copytree(REPO, copy, ignore=COPY_IGNORE, symlinks=True)
    result = run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", tmp / name, copy], tmp, env)
    (wheel,) = (tmp / name).glob("imagenet_shards-*.whl")
    return wheel, result.stdout + result.stderr


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory):
    """A venv as a user's: torch and torchvision first (--no-deps), then the project's wheel with its deps."""
    tmp = tmp_path_factory.mktemp("install")
    wheel, _ = build_wheel(tmp, "wheel")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", venv], tmp)
    python = venv_python(venv)
    run([python, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", TORCH_WHEELS[-1], "torchvision==0.28.0"], tmp)
    run([python, "-m", "pip", "install", "-q", "--no-compile", HUGGING_FACE], tmp)
    run([python, "-m", "pip", "install", "-q", "--no-compile", wheel], tmp)
    return tmp, venv


def site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def linked_copy(venv: Path, second: Path, leave_out=(), scripts=False) -> Path:
    """A second venv holding the first one's packages as hard links (seconds, not a second torch install),
    less the entries whose names start with `leave_out`, and with `scripts` its console scripts (for an
    uninstall, which unlinks them: an install into the copy would write through the links); its python."""
    run([sys.executable, "-m", "venv", "--without-pip", second], second.parent)
    site = site_packages(venv)
    target = second / site.relative_to(venv)
    for entry in site.iterdir():
        if leave_out and entry.name.startswith(tuple(leave_out)):
            continue
        destination = target / entry.name
        if entry.is_dir():
            shutil.copytree(entry, destination, copy_function=os.link, symlinks=True)
        else:
            os.link(entry, destination)
    for script in (venv / "bin").iterdir() if scripts else ():  # not the venv's own python links
        if not (second / "bin" / script.name).exists() and not script.is_symlink():
            os.link(script, second / "bin" / script.name)
    return venv_python(second)


def record_mismatches(site: Path, distribution: str) -> tuple:
    """(files of `distribution` whose bytes differ from its RECORD's sha256 or are missing, files checked)."""
    (record,) = site.glob(f"{distribution}-*.dist-info/RECORD")
    wrong, checked = [], 0
    for path, digest, _ in csv.reader(record.read_text().splitlines()):
        if not digest:  # RECORD itself, and files pip wrote after it (INSTALLER, REQUESTED, bytecode)
            continue
        algorithm, expected = digest.split("=", 1)
        file = site / path
        checked += 1
        if not file.is_file():
            wrong.append(f"{path}: missing")
        elif base64.urlsafe_b64encode(hashlib.new(algorithm, file.read_bytes()).digest()).rstrip(b"=").decode() \
                != expected:
            wrong.append(f"{path}: changed")
    return wrong, checked


def test_beside_hugging_face_datasets_each_package_is_its_own(user_venv):
    """Both import in one interpreter: `datasets.load_dataset` is Hugging Face's, the library is imagenet_shards
    with its native decoder inside it; the library's install wrote none of their files."""
    tmp, venv = user_venv
    probe = ("import datasets, imagenet_shards, imagenet_shards.loader, imagenet_shards._jpeg_crop as native; "
             "print(datasets.load_dataset.__module__, callable(datasets.load_dataset)); "
             "print(imagenet_shards.__file__); print(native.__file__); print(imagenet_shards.loader.get_data.__module__)")
    lines = run([venv_python(venv), "-c", probe], tmp).stdout.splitlines()
    site = site_packages(venv)
    assert lines[0] == "datasets.load True"
    assert lines[1] == str(site / "imagenet_shards" / "__init__.py")
    assert Path(lines[2]).parent == site / "imagenet_shards"
    assert lines[3] == "imagenet_shards.loader.image_loader"
    assert not list(site.glob("_jpeg_crop*"))  # no top-level module of ours
    wrong, checked = record_mismatches(site, HUGGING_FACE)
    assert checked > 100 and wrong == []


def test_uninstalling_the_library_leaves_hugging_face_datasets_whole(user_venv, tmp_path):
    """`pip uninstall imagenet-shards` (in a linked copy of the user's venv, so the module's venv stays whole):
    every file of Hugging Face's `datasets` is still there with its RECORD's sha256, and it still imports."""
    tmp, venv = user_venv
    python = linked_copy(venv, tmp_path / "venv", scripts=True)
    site = site_packages(tmp_path / "venv")
    run([python, "-m", "pip", "uninstall", "-y", "-q", "imagenet-shards"], tmp_path)
    assert not (site / "imagenet_shards").exists()
    wrong, checked = record_mismatches(site, HUGGING_FACE)
    assert checked > 100 and wrong == []
    after = run([python, "-c", "import datasets; print(datasets.load_dataset.__module__); "
                               "import importlib.util; print(importlib.util.find_spec('imagenet_shards'))"], tmp_path)
    assert after.stdout.split() == ["datasets.load", "None"]


def test_the_wheel_installs_the_native_decoder_and_the_commands(user_venv):
    tmp, venv = user_venv
    python, bin_dir = venv_python(venv), venv / "bin"
    (wheel,) = (tmp / "wheel").glob("imagenet_shards-*.whl")
    shipped = zipfile.ZipFile(wheel).namelist()  # issue 46: the test rigs stay in the checkout
    assert not [name for name in shipped if name.startswith(("imagenet_shards/testing/", "testing_rigs/"))]
    work = tmp / "smoke"
    work.mkdir()
    run([bin_dir / "sample-imagenet", "--out", "cmp/source", "--classes", 2, "--train-per-class", 6,
         "--val-per-class", 2, "--layout", "folder", "--workers", 1], work)
    run([bin_dir / "create-webdataset", "--source", "cmp/source", "--target", "cmp/img", "--workers", 1,
         "--no-progress", "--samples-per-shard", 4], work)
    assert "Dataset OK." in run([bin_dir / "validate-dataset", "cmp/img", "--workers", 1, "--no-progress"], work).stdout
    # What was installed, and a batch through the installed loader: one interpreter (a torch import less)
    load = ("import PIL; from imagenet_shards import _jpeg_crop; from imagenet_shards.loader import jpeg_crop; "
            "from imagenet_shards.torchvision_cpu import torchvision, transforms_v2; "
            "print(jpeg_crop.decode_path(), PIL.__version__, torchvision.__version__); "
            "from imagenet_shards.loader import TrainCrop, get_data; "
            "loader = get_data('cmp/img', 'train', batch_size=4, transform=TrainCrop(image_size=64)); "
            "images, labels = next(iter(loader)); print(tuple(images.shape), len(labels))")
    loaded = run([python, "-c", load], work)
    probed, batch = loaded.stdout.split("\n")[:2]
    decode, pil_version, _ = probed.split()
    assert decode == "crop"
    assert "post" not in pil_version  # stock Pillow, as pip pulled it (pillow-simd versions end .postN)
    assert batch == "(4, 3, 64, 64) 4"
    assert PIL_NOTE not in loaded.stderr
    compared = run([bin_dir / "host-benchmark", "--compare", "cmp", "--formats", "img", "--batches", 1,
                    "--warmup-batches", 1, "--batch-size", 4, "--dataloader-worker", 0, "--image-size", 64,
                    "--json", "compare.json"], work)
    assert "img, device normalisation, crop decode" in compared.stdout
    assert (work / "compare.json").is_file()
    # A dataset written before the CRC32C index (3a4a4fc): one line naming the command as an install has it
    shutil.copytree(REPO / "tests" / "data" / "earlier-layouts" / "img-3a4a4fc", work / "earlier")
    earlier = subprocess.run([bin_dir / "validate-dataset", "earlier", "--workers", "1", "--no-progress"], cwd=work,
                             capture_output=True, text=True, timeout=300)
    assert earlier.returncode == 1 and "corrupt" not in (earlier.stdout + earlier.stderr).lower(), earlier.stdout
    assert "tar-tools reindex" in earlier.stdout + earlier.stderr and "tar_tools.py" not in earlier.stderr
    run([bin_dir / "tar-tools", "reindex", "earlier"], work)
    assert "Dataset OK." in run([bin_dir / "validate-dataset", "earlier", "--workers", 1, "--no-progress"], work).stdout


def test_without_libjpeg_headers_the_install_succeeds_and_the_loader_says_it_uses_pil(user_venv, tmp_path):
    tmp, venv = user_venv
    hidden = tmp_path / "include"
    hidden.mkdir()
    (hidden / "jpeglib.h").write_text("#error jpeglib.h hidden by tests/test_install.py\n")
    wheel, output = build_wheel(tmp_path, "wheel", env={"CFLAGS": f"-I{hidden}"})
    assert [line for line in output.splitlines() if BUILD_NOTE in line], output[-3000:]

    # A second venv holding the first one's packages but not the project, which pip then installs from the wheel
    # built without the headers.
    python = linked_copy(venv, tmp_path / "venv", leave_out=("imagenet_shards", "_jpeg_crop"))
    second = tmp_path / "venv"
    target = site_packages(second)
    run([python, "-m", "pip", "install", "-q", "--no-compile", "--no-deps", wheel], tmp_path)
    assert not list(target.glob("_jpeg_crop*")) and not list(target.glob("imagenet_shards/_jpeg_crop*"))

    run([venv / "bin" / "sample-imagenet", "--out", "source", "--classes", 2, "--train-per-class", 4,
         "--val-per-class", 1, "--layout", "folder", "--workers", 1], tmp_path)
    load = ("from imagenet_shards.loader import TrainCrop, get_data, jpeg_crop; print(jpeg_crop.decode_path()); "
            "[next(iter(get_data('source', 'train', batch_size=2, transform=TrainCrop(image_size=32)))) "
            "for _ in range(2)]")
    loaded = run([python, "-c", load], tmp_path)
    assert loaded.stdout.split() == ["pil"]
    notes = [line for line in loaded.stderr.splitlines() if PIL_NOTE in line]
    assert len(notes) == 1, loaded.stderr  # once, for two loaders
    assert "libjpeg-turbo" in notes[0]
    # host_benchmark's report says it too.
    report = run([second / "bin" / "host-benchmark", "--data", "imagenet", "--imagenet-data-path", "source",
                  "--batches", 1, "--warmup-batches", 1, "--batch-size", 2, "--iterations", 1,
                  "--dataloader-worker", 0, "--image-size", 32], tmp_path)
    assert f"note: {PIL_NOTE}" in report.stdout, report.stdout
