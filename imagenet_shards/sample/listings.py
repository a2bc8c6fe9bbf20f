"""The text files beside the images, and the summary: what a converter or a test checks against.

write_listings writes the ground truth and synsets (devkit order), images.csv (one row per image,
train first, by name), quirks.json (with --quirks) and the photos' attribution; make_summary gives
sample_info.json's body. Each takes the plan and what the render loop gathered, not the images.
"""

import csv
import io
import shutil
from pathlib import Path

from imagenet_shards.fileio import atomic_write_bytes, atomic_write_json, sha256_bytes
from imagenet_shards.sample.layouts import archive_path, folder_path
from imagenet_shards.sample.names import (GROUND_TRUTH, IMAGES_CSV, PHOTO_ATTRIBUTION, QUIRKS_JSON, SYNSETS, TRAIN_DIR,
                                   VAL_DIR, ImageSpec)
from imagenet_shards.sample.photos import class_words
from imagenet_shards.sample.plan import Plan
from imagenet_shards.sample.render import QUIRK_DETAILS, RenderedImage

IMAGENET_MEAN_BYTES = 110_000  # ILSVRC2012 train: ~140 GB / 1.28M images

CSV_FIELDS = ("split", "name", "wnid", "class_index", "devkit_id", "source_photo", "crop_box", "flip",
              "quality", "subsampling", "quirk", "width", "height", "upscaled", "bytes", "sha256")


def csv_row(r: RenderedImage, wnid: str, plan: Plan) -> dict:
    """images.csv's row for one rendered image."""
    return {"split": r.spec.split, "name": r.spec.name, "wnid": wnid, "class_index": r.spec.class_index,
            "devkit_id": plan.devkit_id[r.spec.class_index], "source_photo": r.source,
            "crop_box": " ".join(f"{v:.1f}" for v in r.box), "flip": int(r.flip), "quality": r.quality,
            "subsampling": r.subsampling, "quirk": r.spec.quirk, "width": r.width, "height": r.height,
            "upscaled": int(r.upscaled), "bytes": len(r.data), "sha256": sha256_bytes(r.data)}


def _csv_bytes(rows) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode()


def _quirk_record(spec: ImageSpec, wnid: str, layouts) -> dict:
    record = {"kind": spec.quirk, "split": spec.split, "wnid": wnid, "class_index": spec.class_index,
              "name": spec.name, "detail": QUIRK_DETAILS[spec.quirk]}
    if "folder" in layouts:
        record["folder_path"] = folder_path(spec, wnid)
    if "archive" in layouts:
        record["archive_path"] = archive_path(spec, wnid)
    return record


def write_listings(out: Path, plan: Plan, rows: list, layouts, quirks: bool, photo_folder: Path) -> list:
    """Ground truth, synsets, images.csv (`rows` from csv_row, sorted here), quirks.json and the
    attribution; return the quirk records (written to quirks.json only with `quirks`)."""
    devkit_number = plan.devkit_id
    atomic_write_bytes(out / GROUND_TRUTH, "".join(f"{devkit_number[c]}\n" for c in plan.val_labels).encode())
    atomic_write_bytes(out / SYNSETS, "".join(
        f"{plan.wnids[c]} {class_words(plan.class_photos[c])}\n" for c in plan.devkit).encode())
    rows.sort(key=lambda row: (row["split"] != TRAIN_DIR, row["name"]))
    atomic_write_bytes(out / IMAGES_CSV, _csv_bytes(rows))
    quirk_records = [_quirk_record(s, plan.wnids[s.class_index], layouts) for s in plan.quirks]
    if quirks:
        atomic_write_json(out / QUIRKS_JSON, quirk_records)
    attribution = photo_folder / "ATTRIBUTION.md"
    if attribution.is_file():
        shutil.copyfile(attribution, out / PHOTO_ATTRIBUTION)
    return quirk_records


def _split_stats(items):
    """Count, mean bytes and mean size of (bytes, width, height, ...) tuples."""
    if not items:
        return {"images": 0, "mean_bytes": 0.0, "mean_width": 0.0, "mean_height": 0.0}
    return {
        "images": len(items),
        "mean_bytes": round(sum(item[0] for item in items) / len(items), 1),
        "mean_width": round(sum(item[1] for item in items) / len(items), 1),
        "mean_height": round(sum(item[2] for item in items) / len(items), 1),
    }


def make_summary(params: dict, stats: dict, photo_list, skipped_photos, plan: Plan, quirk_records) -> dict:
    """sample_info.json's body. `stats`: split -> [(bytes, width, height, source photo, upscaled)]."""
    devkit_number = plan.devkit_id
    everything = stats[TRAIN_DIR] + stats[VAL_DIR]
    sides = [side for _, width, height, _, _ in everything for side in (width, height)]
    return {
        "parameters": params,
        "splits": {split: _split_stats(items) for split, items in stats.items()},
        "all": _split_stats(everything),
        "imagenet_mean_bytes": IMAGENET_MEAN_BYTES,
        "min_side": min(sides),
        "max_side": max(sides),
        "sides_300_500": round(sum(300 <= s <= 500 for s in sides) / len(sides), 3),
        "upscaled": sum(upscaled for *_, upscaled in everything),
        "photos_found": len(photo_list),
        "photos_used": len({source for _, _, _, source, _ in everything}),
        "photos_skipped": skipped_photos,
        "shared_photos": plan.shared_photos,
        "classes": [{"index": c, "wnid": wnid, "devkit_id": devkit_number[c],
                     "photos": [p.rel for p in plan.class_photos[c]]} for c, wnid in enumerate(plan.wnids)],
        "quirks": quirk_records,
    }
