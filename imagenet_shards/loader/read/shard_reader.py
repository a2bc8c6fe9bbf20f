"""Indexing tar shards that have no sample index (`scan_shard`), and, re-exported for one release, the run
reading that moved to imagenet_shards/formats/runs.py (`Run`, `iter_run`, `payload_extension`...; each
format reads rows of a shard with `read_run` and `read_positions`, from whatever bytes hold it).

`scan_shard` walks a foreign webdataset shard's tar headers once (the payloads of a local shard are not
even paged in), local or remote (http(s), s3; imagenet_shards/storage.py), so exact balancing still holds.
"""

from __future__ import annotations

import logging
from typing import Optional

from imagenet_shards.formats.runs import (  # noqa: F401  (moved to imagenet_shards/formats/runs.py; re-exported)
    LABEL_EXTENSIONS,
    PAYLOAD_PREFERENCE,
    Run,
    iter_run,
    iter_samples,
    payload_extension,
    reads_locally,
    sample_label,
)
from imagenet_shards.formats.tar import BLOCK, iter_tar_members, read_member, split_key  # noqa: F401  (read_member: re-exported)
from imagenet_shards.index import SampleRecord
from imagenet_shards.storage import (  # noqa: F401  (the location helpers moved to imagenet_shards/storage.py; re-exported)
    ShardReadError,
    exists,
    expand_locations,
    is_url,
    join_location,
    open_byte_range,
    read_bytes,
)

log = logging.getLogger(__name__)


def scan_shard(location: str, name: Optional[str] = None) -> list:
    """Index a shard that has no sample index: one SampleRecord per sample, from its headers.

    `name` is the shard name stored in the records (default: the location). A sample's byte
    range starts where the previous sample ended, so GNU long-name and pax headers that belong
    to it are inside its range. Payload hashes are not computed (left empty).
    """
    name = location if name is None else name
    stream = open_byte_range(location, 0, None) if is_url(location) else None
    records = []
    try:
        current = None  # [key, start, end, members, label, payload offset, payload size]
        sample_end = 0
        for member in iter_tar_members(location, stream=stream):
            key, ext = split_key(member.name)
            end = member.data_offset + len(member.data) + (-len(member.data) % BLOCK)
            if current is None or key != current[0]:
                if current is not None:
                    records.append(_scanned(name, current))
                    sample_end = current[2]
                current = [key, sample_end, end, [], -1, 0, 0, None]
            current[2] = end
            current[3].append(f"{ext}:{member.header_offset}")
            if ext in LABEL_EXTENSIONS and current[4] == -1:
                try:
                    current[4] = int(bytes(member.data).strip())
                except ValueError:
                    pass
            if ext in PAYLOAD_PREFERENCE and (current[7] is None
                                              or PAYLOAD_PREFERENCE.index(ext) < PAYLOAD_PREFERENCE.index(current[7])):
                current[5], current[6], current[7] = member.data_offset, len(member.data), ext
        if current is not None:
            records.append(_scanned(name, current))
    finally:
        if stream is not None:
            stream.close()
    return records


def _scanned(name, fields) -> SampleRecord:
    key, start, end, members, label, payload_offset, payload_size, _ = fields
    return SampleRecord(key, name, label, start, end - start, payload_offset, payload_size, None, ";".join(members))
