"""The image-folder kind: items are FolderItems (source_kinds/source.py), each file read whole, undecoded.

Its `resolve` hook takes the extracted ImageNet layout (<root>/<split>/<class>/<image>, `val` accepted for
`validation`) with torchvision ImageFolder semantics (sorted classes, sorted files, the same extensions)."""

from __future__ import annotations

import os
from pathlib import Path

from imagenet_shards.dataset_folder import find_split_folder, image_folder_samples
from imagenet_shards.loader.payloads.image import ENCODED
from imagenet_shards.loader.source_kinds.base import SourceKind
from imagenet_shards.loader.source_kinds.source import FolderItem, Source, SourceError


def _resolve(source, request):
    if isinstance(source, (list, tuple)) or not Path(str(source)).is_dir():
        return None
    folder = find_split_folder(Path(str(source)), request.split)
    if folder is None:
        return None
    try:
        classes, samples = image_folder_samples(str(folder))
    except (FileNotFoundError, OSError) as error:
        raise SourceError(f"{folder}: not an ImageNet folder: {error}") from None
    items = [FolderItem(os.path.splitext(os.path.relpath(path, folder))[0], path, label) for path, label in samples]
    return Source(FOLDER.name, f"{folder} (ImageFolder, {len(items)} images in {len(classes)} classes)",
                  [[item] for item in items], "file", classes=classes)


def _raw_samples(context, items):
    for item in items:
        try:
            with open(item.path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            yield item, item.path, item.label, None, None, f"cannot read: {error.strerror or error}"
            continue
        yield item, item.path, item.label, data, ENCODED.name, None


# FolderItems: the defaults (listed_key, listed_labels...)
FOLDER = SourceKind("folder", _raw_samples, resolve=_resolve)
