"""The sample index held against the sealed metadata.json when the loader reads it.

Why: every payload is checked on read (CRC32C), but the index says which samples exist. One line
duplicated made the loader deliver that sample twice in every epoch with no word; one line dropped
lost a sample silently. metadata.json (sealed with its digest) records every shard's sample count,
so the index's per-shard counts and the uniqueness of its keys are cheap to hold against it: a
bincount, and one hash per key (0.54-0.69 s at 1.28M keys here, 2026-11-28, once per get_data in
the main process). A local index is also held against the size and sha256 metadata.json records
for it (0.54-0.88 s for 140 MB here, 2026-11-28, about ImageNet's train index): a flipped byte in
a label keeps the counts and the keys but delivered a wrong label with no word, and a key that is
no longer UTF-8 broke the loader with a UnicodeDecodeError. A remote index is read once, as a
stream; its hash is not checked. A disagreement is a SourceError naming the index file, never batches.
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np

from imagenet_shards.index import SampleColumns
from imagenet_shards.safe_names import is_plain_name

SHOWN = 3  # disagreements named in one message


def index_disagreement(columns: SampleColumns, split_entry, index_location: str) -> Optional[str]:
    """One line naming `index_location` and how it disagrees with metadata.json's entry for its split
    (per-shard sample counts, keys unique), or None. Metadata without usable counts (an edited or
    older metadata.json, which the validator names) is not held against."""
    unsafe = next((name for name in columns.shard_names if not is_plain_name(name)), None)
    if unsafe is not None:  # never a path or URL outside the dataset (imagenet_shards.safe_names)
        return (f"{index_location}: unsafe shard name {unsafe!r} (not a plain file name: a path, `..` or a URL); "
                f"a hostile or damaged index: restore it or re-convert")
    expected = _expected_counts(split_entry)
    if expected is not None:
        listed = np.bincount(columns.shard_ids, minlength=len(columns.shard_names)).tolist()
        counts = dict(zip(columns.shard_names, listed))
        differences = []
        for name in list(expected) + [name for name in counts if name not in expected]:
            have = counts.get(name, 0)
            if name not in expected and have:
                differences.append(f"shard {name}: {have} samples listed, metadata.json does not list the shard")
            elif name in expected and have != expected[name]:
                differences.append(f"shard {name}: {have} samples listed, metadata.json says {expected[name]}")
        if differences:
            more = f"; and {len(differences) - SHOWN} more" if len(differences) > SHOWN else ""
            return (f"{index_location}: the sample index disagrees with metadata.json: "
                    f"{'; '.join(differences[:SHOWN])}{more} (a damaged or edited index: restore it or re-convert)")
    repeated = columns.duplicate_keys()
    if repeated:
        shown = "; ".join(f"key {key!r} listed {count} times" for key, count in list(repeated.items())[:SHOWN])
        more = f"; and {len(repeated) - SHOWN} more keys" if len(repeated) > SHOWN else ""
        return (f"{index_location}: the sample index lists a key more than once: {shown}{more} "
                f"(keys are unique in a converted dataset: restore the index or re-convert)")
    return None


def index_file_disagreement(path: str, split_entry, recorded_by: str = "metadata.json",
                            remedy: str = "restore it or re-convert") -> Optional[str]:
    """One line naming the local index `path` when its size or sha256 is not what `split_entry`'s
    "index" (metadata.json's entry for its split, or a repartition manifest's entry for an instance)
    records, or None (also when it records neither). A missing index is named too."""
    try:
        recorded = split_entry["index"]
        size, sha256 = int(recorded["bytes"]), str(recorded["sha256"])
    except (KeyError, TypeError, ValueError):
        return None
    try:
        actual = os.stat(path).st_size
    except FileNotFoundError:
        return f"{path}: the sample index is missing ({recorded_by} lists it: {remedy})"
    if actual != size:
        return (f"{path}: the sample index is {actual} bytes, {recorded_by} says {size} "
                f"(a damaged or edited index: {remedy})")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != sha256:
        return (f"{path}: the sample index's sha256 is not the one {recorded_by} records "
                f"(a damaged or edited index: {remedy})")
    return None


def _expected_counts(split_entry) -> Optional[dict]:
    try:
        counts = {}
        for shard in split_entry["shards"]:
            samples = shard["samples"]
            if not isinstance(samples, int) or isinstance(samples, bool):
                return None
            counts[str(shard["name"])] = samples
        return counts
    except (KeyError, TypeError):
        return None
