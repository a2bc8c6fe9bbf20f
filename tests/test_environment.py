"""The installed stack is the one the project pins, with pillow-simd as the active PIL."""

import os
import re
import subprocess
import sys
from pathlib import Path

import PIL
from PIL import Image

from imagenet_shards.torchvision_cpu import torchvision, transforms_v2

REPO = Path(__file__).resolve().parents[1]
PINS = dict(
    line.split("==", 1)
    for line in (REPO / "requirements.txt").read_text().splitlines()
    if "==" in line and not line.startswith("#")
)


def test_torch_and_torchvision_are_pinned_exactly():
    # An unpinned torchvision pulls a newer torch plus GBs of CUDA packages.
    assert PINS["torch"] == "2.13.0"
    assert PINS["torchvision"] == "0.28.0"
    import torch

    assert torch.__version__.split("+")[0] == "2.13.0"
    assert torchvision.__version__.split("+")[0] == "0.28.0"


def test_pillow_simd_is_the_active_pil():
    flavour = (REPO / ".venv" / ".pil-flavour").read_text()
    assert flavour.startswith("pillow-simd"), f"setup fell back: {flavour}"
    assert PIL.__version__ == "12.1.1.post0"
    # pillow-simd ships its own distribution; stock pillow must not shadow it.
    from importlib.metadata import PackageNotFoundError, version

    assert version("pillow-simd") == PIL.__version__
    try:
        version("pillow")
    except PackageNotFoundError:
        pass
    else:
        raise AssertionError("stock pillow is installed next to pillow-simd")


def test_transforms_v2_and_imagefolder_work(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        Image.new("RGB", (64, 48), (10, 20, 30)).save(tmp_path / cls / "x.jpg")
    folder = torchvision.datasets.ImageFolder(
        tmp_path,
        transform=transforms_v2.Compose(
            [transforms_v2.PILToTensor(), transforms_v2.RandomResizedCrop(32), transforms_v2.RandomHorizontalFlip()]
        ),
    )
    image, label = folder[1]
    assert tuple(image.shape) == (3, 32, 32) and label == 1


def test_torchvision_fix_applies_only_to_the_known_failure():
    # A fresh interpreter: the import goes through the fix module and must not raise.
    code = "from imagenet_shards.torchvision_cpu import torchvision, schemas_defined; print(schemas_defined)"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in {"True", "False"}


def test_no_module_imports_torchvision_directly():
    offenders = []
    for path in list((REPO / "imagenet_shards").rglob("*.py")) + list(REPO.glob("*.py")):
        if path.name == "torchvision_cpu.py":
            continue
        if re.search(r"^\s*(import torchvision|from torchvision)", path.read_text(), re.M):
            offenders.append(str(path.relative_to(REPO)))
    assert not offenders, f"import torchvision through imagenet_shards.torchvision_cpu: {offenders}"


def test_the_commands_that_read_indexes_do_not_import_torch():
    # torch's import is ~2.5 CPU-s a process: the converter, validator, inspector, balancer, uploader and the
    # ledger check pay it in every run, and the suite runs them hundreds of times (a source kind's top-level
    # `import torch` made test_inspect_dataset 7x slower)
    modules = ["imagenet_shards.cli.create_webdataset", "imagenet_shards.cli.validate_dataset", "imagenet_shards.cli.inspect_dataset",
               "imagenet_shards.cli.distributed_webdataset", "imagenet_shards.cli.upload_dataset", "imagenet_shards.cli.tar_tools",
               "imagenet_shards.ledger", "imagenet_shards.sample"]
    code = f"import sys; import {', '.join(modules)}; print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


def test_second_setup_run_reinstalls_nothing():
    result = subprocess.run(["make", "-q", "venv"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "make considers the environment out of date: a second run would reinstall"


def test_import_torchvision_first_works_with_the_setup_s_import_hook(tmp_path):
    """scripts/setup_venv.sh's hook step, run against a throwaway venv that reaches the pinned stack through a .pth
    (so .venv is not touched): `import torchvision` as a fresh interpreter's first line works, and nothing is
    imported at start-up. The schemas are defined exactly where the plain import fails (this mismatched pair)."""
    import sysconfig

    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = str(env_dir / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "pinned-stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*command, **extra):
        return subprocess.run([*command], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                              env={**env, **extra})

    plain = run(python, "-c", "import torchvision")
    needed = plain.returncode != 0
    assert not needed or "operator torchvision::nms does not exist" in plain.stderr, plain.stderr
    installed = run(python, str(REPO / "imagenet_shards" / "torchvision_hook.py"), site)  # the setup script's command
    assert installed.returncode == 0, installed.stderr

    start = run(python, "-c", "import sys, _torchvision_schema_hook as h; "
                              "print('torch' in sys.modules, any(isinstance(f, h.TorchvisionFinder) for f in sys.meta_path))")
    assert start.stdout.split() == ["False", "True"], start.stderr
    # `import torchvision` first, the checkout not on sys.path (the hook's copy imports nothing from it); then,
    # in the same interpreter (a torchvision import less), the project's own import path after it, the checkout
    # put first on sys.path as PYTHONPATH would, as a training script does it.
    first = run(python, "-c", "import torchvision; import torchvision.transforms.v2; import sys; "
                              "print(sys.modules['_torchvision_schema_hook'].schemas_defined, "
                              "torchvision.transforms.v2.RandomResizedCrop(8).size); "
                              "assert not [name for name in sys.modules if name.split('.')[0] == 'imagenet_shards']; "
                              f"sys.path.insert(0, {str(REPO)!r}); "
                              "from imagenet_shards.torchvision_cpu import schemas_defined, transforms_v2; "
                              "print(schemas_defined)")
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == [str(needed), "(8,", "8)", str(needed)], first.stdout
