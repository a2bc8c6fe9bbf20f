"""distributed_webdataset.py / imagenet_shards.repartition: equal shares per instance, minimal copying, nothing lost.

Three layers, fastest first:
  * the planning matrix on synthetic index records (pure functions, hundreds of cases in a second):
    N in {1, 2, 3, 4, 7, 8} x dataset sizes x samples per shard (full, partial last, uneven) x policy;
  * execution on small datasets written with the core tar writer (in-process, real files):
    verbatim copies, manifest/indexes/lists agree with the bytes on disk, re-run no-op, SIGKILL + re-run,
    bad input with nothing written;
  * real conversions by create_webdataset.py (img and tensor), repartitioned by the CLI as users run it,
    read back with our tar reader, stock webdataset and GNU tar.
"""

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import textwrap
from collections import Counter
from pathlib import Path

import crc32c
import numpy as np
import pytest

from imagenet_shards.formats import get_format
from imagenet_shards.dataset_folder import REPARTITION_MANIFEST

from conftest import PYTHON, REPO, flip_byte, run_script
from imagenet_shards.fileio import hash_file, sha256_file
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import SampleRecord, ShardRecord, sample_index_name, write_metadata, write_sample_index
from imagenet_shards.formats.webdataset import tar_shard_name
from imagenet_shards.formats.npy import encode_npy
from imagenet_shards.index import read_sample_index
from imagenet_shards.repartition.plan import (
    RepartitionUsageError,
    assign_whole_shards,
    instance_targets,
    plan_split,
    remainder_records,
)
from imagenet_shards.dataset_folder import repartition_dir
from imagenet_shards.repartition.request import Request, decide
from imagenet_shards.repartition.run import repartition
from imagenet_shards.repartition.source import group_records_by_shard
from imagenet_shards.formats.tar import TarShardWriter, iter_tar_members, iter_tar_samples
from imagenet_shards.formats.tfrecord import read_tfrecord_index, tfrecord_index_path, tfrecord_shard_name
from imagenet_shards.formats.tfslim_imagenet import TFSlimShardWriter, iter_tfrecord_samples

NS = (1, 2, 3, 4, 7, 8)
POLICY_NAMES = ("spread", "drop", "pad")


# ================================================================== planning on synthetic records


def synthetic_split(shard_sizes, split="train", record_size=1536):
    """Shards of the given sample counts and their index records (no files)."""
    shards, records, number = [], [], 0
    for n, count in enumerate(shard_sizes):
        name = tar_shard_name(split, n)
        for j in range(count):
            offset = j * record_size
            records.append(
                SampleRecord(f"{split}_{number:06d}", name, number % 5, offset, record_size, offset + 1024, 100,
                             number, f"cls:{offset};jpg:{offset + 512}")
            )
            number += 1
        shards.append(ShardRecord(name, count, count * record_size + 10240, f"{n:064x}"))
    return shards, records


def even_shard_sizes(total, per_shard):
    return [min(per_shard, total - start) for start in range(0, total, per_shard)]


def instance_reads(plan, by_shard):
    """Per instance, the keys it reads in order: its whole shards, then its remainder."""
    return [
        [r.key for name in instance.shards for r in by_shard[name]] + [r.key for r in instance.copied]
        for instance in plan.instances
    ]


def check_plan(plan, shards, records, num_instances, policy):
    by_shard = group_records_by_shard(shards, records)
    total = len(records)
    reads = instance_reads(plan, by_shard)
    counts = [len(keys) for keys in reads]
    assert counts == plan.samples_per_instance
    q, r = divmod(total, num_instances)
    if policy == "spread":
        assert sorted(counts, reverse=True) == [q + 1] * r + [q] * (num_instances - r)
    elif policy == "drop":
        assert counts == [q] * num_instances
    else:
        assert counts == [q + (1 if r else 0)] * num_instances

    # No instance reads a sample twice; across instances only the named pads repeat.
    for keys in reads:
        assert len(keys) == len(set(keys))
    seen = Counter(key for keys in reads for key in keys)
    all_keys = {record.key for record in records}
    dropped, padded = set(plan.dropped_keys), list(plan.padded_keys)
    assert len(padded) == len(set(padded)), "a sample is padded twice"
    assert set(seen) == all_keys - dropped
    assert {key for key, n in seen.items() if n > 1} == set(padded)
    assert all(seen[key] == 2 for key in padded)
    assert len(dropped) == (r if policy == "drop" else 0)
    assert len(padded) == ((num_instances - r) % num_instances if policy == "pad" else 0)
    assert sorted(k for i in plan.instances for k in i.padded_keys) == sorted(padded)
    assert sorted(k for i in plan.instances for k in i.dropped_keys) == sorted(dropped)
    for instance, keys in zip(plan.instances, reads):
        assert set(instance.padded_keys) <= set(keys[len(keys) - len(instance.padded_keys):])

    # Whole shards: each read whole by at most one instance; a shard not read whole is the pool.
    owned = Counter(name for instance in plan.instances for name in instance.shards)
    assert all(n == 1 for n in owned.values())
    original = {record.key: record for record in records}
    for instance in plan.instances:
        for record in instance.copied:
            assert record == original[record.key]  # copied from exactly where the index says
            assert record.shard not in instance.shards  # never copies what it reads whole anyway

    # Minimal movement: at most one shard's worth copied per instance; nothing when it divides evenly.
    largest = max(shard.samples for shard in shards)
    for instance in plan.instances:
        assert len(instance.copied) <= largest
    if len({s.samples for s in shards}) == 1 and len(shards) % num_instances == 0:
        assert plan.copied_samples == 0


@pytest.mark.parametrize("total", [8, 12, 13, 36, 50, 97, 256])
@pytest.mark.parametrize("per_shard", [1, 3, 5, 8, 16, 64])
def test_plan_matrix(total, per_shard):
    shards, records = synthetic_split(even_shard_sizes(total, per_shard))
    by_shard = group_records_by_shard(shards, records)
    for n in NS:
        for policy in POLICY_NAMES:
            if n > total:
                with pytest.raises(RepartitionUsageError, match="fewer than"):
                    plan_split("train", shards, by_shard, n, policy)
                continue
            plan = plan_split("train", shards, by_shard, n, policy)
            check_plan(plan, shards, records, n, policy)
            assert plan == plan_split("train", shards, by_shard, n, policy), "planning is not deterministic"


@pytest.mark.parametrize("seed", range(12))
def test_plan_uneven_shards(seed):
    """Shards of varied sizes (e.g. cut by --max-shard-bytes) still balance with bounded copying."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 20) for _ in range(rng.randint(1, 30))]
    shards, records = synthetic_split(sizes)
    by_shard = group_records_by_shard(shards, records)
    for n in NS:
        for policy in POLICY_NAMES:
            if n <= len(records):
                check_plan(plan_split("train", shards, by_shard, n, policy), shards, records, n, policy)


def test_shards_that_divide_evenly_are_not_copied():
    shards, records = synthetic_split([8] * 12)
    by_shard = group_records_by_shard(shards, records)
    for n in (1, 2, 3, 4, 6, 12):
        for policy in POLICY_NAMES:
            plan = plan_split("train", shards, by_shard, n, policy)
            assert plan.copied_samples == 0
            assert sorted(name for i in plan.instances for name in i.shards) == [s.name for s in shards]


def test_partial_last_shard_example():
    """36 samples in shards of 8 (last one 4) over 2 instances: 4 whole shards + 2 copied samples each."""
    shards, records = synthetic_split(even_shard_sizes(36, 8))
    plan = plan_split("train", shards, group_records_by_shard(shards, records), 2, "spread")
    assert [len(i.shards) for i in plan.instances] == [2, 2]
    assert [len(i.copied) for i in plan.instances] == [2, 2]
    assert [r.key for i in plan.instances for r in i.copied] == [r.key for r in records[32:]]


def test_targets_and_default_policies():
    assert instance_targets(10, 4, "spread") == [3, 3, 2, 2]
    assert instance_targets(10, 4, "drop") == [2, 2, 2, 2]
    assert instance_targets(10, 4, "pad") == [3, 3, 3, 3]
    assert instance_targets(12, 4, "pad") == [3, 3, 3, 3]
    from imagenet_shards.balance import default_policy

    assert default_policy("train") == "drop" and default_policy("validation") == "spread"


def test_assign_whole_shards_largest_first_to_most_room():
    owners, room = assign_whole_shards([8, 8, 8, 8, 4], [18, 18])
    assert owners == [0, 1, 0, 1, None] and room == [2, 2]


def test_planning_errors():
    shards, records = synthetic_split([3, 3])
    by_shard = group_records_by_shard(shards, records)
    with pytest.raises(RepartitionUsageError, match="at least 1"):
        plan_split("train", shards, by_shard, 0, "spread")
    with pytest.raises(RepartitionUsageError, match="fewer than the 7 instances"):
        plan_split("train", shards, by_shard, 7, "spread")
    with pytest.raises(RepartitionUsageError, match="unknown policy 'round' \\(choose from spread, pad, drop\\)"):
        plan_split("train", shards, by_shard, 2, "round")


def test_index_that_disagrees_with_the_shards_is_a_data_error():
    shards, records = synthetic_split([3, 3])
    with pytest.raises(DatasetError, match="metadata says 3 samples"):
        group_records_by_shard(shards, records[:-1])
    with pytest.raises(DatasetError, match="appears twice"):
        group_records_by_shard(shards, records + records[:1])
    bad = [records[0]._replace(shard="elsewhere.tar")] + records[1:]
    with pytest.raises(DatasetError, match="does not list"):
        group_records_by_shard(shards, bad)
    overlapping = [records[1]._replace(record_offset=512)]
    with pytest.raises(DatasetError, match="byte range"):
        group_records_by_shard(shards, records[:1] + overlapping + records[2:])
    unaligned = [records[1]._replace(record_offset=1537)]
    with pytest.raises(DatasetError, match="byte range"):
        group_records_by_shard(shards, records[:1] + unaligned + records[2:], alignment=512)


def test_remainder_records_shift_every_offset():
    _, records = synthetic_split([4, 4])
    copied = [records[5], records[2]]
    placed = remainder_records(copied, "distributed/2-instances/train-remainder-0000.tar")
    assert [p.record_offset for p in placed] == [0, 1536]
    for original, new in zip(copied, placed):
        shift = new.record_offset - original.record_offset
        assert new.payload_offset == original.payload_offset + shift
        assert new.member_offsets() == {e: o + shift for e, o in original.member_offsets().items()}
        assert (new.key, new.label, new.payload_crc32c, new.record_size) == (
            original.key, original.label, original.payload_crc32c, original.record_size)


def test_decide_existing_manifest():
    request = Request(Path("/d"), 2, {"train": "drop", "validation": "spread"})
    assert decide(None, request, "s", "img").build == ["train", "validation"]
    same = {"source_metadata_sha256": "s", "num_instances": 2, "format": "img",
            "splits": {"train": {"policy": "drop"}, "validation": {"policy": "spread"}}}
    assert decide(same, request, "s", "img").build == []
    stale = decide(same, request, "other", "img")
    assert stale.stale and stale.build == ["train", "validation"] and stale.keep == {}
    changed = decide(same, Request(Path("/d"), 2, {"train": "pad"}), "s", "img")
    assert changed.conflicts == [("train", "drop", "pad")] and set(changed.keep) == {"validation"}
    partial = {**same, "splits": {"validation": {"policy": "spread"}}}
    assert decide(partial, request, "s", "img").build == ["train"]


# ================================================================== small real datasets (core writer)


def build_dataset(directory, fmt="img", counts=None, per_shard=8, seed=0, payload_bytes=(200, 3000)):
    """A dataset in the converter's on-disk form, written with the core tar writer and index code."""
    counts = counts or {"train": 36, "validation": 12}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    if fmt == "tfrecord":
        return build_tfrecord_dataset(directory, counts, per_shard, rng)
    ext = get_format(fmt).payload_extension
    splits = {}
    for split, total in counts.items():
        shards, records = [], []
        for n, start in enumerate(range(0, total, per_shard)):
            name = tar_shard_name(split, n)
            with TarShardWriter(directory / name) as writer:
                for number in range(start, min(start + per_shard, total)):
                    key = f"{split}_{number:05d}"
                    label = number % 4
                    if fmt == "tensor":
                        side = int(rng.integers(4, 12))
                        payload = encode_npy(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
                    else:
                        payload = rng.integers(0, 256, int(rng.integers(*payload_bytes)), dtype=np.uint8).tobytes()
                    meta = json.dumps({"source": f"{key}.JPEG"}).encode()
                    written = writer.add_members(key, [("cls", str(label).encode()), ("json", meta), (ext, payload)])
                    members = ";".join(f"{e}:{m.header_offset}" for e, m in written.members.items())
                    records.append(SampleRecord(key, name, label, written.record_offset, written.record_size,
                                                written.members[ext].data_offset, len(payload),
                                                crc32c.crc32c(payload), members))
            shards.append(ShardRecord(name, writer.samples, writer.bytes_written, writer.sha256).to_json())
        index = write_sample_index(directory / sample_index_name(split), records)
        splits[split] = {"length": total, "source_samples": total, "skipped": [], "shards": shards, "index": index}
    write_test_metadata(directory, fmt, counts, splits, seed)
    return directory


def write_test_metadata(directory, fmt, counts, splits, seed=0):
    write_metadata(directory, {
        "train_length": counts.get("train", 0), "validation_length": counts.get("validation", 0),
        "format": fmt, "shuffle": False, "seed": seed, "image_quality": 95,
        "train_transform_pipeline": [], "validation_transform_pipeline": [],
        "format_version": 1, "classes": ["a", "b", "c", "d"], "tensor_layout": "HWC" if fmt == "tensor" else None,
        "splits": splits, **({"label_offset": 1} if fmt == "tfrecord" else {}),
    })


def build_tfrecord_dataset(directory, counts, per_shard, rng):
    """The same, in TF-slim TFRecord shards written with the core TF-slim writer."""
    splits = {}
    for split, total in counts.items():
        shards, records = [], []
        starts = range(0, total, per_shard)
        for n, start in enumerate(starts):
            name = tfrecord_shard_name(split, n, len(starts))
            with TFSlimShardWriter(directory / name) as writer:
                for number in range(start, min(start + per_shard, total)):
                    key, label = f"{split}_{number:05d}", number % 4
                    payload = rng.integers(0, 256, int(rng.integers(200, 3000)), dtype=np.uint8).tobytes()
                    written = writer.add_image(key, label, "abcd"[label], payload, 8, 8, f"{key}.JPEG")
                    records.append(SampleRecord(key, name, label, written.record_offset, written.record_size,
                                                written.payload_offset, written.payload_size,
                                                crc32c.crc32c(payload), ""))
            shards.append(ShardRecord(name, writer.samples, writer.bytes_written, writer.sha256).to_json())
        index = write_sample_index(directory / sample_index_name(split), records)
        splits[split] = {"length": total, "source_samples": total, "skipped": [], "shards": shards, "index": index}
    write_test_metadata(directory, "tfrecord", counts, splits)
    return directory


def read_samples(path, fmt):
    """(key, payload CRC32C) of every sample of a shard, read with the project's reader for the format."""
    if fmt == "tfrecord":
        return [(s["__key__"], crc32c.crc32c(s["jpg"])) for s in iter_tfrecord_samples(path, 1)]
    ext = get_format(fmt).payload_extension
    return [(s["__key__"], crc32c.crc32c(s[ext])) for s in iter_tar_samples(path)]


def original_records(target, split):
    return {r.key: r for r in read_sample_index(Path(target) / sample_index_name(split))}


def read_range(path, offset, size):
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(size)


def check_output(target, num_instances, expected_policies=None):
    """Everything the issue asks of a finished repartition, checked against the bytes on disk."""
    target = Path(target)
    out = repartition_dir(target, num_instances)
    manifest = json.loads((out / REPARTITION_MANIFEST).read_text())
    metadata_bytes = (target / METADATA_FILE).read_bytes()
    metadata = json.loads(metadata_bytes)
    assert manifest["num_instances"] == num_instances
    assert manifest["format"] == metadata["format"]
    assert manifest["source_metadata_sha256"] == hashlib.sha256(metadata_bytes).hexdigest()
    assert not list(out.glob("*.partial")) and not list(out.glob("*.plan.json"))
    fmt = metadata["format"]
    # Nothing else in the folder: no partial, stamp or lock file, no leftover of another plan.
    expected_files = {REPARTITION_MANIFEST} | {
        Path(item[key]).name for entry in manifest["splits"].values() for item in entry["instances"]
        for key in ("index", "shard_list", "remainder") if item[key]}
    if fmt == "tfrecord":  # each TFRecord shard has its tfrecord2idx index beside it
        expected_files |= {tfrecord_index_path(item["remainder"]).name for entry in manifest["splits"].values()
                           for item in entry["instances"] if item["remainder"]}
    # img under N > 1: the files the reference harness's loader reads (tests/test_reference_layout.py checks them)
    for entry in manifest["splits"].values():
        assert ("reference_loader" in entry) == (fmt == "img" and num_instances > 1)
        reference = entry.get("reference_loader") or {"index": None, "remainders": []}
        expected_files |= {Path(name).name for name in [reference["index"], *(r["name"] for r in reference["remainders"])]
                           if name}
    assert {path.name for path in out.iterdir()} == expected_files
    for split, entry in manifest["splits"].items():
        if expected_policies:
            assert entry["policy"] == expected_policies[split]
        originals = original_records(target, split)
        total = len(originals)
        instances = entry["instances"]
        assert [i["instance"] for i in instances] == list(range(num_instances))
        reads = []
        for instance in instances:
            # The plain-text shard list, read with the tar reader, gives exactly the instance's index.
            listed = (target / instance["shard_list"]).read_text().split()
            assert listed == instance["shards"] + ([instance["remainder"]] if instance["remainder"] else [])
            index = read_sample_index(target / instance["index"])
            on_disk = [(key, digest, name) for name in listed for key, digest in read_samples(target / name, fmt)]
            assert [(r.key, r.payload_crc32c, r.shard) for r in index] == on_disk
            assert len(index) == instance["samples"]
            for record in index:
                original = originals[record.key]
                assert record.payload_crc32c == original.payload_crc32c and record.label == original.label
                if record.shard != original.shard:
                    # A copy: its whole byte range (headers, every member, padding) is identical.
                    assert record.shard == instance["remainder"]
                    assert read_range(target / record.shard, record.record_offset, record.record_size) == \
                        read_range(target / original.shard, original.record_offset, original.record_size)
                    payload = read_range(target / record.shard, record.payload_offset, record.payload_size)
                    assert crc32c.crc32c(payload) == original.payload_crc32c
                else:
                    assert record == original
            if instance["remainder"]:
                (digest, md5), size = hash_file(target / instance["remainder"], ("sha256", "md5"))
                assert instance["remainder_record"] == {
                    "name": instance["remainder"], "samples": instance["copied_samples"], "bytes": size, "sha256": digest,
                    "md5": md5}
                copied = [r for r in index if r.shard == instance["remainder"]]
                assert instance["copied_bytes"] == sum(r.record_size for r in copied)
                if fmt == "tfrecord":
                    assert read_tfrecord_index(tfrecord_index_path(target / instance["remainder"])) == [
                        (r.record_offset, r.record_size) for r in copied]
            reads.append([r.key for r in index])

        counts = [len(keys) for keys in reads]
        assert counts == entry["samples_per_instance"]
        q, r = divmod(total, num_instances)
        seen = Counter(key for keys in reads for key in keys)
        padded = [k for i in instances for k in i["padded_keys"]]
        dropped = [k for i in instances for k in i["dropped_keys"]]
        assert sorted(padded) == sorted(entry["padded_keys"]) and sorted(dropped) == sorted(entry["dropped_keys"])
        # Union = dataset (by key and payload CRC32C, checked above per sample) minus the named drops.
        assert set(seen) == set(originals) - set(dropped)
        # Disjoint except for the named pads, each read exactly twice.
        assert {k for k, n in seen.items() if n > 1} == set(padded) and all(seen[k] == 2 for k in padded)
        assert all(len(keys) == len(set(keys)) for keys in reads)
        if entry["policy"] == "spread":
            assert max(counts) - min(counts) <= 1 and sum(counts) == total and not padded and not dropped
        elif entry["policy"] == "drop":
            assert counts == [q] * num_instances and len(dropped) == r
        else:
            assert counts == [-(-total // num_instances)] * num_instances and len(padded) == sum(counts) - total
        largest = max(s["samples"] for s in metadata["splits"][split]["shards"])
        assert all(i["copied_samples"] <= largest for i in instances)
        whole = Counter(name for i in instances for name in i["shards"])
        assert all(n == 1 for n in whole.values())
    return manifest


def snapshot(directory):
    """(name -> size, mtime_ns, inode, sha256) of every file under directory."""
    out = {}
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(directory))] = (st.st_size, st.st_mtime_ns, st.st_ino, sha256_file(path)[0])
    return out


def contents(directory):
    return {k: v[3] for k, v in snapshot(directory).items()}


@pytest.fixture(scope="module")
def small_datasets(tmp_path_factory):
    """build(fmt, counts, per_shard) -> a fresh copy of a cached synthetic dataset."""
    cache = {}

    def build(fmt="img", counts=None, per_shard=8):
        key = (fmt, tuple(sorted((counts or {}).items())), per_shard)
        if key not in cache:
            cache[key] = build_dataset(tmp_path_factory.mktemp("source"), fmt, counts, per_shard)
        copy = tmp_path_factory.mktemp("dataset")
        shutil.copytree(cache[key], copy, dirs_exist_ok=True)
        return copy

    return build


@pytest.mark.parametrize("fmt", ["img", "tensor", "tfrecord"])
@pytest.mark.parametrize("counts, per_shard", [
    ({"train": 36, "validation": 12}, 8),  # partial last shard
    ({"train": 40, "validation": 17}, 5),  # train divides, validation does not
    ({"train": 23, "validation": 9}, 3),
])
def test_execute_matrix(small_datasets, fmt, counts, per_shard):
    target = small_datasets(fmt, counts, per_shard)
    before = snapshot(target)
    for n in NS:
        if n > min(counts.values()):
            continue
        result = repartition(target, n)
        check_output(target, n, {"train": "drop", "validation": "spread"})
        assert result.manifest["splits"]["train"]["copied_samples"] == sum(p.copied_samples for p in result.plans
                                                                          if p.split == "train")
    # The originals (shards, indexes, metadata.json) are untouched.
    after = {k: v for k, v in snapshot(target).items() if not k.startswith("distributed/")}
    assert after == before


@pytest.mark.parametrize("policy", ["pad", "spread", "drop"])
def test_execute_each_policy_on_both_splits(small_datasets, policy):
    target = small_datasets("img", {"train": 37, "validation": 13}, 4)
    for n in (3, 4, 7):
        repartition(target, n, policies={None: policy})
        check_output(target, n, {"train": policy, "validation": policy})


def test_rerun_is_a_noop_and_other_n_gets_its_own_folder(small_datasets):
    target = small_datasets()
    first = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3)
    assert first.returncode == 0, first.stderr
    out3 = repartition_dir(target, 3)
    before = snapshot(out3)
    again = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3)
    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout
    assert snapshot(out3) == before  # not even rewritten: same inodes and mtimes
    other = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 4)
    assert other.returncode == 0, other.stderr
    assert snapshot(out3) == before
    check_output(target, 3)
    check_output(target, 4)


def test_splits_are_added_and_policies_changed_only_with_overwrite(small_datasets):
    target = small_datasets()
    assert repartition(target, 2, splits=["validation"]).manifest["splits"].keys() == {"validation"}
    validation_files = {k: v for k, v in snapshot(repartition_dir(target, 2)).items() if k.startswith("validation")}
    manifest = repartition(target, 2, splits=["train"]).manifest
    assert manifest["splits"].keys() == {"train", "validation"}
    assert {k: v for k, v in snapshot(repartition_dir(target, 2)).items() if k.startswith("validation")} == validation_files
    check_output(target, 2)

    refused = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 2, "--remainder", "train=pad")
    assert refused.returncode == 2 and "--overwrite" in refused.stderr and "'drop'" in refused.stderr
    check_output(target, 2, {"train": "drop", "validation": "spread"})
    replaced = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 2,
                          "--remainder", "train=pad", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    check_output(target, 2, {"train": "pad", "validation": "spread"})
    assert {k: v for k, v in snapshot(repartition_dir(target, 2)).items() if k.startswith("validation")} == validation_files


def test_reconverted_dataset_replaces_a_stale_repartition(small_datasets):
    target = small_datasets()
    repartition(target, 3)
    metadata = json.loads((target / METADATA_FILE).read_text())
    metadata["seed"] = 1  # as a re-conversion would change it
    write_metadata(target, metadata)
    result = repartition(target, 3)
    assert result.stale_replaced and not result.no_op
    check_output(target, 3)


def test_dry_run_prints_the_plan_and_writes_nothing(small_datasets):
    target = small_datasets()
    before = snapshot(target)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3, "--dry-run",
                        "--remainder", "validation=pad")
    assert result.returncode == 0, result.stderr
    assert snapshot(target) == before and not (target / "distributed").exists()
    out = result.stdout
    assert "train: 36 samples over 3 instances, policy drop" in out
    assert "validation: 12 samples over 3 instances, policy pad" in out
    assert "dry run: nothing written" in out
    # One row per instance and split: instance, samples, whole shards, copied, padded, bytes, shard names.
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[1] for row in rows] == ["12"] * 3 + ["4"] * 3
    assert "train-000000.tar" in out and "KB" in out


# ---------------------------------------------------------------- SIGKILL, then re-run

KILLER = textwrap.dedent("""
    import os, signal, sys
    from imagenet_shards.repartition.run import repartition
    target, n, event, after, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
    seen = 0
    def progress(what, **info):
        global seen
        if what == event:
            seen += 1
            if seen == after:
                os.kill(os.getpid(), signal.SIGKILL)
    repartition(target, n, policies=dict(item.split("=") for item in policies.split(",")), progress=progress)
""")


def kill_during(target, n, event, after, policies):
    """Run a repartition that SIGKILLs itself at the `after`-th progress event of kind `event`."""
    return subprocess.run([PYTHON, "-c", KILLER, str(target), str(n), event, str(after), policies],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)


@pytest.mark.parametrize("event, after", [
    ("verified", 1),  # while verifying: nothing written yet
    ("copied", 3),  # in the middle of the first remainder shard (a .partial on disk)
    ("written", 2),  # between two remainder shards
    ("written", 5),  # first remainder of the second split
])
def test_sigkill_then_rerun_ends_complete_and_correct(small_datasets, tmp_path, event, after):
    reference = small_datasets()
    repartition(reference, 4, policies={"validation": "pad"})
    target = small_datasets()
    sigkill_then_rerun(target, reference, event, after)


def test_sigkill_then_rerun_tfrecord(small_datasets):
    reference = small_datasets("tfrecord")
    repartition(reference, 4, policies={"validation": "pad"})
    sigkill_then_rerun(small_datasets("tfrecord"), reference, "copied", 3)


def sigkill_then_rerun(target, reference, event, after):
    killed = kill_during(target, 4, event, after, "validation=pad")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    out = repartition_dir(target, 4)
    assert not (out / REPARTITION_MANIFEST).exists()
    # The kill happened where intended: mid-shard leaves a partial, between shards finished remainders.
    if event == "verified":
        assert not (target / "distributed").exists()
    elif event == "copied":
        assert list(out.glob("*.partial"))
    else:
        assert len(list(out.glob("*-remainder-*.tar"))) == after and not list(out.glob("*.partial"))
    rerun = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 4, "--remainder", "validation=pad")
    assert rerun.returncode == 0, rerun.stderr
    check_output(target, 4, {"train": "drop", "validation": "pad"})
    assert contents(repartition_dir(target, 4)) == contents(repartition_dir(reference, 4))


def test_leftovers_of_another_plan_are_discarded(small_datasets):
    """A killed run of one plan, then a run of another: nothing of the first may mix in."""
    counts = {"train": 37, "validation": 13}
    target = small_datasets("img", counts)
    killed = kill_during(target, 4, "written", 6, "train=pad,validation=pad")
    assert killed.returncode == -signal.SIGKILL
    assert len(list(repartition_dir(target, 4).glob("*-remainder-*.tar"))) == 6
    assert repartition(target, 4).manifest
    check_output(target, 4, {"train": "drop", "validation": "spread"})
    reference = small_datasets("img", counts)
    repartition(reference, 4)
    assert contents(repartition_dir(target, 4)) == contents(repartition_dir(reference, 4))


# ---------------------------------------------------------------- bad input: clear error, nothing written


def run_cli(target, *args):
    return run_script("distributed_webdataset.py", "--target", target, *args)


def assert_nothing_written(target, before):
    assert snapshot(target) == before
    assert not (Path(target) / "distributed").exists()


def test_not_a_converted_dataset(tmp_path):
    result = run_cli(tmp_path, "--num-instances", 2)
    assert result.returncode == 2 and "not a converted dataset" in result.stderr and "metadata.json" in result.stderr
    assert list(tmp_path.iterdir()) == []
    missing = run_cli(tmp_path / "nope", "--num-instances", 2)
    assert missing.returncode == 2 and "no such directory" in missing.stderr


@pytest.mark.parametrize("args, message", [
    (("--num-instances", 0), "at least 1"),
    (("--num-instances", -3), "at least 1"),
    (("--num-instances", 13), "validation has 12 samples, fewer than the 13 instances"),
    (("--num-instances", 2, "--splits", "test"), "no split 'test'"),
    (("--num-instances", 2, "--remainder", "round"), "unknown policy 'round'"),
    (("--num-instances", 2, "--remainder", "val=pad"), "does not have"),
    (("--num-instances", "two"), "invalid int value"),
])
def test_usage_errors(small_datasets, args, message):
    target = small_datasets()
    before = snapshot(target)
    result = run_cli(target, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert_nothing_written(target, before)


def test_more_instances_than_samples_is_fine_for_a_split_not_selected(small_datasets):
    target = small_datasets()
    result = run_cli(target, "--num-instances", 13, "--splits", "train")
    assert result.returncode == 0, result.stderr
    check_output(target, 13)


def copied_and_whole_shards(target, n):
    plan = repartition(target, n, dry_run=True).plans[0]
    copied = {r.shard for i in plan.instances for r in i.copied}
    whole = {name for i in plan.instances for name in i.shards} - copied
    return sorted(copied), sorted(whole)




def test_corrupt_shard_that_is_copied_from(small_datasets):
    target = small_datasets()
    copied, _ = copied_and_whole_shards(target, 3)
    flip_byte(target / copied[0], 700)  # same size, other bytes
    before = snapshot(target)
    result = run_cli(target, "--num-instances", 3)
    assert result.returncode == 1
    assert copied[0] in result.stderr and "sha256" in result.stderr and "does not match metadata.json" in result.stderr
    assert_nothing_written(target, before)


def test_corrupt_whole_shard_is_caught_with_verify_all(small_datasets):
    target = small_datasets()
    _, whole = copied_and_whole_shards(target, 3)
    flip_byte(target / whole[0], 700)
    before = snapshot(target)
    result = run_cli(target, "--num-instances", 3, "--verify-shards", "all")
    assert result.returncode == 1 and whole[0] in result.stderr and "sha256" in result.stderr
    assert_nothing_written(target, before)
    # The default only hashes the shards it copies from (documented): a whole shard is the loader's to check.
    assert run_cli(target, "--num-instances", 3).returncode == 0


@pytest.mark.parametrize("damage, message", [
    ("truncate", "metadata.json says"),
    ("delete", "cannot read the shard"),
    ("index", "sha256 does not match metadata.json"),
    ("metadata", "not valid JSON"),
])
def test_damaged_dataset_is_a_data_error(small_datasets, damage, message):
    target = small_datasets()
    if damage == "truncate":
        with open(target / "train-000002.tar", "r+b") as handle:
            handle.truncate(4096)
    elif damage == "delete":
        (target / "validation-000001.tar").unlink()
    elif damage == "index":
        with open(target / "samples-train.index.tsv", "ab") as handle:
            handle.write(b"\n")
    else:
        (target / METADATA_FILE).write_text("{broken")
    before = snapshot(target)
    result = run_cli(target, "--num-instances", 3)
    assert result.returncode == 1, result.stdout + result.stderr
    assert message in result.stderr
    assert_nothing_written(target, before)


def test_a_second_run_at_the_same_time_is_refused(small_datasets):
    import fcntl

    target = small_datasets()
    out = repartition_dir(target, 2)
    out.mkdir(parents=True)
    held = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        result = run_cli(target, "--num-instances", 2)
    finally:
        os.close(held)
    assert result.returncode == 2 and "another repartition for 2 instances is running" in result.stderr
    assert list(out.iterdir()) == []
    assert run_cli(target, "--num-instances", 2).returncode == 0
    check_output(target, 2)


# ================================================================== real conversions, the CLI as users run it

DEFAULTS = {"train": "drop", "validation": "spread"}


@pytest.fixture(scope="module")
def real_dataset(converted, sample_source, tmp_path_factory):
    """real_dataset(fmt, per_shard) -> a private copy of the sample source converted by create_webdataset.py.

    Copies, because the shared conversions are read by other test files, which must not find our
    distributed/ folders in them. per_shard 8 reuses conftest's cached conversion; others are converted here.
    """
    cache = {}

    def get(fmt, per_shard):
        if (fmt, per_shard) not in cache:
            if per_shard == 8:
                cache[fmt, per_shard] = converted(fmt)
            else:
                target = tmp_path_factory.mktemp(f"converted-{fmt}-{per_shard}")
                result = run_script("create_webdataset.py", "--source", sample_source, "--target", target,
                                    "--format", fmt, "--samples-per-shard", per_shard, "--seed", 0)
                assert result.returncode == 0, result.stdout + result.stderr
                cache[fmt, per_shard] = target
        copy = tmp_path_factory.mktemp(f"repartition-{fmt}-{per_shard}") / "dataset"
        shutil.copytree(cache[fmt, per_shard], copy)
        return copy

    return get


@pytest.mark.parametrize("fmt", ["img", "tensor"])
@pytest.mark.parametrize("per_shard", [8, 5])
def test_real_conversion_for_every_instance_count(real_dataset, fmt, per_shard):
    """36 train / 12 validation samples; shards of 8 (last partial: 4) or 5 (last: 1 and 2)."""
    target = real_dataset(fmt, per_shard)
    before = snapshot(target)
    # The command's main in this process for each count (a subprocess would only add its imports, ~0.5 CPU-s
    # a run); the --overwrite run below is the command line itself.
    from imagenet_shards.cli.distributed_webdataset import main

    for n in NS:
        assert main(["--target", str(target), "--num-instances", str(n), "--quiet"]) == 0
        check_output(target, n, DEFAULTS)
    result = run_cli(target, "--num-instances", 7, "--remainder", "pad", "--overwrite", "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    check_output(target, 7, {"train": "pad", "validation": "pad"})
    assert {k: v for k, v in snapshot(target).items() if not k.startswith("distributed/")} == before
    if (fmt, per_shard) == ("img", 8):
        # The project's validator agrees that the dataset and its repartitions are intact.
        checked = run_script("validate_dataset.py", target, "--no-progress", "--workers", 1)
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_remainder_shards_are_standard_tar(real_dataset):
    """Stock webdataset reads an instance's shard list; GNU tar lists a remainder shard's members."""
    import webdataset

    target = real_dataset("img", 8)
    assert run_cli(target, "--num-instances", 3, "--quiet").returncode == 0
    manifest = json.loads((repartition_dir(target, 3) / REPARTITION_MANIFEST).read_text())
    instance = next(i for i in manifest["splits"]["validation"]["instances"] if i["remainder"])
    urls = [str(target / name) for name in (target / instance["shard_list"]).read_text().split()]
    index = read_sample_index(target / instance["index"])
    stock = [(s["__key__"], crc32c.crc32c(s["jpg"]), int(s["cls"]))
             for s in webdataset.WebDataset(urls, shardshuffle=False, empty_check=False)]
    assert stock == [(r.key, r.payload_crc32c, r.label) for r in index]

    listing = subprocess.run(["tar", "-tvf", target / instance["remainder"]], capture_output=True, text=True, check=True)
    names = [line.split()[-1] for line in listing.stdout.splitlines()]
    copied = [r for r in index if r.shard == instance["remainder"]]
    assert names == [f"{r.key}.{ext}" for r in copied for ext in r.member_offsets()]
    original = {m.name: m for s in {o.shard for o in original_records(target, "validation").values()}
                for m in iter_tar_members(target / s)}
    for member in iter_tar_members(target / instance["remainder"]):
        assert bytes(member.data) == bytes(original[member.name].data)


# ================================================================== end to end: the loader under torchrun

E2E_SCRIPT = """
import json, sys
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import get_data

source, out_dir = sys.argv[1], sys.argv[2]
instance = detect_instance()
result = {}
for split, batch in (("validation", 2), ("train", 4)):
    loader = get_data(source, split, batch, 1, normalization="device", with_keys=True, instance=instance)
    keys, batches = [], 0
    for images, labels, batch_keys in loader:
        keys += batch_keys
        batches += 1
    report = loader.report
    print(f"instance {instance.index} of {instance.count}, {split}: {len(keys)} samples in {batches} batches"
          f" ({report.repartition})", flush=True)
    result[split] = {"keys": keys, "batches": batches, "repartition": report.repartition, "policy": report.policy}
with open(f"{out_dir}/rank{instance.index}.json", "w") as handle:
    json.dump(result, handle)
"""


def test_three_torchrun_instances_read_the_repartition(real_dataset, tmp_path):
    target = real_dataset("img", 8)
    made = run_cli(target, "--num-instances", 3, "--quiet")
    assert made.returncode == 0, made.stdout + made.stderr
    manifest = check_output(target, 3, DEFAULTS)
    script = tmp_path / "read_share.py"
    script.write_text(E2E_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 3, script, target, out,
                        timeout=240, env={"OMP_NUM_THREADS": "1"})
    # A rank's traceback comes first in stderr; torchrun's summary comes last.
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[:4000] + result.stderr[-1000:]
    ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(3)]
    for split in ("validation", "train"):
        entry = manifest["splits"][split]
        for rank, share in enumerate(ranks):
            assert share[split]["repartition"].endswith("distributed/3-instances/manifest.json")
            assert f"instance {rank} of 3, {split}: {len(share[split]['keys'])} samples" in result.stdout
            # Each instance reads exactly the samples its repartition index lists.
            listed = [r.key for r in read_sample_index(target / entry["instances"][rank]["index"])]
            assert sorted(share[split]["keys"]) == sorted(listed)
    validation = [key for share in ranks for key in share["validation"]["keys"]]
    assert sorted(validation) == sorted(original_records(target, "validation"))  # every sample exactly once
    assert len({share["train"]["batches"] for share in ranks}) == 1  # equal batch counts for training
    assert [len(share["train"]["keys"]) for share in ranks] == [12, 12, 12]


def test_full_disk_names_the_file_and_a_rerun_finishes(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("mounting a 1 MiB tmpfs needs root")
    try:
        # ~650 KB of shards; N=8 copies 28 of the 36 samples (~500 KB): the disk fills mid-copy.
        target = build_dataset(disk / "dataset", "img", {"train": 36}, 8, payload_bytes=(15000, 20000))
        before = {k: v for k, v in snapshot(target).items()}
        result = run_cli(target, "--num-instances", 8)
        assert result.returncode == 1, result.stdout + result.stderr
        assert "No space left on device" in result.stderr and "train-remainder-" in result.stderr
        out = repartition_dir(target, 8)
        assert not (out / REPARTITION_MANIFEST).exists() and not list(out.glob("*.partial"))
        assert {k: v for k, v in snapshot(target).items() if not k.startswith("distributed/")} == before
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        again = run_cli(target, "--num-instances", 8)
        assert again.returncode == 0, again.stdout + again.stderr
        check_output(target, 8, {"train": "drop"})
    finally:
        subprocess.run(["umount", str(disk)], check=False)
