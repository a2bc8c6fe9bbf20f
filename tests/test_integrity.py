"""Issue 12: integrity cheap enough to check on every read.

Per shard: sha256 and md5, computed while the shard is written and stored in metadata.json.
"""

import subprocess

import pytest

from datasets.index import read_metadata


def coreutils_digest(command: str, path) -> str:
    """The digest printed by the real `md5sum` / `sha256sum` for one file."""
    return subprocess.run([command, str(path)], capture_output=True, text=True, check=True).stdout.split()[0]


@pytest.mark.parametrize("fmt", ["img", "tensor", "tfrecord"])
def test_metadata_md5_and_sha256_equal_md5sum_and_sha256sum_of_every_shard(converted, fmt):
    target = converted(fmt)
    metadata = read_metadata(target)
    shards = [shard for entry in metadata["splits"].values() for shard in entry["shards"]]
    assert shards
    for shard in shards:
        path = target / shard["name"]
        assert shard["md5"] == coreutils_digest("md5sum", path)
        assert shard["sha256"] == coreutils_digest("sha256sum", path)
