"""The contract a source kind fulfils (see datasets/loader/source_kinds/__init__.py for the registry).

A source kind turns a plan's items into raw samples, in order, without decoding:
`raw_samples(stream, items)` yields one tuple per item,

    (item, shard, label, payload, kind, error)

  item     the plan item as given (a row of the columnar index, a FolderItem, a number...)
  shard    where it was read (named in skip reports and errors)
  label    the class index
  payload  what the payload kind `kind` decodes, or `Boxed(payload, bbox)` when the sample has a
           bounding box for the crop (only kinds with `bboxes`); None with an error
  kind     a key of datasets.loader.payloads.PAYLOADS; None with an error
  error    None, or the one-line reason this sample is bad (it is skipped or fails, per on_error)

`stream` is the loader's ImageStream; a kind reads only its `source` (the loader.sources.Source),
`columns` (the index the rows refer to: this instance's repartition share or the source's),
`verify`, `use_bbox_info` and `seed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional


@dataclass(frozen=True)
class SourceKind:
    name: str  # the `kind` of a loader.sources.Source
    raw_samples: Callable  # raw_samples(stream, items) -> iterator of raw sample tuples (above)
    bboxes: bool = False  # its samples may carry a bounding box (get_data's use_bbox_info applies)
    output_sized: bool = False  # its samples are output-sized arrays: no runtime step (resize, crop...) runs


class Boxed(NamedTuple):
    """A payload with its sample's bounding box (use_bbox_info)."""

    payload: object
    bbox: Optional[list]
