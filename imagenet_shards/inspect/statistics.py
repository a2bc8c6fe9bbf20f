"""What a dataset holds, as numbers: from its index (every sample) and from a seeded sample of it.

From the index, for every sample at no cost beyond reading it: samples, shards, bytes, per-class
counts (min / median / max, the rarest classes), encoded payload size percentiles.
From the samples read (`--sample N`, seeded): stored resolution percentiles and the quirks found
(the sample json's `quirks` where the converter recorded the source's; otherwise what the stored
image's header says: grayscale, CMYK, PNG under a .jpg name, other modes), counted. An image folder
has no index: its per-class counts come from the listing, its sizes from the files sampled.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Optional

import numpy as np

from imagenet_shards.inspect.reading import SplitView, Shown, class_name

PERCENTILES = (0, 5, 50, 95, 100)
RAREST = 5
JPEG_NAMES = ("jpg", "jpeg")


def percentiles(values) -> Optional[dict]:
    """{"p0": ..., "p5": ..., "p50": ..., "p95": ..., "p100": ..., "mean": ...} of `values`, None when empty."""
    values = np.asarray(values, dtype=np.float64)
    if not len(values):
        return None
    points = np.percentile(values, PERCENTILES)
    result = {f"p{p}": round(float(v), 1) for p, v in zip(PERCENTILES, points)}
    result["mean"] = round(float(values.mean()), 1)
    return result


def index_statistics(view: SplitView, synsets: dict, shown=()) -> dict:
    """A split's figures from its index (or an image folder's listing). Labels the index does not
    hold (TFRecords without metadata: read with each record) are counted over the samples `shown`."""
    source = view.source
    if source.columns is not None:
        columns = source.columns
        labels = columns.labels
        shards = len(np.unique(columns.shard_ids))
        sizes = columns.payload_sizes
        stored_bytes = _shard_bytes(view) or int(columns.record_sizes.sum())
    else:
        labels = np.array([item.label for item in view.folder_items()], dtype=np.int64)
        shards, sizes, stored_bytes = 0, None, None
    counted_from = "index (every sample)" if source.columns is not None else "listing (every image)"
    if len(labels) and (labels < 0).all() and shown:
        labels = np.array([item.label for item in shown if item.error is None], dtype=np.int64)
        counted_from = f"the {len(labels)} samples read"
    known = labels[labels >= 0]
    classes = len(source.classes) if source.classes else (int(known.max()) + 1 if len(known) else 0)
    counts = np.bincount(known, minlength=classes) if len(known) else np.zeros(0, np.int64)
    present = counts[counts > 0]
    rare = np.argsort(counts, kind="stable")[:RAREST] if len(counts) else []
    return {
        "samples": int(view.total),
        "unlabelled": int((view_labels(view) < 0).sum()),
        "shards": shards,
        "bytes": stored_bytes,
        "classes": classes,
        "classes_present": int(len(present)),
        "per_class": {"min": int(counts.min()) if len(counts) else 0,
                      "median": float(np.median(counts)) if len(counts) else 0.0,
                      "max": int(counts.max()) if len(counts) else 0},
        "rarest": [_class_entry(view, synsets, int(c), int(counts[c])) for c in rare],
        "class_counts": counts.tolist(),
        "class_counts_from": counted_from,
        "payload_bytes": percentiles(sizes) if sizes is not None else None,
        "payload_bytes_from": "index (every sample)" if sizes is not None else "the files sampled",
    }


def view_labels(view: SplitView) -> np.ndarray:
    if view.source.columns is not None:
        return view.source.columns.labels
    return np.array([item.label for item in view.folder_items()], dtype=np.int64)


def _shard_bytes(view: SplitView) -> Optional[int]:
    """The split's shard bytes as metadata.json records them (converted datasets), else None."""
    metadata = view.source.metadata or {}
    entry = (metadata.get("splits") or {}).get(view.split)
    if not entry:
        return None
    return sum(int(shard["bytes"]) for shard in entry.get("shards", []))


def _class_entry(view, synsets, label, count) -> dict:
    name = class_name(view, label)
    return {"label": label, "class": name, "words": synsets.get(name, ""), "samples": count}


def describe_image(shown: Shown, tensor_layout: str = "HWC") -> dict:
    """{width, height, format, mode} of a stored payload, read from its header only (no decode of
    the pixels for encoded images); raises what the decoder raises."""
    from imagenet_shards.loader.payloads import get_payload

    kind = get_payload(shown.ext)
    if kind.pixels is not None:  # stored pixels (.npy, .pth)
        height, width = kind.pixels(shown.payload, tensor_layout).shape[:2]
        return {"width": int(width), "height": int(height), "format": shown.ext.upper(), "mode": "RGB"}
    from PIL import Image

    with Image.open(io.BytesIO(shown.payload)) as image:
        return {"width": image.width, "height": image.height, "format": image.format, "mode": image.mode}


def stored_quirks(shown: Shown, header: dict) -> list:
    """The source's quirks the converter recorded (sample json), else those the stored header shows."""
    if shown.info is not None and ("quirks" in shown.info or "converted" in shown.info):
        return list(shown.info.get("quirks") or ())
    quirks = []
    if (shown.ext or "").lower() in JPEG_NAMES and header["format"] not in ("JPEG", "MPO"):
        quirks.append(f"{(header['format'] or 'unknown').lower()}_as_jpeg")
    if header["mode"] == "CMYK":
        quirks.append("cmyk")
    elif header["mode"] in ("L", "LA", "1", "I", "I;16"):
        quirks.append("grayscale")
    elif header["mode"] not in ("RGB",):
        quirks.append(f"mode_{header['mode']}")
    return quirks


def sample_statistics(view: SplitView, shown: list) -> dict:
    """Resolutions and quirks of the samples read (Shown), and which of them could not be read."""
    widths, heights, sizes = [], [], []
    quirks = Counter()
    examples = {}
    unreadable = []
    for item in shown:
        if item.error is not None:
            unreadable.append({"key": item.key, "problem": item.error})
            continue
        sizes.append(len(item.payload))
        try:
            header = describe_image(item, view.source.tensor_layout)
        except Exception as error:  # any decoder's complaint is this sample's problem
            unreadable.append({"key": item.key, "problem": f"{type(error).__name__}: {error}"})
            continue
        widths.append(header["width"])
        heights.append(header["height"])
        for quirk in stored_quirks(item, header):
            quirks[quirk] += 1
            examples.setdefault(quirk, item.key)
    return {
        "sampled": len(shown),
        "width": percentiles(widths),
        "height": percentiles(heights),
        "resolutions": list(zip(widths, heights)),
        "sampled_payload_bytes": percentiles(sizes),
        "sampled_sizes": sizes,
        "quirks": {name: {"count": count, "example": examples[name]} for name, count in quirks.most_common()},
        "unreadable": unreadable,
    }
