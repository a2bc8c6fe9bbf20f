"""The contact sheet: seeded samples as labelled tiles, and the class / size / resolution histograms.

Each tile shows one sample (as stored, or `as_trained`: what the split's loader pipeline makes of
it, the crop the model sees) under three short lines: its class (wnid and label), the class's words
where the dataset has a synset file, and its key. Lines are cut to fit the tile, so no text leaves
it (tests/test_plot_layout.py checks the drawn extent of every PNG a tool writes).
"""

from __future__ import annotations

import io
import math
import random
import textwrap

import numpy as np

from imagenet_shards.inspect.reading import SplitView, Shown, class_name

TILE_INCHES = 1.9
LABEL_CHARS = 30  # characters of a 7 pt line that fit a tile
TILE_PIXELS = 224
DPI = 100
MAX_BARS = 100  # more classes than this: a histogram of per-class counts instead of a bar per class


def _short(text: str, width: int = LABEL_CHARS, keep_end: bool = False) -> str:
    if len(text) <= width:
        return text
    return "…" + text[-(width - 1):] if keep_end else textwrap.shorten(text, width, placeholder="…") or text[:width - 1] + "…"


def tile_label(view: SplitView, shown: Shown, synsets: dict) -> str:
    name = class_name(view, shown.label)
    words = synsets.get(name, "")
    lines = [_short(f"{name} ({shown.label})" if name != str(shown.label) else f"label {shown.label}")]
    if words:
        lines.append(_short(words))
    lines.append(_short(shown.key, keep_end=True))
    return "\n".join(lines)


def stored_pixels(shown: Shown, tensor_layout: str = "HWC") -> np.ndarray:
    """The stored image as RGB uint8 HWC, scaled down to a tile (aspect kept)."""
    from PIL import Image

    from imagenet_shards.loader.payloads import get_payload

    kind = get_payload(shown.ext)
    if kind.pixels is not None:  # stored pixels (.npy, .pth)
        image = Image.fromarray(kind.pixels(shown.payload, tensor_layout))
    else:
        image = Image.open(io.BytesIO(shown.payload))
        image.draft("RGB", (TILE_PIXELS, TILE_PIXELS))
        image = image.convert("RGB")
    image.thumbnail((TILE_PIXELS, TILE_PIXELS))
    return np.asarray(image)


def trained_pixels(view: SplitView, shown: Shown, seed: int) -> np.ndarray:
    """What the loader's pipeline for this split makes of the sample (train: RandomResizedCrop + flip)."""
    from imagenet_shards.loader.payloads import get_payload
    from imagenet_shards.loader.transform import ImagePipeline

    source = view.source
    pipeline, _ = ImagePipeline.build(view.split == "train", stored=source.stored_steps)
    slot = np.empty((pipeline.size, pipeline.size, 3), dtype=np.uint8)
    rng = random.Random(f"{seed}/{shown.row}")  # the loader's kind of generator; one per tile, by seed
    get_payload(shown.ext).into(pipeline, shown.payload, slot, rng, None, source)  # as the loader does
    return slot


def contact_sheet(view: SplitView, shown: list, synsets: dict, index_stats: dict, sample_stats: dict,
                  as_trained: bool = False, seed: int = 0):
    """A matplotlib figure: the tiles, then the three histograms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(1, min(8, math.ceil(math.sqrt(len(shown) * 1.5))))
    rows = max(1, math.ceil(len(shown) / columns))
    tile_height = TILE_INCHES * 1.25
    width = max(columns * TILE_INCHES, 12.0)
    figure = plt.figure(figsize=(width, rows * tile_height + 3.6), dpi=DPI, layout="constrained")
    top, bottom = figure.subfigures(2, 1, height_ratios=[rows * tile_height, 3.0])
    axes = top.subplots(rows, columns, squeeze=False)
    for axis in axes.flat:
        axis.set_axis_off()
    for axis, item in zip(axes.flat, shown):
        _draw_tile(axis, view, item, synsets, as_trained, seed)
    what = "as the train pipeline makes them" if as_trained and view.split == "train" else (
        "as the validation pipeline makes them" if as_trained else "as stored")
    top.suptitle(_short(f"{view.split}: {len(shown)} of {view.total:,} samples drawn with seed {seed}, {what}",
                        int(width * 12)), fontsize=11)
    _histograms(bottom, view, index_stats, sample_stats)
    return figure


def _draw_tile(axis, view, item, synsets, as_trained, seed):
    label = tile_label(view, item, synsets)
    problem = item.error
    if problem is None:
        try:
            pixels = trained_pixels(view, item, seed) if as_trained else stored_pixels(item, view.source.tensor_layout)
            axis.imshow(pixels)
        except Exception as error:  # a sample the decoder refuses is shown as such, named
            problem = f"{type(error).__name__}: {error}"
    if problem is not None:
        axis.text(0.5, 0.5, "\n".join(textwrap.wrap(problem, LABEL_CHARS)[:6]), ha="center", va="center",
                  fontsize=6, color="#b71c1c", transform=axis.transAxes)
    axis.set_title(label, fontsize=7, pad=2)


def _histograms(subfigure, view, index_stats, sample_stats):
    class_axis, size_axis, resolution_axis = subfigure.subplots(1, 3)
    counts = np.asarray(index_stats["class_counts"])
    if 0 < len(counts) <= MAX_BARS:
        class_axis.bar(np.arange(len(counts)), counts, color="#1f77b4", width=0.8)
        class_axis.set_xlabel("class index")
        class_axis.set_ylabel("samples")
        class_axis.set_title(f"samples per class ({len(counts)} classes)", fontsize=9)
    elif len(counts):
        class_axis.hist(counts, bins=30, color="#1f77b4")
        class_axis.set_xlabel("samples in a class")
        class_axis.set_ylabel("classes")
        class_axis.set_title(f"class sizes ({len(counts)} classes)", fontsize=9)
    sizes = view.source.columns.payload_sizes if view.source.columns is not None else sample_stats["sampled_sizes"]
    if len(sizes):
        size_axis.hist(np.asarray(sizes) / 1024.0, bins=40, color="#ff7f0e")
    size_axis.set_xlabel("stored payload, KiB")
    size_axis.set_ylabel("samples")
    source = "every sample (index)" if view.source.columns is not None else f"{len(sizes)} sampled files"
    size_axis.set_title(f"payload size, {source}", fontsize=9)
    resolutions = np.asarray(sample_stats["resolutions"] or np.zeros((0, 2)))
    if len(resolutions):
        resolution_axis.scatter(resolutions[:, 0], resolutions[:, 1], s=8, alpha=0.6, color="#2e7d32")
    resolution_axis.set_xlabel("width, px")
    resolution_axis.set_ylabel("height, px")
    resolution_axis.set_title(f"stored resolution, {len(resolutions)} sampled", fontsize=9)
    from matplotlib.ticker import MaxNLocator

    class_axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # class indexes, not 2.5
    for axis in (class_axis, size_axis, resolution_axis):
        axis.tick_params(labelsize=8)
