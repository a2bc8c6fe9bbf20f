"""metadata.json: what a converted dataset holds, written last (its presence means the dataset is complete).

A converted dataset directory holds (imagenet_shards.dataset_folder names the files and folders):

    metadata.json                 this record
    <split>-000000.tar ...        shards, named by their format (imagenet_shards.formats; e.g. TF-slim's
                                  <split>-00000-of-01024 with a <shard>.tfindex each)
    samples-<split>.index.tsv     one line per sample, so any sample can be found and checked alone
                                  (imagenet_shards.index.schema)

metadata.json keeps the reference harness's keys (`train_length`, `validation_length`,
`format`, `shuffle`, `train_transform_pipeline`, `validation_transform_pipeline`,
`seed`, `image_quality`, `checksum`: checksumdir's md5 dirhash of the folder without metadata.json,
see imagenet_shards.reference.checksum) and adds:

    "format_version": 1,
    "classes": ["n01440764", ...],          class index -> class folder name
    "tensor_layout": "HWC" | null,
    "label_offset": 1,                      formats whose shards store label + 1 (TF-slim's 1..N);
                                            labels in the sample index are always 0-based
    "splits": {"train": {
        "length": samples written,
        "source_samples": samples found in the source (= length + len(skipped)),
        "skipped": [{"path": ..., "reason": ...}],
        "shards": [ShardRecord.to_json(), ...],
        "index": {"name": "samples-train.index.tsv", "bytes": ..., "sha256": ..., "md5": ...}}}
    "plan_fingerprint": "<sha256>",          the conversion plan (options, source listing): create_webdataset.py
                                            --resume with the same options and source finds the dataset complete
    "convert_state_removed": true,          .convert-state/ is outside `checksum` and was removed once this
                                            file was written (absent: made by an earlier version that kept it,
                                            inside the checksum)
    "payload_extension": "pth",             only where it differs from the format's (imagenet_shards.formats.payload_extension_of)
                                            (an adopted reference tensor dataset)
    "metadata_digest": "sha256:<hex>",      last: the sha256 of the canonical JSON of every other key
                                            (imagenet_shards.metadata_digest; absent: written before it existed)

A metadata.json written by another tool is recognised through `METADATA_RECOGNISERS`
(imagenet_shards.reference: its harness's own, its keys only, no "splits").
"""

from __future__ import annotations

import json
from pathlib import Path

from imagenet_shards.errors import DatasetError
from imagenet_shards.fileio import atomic_write_json
from imagenet_shards.index.records import ShardRecord
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.metadata_digest import sealed
from imagenet_shards.safe_names import plain_name

FORMAT_VERSION = 1
# metadata.json key (see above): true when the converter's .convert-state/ is outside `checksum` and removed.
CONVERT_STATE_REMOVED = "convert_state_removed"

# Hooks for metadata.json written by other tools: each takes (metadata, source) and returns the
# DatasetError (a subclass naming that tool) parse_metadata raises, or None. imagenet_shards.reference
# registers the one for the layout it reads and adopts.
METADATA_RECOGNISERS = []


def read_metadata(directory) -> dict:
    """Read and sanity-check `metadata.json`; a clear DatasetError if it is missing or malformed."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise DatasetError(f"{directory}: not a converted dataset ({METADATA_FILE} is missing)")
    return parse_metadata(path.read_bytes(), path)


def parse_metadata(data: bytes, source=METADATA_FILE) -> dict:
    try:
        metadata = json.loads(data)
    except ValueError as error:
        raise DatasetError(f"{source}: not valid JSON: {error}") from None
    if not isinstance(metadata, dict):
        raise DatasetError(f"{source}: expected a JSON object")
    for recognise in METADATA_RECOGNISERS:
        foreign = recognise(metadata, source)
        if foreign is not None:
            raise foreign
    for key in ("format", "splits", "classes"):
        if key not in metadata:
            raise DatasetError(f"{source}: the key {key!r} is missing")
    version = metadata.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DatasetError(f"{source}: format_version {version!r} is not a version number")
    if version > FORMAT_VERSION:
        raise DatasetError(f"{source}: format_version {version} is newer than this tool")
    check_names(metadata, source)
    return metadata


def check_names(metadata: dict, source) -> None:
    """Every split, shard and index name metadata.json gives is a plain name (imagenet_shards.safe_names): none
    becomes a path or URL outside the dataset. UnsafeNameError (a DatasetError) naming `source` and the name."""
    splits = metadata["splits"]
    if not isinstance(splits, dict):
        raise DatasetError(f"{source}: 'splits' is not a JSON object")
    for split, entry in splits.items():
        plain_name(split, source)
        if not isinstance(entry, dict):
            continue
        shards = entry.get("shards")
        for shard in shards if isinstance(shards, list) else ():  # a malformed list: the validator names it
            if isinstance(shard, dict) and "name" in shard:
                plain_name(shard["name"], source)
        index = entry.get("index")
        if isinstance(index, dict) and index.get("name") is not None:
            plain_name(index["name"], source)


def write_metadata(directory, metadata: dict) -> dict:
    """Write metadata.json atomically, sealed with the digest of its own content
    (imagenet_shards.metadata_digest); returns what was written. Every writer of a metadata.json goes here."""
    metadata = sealed(metadata)
    atomic_write_json(Path(directory) / METADATA_FILE, metadata)
    return metadata


def shard_records(metadata: dict, split: str):
    return [ShardRecord.from_json(s) for s in metadata["splits"][split]["shards"]]
