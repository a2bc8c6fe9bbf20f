"""Fixtures and helpers shared by the test files: one small sample dataset, converted once per format;
running the scripts as users do; converting, hashing a conversion's output, damaging a byte.

Sizes are chosen so that nothing divides evenly: 4 classes x 9 train images = 36 train
samples and 4 x 3 = 12 validation samples, in shards of 8 (so the last shard of each
split is partial).
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
# Where the environment sets PYTHONDONTWRITEBYTECODE (this project's hosts do), every process the suite
# starts (hundreds: scripts, torchrun launchers and ranks) compiled the checkout's modules
# again. The suite and its processes write bytecode into the checkout's __pycache__ (.gitignore'd) as a
# default Python does; .venv and the standard library are compiled already, so nothing is written there.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False
# torch's intra-op work on one thread in each of the suite's processes (a worker of `-n 2`, and the scripts,
# benchmark rows and training runs it starts; torchrun sets it for its ranks anyway): two workers fill a
# 2-core host, and threads beyond the free cores spin in OpenMP's barriers (a 4-step resnet18 run of
# examples/train_imagenet.py on a busy host: 8.6 CPU-s on one thread, 14.5 on two). An explicit setting wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")
SAMPLES_PER_SHARD = 8
SAMPLE_SIZE = {"classes": 4, "train_per_class": 9, "val_per_class": 3}


def _script_command(script, args, env):
    command = [PYTHON, *( [script] if script == "-m" else [str(REPO / script)] ), *map(str, args)]
    # the checkout first; what the caller's PYTHONPATH adds (a GPU host's carried wheels) after it
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))))
    full_env.update(env or {})
    return command, full_env


def run_script(script, *args, env=None, timeout=600, cwd=None):
    """Run a top-level script (e.g. "create_webdataset.py") or a module ("-m", "x") as users do."""
    command, full_env = _script_command(script, args, env)
    return subprocess.run(command, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd or REPO)


def run_main(main, *args):
    """A command's main(argv) in this process, its stdout and stderr captured: a CompletedProcess as
    run_script's. For a successful run that a test needs, not one about the command line (exit codes, one-line
    errors): a subprocess would add the command's imports (torch's ~2.5 CPU-s where it needs torch)."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(arg) for arg in args])
    return subprocess.CompletedProcess(["main", *map(str, args)], code, out.getvalue(), err.getvalue())


def run_scripts(*runs, env=None, timeout=600, cwd=None):
    """run_script for several independent runs ((script, *args) each) at the same time: most of a run that
    imports torch is one busy core, so on a 2-core machine two at once take little longer than one.
    -> their CompletedProcess, in order."""
    jobs = []
    for script, *args in runs:
        command, full_env = _script_command(script, args, env)
        jobs.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=full_env, cwd=cwd or REPO))
    results = []
    try:
        for job in jobs:
            stdout, stderr = job.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr))
    finally:
        for job in jobs[len(results):]:  # a timeout: leave nothing running
            job.kill()
            job.communicate()
    return results


def convert(source, target, *args):
    """create_webdataset.py from `source` to `target` (no progress bar): its CompletedProcess."""
    return run_script("create_webdataset.py", "--source", source, "--target", target, "--no-progress", *args)


def converted_ok(source, target, *args):
    result = convert(source, target, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def output_hashes(directory: Path) -> dict:
    """sha256 of every file a conversion publishes (shards and their companions, sample indexes, metadata)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).iterdir())
            if p.is_file() and not p.name.startswith(".")}


def reseal_index(dataset: Path, split: str) -> None:
    """Make metadata.json agree with a sample index edited on purpose (a dataset B that differs, not a
    damaged one): the index's size and hashes and each shard's sample count, sealed again."""
    import json
    from collections import Counter

    from imagenet_shards.dataset_folder import METADATA_FILE
    from imagenet_shards.index import read_sample_index, write_metadata

    metadata = json.loads((dataset / METADATA_FILE).read_text())
    entry = metadata["splits"][split]
    index = dataset / entry["index"]["name"]
    data = index.read_bytes()
    entry["index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), md5=hashlib.md5(data).hexdigest())
    counts = Counter(record.shard for record in read_sample_index(index))
    for shard in entry["shards"]:
        shard["samples"] = counts.get(shard["name"], 0)
    metadata.pop("metadata_digest", None)
    write_metadata(dataset, metadata)


def flip_byte(path, offset, mask=0xFF) -> None:
    """XOR the byte at `offset` of the file `path` with `mask` (every bit by default), in place."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([value ^ mask]))


MUTATIONS = ("flip", "flip", "truncate", "zero-block", "append", "delete")  # the fuzz tests' damage, drawn


def damage(path, rng, mutations=MUTATIONS) -> str:
    """Damage `path` at a seeded byte position: -> what was done, for the failure message."""
    path = Path(path)
    data = bytearray(path.read_bytes())
    kind = rng.choice(mutations) if data else "append"
    position = rng.randrange(len(data)) if data else 0
    if kind == "flip":
        data[position] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        del data[position:]
    elif kind == "zero-block":
        data[position:position + 512] = bytes(len(data[position:position + 512]))
    elif kind == "append":
        data += bytes(rng.choice([1, 512, 4096]))
    if kind == "delete":
        path.unlink()
    else:
        path.write_bytes(bytes(data))
    return f"{path.name} {kind} at byte {position}"


# Fixtures that cost a minute or more each and serve several tests: host_benchmark.py --compare runs
# (session; test_host_benchmark, test_recommend, test_tfrecord_dataset, test_lmdb_format), the installed
# venv (test_install), the torchrun launches (test_loader_distributed).
EXPENSIVE_FIXTURES = ("compare_run", "filtered_compare_run", "user_venv", "launches")


def pytest_collection_modifyitems(items):
    """The tests of each EXPENSIVE_FIXTURES fixture side by side, at the front: under pytest-xdist
    (pytest.ini: --dist worksteal) the first worker takes the first half of the tests and a worker
    steals only from the other's tail, so these all run on the first worker, each fixture made once
    (not once per worker that draws one of its tests), and the longest work starts first."""
    def first_expensive(item):
        return next((n for n, name in enumerate(EXPENSIVE_FIXTURES) if name in item.fixturenames), None)

    ranks = {id(item): first_expensive(item) for item in items}
    front = sorted((item for item in items if ranks[id(item)] is not None), key=lambda item: ranks[id(item)])
    items[:] = front + [item for item in items if ranks[id(item)] is None]


@pytest.fixture(scope="session")
def sample_source(tmp_path_factory):
    """An ImageNet-like source: folder layout (train/, validation/) and archive layout, seed 0."""
    from imagenet_shards.sample import build_sample_dataset

    out = tmp_path_factory.mktemp("sample-source")
    build_sample_dataset(out, seed=0, **SAMPLE_SIZE)
    return out


@pytest.fixture(scope="session")
def converted(tmp_path_factory, sample_source):
    """converted(fmt, *extra_args) -> directory of the sample source converted by create_webdataset.py.

    Cached per argument list, so every test file shares one conversion per format.
    """
    cache = {}

    def convert(fmt="img", *extra):
        args = ("--format", fmt, "--samples-per-shard", SAMPLES_PER_SHARD, "--seed", 0, *extra)
        if args not in cache:
            target = tmp_path_factory.mktemp(f"converted-{fmt}")
            result = run_script("create_webdataset.py", "--source", sample_source, "--target", target, *args)
            assert result.returncode == 0, result.stdout + result.stderr
            cache[args] = target
        return cache[args]

    return convert


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real SeaweedFS S3 server on loopback for the whole session (see testing_rigs/s3_server.py)."""
    from testing_rigs.s3_server import SeaweedServer

    server = SeaweedServer(tmp_path_factory.mktemp("seaweedfs")).start()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, request):
    """A fresh bucket on the session server, named after the test."""
    import re

    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"t{len(_BUCKETS)}-{name}"
    _BUCKETS.append(name)
    return s3_server.create_bucket(name)


_BUCKETS = []


@pytest.fixture(scope="session")
def compare_run(tmp_path_factory, sample_source, converted):
    """One `host_benchmark.py --compare --recommend` of the source folder, img and tensor (every row, the
    goals, the JSON, the PNG, the decision), shared by test_host_benchmark and test_recommend: a run costs
    a torch + torchvision import and 22 rows. -> (result, json path, plot, recommendation plot)."""
    directory = tmp_path_factory.mktemp("compare-run")
    (directory / "source").symlink_to(sample_source, target_is_directory=True)
    for fmt in ("img", "tensor"):
        (directory / fmt).symlink_to(converted(fmt), target_is_directory=True)
    out = tmp_path_factory.mktemp("compare-run-out")
    paths = out / "compare.json", out / "compare.png", out / "rec.png"
    result = run_script("host_benchmark.py", "--compare", directory, "--batches", 2, "--warmup-batches", 1,
                        "--batch-size", 4, "--dataloader-worker", 1, "--json", paths[0], "--plot", paths[1],
                        "--recommend", "--target-rate", 3000, "--recommend-plot", paths[2], timeout=900)
    return (result, *paths)


@pytest.fixture(scope="session")
def filtered_compare_run(tmp_path_factory, sample_source, converted):
    """One `host_benchmark.py --compare --formats img,tfrecord,lmdb` of a folder that also holds the source
    folder and tensor (which the filter leaves out), shared by the filter test and the tfrecord and lmdb
    row tests. -> (result, json path)."""
    directory = tmp_path_factory.mktemp("filtered-compare")
    (directory / "source").symlink_to(sample_source, target_is_directory=True)
    for fmt in ("img", "tensor", "tfrecord", "lmdb"):
        (directory / fmt).symlink_to(converted(fmt), target_is_directory=True)
    out = tmp_path_factory.mktemp("filtered-compare-out") / "compare.json"
    result = run_script("host_benchmark.py", "--compare", directory, "--formats", "img,tfrecord,lmdb", "--batches", 2,
                        "--warmup-batches", 1, "--batch-size", 4, "--dataloader-worker", 1, "--json", out)
    return result, out


def tree(root) -> dict:
    """{relative path: (kind, size, mtime_ns)} of everything under `root`, links listed, never followed."""
    found = {}
    for folder, folders, names in os.walk(root, followlinks=False):
        for name in folders + names:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            kind = "link" if os.path.islink(path) else "dir" if os.path.isdir(path) else "file"
            found[os.path.relpath(path, root)] = (kind, 0 if kind == "dir" else info.st_size,
                                                  0 if kind == "dir" else info.st_mtime_ns)
    return found
