"""build_sample_dataset: the sample builder's steps in order (arguments, photos, plan, render and
write, archives, listings, summary); each step lives in the module for its job.
"""

import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from imagenet_shards.fileio import atomic_write_json
from imagenet_shards.sample.layouts import make_staging, prepare_output, write_archives, write_class
from imagenet_shards.sample.names import INFO_JSON, LAYOUTS, TRAIN_DIR, VAL_DIR, SampleDatasetError
from imagenet_shards.sample.photos import DEFAULT_PHOTOS, find_photos
from imagenet_shards.sample.plan import Plan, make_plan
from imagenet_shards.sample.listings import csv_row, make_summary, write_listings
from imagenet_shards.sample.render import render_class

PARALLEL_FROM_IMAGES = 200


def build_sample_dataset(out, classes=10, train_per_class=100, val_per_class=20, seed=0, photos=None,
                         quirks=False, layouts=LAYOUTS, workers=None) -> dict:
    """Build the sample dataset in `out` (see the package docstring); return its summary.

    `photos`: a folder searched recursively for *.jpg/*.jpeg/*.png (default: the bundled
    imagenet_shards/photos). `layouts`: any of "folder", "archive". `workers`: processes that render
    images (default: one per core, at most one per class, or 1 below PARALLEL_FROM_IMAGES images);
    the bytes do not depend on it.
    """
    started = time.perf_counter()
    out = Path(out)
    layouts = tuple(dict.fromkeys(layouts))
    _check_arguments(classes, train_per_class, val_per_class, seed, layouts)
    photo_folder = Path(photos) if photos is not None else DEFAULT_PHOTOS
    photo_list, skipped_photos = _usable_photos(photo_folder, out)
    plan = make_plan(photo_list, classes, train_per_class, val_per_class, seed, quirks)

    prepare_output(out)
    photos_label = "imagenet_shards/photos (bundled)" if photos is None else str(photos)
    params = {"classes": classes, "train_per_class": train_per_class, "val_per_class": val_per_class,
              "seed": seed, "photos": photos_label, "quirks": bool(quirks), "layouts": list(layouts)}
    atomic_write_json(out / INFO_JSON, {"builder": "imagenet_shards.sample", "complete": False, "parameters": params})
    staging = make_staging(out)
    if workers is None:  # a process pool only pays off beyond a few hundred images
        total = classes * (train_per_class + val_per_class)
        workers = min(os.cpu_count() or 1, classes) if total >= PARALLEL_FROM_IMAGES else 1
    rows, val_files, stats = _render_and_write(out, staging, plan, seed, layouts, workers)
    if "archive" in layouts:
        write_archives(out, staging, plan.wnids, val_files)
    shutil.rmtree(staging)

    quirk_records = write_listings(out, plan, rows, layouts, quirks, photo_folder)
    summary = make_summary(params, stats, photo_list, skipped_photos, plan, quirk_records)
    atomic_write_json(out / INFO_JSON, {"builder": "imagenet_shards.sample", "complete": True, **summary})
    summary["out"] = str(out)
    summary["elapsed_s"] = round(time.perf_counter() - started, 2)
    return summary


def _check_arguments(classes, train_per_class, val_per_class, seed, layouts):
    """SampleDatasetError naming the first bad argument."""
    for name, value, low in (("classes", classes, 1), ("train_per_class", train_per_class, 1),
                             ("val_per_class", val_per_class, 0), ("seed", seed, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise SampleDatasetError(f"{name} must be an integer >= {low}, got {value!r}")
    if not layouts or any(layout not in LAYOUTS for layout in layouts):
        raise SampleDatasetError(f"layouts must be a non-empty subset of {LAYOUTS}, got {layouts!r}")


def _usable_photos(photo_folder: Path, out: Path):
    """find_photos, with a warning on stderr for each unreadable photo it skipped."""
    photo_list, skipped_photos = find_photos(photo_folder, exclude=out)
    for item in skipped_photos:
        print(f"warning: skipping unreadable photo {photo_folder / item['path']}: {item['reason']}", file=sys.stderr)
    return photo_list, skipped_photos


def _render_and_write(out: Path, staging: Path, plan: Plan, seed: int, layouts, workers: int):
    """Render every class and write it to `layouts` as it arrives.

    Returns (images.csv rows, {validation file name: file holding its bytes}, split -> [(bytes,
    width, height, source photo, upscaled)]): what the later steps need, never the image data.
    """
    tasks = [(seed, [p.path for p in plan.class_photos[c]], [p.rel for p in plan.class_photos[c]], plan.specs[c])
             for c in range(len(plan.wnids))]
    rows, val_files = [], {}
    stats = {TRAIN_DIR: [], VAL_DIR: []}
    executor = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        # One class at a time, in class order, so memory holds one class's images at most.
        results = executor.map(render_class, tasks) if executor else map(render_class, tasks)
        for c, rendered in enumerate(results):
            wnid = plan.wnids[c]
            val_files.update(write_class(out, staging, wnid, rendered, layouts))
            for r in rendered:
                stats[r.spec.split].append((len(r.data), r.width, r.height, r.source, r.upscaled))
                rows.append(csv_row(r, wnid, plan))
    finally:
        if executor:
            executor.shutdown(cancel_futures=True)
    return rows, val_files, stats
