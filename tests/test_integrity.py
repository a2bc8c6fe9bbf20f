"""Issue 12: integrity cheap enough to check on every read.

Per shard: sha256 and md5, computed while the shard is written and stored in metadata.json.
"""

import hashlib
import io
import json
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from conftest import run_script
from datasets.index import read_metadata, read_sample_index
from datasets.loader import get_data
from datasets.loader.image_loader import SampleError

FORMATS = ["img", "tensor", "tfrecord"]


def coreutils_digest(command: str, path) -> str:
    """The digest printed by the real `md5sum` / `sha256sum` for one file."""
    return subprocess.run([command, str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_metadata_md5_and_sha256_equal_md5sum_and_sha256sum_of_every_shard(converted, fmt):
    target = converted(fmt)
    metadata = read_metadata(target)
    shards = [shard for entry in metadata["splits"].values() for shard in entry["shards"]]
    assert shards
    for shard in shards:
        path = target / shard["name"]
        assert shard["md5"] == coreutils_digest("md5sum", path)
        assert shard["sha256"] == coreutils_digest("sha256sum", path)


# ------------------------------------------------------------------ a bit flipped at rest that still decodes


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
def flipped(converted, tmp_path):
    """flipped(fmt) -> (dataset copy, the SampleRecord of the train sample whose payload has one low bit
    flipped; the payload still decodes)."""

    def make(fmt):
        target = tmp_path / fmt
        shutil.copytree(converted(fmt), target)
        record = read_sample_index(target / "samples-train.index.tsv")[13]
        path = target / record.shard
        data = bytearray(path.read_bytes())
        payload = bytearray(data[record.payload_offset: record.payload_offset + record.payload_size])
        at = still_decoding_bit(bytes(payload))
        payload[at] ^= 1
        assert decodes(bytes(payload))
        data[record.payload_offset + at] ^= 1
        path.write_bytes(bytes(data))
        return target, record

    return make


@pytest.mark.parametrize("fmt", FORMATS)
def test_loader_on_error_fail_raises_naming_the_shard_and_key(flipped, fmt):
    target, bad = flipped(fmt)
    loader = get_data(str(target), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device")
    with pytest.raises(SampleError, match=rf"{bad.shard}: sample '{bad.key}'"):
        for _ in loader:
            pass


@pytest.mark.parametrize("fmt", FORMATS)
def test_loader_on_error_skip_reports_it_and_train_batches_stay_equal(flipped, fmt):
    target, bad = flipped(fmt)
    loader = get_data(str(target), "train", 4, 1, instance=(0, 1), normalization="device", with_keys=True)
    with pytest.warns(UserWarning, match="1 samples skipped"):
        keys = [key for batch in loader for key in batch.keys]
    report = loader.report
    assert [(s.key, s.shard) for s in report.skipped] == [(bad.key, bad.shard)]
    assert "CRC" in report.skipped[0].reason
    assert report.batches == len(loader) == 9 and len(keys) == 36 and bad.key not in keys
    assert [missing for missing, _ in report.substituted] == [bad.key]


@pytest.mark.parametrize("fmt", FORMATS)
def test_loader_verify_false_delivers_the_flipped_sample(flipped, fmt):
    target, bad = flipped(fmt)
    loader = get_data(str(target), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device",
                      with_keys=True, verify=False)
    assert bad.key in [key for batch in loader for key in batch.keys]
    assert not loader.report.skipped


@pytest.mark.parametrize("fmt", FORMATS)
def test_validator_exits_1_naming_the_key(flipped, fmt):
    target, bad = flipped(fmt)
    result = run_script("validate_dataset.py", target, "--workers", 1)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: {bad.shard} [{bad.key}]:" in result.stdout


# ------------------------------------------------------------------ datasets written by the earlier version


def write_legacy_index_and_metadata(target):
    """Rewrite a converted dataset as the earlier version wrote it: the sample index with a
    payload_sha256 column (the payload's sha256 in place of its CRC32C), no md5 in metadata.json."""
    metadata = read_metadata(target)
    for entry in metadata["splits"].values():
        index_path = target / entry["index"]["name"]
        lines = ["\t".join(LEGACY_COLUMNS)]
        for r in read_sample_index(index_path):
            with open(target / r.shard, "rb") as handle:
                handle.seek(r.payload_offset)
                sha256 = hashlib.sha256(handle.read(r.payload_size)).hexdigest()
            lines.append("\t".join(map(str, (r.key, r.shard, r.label, r.record_offset, r.record_size,
                                              r.payload_offset, r.payload_size, sha256, r.members))))
        data = ("\n".join(lines) + "\n").encode()
        index_path.write_bytes(data)
        entry["index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        for shard in entry["shards"]:
            del shard["md5"]
    (target / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n")


# The earlier version's header, written out here (not derived from datasets.index) so this stays what it wrote.
LEGACY_COLUMNS = ["key", "shard", "label", "record_offset", "record_size", "payload_offset", "payload_size",
                  "payload_sha256", "members"]


@pytest.fixture
def legacy(converted, tmp_path):
    def make(fmt):
        target = tmp_path / f"legacy-{fmt}"
        shutil.copytree(converted(fmt), target)
        write_legacy_index_and_metadata(target)
        assert (target / "samples-train.index.tsv").read_text().split("\n")[0].split("\t")[7] == "payload_sha256"
        return target

    return make


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dataset_of_the_earlier_index_format_validates_loads_and_repartitions(legacy, fmt):
    target = legacy(fmt)
    for extra in ((), ("--deep",)):
        result = run_script("validate_dataset.py", target, "--workers", 1, *extra)
        assert result.returncode == 0, result.stdout + result.stderr
    records = read_sample_index(target / "samples-train.index.tsv")
    assert all(r.payload_crc32c is None and len(r.payload_sha256) == 64 for r in records)
    loader = get_data(str(target), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device",
                      with_keys=True)
    assert sorted(key for batch in loader for key in batch.keys) == sorted(r.key for r in records)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3)
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_script("validate_dataset.py", target, "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_a_flipped_bit_in_a_dataset_of_the_earlier_format_is_caught_by_its_payload_sha256(legacy, fmt):
    """The validator checks an earlier index's payload sha256. (The loader's columnar index keeps only CRC32Cs:
    it loads such a dataset without checking payloads.)"""
    target = legacy(fmt)
    bad = read_sample_index(target / "samples-train.index.tsv")[13]
    with open(target / bad.shard, "r+b") as handle:
        handle.seek(bad.payload_offset + bad.payload_size - 1)
        last = handle.read(1)[0]
        handle.seek(-1, 1)
        handle.write(bytes([last ^ 1]))
    result = run_script("validate_dataset.py", target, "--workers", 1)
    assert result.returncode == 1 and f"error: {bad.shard} [{bad.key}]: payload sha256 differs" in result.stdout


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_index_crc32c_is_the_crc32c_of_each_payload(converted, fmt):
    import crc32c

    target = converted(fmt)
    for split in ("train", "validation"):
        records = read_sample_index(target / f"samples-{split}.index.tsv")
        assert records and all(isinstance(r.payload_crc32c, int) and not r.payload_sha256 for r in records)
        for r in records:
            with open(target / r.shard, "rb") as handle:
                handle.seek(r.payload_offset)
                assert crc32c.crc32c(handle.read(r.payload_size)) == r.payload_crc32c, r.key
