"""The contract a source kind fulfils (see imagenet_shards/loader/source_kinds/__init__.py for the registry).

A source kind turns a plan's items into raw samples, in order, without decoding:
`raw_samples(context, items)` yields one tuple per item,

    (item, shard, label, payload, kind, error)

  item     the plan item as given (a row of the columnar index, a FolderItem, a number...)
  shard    where it was read (named in skip reports and errors)
  label    the class index
  payload  what the payload kind `kind` decodes, or `Boxed(payload, bbox)` when the sample has a
           bounding box for the crop (only kinds with `bboxes`); None with an error
  kind     a key of imagenet_shards.loader.payloads.PAYLOADS; None with an error
  error    None, or the one-line reason this sample is bad (it is skipped or fails, per on_error)

`context` is the `ReadContext` below: the little of the loader a kind reads, fixed when the
loader is made (workers receive it with the dataset).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from imagenet_shards.loader.plan.share_plan import epoch_sequence


@dataclass(frozen=True)
class ReadContext:
    """What a source kind reads besides the items."""

    source: object  # the Source (source_kinds/source.py)
    columns: object  # the sample index the rows refer to (this instance's repartition share or the source's), or None
    verify: bool  # check each indexed payload's CRC32C
    use_bbox_info: bool  # payloads come Boxed with their bounding box (kinds with `bboxes` only)
    seed: int
    # How the plan's items come: False, runs of each shard (the shard order); True, positions in no shard
    # order (order="global": the plan's block shuffle). Told by the plan, never guessed from the rows.
    positions: bool = False


class Boxed(NamedTuple):
    """A payload with its sample's bounding box (use_bbox_info)."""

    payload: object
    bbox: Optional[list]


# -- what several kinds share (the defaults: items listed in groups, each with a key and a label)

def numbered_key(context, item) -> str:
    """The key of a numbered item (synthetic, cifar10): synthetic-000000042, cifar10-000000042."""
    return f"{context.source.kind}-{item:09d}"


def listed_key(context, item) -> str:
    return item.key


def listed_labels(context, items) -> list:
    return [item.label for item in items]


def grouped_sequence(source, seed: int, epoch: int, shuffle: bool):
    """The epoch order of a source whose items are listed in groups (folder, synthetic, cifar10)."""
    return epoch_sequence(source.groups, seed, epoch, shuffle)


def fingerprint_start(name: str, source):
    """The fingerprint's first line, the same for every kind: its name and sample count."""
    return hashlib.sha256(f"{name}\n{source.total}\n".encode())


def grouped_fingerprint(source):
    """The fingerprint of a source listed in groups: every item's key, in dataset order."""
    digest = fingerprint_start(source.kind, source)
    for group in source.groups:
        digest.update("\n".join(getattr(item, "key", str(item)) for item in group).encode())
    return digest


@dataclass(frozen=True)
class SourceKind:
    """A source kind: how its items are read, named, labelled, ordered and fingerprinted."""

    name: str  # the `kind` of a Source (source_kinds/source.py)
    raw_samples: Callable  # raw_samples(context, items) -> iterator of raw sample tuples (above)
    key: Callable = listed_key  # key(context, item) -> the sample's key (reports, ledgers, batches with_keys)
    labels: Callable = listed_labels  # labels(context, items) -> their class indexes, a list of ints (ledgers)
    # epoch_sequence(source, seed, epoch, shuffle) -> the epoch's global order of items (share_plan.py)
    epoch_sequence: Callable = grouped_sequence
    fingerprint: Callable = grouped_fingerprint  # fingerprint(source) -> hashlib digest identifying its samples
    bboxes: bool = False  # its samples may carry a bounding box (get_data's use_bbox_info applies)
    output_sized: bool = False  # its samples are output-sized arrays: no runtime step (resize, crop...) runs
    indexed: bool = False  # its items are rows of a sample index (the source's columns): a converted dataset's
    former_names: tuple = ()  # names it had before: get_source_kind maps them to it
    # resolve(source, request) -> the Source (source_kinds/source.py) a `source` argument names when it names one of
    # this kind, else None; `request` a ResolveRequest. resolve_source (__init__.py) asks them in RESOLVING's order.
    resolve: Optional[Callable] = None
    resolve_loose: Optional[Callable] = None  # the same, asked after every kind's `resolve` (a folder of loose shards)
    # stored_bytes_per_image(source) -> the mean bytes the source stores per sample (the host benchmark's figure)
    stored_bytes_per_image: Optional[Callable] = None
    # check_location(location) -> None, or a DatasetError naming what is missing: a command's usage check of the
    # location given for this kind by name (host_benchmark --data cifar10), before anything is read
    check_location: Optional[Callable] = None
