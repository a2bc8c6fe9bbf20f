"""The contract a source kind fulfils (see datasets/loader/source_kinds/__init__.py for the registry).

A source kind turns a plan's items into raw samples, in order, without decoding:
`raw_samples(context, items)` yields one tuple per item,

    (item, shard, label, payload, kind, error)

  item     the plan item as given (a row of the columnar index, a FolderItem, a number...)
  shard    where it was read (named in skip reports and errors)
  label    the class index
  payload  what the payload kind `kind` decodes, or `Boxed(payload, bbox)` when the sample has a
           bounding box for the crop (only kinds with `bboxes`); None with an error
  kind     a key of datasets.loader.payloads.PAYLOADS; None with an error
  error    None, or the one-line reason this sample is bad (it is skipped or fails, per on_error)

`context` is the `ReadContext` below: the little of the loader a kind reads, fixed when the
loader is made (workers receive it with the dataset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional


@dataclass(frozen=True)
class ReadContext:
    """What a source kind reads besides the items."""

    source: object  # the loader.sources.Source
    columns: object  # the sample index the rows refer to (this instance's repartition share or the source's), or None
    verify: bool  # check each indexed payload's CRC32C
    use_bbox_info: bool  # payloads come Boxed with their bounding box (kinds with `bboxes` only)
    seed: int

    def key_of(self, item) -> str:
        """The key of a plan item: a row of the columnar index, a folder item or a synthetic number."""
        if self.columns is not None:
            return self.columns.key(item)
        if isinstance(item, int):
            return f"{self.source.kind}-{item:09d}"  # synthetic-000000042, cifar10-000000042
        return item.key

    def keys_of(self, items) -> list:
        return [item if isinstance(item, str) else self.key_of(item) for item in items]


@dataclass(frozen=True)
class SourceKind:
    name: str  # the `kind` of a loader.sources.Source
    raw_samples: Callable  # raw_samples(context, items) -> iterator of raw sample tuples (above)
    bboxes: bool = False  # its samples may carry a bounding box (get_data's use_bbox_info applies)
    output_sized: bool = False  # its samples are output-sized arrays: no runtime step (resize, crop...) runs


class Boxed(NamedTuple):
    """A payload with its sample's bounding box (use_bbox_info)."""

    payload: object
    bbox: Optional[list]
