"""Issue 12: integrity cheap enough to check on every read; datasets written by the earlier version.

Per shard: sha256 and md5, computed while the shard is written and stored in metadata.json; per
payload: a CRC32C in the sample index. What every format must do with them (the digests equal
coreutils', the CRC32C is checked, a flipped bit is named by the loader and the validator) is in
tests/test_format_conformance.py, over the format registry. Here: datasets of the earlier index
format (a payload sha256 in place of the CRC32C) are refused with the one command that re-creates the
index (`tar_tools.py reindex`), which checks every payload against its sha256 first; after it they
validate, load and repartition.
"""

import hashlib
import json
import shutil

import pytest

from conftest import run_main, run_script
from imagenet_shards.cli.validate_dataset import main as validate_main
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import read_metadata, read_sample_index
from imagenet_shards.loader import get_data

# The formats the earlier version wrote (the payload sha256 index predates lmdb).
EARLIER_VERSION_FORMATS = ["img", "tensor", "tfrecord"]


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
    metadata.pop("metadata_digest")  # the earlier version recorded none
    (target / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n")


# The earlier version's header, written out here (not derived from imagenet_shards.index) so this stays what it wrote.
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


@pytest.mark.parametrize("fmt", EARLIER_VERSION_FORMATS)
def test_a_dataset_of_the_earlier_index_format_is_refused_then_reindexed_validates_loads_and_repartitions(legacy, fmt):
    target = legacy(fmt)
    result = run_script("validate_dataset.py", target, "--workers", 1)
    assert result.returncode == 1 and "tar_tools.py reindex" in result.stdout + result.stderr, result.stdout
    with pytest.raises(DatasetError, match="re-create it with `python tar_tools.py reindex"):
        get_data(str(target), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device")
    result = run_script("tar_tools.py", "reindex", target)
    assert result.returncode == 0 and "train" in result.stdout and "validation" in result.stdout, result.stderr
    for extra in ((), ("--deep",)):
        result = run_main(validate_main, target, "--workers", 1, *extra)
        assert result.returncode == 0, result.stdout + result.stderr
    records = read_sample_index(target / "samples-train.index.tsv")
    assert all(isinstance(r.payload_crc32c, int) for r in records)
    loader = get_data(str(target), "train", 4, 0, instance=(0, 1), on_error="fail", normalization="device",
                      with_keys=True)
    assert sorted(key for batch in loader for key in batch.keys) == sorted(r.key for r in records)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3)
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_main(validate_main, target, "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_script("tar_tools.py", "reindex", target).stdout.startswith("reindex: every index")


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_a_flipped_bit_in_a_dataset_of_the_earlier_format_is_named_by_reindex_which_leaves_the_index(legacy, fmt):
    """Re-indexing checks each payload against its sha256 before writing its CRC32C: damage is named, never blessed."""
    target = legacy(fmt)
    index = target / "samples-train.index.tsv"
    before = index.read_bytes()
    lines = before.decode().splitlines()
    bad = dict(zip(lines[0].split("\t"), lines[14].split("\t")))  # the 14th sample
    with open(target / bad["shard"], "r+b") as handle:
        handle.seek(int(bad["payload_offset"]) + int(bad["payload_size"]) - 1)
        last = handle.read(1)[0]
        handle.seek(-1, 1)
        handle.write(bytes([last ^ 1]))
    result = run_script("tar_tools.py", "reindex", target)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(f"{bad['shard']}: the payload at line 15 of samples-train.index.tsv differs "
                                    f"from its sha256")
    assert index.read_bytes() == before and "Traceback" not in result.stderr
