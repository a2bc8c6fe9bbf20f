"""`validate_dataset.py A --same-as B`: do two datasets hold the same samples?

A and B may be any formats, local or remote (anything `get_data` reads: a converted dataset, its
http(s) or s3 copy, a dataset of the reference harness), or a repartition of one
(`DIR/distributed/<N>-instances`: the union of its instances' indexes). Per split present in either:

  * the same keys (a repartition's keys dropped by its policy are named in a note, not a difference;
    its padded keys count once);
  * the same class (by name, through each class table) and, when both indexes record boxes, the same box;
  * the same pixels. With the same recorded steps (metadata.json's `<split>_transform_pipeline`), the
    payloads are byte-equal, or decode to equal pixels. Where one dataset's steps extend the other's
    (a tensor dataset's Resize(256) CenterCrop(256) over img's none), those remaining steps are applied
    to the other's decoded image (imagenet_shards.preprocess, as the converter does) and the mean absolute
    difference per channel value must be at most `LOSSY_BOUND`: a JPEG re-encoded at conversion (PNG,
    CMYK or grayscale sources, a derived resolution) differs from the pixels the tensor was made from.

Both sides are walked in key order: each side's keys are sorted once (fixed-width bytes in numpy,
from the columnar index, ~key length + 12 bytes a sample) and each sample's payload is read alone by
its shard and offset (imagenet_shards.loader's readers: one pread, or one ranged GET when remote). Memory
is the two indexes plus one sample from each side, whatever the dataset's size; the report keeps the
first `SHOWN` keys of each kind of difference and counts the rest.
"""

from __future__ import annotations

import io
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from imagenet_shards.formats import format_for_location
from imagenet_shards.formats.runs import RowReading, ShardBytes
from imagenet_shards.formats.shard_check import error
from imagenet_shards.storage import is_url
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import payload_problem
from imagenet_shards.dataset_folder import DISTRIBUTED_DIR, REPARTITION_MANIFEST, SPLITS
from imagenet_shards.loader.payloads import get_payload
from imagenet_shards.loader.source_kinds import SourceError, get_source_kind, load_own_share, resolve_source
from imagenet_shards.preprocess import apply_steps, parse_steps
from imagenet_shards.validate.report import Report, ValidationUsageError

# Mean |a - b| per uint8 channel value where steps were applied to the other's image. A JPEG stored as is
# matches exactly; one re-encoded at conversion (PNG/CMYK/grayscale source, or a derived resolution) by
# --image-quality 95 measured 0.32-2.03 on the sample dataset's quirks (CMYK the worst); a different
# image of the same size measures tens.
LOSSY_BOUND = 4.0
SHOWN = 10  # differing keys listed per kind (all are counted)
KINDS = ("missing in B", "only in B", "duplicate key", "label", "box", "pixels", "shape", "unreadable")


@dataclass
class Side:
    """One dataset as the comparison reads it: its source (imagenet_shards.loader) and index parts."""

    location: str
    source: object
    parts: list  # SampleColumns: one, or one per instance of a repartition
    padded: set = field(default_factory=set)
    dropped: list = field(default_factory=list)

    @property
    def steps(self) -> list:
        return [str(step) for step in self.source.stored_steps]


def open_side(location: str, split: str) -> Side:
    """The split of the dataset (or repartition) at `location`; SourceError/DatasetError if unusable."""
    path = Path(location)
    if not is_url(location) and path.parent.name == DISTRIBUTED_DIR and (path / REPARTITION_MANIFEST).is_file():
        count = int(path.name.split("-", 1)[0]) if path.name.split("-", 1)[0].isdigit() else 0
        source = resolve_source(str(path.parent.parent), split, instance_count=count, use_repartition=True)
        if source.repartition is None:
            raise SourceError(f"{path}: not a usable repartition of {path.parent.parent} (made for another "
                              f"version of it, or without the {split} split)")
        shares = [load_own_share(source.repartition, n) for n in range(count)]
        return Side(location, source, [share.columns for share in shares],
                    {key for share in shares for key in share.padded_keys}, list(shares[0].dropped_keys))
    source = resolve_source(location, split, instance_count=1, use_repartition=False)
    if not get_source_kind(source.kind).indexed or source.columns is None:
        raise SourceError(f"{location}: not a dataset of shards (--same-as compares converted datasets, their "
                          f"copies and repartitions)")
    return Side(location, source, [source.columns])


def sorted_keys(side: Side):
    """(keys as a numpy bytes array, part of each, row of each), sorted by key."""
    keys, parts, rows = [], [], []
    for number, columns in enumerate(side.parts):
        lengths = np.diff(columns.key_offsets)
        width = max(1, int(lengths.max()) if len(lengths) else 1)
        grid = np.zeros((len(columns), width), dtype=np.uint8)
        grid[np.repeat(np.arange(len(columns)), lengths),
             np.arange(int(columns.key_offsets[-1])) - np.repeat(columns.key_offsets[:-1], lengths)] = columns.keys
        keys.append(grid.view(f"S{width}").ravel())
        parts.append(np.full(len(columns), number, dtype=np.int32))
        rows.append(np.arange(len(columns), dtype=np.int64))
    width = max((k.dtype.itemsize for k in keys), default=1)
    joined = np.concatenate([k.astype(f"S{width}") for k in keys]) if keys else np.zeros(0, f"S{width}")
    order = np.argsort(joined, kind="stable")
    return joined[order], np.concatenate(parts)[order], np.concatenate(rows)[order]


def read_payload(side: Side, part: int, row: int):
    """(payload bytes, extension, None) of one sample, checked against its index's CRC32C, or
    (None, None, why it cannot be read)."""
    columns = side.parts[part]
    record = columns.record(row)
    source = side.source
    location = source.locate(record.shard)
    fmt = source.shard_format or format_for_location(location)
    how = RowReading(source.label_offset, source.payload)
    found = None
    for _, ext, payload, _, _, problem in fmt.read_positions(ShardBytes(location), columns, np.array([row]), how):
        found = (None, None, problem) if problem else (bytes(payload), ext, None)
        break
    if found is None:
        return None, None, "not found in its shard"
    if found[0] is not None and payload_problem(record, found[0]):
        return None, None, f"{record.shard}: {payload_problem(record, found[0])}"
    return found


def decode(payload: bytes, ext: str, layout: str):
    """An RGB PIL image of a payload (JPEG, .npy HWC/CHW, .pth CHW)."""
    from PIL import Image

    kind = get_payload(ext)
    if kind.pixels is not None:
        return Image.fromarray(kind.pixels(payload, layout))
    image = Image.open(io.BytesIO(payload))
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


@dataclass
class Tally:
    """Differences: counted per kind, the first SHOWN of each kept with what differs."""

    counts: Counter = field(default_factory=Counter)
    shown: list = field(default_factory=list)  # (split, kind, key, what)
    compared: int = 0
    byte_equal: int = 0
    worst_lossy: float = 0.0
    lossy: int = 0
    exact_after_steps: int = 0

    def add(self, split, kind, key, what):
        self.counts[(split, kind)] += 1
        if self.counts[(split, kind)] <= SHOWN:
            self.shown.append((split, kind, key, what))


class Comparison:
    """One split of A against B: the remaining steps, and the per-key check."""

    def __init__(self, split: str, a: Side, b: Side, tally: Tally):
        self.split, self.a, self.b, self.tally = split, a, b, tally
        self.same_steps = a.steps == b.steps
        self.apply_to = None  # "a" or "b": whose decoded image gets the remaining steps
        self.remaining = []
        if not self.same_steps:
            if b.steps[:len(a.steps)] == a.steps:
                self.apply_to, self.remaining = "a", parse_steps(b.steps[len(a.steps):])
            elif a.steps[:len(b.steps)] == b.steps:
                self.apply_to, self.remaining = "b", parse_steps(a.steps[len(b.steps):])
            else:
                raise ValidationUsageError(
                    f"--same-as: the {split} steps of A ({' '.join(a.steps) or 'none'}) and B "
                    f"({' '.join(b.steps) or 'none'}) differ and neither extends the other: their pixels cannot "
                    f"be compared")

    def class_name(self, side: Side, label: int):
        classes = side.source.classes
        return classes[label] if classes and 0 <= label < len(classes) else label

    def check(self, key: str, a_at, b_at) -> None:
        tally, split = self.tally, self.split
        tally.compared += 1
        (pa, ra), (pb, rb) = a_at, b_at
        ca, cb = self.a.parts[pa], self.b.parts[pb]
        name_a, name_b = self.class_name(self.a, int(ca.labels[ra])), self.class_name(self.b, int(cb.labels[rb]))
        if name_a != name_b:
            tally.add(split, "label", key, f"A's class {name_a}, B's {name_b}")
        if ca.has_boxes and cb.has_boxes and ca.box(ra) != cb.box(rb):
            tally.add(split, "box", key, f"A's box {ca.box(ra)}, B's {cb.box(rb)}")
        payload_a, ext_a, why_a = read_payload(self.a, pa, ra)
        payload_b, ext_b, why_b = read_payload(self.b, pb, rb)
        if why_a or why_b:
            tally.add(split, "unreadable", key, f"A: {why_a}" if why_a else f"B: {why_b}")
            return
        if self.same_steps and payload_a == payload_b:
            tally.byte_equal += 1
            return
        try:
            image_a = decode(payload_a, ext_a, self.a.source.tensor_layout)
            image_b = decode(payload_b, ext_b, self.b.source.tensor_layout)
            if self.apply_to == "a":
                image_a = apply_steps(self.remaining, image_a)
            elif self.apply_to == "b":
                image_b = apply_steps(self.remaining, image_b)
        except Exception as exc:  # a payload that does not decode is this sample's difference
            tally.add(split, "unreadable", key, f"does not decode: {type(exc).__name__}: {exc}")
            return
        array_a, array_b = np.asarray(image_a, dtype=np.int16), np.asarray(image_b, dtype=np.int16)
        if array_a.shape != array_b.shape:
            tally.add(split, "shape", key, f"A {array_a.shape[1]}x{array_a.shape[0]}, B {array_b.shape[1]}x"
                                           f"{array_b.shape[0]}" + (f" after {self.remaining}" if self.remaining else ""))
            return
        difference = float(np.abs(array_a - array_b).mean())
        if self.same_steps:
            if difference:
                tally.add(split, "pixels", key, f"decoded pixels differ (mean |A - B| {difference:.3f})")
            return
        tally.lossy += 1
        tally.exact_after_steps += difference == 0
        tally.worst_lossy = max(tally.worst_lossy, difference)
        if difference > LOSSY_BOUND:
            tally.add(split, "pixels", key, f"mean |A - B| {difference:.3f} after applying "
                                            f"{' '.join(map(str, self.remaining))} to {self.apply_to.upper()}, "
                                            f"bound {LOSSY_BOUND}")


def compare_split(split: str, a: Side, b: Side, tally: Tally, notes: list) -> None:
    """Walk both sides' keys in order, checking each key present in both."""
    comparison = Comparison(split, a, b, tally)
    keys_a, parts_a, rows_a = sorted_keys(a)
    keys_b, parts_b, rows_b = sorted_keys(b)
    dropped = set(b.dropped) | set(a.dropped)
    i = j = 0
    previous_a = previous_b = None
    while i < len(keys_a) or j < len(keys_b):
        key_a = keys_a[i] if i < len(keys_a) else None
        key_b = keys_b[j] if j < len(keys_b) else None
        if key_a is not None and key_a == previous_a:  # a key twice on one side
            if key_a.decode() not in a.padded:
                tally.add(split, "duplicate key", key_a.decode(), "listed twice in A")
            i += 1
            continue
        if key_b is not None and key_b == previous_b:
            if key_b.decode() not in b.padded:
                tally.add(split, "duplicate key", key_b.decode(), "listed twice in B")
            j += 1
            continue
        if key_b is None or (key_a is not None and key_a < key_b):
            if key_a.decode() not in dropped:
                tally.add(split, "missing in B", key_a.decode(), "in A, not in B")
            previous_a, i = key_a, i + 1
        elif key_a is None or key_b < key_a:
            if key_b.decode() not in dropped:
                tally.add(split, "only in B", key_b.decode(), "in B, not in A")
            previous_b, j = key_b, j + 1
        else:
            comparison.check(key_a.decode(), (int(parts_a[i]), int(rows_a[i])), (int(parts_b[j]), int(rows_b[j])))
            previous_a, previous_b, i, j = key_a, key_b, i + 1, j + 1
    if dropped:
        notes.append(f"{split}: {len(dropped)} key(s) a repartition drops by its policy are not counted as missing: "
                     f"{', '.join(sorted(dropped)[:5])}")
    if comparison.remaining:
        notes.append(f"{split}: {comparison.apply_to.upper()}'s images compared after applying "
                     f"{' '.join(map(str, comparison.remaining))} (the other's recorded steps beyond its own); bound: "
                     f"mean |A - B| <= {LOSSY_BOUND} per channel value")


def same_as(a_location: str, b_location: str, splits=None) -> Report:
    """A Report whose problems are the differences (exit 1 when any), one per key shown, and the counts."""
    started = time.perf_counter()
    report = Report(str(a_location), "same-as")
    tally = Tally()
    compared_splits = []
    for split in splits or SPLITS:
        sides = []
        for location in (a_location, b_location):
            try:
                sides.append(open_side(str(location), split))
            except (SourceError, DatasetError) as exc:
                sides.append(exc)
        missing = [n for n, side in enumerate(sides) if isinstance(side, Exception)]
        if len(missing) == 2:
            if splits:
                raise ValidationUsageError(f"--same-as: split {split}: {sides[0]}")
            continue  # neither has the split
        if missing:
            where = "AB"[missing[0]]
            report.problems.append(error("", f"split {split}: {where} cannot be read: {sides[missing[0]]}"))
            continue
        compared_splits.append(split)
        compare_split(split, sides[0], sides[1], tally, report.notes)
    if not compared_splits and not report.problems:
        raise ValidationUsageError(f"--same-as: neither {a_location} nor {b_location} has a split to compare")
    for split, kind, key, what in tally.shown:
        report.problems.append(error(split, f"{kind}: {what}", key))
    for (split, kind), count in sorted(tally.counts.items(), key=lambda item: (item[0][0], KINDS.index(item[0][1]))):
        if count > SHOWN:
            report.problems.append(error(split, f"{kind}: {count - SHOWN:,} more keys"))
    report.verdicts["Same samples"] = not report.problems
    report.stats = {
        "a": str(a_location), "b": str(b_location), "splits": compared_splits, "samples_compared": tally.compared,
        "byte_equal": tally.byte_equal, "compared_after_steps": tally.lossy,
        "exactly_equal_after_steps": tally.exact_after_steps,
        "worst_mean_abs_difference_after_steps": round(tally.worst_lossy, 4), "lossy_bound": LOSSY_BOUND,
        "differences": {f"{split} {kind}": count for (split, kind), count in tally.counts.items()},
        "seconds": round(time.perf_counter() - started, 3),
    }
    return report


def render(report: Report) -> list:
    """The lines validate_dataset.py prints for --same-as."""
    stats = report.stats
    lines = ["Same samples." if report.ok else "Datasets differ."]
    counts = Counter()
    for kind_count, count in stats.get("differences", {}).items():
        counts[kind_count] += count
    if counts:
        lines.append("differences: " + ", ".join(f"{name}: {count:,}" for name, count in counts.items()))
    lines += [problem.line() for problem in report.problems]
    lines += [f"note: {note}" for note in report.notes]
    lossy = stats.get("compared_after_steps", 0)
    lines.append(f"Compared {stats.get('samples_compared', 0):,} samples of {', '.join(stats.get('splits', []))} "
                 f"({stats.get('byte_equal', 0):,} byte-equal payloads"
                 + (f", {lossy:,} after steps, {stats['exactly_equal_after_steps']:,} of them pixel-equal: worst mean "
                    f"|A - B| {stats['worst_mean_abs_difference_after_steps']} of bound {stats['lossy_bound']}"
                    if lossy else "") + f") in {stats.get('seconds', 0):.1f} s.")
    return lines
