"""The reference harness's metadata.json: recognised, checked, read.

Its keys: train_length, validation_length, format (img|tensor), shuffle,
train_transform_pipeline, validation_transform_pipeline, seed, image_quality, checksum; no
"splits". `recognise` is the hook imagenet_shards.index.parse_metadata calls (registered by
imagenet_shards.reference on import): such a metadata.json is a `ReferenceMetadataError` there, which
a reader catches to read the dataset this package's way (imagenet_shards.reference.layout).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import METADATA_FILE, SPLITS
from imagenet_shards.errors import DatasetError
from imagenet_shards.metadata_digest import DIGEST_KEY

REFERENCE_KEYS = ("train_length", "validation_length", "format", "shuffle", "train_transform_pipeline",
                  "validation_transform_pipeline", "seed", "image_quality", "checksum")
REFERENCE_PAYLOAD = {"img": "jpg", "tensor": "pth"}


def is_reference_metadata(metadata) -> bool:
    """True for the reference harness's metadata.json (its keys, none of this project's: a metadata.json
    that carries this project's digest is ours, even with its "splits" deleted)."""
    return (isinstance(metadata, dict) and "splits" not in metadata and DIGEST_KEY not in metadata
            and "format" in metadata and any(f"{split}_length" in metadata for split in SPLITS))


class ReferenceMetadataError(DatasetError):
    """metadata.json of a dataset made by the reference harness: read with imagenet_shards.reference.layout."""


def recognise(metadata, source) -> Optional[ReferenceMetadataError]:
    """imagenet_shards.index's metadata hook: the error parse_metadata raises for a reference metadata.json."""
    if is_reference_metadata(metadata):
        return ReferenceMetadataError(f"{source}: a dataset made by the reference harness (Graphcore's "
                                      f"create_webdataset.py); `validate_dataset.py --adopt` indexes it")
    return None


def reference_metadata_problems(metadata: dict) -> list:
    """What is wrong with a reference metadata.json, as strings (empty: usable)."""
    problems = [f"the key {key!r} is missing" for key in ("format", "checksum") if key not in metadata]
    fmt = metadata.get("format")
    if "format" in metadata and fmt not in REFERENCE_PAYLOAD:
        problems.append(f"format {fmt!r} is not one of the reference formats ({', '.join(REFERENCE_PAYLOAD)})")
    for split in SPLITS:
        value = metadata.get(f"{split}_length")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            problems.append(f"{split}_length is {value!r}, not a sample count")
    if "checksum" in metadata and not (isinstance(metadata["checksum"], str) and len(metadata["checksum"]) == 32):
        problems.append(f"checksum {metadata['checksum']!r} is not an md5 hex digest")
    return problems


def read_reference_metadata(root) -> Optional[dict]:
    """The reference metadata.json of `root`, or None if it is this project's (or missing)."""
    try:
        metadata = json.loads((Path(root) / METADATA_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return metadata if is_reference_metadata(metadata) else None
