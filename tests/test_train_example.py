"""examples/train_imagenet.py under real torchrun (2 processes, gloo, CPU): killed with SIGKILL mid-epoch,
resumed, it trains on exactly the batches (keys and pixels) of an uninterrupted run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PYTHON, REPO

SCRIPT = REPO / "examples" / "train_imagenet.py"


def start_torchrun(*args, cwd):
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(SCRIPT),
               *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)


def finish(job, timeout=420) -> subprocess.CompletedProcess:
    stdout, stderr = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


def torchrun(*args, cwd, timeout=420):
    return finish(start_torchrun(*args, cwd=cwd), timeout)


def steps_of(directory: Path) -> dict:
    """(rank, step) -> (keys, pixel sum): the last record of each step (a replayed step overwrites)."""
    found = {}
    for rank in (0, 1):
        for line in (directory / f"rank{rank}.jsonl").read_text().splitlines():
            record = json.loads(line)
            found[(rank, record["step"])] = (record["epoch"], record["keys"], record["pixels"])
    return found


def test_killed_and_resumed_run_continues_with_the_right_samples(converted, tmp_path):
    """SIGKILL after step 4, the checkpoint at step 3 (mid-epoch): the resumed run loads both ranks'
    loader states, trains step 4 again and crosses into epoch 1 (36 train samples, 2 instances,
    batches of 4: 4 batches per instance and epoch). Strong augmentation and MixUp/CutMix included:
    the pixels must repeat too. The epoch's ledgers, the killed run's part included, verify. The model is a
    small one (shufflenet_v2_x0_5, 1.4M parameters): what is checked is the data, not the weights."""
    common = ["--data", converted("img"), "--arch", "shufflenet_v2_x0_5", "--image-size", "32", "--batch-size", "4",
              "--workers", "1", "--max-steps", "7", "--strong-aug", "--no-val", "--checkpoint-every", "3"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "resumed").mkdir()
    # The uninterrupted run and the one killed run side by side: independent jobs (own rendezvous port,
    # files and checkpoint), and each job's launcher and start-up leave a core idle on a 2-core machine.
    jobs = [start_torchrun(*common, "--checkpoint", "whole.pt", "--keys-log", "whole", "--step-log", "steps.jsonl",
                           cwd=tmp_path),
            start_torchrun(*common, "--checkpoint", "resumed.pt", "--keys-log", "resumed", "--kill-at-step", "4",
                           cwd=tmp_path)]
    whole, killed = [finish(job) for job in jobs]
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    assert "data wait" in whole.stdout and "img/s per instance" in whole.stdout
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]  # rank 0's
    assert [s["step"] for s in steps] == list(range(1, 8)) and all(0 <= s["wait_s"] <= s["step_s"] for s in steps)
    assert "done: 7 steps; data wait: not measured (no step after the first 10)" in whole.stdout

    assert killed.returncode != 0 and "done:" not in killed.stdout
    assert "checkpoint resumed.pt at step 3" in killed.stdout and "epoch 1" not in killed.stdout
    resumed = torchrun(*common, "--checkpoint", "resumed.pt", "--keys-log", "resumed", "--resume",
                       "--ledger", "ledger", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert ("resumed from resumed.pt: epoch 0, step 3, 3 batches into the epoch (the loader continues from its "
            "state)") in resumed.stdout
    assert "done: 7 steps" in resumed.stdout

    expected, got = steps_of(tmp_path / "whole"), steps_of(tmp_path / "resumed")
    assert sorted(expected) == sorted(got) == [(r, s) for r in (0, 1) for s in range(1, 8)]
    assert {epoch for epoch, _, _ in got.values()} == {0, 1}
    for key in expected:
        assert got[key] == expected[key], f"rank {key[0]} step {key[1]}"
    ledgers = sorted(str(p) for p in (tmp_path / "ledger").glob("epoch0-rank*.json"))
    assert len(ledgers) == 2
    verified = subprocess.run([PYTHON, "-m", "imagenet_shards.ledger", "verify", *ledgers], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def load_example():
    """examples/train_imagenet.py as a module: its main(argv) in this process (torch is imported already)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_imagenet_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_run_s_data_wait_is_summed_over_the_steps_after_the_warm_up():
    waited = load_example().DataWait()
    for step in range(1, 15):  # 10 warm-up steps of 1 s waiting; then 4 steps of 0.1 s wait in 0.4 s
        waited.add(8, 1.0, 1.0) if step <= 10 else waited.add(8, 0.1, 0.4)
    assert waited.summary() == "data wait 25.0% of step time over steps 11-14 (20 img/s per instance)"


def test_a_checkpoint_of_another_run_is_refused(converted, tmp_path, capsys):
    checkpoint = tmp_path / "c.pt"
    import torch

    torch.save({"version": 1, "run": {"data": "elsewhere", "seed": 0, "batch_size": 4, "world_size": 2,
                                      "image_size": 32, "strong_aug": False}, "loader": None}, checkpoint)
    with torch.random.fork_rng(), pytest.raises(SystemExit) as exited:  # main() seeds torch's generator
        load_example().main(["--data", str(converted("img")), "--arch", "resnet18", "--image-size", "32",
                             "--batch-size", "4", "--workers", "0", "--checkpoint", str(checkpoint), "--resume",
                             "--no-val"])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "was written by another run" in err and err.strip().count("\n") == 0, err


def test_another_datasets_package_imported_first_changes_nothing(tmp_path):
    """A package named `datasets` (as Hugging Face's) first on sys.path: both import in one interpreter, each
    its own (the library's name is `imagenet_shards`, issue 42)."""
    fake = tmp_path / "elsewhere" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("def load_dataset(name):\n    return 'hugging face ' + name\n")
    code = (f"import sys; sys.path.insert(0, {str(fake.parent)!r}); import datasets; "
            "from imagenet_shards.loader import get_data, GlobalOrder; import imagenet_shards; "
            "print(datasets.load_dataset('x')); print(imagenet_shards.__file__)")
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["hugging face x", str(REPO / "imagenet_shards" / "__init__.py")]


def test_the_old_name_is_an_alias_with_a_deprecation_warning():
    """`datasets` in the checkout: the same modules as `imagenet_shards` (not copies), one DeprecationWarning;
    `python -m datasets.X` runs; Hugging Face's API asked of it fails on its first attribute, saying so."""
    code = ("import warnings, pickle; warnings.simplefilter('always'); "
            "import datasets.loader, imagenet_shards.loader, imagenet_shards.loader.options as options; "
            "from datasets.loader.options import Cache; from datasets import storage; "
            "print(datasets.loader is imagenet_shards.loader, Cache is options.Cache, storage.__name__, "
            "imagenet_shards.loader.__spec__.name, pickle.loads(pickle.dumps(Cache)) is Cache)")
    result = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "imagenet_shards.storage", "imagenet_shards.loader", "True"]
    assert result.stderr.count("DeprecationWarning") == 1 and "is now `imagenet_shards`" in result.stderr
    ledger = subprocess.run([PYTHON, "-m", "datasets.ledger", "--help"], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert ledger.returncode == 0 and "verify" in ledger.stdout, ledger.stderr
    wrong = subprocess.run([PYTHON, "-c", "import datasets; datasets.load_dataset('imagenet-1k')"],
                           capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert wrong.returncode == 1
    last = wrong.stderr.strip().splitlines()[-1]
    assert "not Hugging Face's `datasets`" in last and "ImageNet-shards library" in last


def test_pip_install_editable_beside_another_datasets_in_site_packages(tmp_path):
    """`pip install -e .` into a throwaway environment (the pinned stack reached through a .pth, so
    nothing is downloaded and .venv is not touched) that already has another `datasets` package (as
    Hugging Face's would be): the library imports from anywhere, and `datasets` stays the other one."""
    import sysconfig

    env_dir = tmp_path / "env"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "pinned-stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (site / "datasets").mkdir()
    (site / "datasets" / "__init__.py").write_text("load_dataset = 'hugging face'\n")
    # No native build: an editable install would put the module into the checkout, over .venv's (setup.py)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "DATASETS_NATIVE_BUILD": "0"}
    install = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                              "--no-index", "-e", str(REPO)], capture_output=True, text=True, env=env,
                             timeout=300, cwd=tmp_path)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = ("import datasets, imagenet_shards, imagenet_shards.loader; "
             "print(datasets.load_dataset); print(imagenet_shards.__file__)")
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                           timeout=120)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines() == ["hugging face", str(REPO / "imagenet_shards" / "__init__.py")]
    assert (site / "datasets" / "__init__.py").read_text() == "load_dataset = 'hugging face'\n"


def test_a_missing_dataset_is_one_line_and_exit_2(tmp_path):
    """--data naming no dataset: one line naming it, exit 2, as every other command (issue 32)."""
    missing = tmp_path / "no" / "such" / "path"
    result = subprocess.run([PYTHON, str(SCRIPT), "--data", str(missing), "--arch", "resnet18", "--workers", "0",
                             "--no-val", "--checkpoint", str(tmp_path / "c.pt")], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().count("\n") == 0 and str(missing) in result.stderr, result.stderr


def test_every_output_path_gets_its_folder_or_one_line(converted, tmp_path, capsys):
    """--keys-log, --ledger (folders), --step-log and --checkpoint (files) in folders that do not exist yet are
    created; a folder option naming a file is one line and exit 2."""
    import torch

    out = tmp_path / "new"
    options = ["--data", str(converted("img")), "--arch", "resnet18", "--image-size", "32", "--batch-size", "4",
               "--workers", "0", "--no-val", "--max-steps", "1", "--epochs", "1", "--checkpoint-every", "1"]
    with torch.random.fork_rng():  # main() seeds torch's generator
        assert load_example().main([*options, "--keys-log", str(out / "keys"), "--ledger", str(out / "ledger"),
                                    "--step-log", str(out / "steps" / "s.jsonl"),
                                    "--checkpoint", str(out / "ckpt" / "c.pt")]) == 0
    assert (out / "keys" / "rank0.jsonl").is_file() and (out / "steps" / "s.jsonl").is_file()
    assert list((out / "ledger").glob("epoch0-rank0.json")) and (out / "ckpt" / "c.pt").is_file()
    capsys.readouterr()
    (tmp_path / "a-file").write_text("")
    with torch.random.fork_rng(), pytest.raises(SystemExit) as exited:
        load_example().main([*options, "--keys-log", str(tmp_path / "a-file"), "--checkpoint", str(out / "c2.pt")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().count("\n") == 0 and "--keys-log" in err, err


def test_the_global_order_and_g_are_options(converted, tmp_path, capsys):
    """--global-batch-size G: the global order, the per-instance batch G/N (a --batch-size that is not G/N is one
    line and exit 2)."""
    import torch

    options = ["--data", str(converted("img")), "--arch", "shufflenet_v2_x0_5", "--image-size", "32", "--workers", "0",
               "--no-val", "--max-steps", "1", "--epochs", "1", "--checkpoint", str(tmp_path / "c.pt")]
    with torch.random.fork_rng(), pytest.raises(SystemExit) as exited:
        load_example().main([*options, "--global-batch-size", "8", "--batch-size", "3"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.strip().count("\n") == 0, err
    assert "--global-batch-size 8 is not --batch-size x 1 instances (give --batch-size 8 or none)" in err
    with torch.random.fork_rng():
        assert load_example().main([*options, "--global-batch-size", "8", "--keys-log", str(tmp_path / "keys")]) == 0
    record = json.loads((tmp_path / "keys" / "rank0.jsonl").read_text().splitlines()[0])
    assert len(record["keys"]) == 8 and record["ranks"] == 1
    assert "4 batches of 8 per instance" in capsys.readouterr().out  # 36 samples: 4 global batches of 8
