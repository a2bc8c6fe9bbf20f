"""The image-folder kind: items are FolderItems (loader.sources), each file read whole, undecoded."""

from __future__ import annotations

from imagenet_shards.loader.payloads.image import ENCODED
from imagenet_shards.loader.source_kinds.base import SourceKind


def _raw_samples(context, items):
    for item in items:
        try:
            with open(item.path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            yield item, item.path, item.label, None, None, f"cannot read: {error.strerror or error}"
            continue
        yield item, item.path, item.label, data, ENCODED.name, None


FOLDER = SourceKind("folder", _raw_samples)  # FolderItems: the defaults (listed_key, listed_labels...)
