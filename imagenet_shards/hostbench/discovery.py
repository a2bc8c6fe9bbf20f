"""What the host benchmark reads: the formats it knows, and the sources found in a comparison directory.

The formats are the registry's (imagenet_shards.formats), plus the extracted image folder; a format's
stock pipeline is imagenet_shards.hostbench.stock_baselines'. Light to import (no torch): the CLI uses it to
check its arguments.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from imagenet_shards import formats as registry
from imagenet_shards.dataset_folder import find_split_folder, is_image_name
from imagenet_shards.hostbench.timing import BenchmarkError
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import read_metadata
from imagenet_shards.reference.layout import unadopted_shards
from imagenet_shards.hostbench.stock_baselines import stock_baseline_of



@dataclass(frozen=True)
class FormatEntry:
    """One on-disk format the comparison knows: how to label it and what to compare it with."""

    name: str  # metadata.json "format" value, or "folder"
    payload: str  # "jpeg" or "tensor": JPEG formats are held against the bare decode+augment ceiling
    stock_baseline: str | None  # BASELINES key of the stock pipeline that reads the same data, if any
    description: str


COMPARED_FORMATS = {
    "folder": FormatEntry("folder", "jpeg", "imagefolder", "extracted ImageNet folder (train/<class>/*.JPEG)"),
    **{fmt.name: FormatEntry(fmt.name, "jpeg" if fmt.stores_jpeg else "tensor",
                             stock.key if (stock := stock_baseline_of(fmt.name)) else None, fmt.description)
       for fmt in registry.FORMATS.values()},
}


@dataclass(frozen=True)
class BenchmarkSource:
    format: str
    path: Path
    shards: dict = field(default_factory=dict)  # split -> [shard paths] (converted formats)
    bytes_per_image: dict = field(default_factory=dict)  # split -> mean stored bytes per sample
    samples: dict = field(default_factory=dict)  # split -> samples
    metadata: dict | None = None
    name: str = ""  # row-id prefix: the format, or "format@directory" for a second source of one format

    @property
    def label(self) -> str:
        return self.format if self.name in ("", self.format) else f"{self.format} ({self.path.name})"


class NothingToCompare(BenchmarkError):
    """--compare DIR holds no dataset: a wrong path (exit 2), not bad data."""


def list_folder_images(folder: Path) -> list:
    """(path, class index) for every image under `folder`/<class>/, classes in sorted order."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    items = []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).iterdir()):
            if is_image_name(path.name) and path.is_file():
                items.append((path, label))
    return items


def folder_split_dir(root: Path, split: str) -> Path | None:
    return find_split_folder(root, split)
    return None


def folder_source(root: Path) -> BenchmarkSource:
    samples, per_image = {}, {}
    for split in ("train", "validation"):
        split_dir = folder_split_dir(root, split)
        if split_dir is None:
            continue
        items = list_folder_images(split_dir)
        samples[split] = len(items)
        per_image[split] = (sum(p.stat().st_size for p, _ in items) / len(items)) if items else 0.0
    return BenchmarkSource("folder", root, {}, per_image, samples)


def converted_source(root: Path) -> BenchmarkSource:
    unadopted = unadopted_shards(root)  # another tool's layout (imagenet_shards.reference), not adopted
    if unadopted is not None:
        return BenchmarkSource(*unadopted)
    metadata = read_metadata(root)
    shards, per_image, samples = {}, {}, {}
    for split, info in metadata.get("splits", {}).items():
        records = info.get("shards", [])
        shards[split] = [root / s["name"] for s in records]
        count = sum(int(s["samples"]) for s in records)
        samples[split] = count
        per_image[split] = sum(int(s["bytes"]) for s in records) / count if count else 0.0
    return BenchmarkSource(str(metadata["format"]), root, shards, per_image, samples, metadata)


def is_image_folder(root: Path) -> bool:
    return any(folder_split_dir(root, split) is not None for split in ("train", "validation"))


def discover_sources(directory) -> list:
    """The sources in a comparison directory, in COMPARED_FORMATS order, then unknown formats by name.

    Layout (what `make demo` writes; names are free, detection is by content):
        DIR/source/    the extracted folder: train/<class>/*.JPEG, validation/<class>/*.JPEG
        DIR/img/       a converted dataset: metadata.json with "format": "img"
        DIR/tensor/    ... "format": "tensor"
        DIR/<format>/  ... any other registered format (imagenet_shards.formats)
    DIR itself may also be the folder or a converted dataset.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise NothingToCompare(f"{directory}: not a directory (--compare expects the folder holding the source "
                             f"folder and its converted forms)")
    candidates = [directory] + sorted(p for p in directory.iterdir() if p.is_dir())
    found = []
    for path in candidates:
        if (path / METADATA_FILE).is_file():
            try:
                source = converted_source(path)
            except DatasetError as error:
                raise BenchmarkError(str(error)) from None
        elif is_image_folder(path):
            source = folder_source(path)
        else:
            continue
        found.append(source)
    if not found:
        raise NothingToCompare(
            f"{directory}: found no image folder (train/ or validation/ of class folders) and no converted "
            f"dataset ({METADATA_FILE}) in it or its subdirectories"
        )
    order = list(COMPARED_FORMATS)
    found.sort(key=lambda s: (order.index(s.format) if s.format in order else len(order), s.format))
    # The first source of a format (by directory name) carries the plain row ids the goals use;
    # further ones (another quality, other steps) get "format@directory".
    named, seen = [], set()
    for source in found:
        name = source.format if source.format not in seen else f"{source.format}@{source.path.name}"
        seen.add(source.format)
        named.append(dataclasses.replace(source, name=name))
    return named


def webdataset_shards(path, split: str):
    """The shard paths of `split` in a converted dataset (ours or the reference harness's), in
    order, or None when `path` is not one (a folder, TFRecords, a URL or a shard list)."""
    if path is None or "://" in str(path) or not (Path(path) / METADATA_FILE).is_file():
        return None
    return [str(p) for p in converted_source(Path(path)).shards.get(split, [])]


def source_bytes_per_image(data: str, path, split: str) -> float:
    """Mean stored bytes per image of the source `--data` names (0 for generated data: path None). A `data` that
    names a loader source kind (cifar10) is resolved and asked (the kind's stored_bytes_per_image)."""
    if path is None:
        return 0.0
    from imagenet_shards.loader.source_kinds import SOURCE_KINDS  # lazy: the command's usage checks stay light

    kind = SOURCE_KINDS.get(data)
    if kind is not None and kind.stored_bytes_per_image is not None:
        from imagenet_shards.loader.source_kinds import resolve_source

        return kind.stored_bytes_per_image(resolve_source(str(path), split))
    if str(path).startswith("s3://"):
        return _remote_bytes_per_image(str(path), split)
    path = Path(path)
    if (path / METADATA_FILE).is_file():
        return converted_source(path).bytes_per_image.get(split, 0.0)
    if is_image_folder(path):
        return folder_source(path).bytes_per_image.get(split, 0.0)
    return 0.0  # URLs or a list of shards: not counted (reported as 0)


def _remote_bytes_per_image(location: str, split: str) -> float:
    """A converted dataset on S3: shard bytes / samples of the split, from its metadata.json."""
    import json

    from imagenet_shards.storage import join_location, read_bytes

    try:
        entry = json.loads(read_bytes(join_location(location, METADATA_FILE)))["splits"][split]
    except (FileNotFoundError, KeyError, ValueError):
        return 0.0
    samples = sum(int(s["samples"]) for s in entry["shards"])
    return sum(int(s["bytes"]) for s in entry["shards"]) / samples if samples else 0.0


def compared_sources(directory, formats=None) -> list:
    """The sources in --compare DIR, those of `formats` (comma-separated) only; NothingToCompare (a wrong
    path or argument: exit 2) when DIR or `formats` finds none."""
    sources = discover_sources(directory)
    if formats:
        wanted = [f.strip() for f in formats.split(",") if f.strip()]
        unknown = sorted(set(wanted) - {s.format for s in sources})
        if unknown:
            raise NothingToCompare(
                f"--formats {formats}: {', '.join(unknown)} not found in {directory} "
                f"(found: {', '.join(s.format for s in sources)})")
        sources = [s for s in sources if s.format in wanted]
    return sources
