"""The loader under real torchrun: K = 2 and 3 processes x 0, 1 and 2 DataLoader workers.

A dedicated dataset whose sizes divide by neither 2 nor 3 (35 train, 25 validation samples,
shards of 8, so the last shards are partial), batches of 3, in every format that reads by byte range or
cursor (img, tfrecord, lmdb). One torchrun launch per K, the two side by side (a launch costs each rank a
torch import, most of the test's time); the script loops over formats, worker counts and policies and
writes the keys each rank read to a JSON file.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from conftest import run_scripts
from imagenet_shards.index import read_sample_index

BATCH = 3
FORMATS = ("img", "tfrecord", "lmdb")
PROCESSES = (2, 3)
WORKERS = (0, 1, 2)
CONFIGS = (("validation", "spread"), ("train", "drop"), ("train", "pad"))

RANK_SCRIPT = """
import json, sys
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import Order, get_data

out_dir, batch, sources = sys.argv[1], int(sys.argv[2]), sys.argv[3:]  # sources: FORMAT=PATH
instance = detect_instance()
result = {}
runs = [(fmt, source, workers, split, policy) for fmt, source in (s.split("=", 1) for s in sources)
        for workers in (0, 1, 2) for split, policy in (("validation", "spread"), ("train", "drop"), ("train", "pad"))]
for fmt, source, workers, split, policy in runs:
    loader = get_data(source, split, batch, workers, normalization="device", with_keys=True,
                      order=Order(policy=policy), epoch=2, seed=7, instance=instance)
    keys, batches = [], 0
    for images, labels, batch_keys in loader:
        assert images.shape[0] == len(batch_keys) == labels.shape[0]
        keys += batch_keys
        batches += 1
    report = loader.report
    result[f"{fmt}/{workers}/{split}/{policy}"] = {
        "keys": keys, "batches": batches, "len": len(loader), "complete": report.complete,
        "padded": report.padded, "policy_dropped": report.policy_dropped,
        "last_batch_dropped": report.last_batch_dropped, "skipped": len(report.skipped),
    }
with open(f"{out_dir}/rank{instance.index}.json", "w") as handle:
    json.dump({"instance": [instance.index, instance.count, instance.source], "result": result}, handle)
print(instance.describe(), "samples:", {k: len(v["keys"]) for k, v in result.items()})
"""


@pytest.fixture(scope="module")
def uneven_source(tmp_path_factory):
    from imagenet_shards.sample import build_sample_dataset

    root = tmp_path_factory.mktemp("uneven")
    build_sample_dataset(root / "source", seed=1, classes=5, train_per_class=7, val_per_class=5)
    return root


@pytest.fixture(scope="module")
def uneven_datasets(uneven_source):
    """{format: the uneven source converted to it} (the three conversions at once)."""
    made = {fmt: uneven_source / fmt for fmt in FORMATS}
    results = run_scripts(*(("create_webdataset.py", "--source", uneven_source / "source", "--target", target,
                             "--format", fmt, "--samples-per-shard", 8, "--seed", 0) for fmt, target in made.items()))
    for result in results:
        assert result.returncode == 0, result.stdout + result.stderr
    return made


@pytest.fixture(scope="module")
def launches(uneven_datasets, tmp_path_factory):
    """{K: (torchrun's result, the folder its ranks wrote)}: the K = 2 and K = 3 jobs side by side
    (independent: each has its own rendezvous port and output folder)."""
    root = tmp_path_factory.mktemp("launches")
    script = root / "rank_script.py"
    script.write_text(RANK_SCRIPT)
    outs = {k: root / f"out-{k}" for k in PROCESSES}
    for out in outs.values():
        out.mkdir()
    sources = [f"{fmt}={path}" for fmt, path in uneven_datasets.items()]
    results = run_scripts(*(("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", k, script, outs[k],
                             BATCH, *sources) for k in PROCESSES), timeout=480, env={"OMP_NUM_THREADS": "1"})
    return {k: (result, outs[k]) for k, result in zip(PROCESSES, results)}


@pytest.mark.parametrize("processes", PROCESSES)
def test_torchrun_exactly_once_and_equal_batches(uneven_datasets, launches, processes):
    result, out = launches[processes]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(processes)]
    assert [r["instance"] for r in ranks] == [[i, processes, "torchrun"] for i in range(processes)]
    for fmt in FORMATS:
        check_format(fmt, uneven_datasets[fmt], ranks, processes)


def check_format(fmt, dataset, ranks, processes):
    """Every worker count and policy of one format: exactly once (validation), equal batch counts and
    every train sample read, padded or named as dropped (train)."""
    keys = {split: [r.key for r in read_sample_index(dataset / f"samples-{split}.index.tsv")]
            for split in ("train", "validation")}
    assert len(keys["train"]) == 35 and len(keys["validation"]) == 25, fmt

    for workers in WORKERS:
        for split, policy in CONFIGS:
            runs = [r["result"][f"{fmt}/{workers}/{split}/{policy}"] for r in ranks]
            where = f"{fmt}, {processes} instances, {workers} workers, {split}/{policy}"
            assert all(run["complete"] and run["skipped"] == 0 for run in runs), where
            assert all(run["batches"] == run["len"] for run in runs), where
            read = Counter(k for run in runs for k in run["keys"])
            if split == "validation":
                assert read == Counter(keys["validation"]), where
                continue
            assert len({run["batches"] for run in runs}) == 1, where
            padded = Counter(k for run in runs for k in run["padded"])
            last_batches = Counter(k for run in runs for k in run["last_batch_dropped"])
            policy_dropped = runs[0]["policy_dropped"]
            assert all(run["policy_dropped"] == policy_dropped for run in runs), where
            assert read + last_batches + Counter(policy_dropped) == Counter(keys["train"]) + padded, where
            if policy == "drop":
                assert not padded and len(policy_dropped) == 35 % processes, where
            else:
                assert not policy_dropped and sum(padded.values()) == -(-35 // processes) * processes - 35, where
