"""Open any dataset the loader reads, pick samples by seed, and read only those samples.

    opened = open_dataset("s3://bucket/imagenet-img")         # every split's index, nothing else
    rows = pick_rows(opened.splits["train"], 64, seed=0)      # seeded, sorted by shard and offset
    for shown in read_rows(opened.splits["train"], rows):     # one ranged read per sample
        shown.key, shown.label, shown.payload, shown.info

What a PATH may be is what `imagenet_shards.loader.source_kinds.resolve_source` accepts: a converted dataset
(local, http(s)://, s3://), a dataset of the reference harness (its tar headers are scanned once),
TF-slim TFRecords without metadata (indexed by their framing), a folder or list of tar shards,
or an extracted ImageNet folder. Memory: the split's index as columns (imagenet_shards.index.columns)
plus the samples being shown; bytes read: the index and each shown sample's byte range.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from imagenet_shards.formats import format_for_location
from imagenet_shards.errors import DatasetError
from imagenet_shards.dataset_folder import SPLITS
from imagenet_shards.loader.read import Run, iter_run, payload_extension, sample_label
from imagenet_shards.loader.source_kinds import Source, resolve_source
from imagenet_shards.storage import is_url, read_bytes

# Files beside a dataset that give a wnid its words ("n01440764 tench, Tinca tinca" per line):
# the sample dataset's and the devkit's synsets.txt, Kaggle's LOC_synset_mapping.txt, Caffe's synset_words.txt.
SYNSET_FILES = ("synsets.txt", "LOC_synset_mapping.txt", "synset_words.txt")


class InspectError(DatasetError):
    """A dataset (or a sample in it) that cannot be shown: names the file and the problem."""


@dataclass
class SplitView:
    """One split of an opened dataset: its resolved source (index as columns, or an image listing)."""

    split: str
    source: Source
    notes: list = field(default_factory=list)  # what resolving it said (scanned headers, label offsets)

    @property
    def total(self) -> int:
        return self.source.total

    def folder_items(self) -> list:
        """An image folder's items, in dataset order (row = position)."""
        return [item for group in self.source.groups for item in group]


@dataclass
class Opened:
    path: str
    splits: dict  # split -> SplitView, in SPLITS order
    synsets: dict  # wnid -> words (empty when the dataset has no synset file)


@dataclass
class Shown:
    """One sample as stored: its key, label, class, payload bytes (exact), json description, or error."""

    row: int
    key: str
    shard: str
    label: int
    payload: Optional[bytes] = None
    ext: Optional[str] = None  # "jpg", "png", "npy", "pth", or the image file's extension
    info: Optional[dict] = None  # the sample's json (converted datasets), else None
    error: Optional[str] = None
    record: Optional[object] = None  # the SampleRecord (index-backed sources)


def open_dataset(path: str, splits=SPLITS, synset_file: Optional[str] = None,
                 label_offset: Optional[int] = None) -> Opened:
    """Resolve every split of `path` that exists. Raises InspectError when none does.
    `label_offset`: of TFRecords without metadata (None: detected, as the loader does)."""
    views, problems = {}, []
    for split in splits:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                source = resolve_source(path, split, label_offset=label_offset)
            except DatasetError as error:  # SourceError and the index/metadata errors
                problems.append(str(error))
                continue
        if source.total == 0:
            problems.append(f"{path}: the {split} split holds no samples")
            continue
        views[split] = SplitView(split, source, [str(w.message) for w in caught])
    if not views:
        raise InspectError("; ".join(dict.fromkeys(problems)) or f"{path}: no split found")
    return Opened(str(path), views, read_synsets(path, synset_file))


def read_synsets(path: str, synset_file: Optional[str] = None) -> dict:
    """{wnid: words} from `synset_file`, or from the first of SYNSET_FILES found in or beside a local `path`."""
    if synset_file:
        candidates = [synset_file]
    elif is_url(str(path)):
        return {}
    else:
        root = Path(path)
        folder = root if root.is_dir() else root.parent
        candidates = [place / name for place in (folder, folder.parent) for name in SYNSET_FILES]
    for candidate in candidates:
        try:
            text = read_bytes(str(candidate)).decode("utf-8", "replace")
        except (FileNotFoundError, IsADirectoryError):
            if synset_file:
                raise InspectError(f"{candidate}: no such synset file") from None
            continue
        except OSError as error:
            raise InspectError(f"{candidate}: cannot read the synset file: {error}") from None
        words = {}
        for line in text.splitlines():
            wnid, _, rest = line.strip().partition(" ")
            if wnid:
                words[wnid] = rest.strip()
        return words
    return {}


def pick_rows(view: SplitView, count: int, seed: int) -> np.ndarray:
    """`count` distinct rows of the split drawn by `seed` (all of them when it has fewer), in reading
    order (by shard, then offset), so the samples of one shard are read together."""
    total = view.total
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(total, size=min(count, total), replace=False)) if total else np.zeros(0, np.int64)
    return rows.astype(np.int64)


def class_name(view: SplitView, label: int) -> str:
    classes = view.source.classes or []
    return classes[label] if 0 <= label < len(classes) else (str(label) if label >= 0 else "?")


def find_key(opened: Opened, key: str):
    """(SplitView, row) of the sample `key`, searching the splits in order. Raises InspectError."""
    for view in opened.splits.values():
        if view.source.columns is not None:
            rows = view.source.columns.rows_with_keys([key]).get(key)
            if rows:
                return view, rows[0]
        else:
            for row, item in enumerate(view.folder_items()):
                if item.key == key:
                    return view, row
    raise InspectError(f"{opened.path}: no sample with key {key!r} in {', '.join(opened.splits)}")


def read_rows(view: SplitView, rows) -> Iterator[Shown]:
    """Each row's sample as stored (its exact payload bytes and json): one read of its byte range."""
    source = view.source
    if source.columns is None:
        items = view.folder_items()
        for row in rows:
            yield _read_file(int(row), items[int(row)])
        return
    for row in rows:
        yield _read_record(source, int(row))


def _read_file(row: int, item) -> Shown:
    shown = Shown(row, item.key, item.path, item.label, ext=Path(item.path).suffix.lstrip(".").lower())
    try:
        with open(item.path, "rb") as handle:
            shown.payload = handle.read()
    except OSError as error:
        shown.error = f"{item.path}: cannot read: {error.strerror or error}"
    return shown


def _read_record(source: Source, row: int) -> Shown:
    columns = source.columns
    record = columns.record(row)
    location = source.locate(record.shard)
    fmt = source.shard_format or format_for_location(location)
    shown = Shown(row, record.key, record.shard, record.label, record=record)
    try:
        if fmt.records_are_byte_ranges:
            run = Run(location, record.record_offset, record.record_offset + record.record_size, (record,))
            (_, sample, error), = list(iter_run(run, source.label_offset, fmt))
            if error is not None:
                shown.error = f"{location}: sample {record.key!r}: {error}"
                return shown
        else:
            sample = fmt.read_sample(location, record, source.label_offset)
    except Exception as error:  # any format's read error is this sample's problem, named with it
        shown.error = f"{location}: sample {record.key!r}: {type(error).__name__}: {error}"
        return shown
    ext = source.payload if source.payload in sample else payload_extension(sample)
    if ext is None:
        members = ", ".join(k for k in sample if not k.startswith("__"))
        shown.error = f"{location}: sample {record.key!r} has no image payload (members: {members})"
        return shown
    shown.ext, shown.payload = ext, bytes(sample[ext])
    try:
        shown.label = sample_label(sample, record.label)
    except ValueError:
        shown.error = f"{location}: sample {record.key!r}: the class label is not an integer"
    if "json" in sample:
        try:
            shown.info = json.loads(bytes(sample["json"]))
        except ValueError:
            shown.error = f"{location}: sample {record.key!r}: its json member is not valid JSON"
    return shown
