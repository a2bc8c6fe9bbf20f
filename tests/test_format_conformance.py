"""Every registered format (imagenet_shards.formats.FORMATS) meets the same contract, tested the same way.

For each format, on the conftest sample dataset converted by create_webdataset.py (36 train and
12 validation samples in shards of 8, so the last shard of each split is partial):
  write       metadata.json's md5 and sha256 of every shard equal coreutils' md5sum and sha256sum;
  read back   the loader delivers every indexed sample exactly once, with its index label;
  CRC32C      the index's CRC32C of each payload is crc32c of the payload's bytes in the shard;
  validate    validate_dataset.py says "Dataset OK." (exit 0), and --deep decodes every payload;
  repartition distributed_webdataset.py's output validates, and a sample taken out of an
              instance's index is named;
  damage      a flipped payload byte (one that still decodes, so only the CRC can tell) is named
              with its shard and sample key by the validator (exit 1) and the loader (fail: raises;
              skip: reports it, train batches stay equal; verify=False: delivers it); a truncated
              shard is named by the validator.
A format added to the registry is tested here with no change to this file.
"""

import io
import json
import os
import re
import shutil
import subprocess

import crc32c
import numpy as np
import pytest
from PIL import Image

from conftest import run_script
from imagenet_shards.formats import FORMATS, get_format
from imagenet_shards.index import encode_sample_index, read_metadata
from imagenet_shards.index import read_sample_index
from imagenet_shards.loader import DataSource, Order, get_data
from imagenet_shards.loader.image_loader import SampleError
from imagenet_shards.formats.shard_check import ERROR
from imagenet_shards.validate.validator import validate

FORMAT_NAMES = sorted(FORMATS)
SPLITS = {"train": 36, "validation": 12}
SHARDS = 7  # 5 train + 2 validation shards of 8


@pytest.fixture(params=FORMAT_NAMES)
def fmt(request):
    return request.param


@pytest.fixture
def dataset(converted, fmt, tmp_path):
    """A private copy of the format's converted sample dataset, to damage or repartition."""
    copy = tmp_path / f"dataset-{fmt}"
    shutil.copytree(converted(fmt), copy)
    return copy


def records(target, split="train"):
    return read_sample_index(target / read_metadata(target)["splits"][split]["index"]["name"])


def payload_position(target, record) -> int:
    """Where `record`'s payload starts in its shard file. A format whose records are not byte ranges
    of the file (lmdb) gives the record's bytes by key; the payload is found in the file by its bytes."""
    shard_format = get_format(read_metadata(target)["format"])
    if shard_format.records_are_byte_ranges:
        return record.payload_offset
    value = shard_format.read_record(target / record.shard, record)
    payload = bytes(value[record.payload_offset - record.record_offset:][:record.payload_size])
    data = (target / record.shard).read_bytes()
    at = data.index(payload)
    assert data.find(payload, at + 1) == -1, f"{record.key}: its payload appears twice in {record.shard}"
    return at


def read_payload(target, record) -> bytes:
    with open(target / record.shard, "rb") as handle:
        handle.seek(payload_position(target, record))
        return handle.read(record.payload_size)


def problems(report):
    return "\n".join(p.line() for p in report.problems)


def found(report, file, key, fragment) -> bool:
    return any(p.severity == ERROR and p.file == file and p.key == key and fragment in p.problem
               for p in report.problems)


# ------------------------------------------------------------------------------------------ write, read back


def coreutils_digest(command: str, path) -> str:
    """The digest printed by the real `md5sum` / `sha256sum` for one file."""
    return subprocess.run([command, str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


def test_write_metadata_md5_and_sha256_equal_md5sum_and_sha256sum_of_every_shard(converted, fmt):
    target = converted(fmt)
    metadata = read_metadata(target)
    assert metadata["format"] == fmt
    shards = [shard for entry in metadata["splits"].values() for shard in entry["shards"]]
    assert len(shards) == SHARDS
    for shard in shards:
        path = target / shard["name"]
        assert shard["md5"] == coreutils_digest("md5sum", path)
        assert shard["sha256"] == coreutils_digest("sha256sum", path)


def test_read_back_every_sample_once_with_its_label(converted, fmt):
    target = converted(fmt)
    for split, count in SPLITS.items():
        labels = {r.key: r.label for r in records(target, split)}
        loader = get_data(str(target), split, 4, 0, instance=(0, 1), on_error="fail", normalization="device",
                          with_keys=True, order=Order(policy="spread"))
        read = [(key, int(label)) for _, batch_labels, keys in loader for key, label in zip(keys, batch_labels)]
        assert len(read) == len(labels) == count
        assert dict(read) == labels and len(set(k for k, _ in read)) == count


def test_index_crc32c_is_the_crc32c_of_each_payload_in_the_shard(converted, fmt):
    target = converted(fmt)
    for split in SPLITS:
        in_index = records(target, split)
        assert in_index and all(isinstance(r.payload_crc32c, int) for r in in_index)
        for r in in_index:
            assert crc32c.crc32c(read_payload(target, r)) == r.payload_crc32c, r.key


# ------------------------------------------------------------------------------------------ validate, repartition


def test_validate_a_clean_dataset_exit_0_and_deep(converted, fmt):
    result = run_script("validate_dataset.py", "--imagenet-data-path", converted(fmt), "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "Dataset OK."
    assert not [line for line in out if line.startswith(("error:", "warning:"))]
    assert f"Checked {SHARDS} shards, 48 samples" in result.stdout
    report = validate(converted(fmt), deep=True)
    assert report.ok and not report.problems, problems(report)
    assert report.stats["payloads_decoded"] == 48 and report.stats["payloads_hashed"] == 48


def test_repartition_validates_and_a_sample_left_out_is_named(dataset):
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 5, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    report = validate(dataset)
    assert report.ok and not report.problems, problems(report)
    assert report.stats["repartitions"] == ["distributed/5-instances"]
    manifest_name = "distributed/5-instances/manifest.json"
    manifest = json.loads((dataset / manifest_name).read_text())
    # validation (spread, 12 over 5): every sample read by exactly one instance
    instances = manifest["splits"]["validation"]["instances"]
    keys = [r.key for item in instances for r in read_sample_index(dataset / item["index"])]
    assert sorted(keys) == sorted(r.key for r in records(dataset, "validation"))
    assert [item["samples"] for item in instances] == [3, 3, 2, 2, 2]
    instance = instances[1]
    kept = read_sample_index(dataset / instance["index"])
    lost = kept.pop(2)
    (dataset / instance["index"]).write_bytes(encode_sample_index(kept))
    report = validate(dataset)
    assert report.exit_code == 1
    assert found(report, manifest_name, lost.key, "read by no instance and not named as dropped"), problems(report)
    assert found(report, instance["index"], None, "the index lists 2 samples, the manifest says 3"), problems(report)


# ------------------------------------------------------------------------------------------ damage named


def still_decoding_bit(payload: bytes) -> int:
    """The byte offset, inside `payload`, of a byte whose lowest bit can flip while the payload still
    decodes: for a JPEG, one in the middle of the entropy-coded data (after the start-of-scan header, away
    from any 0xFF byte, so no marker is made or broken); for a .npy, the last pixel byte."""
    if payload[:6] == b"\x93NUMPY":
        return len(payload) - 1
    sos = payload.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(payload[sos + 2: sos + 4], "big")
    end = payload.rindex(b"\xff\xd9")
    for at in range((start + end) // 2, end - 1):
        if 0xFF not in payload[at - 1: at + 2] and payload[at] ^ 1 != 0xFF:
            return at
    raise AssertionError("no byte in the scan data to flip")


def decodes(payload: bytes) -> bool:
    if payload[:6] == b"\x93NUMPY":
        np.load(io.BytesIO(payload))
        return True
    with Image.open(io.BytesIO(payload)) as image:
        image.load()
    return True


@pytest.fixture
def flipped(dataset):
    """(dataset copy, the SampleRecord of the train sample whose payload has one low bit flipped; the
    payload still decodes, so only its CRC32C tells)."""
    record = records(dataset)[13]
    path = dataset / record.shard
    data = bytearray(path.read_bytes())
    start = payload_position(dataset, record)
    payload = bytearray(data[start: start + record.payload_size])
    at = still_decoding_bit(bytes(payload))
    payload[at] ^= 1
    assert decodes(bytes(payload))
    data[start + at] ^= 1
    path.write_bytes(bytes(data))
    return dataset, record


def test_flipped_payload_byte_validator_names_shard_and_key(flipped):
    target, bad = flipped
    report = validate(target)
    assert report.exit_code == 1 and report.verdict_lines() == ["Dataset is corrupted."]
    # the payload's CRC32C against the index (the format's own CRC, where it has one, may say it first)
    assert found(report, bad.shard, bad.key, "CRC"), problems(report)
    assert found(report, bad.shard, None, "differs from metadata"), problems(report)
    # exactly one sample is named: the others in that shard still match the index
    assert {p.key for p in report.errors} == {bad.key, None}, problems(report)
    result = run_script("validate_dataset.py", target, "--workers", 1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: {bad.shard} [{bad.key}]:" in result.stdout


def test_flipped_payload_byte_loader_fail_raises_naming_shard_and_key(flipped):
    target, bad = flipped
    loader = get_data(str(target), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device")
    with pytest.raises(SampleError, match=rf"{bad.shard}: sample '{bad.key}'"):
        for _ in loader:
            pass


def test_flipped_payload_byte_loader_skip_reports_it_and_train_batches_stay_equal(flipped):
    target, bad = flipped
    loader = get_data(str(target), "train", 4, 1, instance=(0, 1), normalization="device", with_keys=True)
    with pytest.warns(UserWarning, match="1 samples skipped"):
        keys = [key for batch in loader for key in batch.keys]
    report = loader.report
    assert [(s.key, s.shard) for s in report.skipped] == [(bad.key, bad.shard)]
    assert "CRC" in report.skipped[0].reason
    assert report.batches == len(loader) == 9 and len(keys) == 36 and bad.key not in keys
    assert [missing for missing, _ in report.substituted] == [bad.key]


def test_flipped_payload_byte_loader_verify_false_delivers_it(flipped):
    target, bad = flipped
    loader = get_data(DataSource(str(target), verify=False), "train", 4, 0, instance=(0, 1), on_error="fail",
                      normalization="device", with_keys=True)
    assert bad.key in [key for batch in loader for key in batch.keys]
    assert not loader.report.skipped


def test_truncated_shard_is_named(dataset):
    shard = records(dataset)[12].shard  # the second train shard: 8 samples
    os.truncate(dataset / shard, (dataset / shard).stat().st_size // 2)
    report = validate(dataset)
    assert report.exit_code == 1
    assert found(report, shard, None, "size"), problems(report)
    assert {p.file for p in report.errors} == {shard}, problems(report)
    result = run_script("validate_dataset.py", dataset, "--workers", 1)
    assert result.returncode == 1 and f"error: {shard}:" in result.stdout, result.stdout + result.stderr
    loader = get_data(str(dataset), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device")
    with pytest.raises(SampleError, match=re.escape(shard)):
        for _ in loader:
            pass
