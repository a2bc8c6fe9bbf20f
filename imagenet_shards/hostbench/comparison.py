"""The format comparison: which rows to measure, measuring them in interleaved rounds, and the goals.

Rows (`plan_rows`), for a directory that holds the source folder and its converted forms
(layout: see `discovery.discover_sources`): the bare decode+augment ceiling, the
floor of each JPEG decode path the loader rows use (the loader's per-sample work alone), then
per format its stock baseline and the loader with each normalisation location (the
pipelines: see pipelines.py).

Goals (`GOALS`): "per worker" and "per core" are compared as images per CPU-second of all
processes involved, the rate of one worker that has a core to itself, which other programs
on a shared host do not distort; the wall-clock ratio is printed beside it. Compare ratios
from one run: rows are interleaved over `rounds` and the median round is reported; a goal's
ratio is the median over rounds of the two rows' ratio in each round (`round_pairs`).
torch runs one thread per process (as DataLoader workers do), set by run.py.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from dataclasses import dataclass
from typing import Callable

from imagenet_shards.hostbench.timing import combine_instances, measure_batches
from imagenet_shards.hostbench.pipelines import (AUGMENTATIONS, BASELINES, IMAGE_SIZE, augmented_loader_batches,
                                          bare_decode_augment, floor_batches, loader_batches, validation_resize)
from imagenet_shards.hostbench.discovery import COMPARED_FORMATS, folder_split_dir, list_folder_images
from imagenet_shards.loader import jpeg_crop
from imagenet_shards.loader.global_order import GlobalOrder

NORMALIZATIONS = ("host", "device")
NO_VERIFY = "-noverify"  # row id suffix of a loader row with verify=False
ORDER_GLOBAL = "-order-global"  # row id suffix of a loader row with order="global" (train)
ORDER_GLOBAL_FORMATS = ("img",)  # the formats that get it: the JPEG reference format (issue 36's goal)
AUGMENTED_FORMATS = ("img", "tensor")  # formats that get the user-transform rows (train, device normalisation)


@dataclass
class RowPlan:
    id: str
    label: str
    kind: str  # "ceiling" | "floor" | "baseline" | "loader"
    format: str
    normalization: str
    workers: int
    bytes_per_image: float
    source: str
    build: Callable  # () -> iterable of batches
    note: str = ""
    decode: str = ""  # JPEG decode: "pil" (whole image) or "crop" (the crop's region only); "" for tensors
    # () -> a context manager around the measurement yielding a dict it fills with more figures on
    # exit (e.g. the row's remote requests: hostbench.transports.observe_requests)
    observe: Callable | None = None


DEVICE_DECODE_SUFFIX = "-device-decode"  # rows of get_data(jpeg_decode="device"), on a CUDA host only


def device_decode_measurable() -> bool:
    """Device-decode rows are measured where there is a CUDA device (the CPU stand-in is for tests, not speed)."""
    import torch

    return torch.cuda.is_available()


def plan_rows(sources: list, split: str, batch_size: int, workers: int, instance, seed: int = 0,
              normalizations=NORMALIZATIONS, loader_options: dict | None = None, size: int = IMAGE_SIZE) -> list:
    """The rows to measure, in display order: ceiling, then per format its stock baseline and its loader rows.

    `size`: the output side of every row (validation resizes to 256/224 of it first). Where the
    loader decodes JPEGs' crop regions (train crops, validation's center crop), each JPEG
    format gets one more row: its device row on the whole-image PIL decode (the path before
    the region decode), side by side. With the image folder, a floor row per decode path.
    """
    resize = validation_resize(size)
    loader_options = {"image_size": size, **(loader_options or {})}
    loader_decode = loader_options.get("jpeg_decode") or jpeg_crop.decode_path()
    rows = []
    jpeg_folder = next((s for s in sources if s.format == "folder"), None)
    if jpeg_folder is not None and folder_split_dir(jpeg_folder.path, split) is not None:
        items = list_folder_images(folder_split_dir(jpeg_folder.path, split))
        share = items[instance.index :: instance.count]
        rows.append(RowPlan(
            "bare_decode_augment", "bare decode+augment, 1 process (ceiling)", "ceiling", "folder", "none", 0,
            jpeg_folder.bytes_per_image.get(split, 0.0), str(jpeg_folder.path),
            lambda share=share: bare_decode_augment(share, split, batch_size, seed, size, resize),
            "PIL open+decode+" + ("RandomResizedCrop+flip" if split == "train" else "Resize+CenterCrop")
            + " to uint8 from in-memory bytes: the per-process ceiling for JPEG formats", jpeg_crop.PIL_FULL,
        ))
        with_pil = loader_decode == jpeg_crop.CROP and "device" in normalizations
        for decode in (loader_decode, jpeg_crop.PIL_FULL) if with_pil else (loader_decode,):
            rows.append(RowPlan(
                "floor" + ("-pil" if with_pil and decode == jpeg_crop.PIL_FULL else ""),
                f"floor: the loader's image_into, {decode} decode, 1 process", "floor", "folder", "device", 0,
                jpeg_folder.bytes_per_image.get(split, 0.0), str(jpeg_folder.path),
                lambda share=share, decode=decode: floor_batches(share, split, batch_size, seed, size, resize, decode),
                "ImagePipeline.image_into of in-memory bytes into a reused uint8 batch, no loader: a JPEG loader "
                "row over it is the loader's own overhead", decode,
            ))
    for source in sources:
        entry = COMPARED_FORMATS.get(source.format)
        baseline = BASELINES.get(entry.stock_baseline) if entry and entry.stock_baseline else None
        if baseline is not None and source.name == source.format:  # once per format
            rows.append(RowPlan(
                f"baseline_{baseline.key}", baseline.label, "baseline", source.format, "host", workers,
                source.bytes_per_image.get(split, 0.0), str(source.path),
                lambda b=baseline, s=source: b.build(s, split, batch_size, workers, instance, seed=seed, size=size),
                baseline.note, jpeg_crop.PIL_FULL if entry.payload == "jpeg" else "",
            ))
        jpeg = entry is not None and entry.payload == "jpeg"
        variants = [(n, "", loader_options, loader_decode if jpeg else "") for n in normalizations]
        if jpeg and loader_decode == jpeg_crop.CROP and "device" in normalizations:
            variants.append(("device", "-pil", {**loader_options, "jpeg_decode": jpeg_crop.PIL_FULL},
                             jpeg_crop.PIL_FULL))
        if jpeg and "device" in normalizations and device_decode_measurable():
            # The JPEGs decoded on the accelerator (nvJPEG), the workers only reading and drawing crops.
            variants.append(("device", DEVICE_DECODE_SUFFIX, {**loader_options, "jpeg_decode": "device"}, "device"))
        if source.format != "folder" and "device" in normalizations and loader_options.get("verify", True):
            # The same device row without the per-sample CRC32C check: what verification costs.
            variants.append(("device", NO_VERIFY, {**loader_options, "verify": False}, loader_decode if jpeg else ""))
        if split == "train" and source.format in ORDER_GLOBAL_FORMATS and "device" in normalizations:
            # The global train order (imagenet_shards/loader/global_order.py) against today's: its block shuffle
            # reads a partition's rows out of shard order. G = this row's batch x the instances, P its default.
            order = GlobalOrder(global_batch_size=batch_size * instance.count)
            variants.append(("device", ORDER_GLOBAL, {**loader_options, "order": order},
                             loader_decode if jpeg else ""))
        for normalization, suffix, options, decode in variants:
            rows.append(RowPlan(
                f"{source.name or source.format}/{normalization}{suffix}",
                f"{source.label}, {normalization} normalisation" + (f", {decode} decode" if decode else "")
                + (", verify off" if options.get("verify", True) is False else "")
                + (", order=global" if suffix == ORDER_GLOBAL else ""),
                "loader",
                source.format, normalization, workers, source.bytes_per_image.get(split, 0.0), str(source.path),
                lambda s=source, n=normalization, o=options: loader_batches(s.path, split, batch_size, workers, n,
                                                                            instance, seed=seed, **o),
                (entry.description if entry else f"format {source.format!r}") + " via imagenet_shards.loader.get_data",
                decode,
            ))
        if split == "train" and source.format in AUGMENTED_FORMATS and "device" in normalizations:
            rows.extend(_augmented_rows(source, split, batch_size, workers, instance, seed, loader_options,
                                        loader_decode if jpeg else ""))
    return rows


def _augmented_rows(source, split, batch_size, workers, instance, seed, options, decode) -> list:
    """The loader with a user transform (get_data(transform=..., batch_transform=...)): what the
    fused path keeps and what strong augmentation and MixUp/CutMix cost, device normalisation."""
    return [RowPlan(
        f"{source.name or source.format}/device-{recipe}", f"{source.label}, device normalisation, {recipe}",
        "loader", source.format, "device", workers, source.bytes_per_image.get(split, 0.0), str(source.path),
        lambda r=recipe: augmented_loader_batches(source.path, split, batch_size, workers, "device", instance, r,
                                                  seed=seed, **options),
        text + " via imagenet_shards.loader.get_data", decode,
    ) for recipe, text in AUGMENTATIONS.items()]


def run_comparison(rows: list, *, warmup_batches: int, max_batches=None, max_seconds=None, rounds: int = 1,
                   gather=None, progress=None) -> list:
    """Measure every row `rounds` times, interleaved (row order repeated), so drift hits all rows alike.

    `gather(figures) -> [figures per instance]` collects each instance's figures (identity
    when single). Returns one dict per row: its plan, per-round and per-instance figures,
    and the headline figures of the round with the median aggregate images/s.
    """
    gather = gather or (lambda figures: [figures])
    results = {row.id: [] for row in rows}
    for round_number in range(rounds):
        for row in rows:
            if progress:
                progress(f"round {round_number + 1}/{rounds}: {row.label}")
            try:
                batches = row.build()  # outside `observe`: a loader's set-up reads (metadata, index) are not the row's
                with (row.observe() if row.observe else contextlib.nullcontext({})) as observed:
                    figures = measure_batches(batches, warmup_batches=warmup_batches, max_batches=max_batches,
                                              max_seconds=max_seconds, bytes_per_image=row.bytes_per_image,
                                              workers=row.workers)
                figures.update(observed)
                error = None
            except Exception as exc:  # one broken row must not hide the others' figures
                figures, error = None, f"{type(exc).__name__}: {exc}"
            # Drop what a failed row's traceback still holds (DataLoader iterators) before the next forks.
            gc.collect()
            gathered = gather({"figures": figures, "error": error})
            errors = [g["error"] for g in gathered if g["error"]]
            if errors:
                results[row.id].append({"error": errors[0], "instances": None})
            else:
                per_instance = [g["figures"] for g in gathered]
                results[row.id].append({"instances": per_instance, "aggregate": combine_instances(per_instance)})
    return [row_result(row, results[row.id]) for row in rows]


def row_result(row: RowPlan, rounds: list) -> dict:
    result = {
        "id": row.id, "label": row.label, "kind": row.kind, "format": row.format,
        "normalization": row.normalization, "workers": row.workers, "source": row.source, "note": row.note,
        "decode": row.decode,
    }
    good = [r for r in rounds if r.get("error") is None]
    if not good:
        result["error"] = rounds[0]["error"] if rounds else "not measured"
        return result
    good.sort(key=lambda r: r["aggregate"]["images_per_s"])
    median = good[len(good) // 2]
    headline = {k: v for k, v in median["aggregate"].items() if k != "waits_s"}
    result.update(headline)
    result["rounds_images_per_s"] = [r["aggregate"]["images_per_s"] for r in rounds if r.get("error") is None]
    # Per round, None where it failed: a goal pairs each round with its reference row's same round.
    result["by_round"] = {metric: [None if r.get("error") else r["aggregate"][metric] for r in rounds]
                          for metric in ROUND_METRICS}
    result["instances"] = [{k: v for k, v in m.items() if k != "waits_s"} for m in median["instances"]]
    failed = [r["error"] for r in rounds if r.get("error")]
    if failed:
        result["failed_rounds"] = failed
    return result


# ---------------------------------------------------------------- goals


@dataclass(frozen=True)
class Goal:
    name: str
    row: str
    reference: str
    metric: str  # decides met / not met
    threshold: float
    text: str
    also: str  # a second ratio, printed for context
    splits: tuple = ()  # the splits it is defined for; () = every split


METRIC_UNITS = {"images_per_s": "img/s", "images_per_cpu_s": "img/CPU-s", "images_per_s_per_worker": "img/s/worker",
                "mb_per_s": "MB/s"}

# "Per worker" and "per core" are both measured as images per CPU-second of every process
# involved (main + workers): that is the rate of one worker that has a core to itself, and
# it does not depend on how many cores other programs on the host take meanwhile. The
# wall-clock per-worker ratio is printed beside it.
# "The JPEG pipeline": the first JPEG format present, in registry order, then the image folder.
JPEG_DEVICE_ROWS = "|".join(f"{name}/device" for name, entry in COMPARED_FORMATS.items() if entry.payload == "jpeg"
                            and name != "folder") + "|folder/device"
GOALS = (
    Goal("jpeg_vs_bare", JPEG_DEVICE_ROWS, "bare_decode_augment", "images_per_cpu_s", 0.90,
         "JPEG train pipeline (device normalisation) per worker >= 90% of bare decode+augment",
         "images_per_s_per_worker", ("train",)),
    Goal("jpeg_crop_decode_vs_bare", JPEG_DEVICE_ROWS, "bare_decode_augment",
         "images_per_cpu_s", 1.30,
         "JPEG train pipeline (device normalisation, default decode) per worker >= 1.3x bare decode+augment "
         "(issue 14; 2x at 128 px)", "images_per_s_per_worker", ("train",)),
    Goal("jpeg_vs_imagefolder", JPEG_DEVICE_ROWS, "baseline_imagefolder", "images_per_s", 1.40,
         "JPEG train pipeline (device normalisation) >= 1.4x torchvision ImageFolder (same workers)",
         "images_per_cpu_s", ("train",)),
    Goal("tensor_vs_stock_npy", "tensor/device", "baseline_webdataset_npy", "images_per_cpu_s", 3.0,
         "tensor format (device normalisation) >= 3x stock webdataset .npy per core", "images_per_s"),
    # Issue 12: checking every sample's CRC32C costs <= 2% (img) / 5% (tensor) of loader CPU per image.
    Goal("img_verify_cost", "img/device", "img/device" + NO_VERIFY, "images_per_cpu_s", 0.98,
         "img loader with CRC32C verification >= 98% of it without, per CPU-second", "images_per_s"),
    Goal("tensor_verify_cost", "tensor/device", "tensor/device" + NO_VERIFY, "images_per_cpu_s", 0.95,
         "tensor loader with CRC32C verification >= 95% of it without, per CPU-second", "images_per_s"),
    # Issue 21: a user transform that begins with RandomResizedCrop + flip keeps the fused decode;
    # issue 32: as fast as the built-in recipe (the native resize of the cut, the CPU generator alone seeded).
    Goal("jpeg_user_transform_fused", "img/device-tv-rrc-flip", "img/device", "images_per_cpu_s", 0.97,
         "img loader with a torchvision RandomResizedCrop + flip transform >= 97% of its built-in recipe, "
         "per CPU-second", "images_per_s"),
    # Issue 23: the loader's own overhead (reading, index, CRC32C, batching, IPC) <= 5% of its floor,
    # and validation's fused decode >= 1.4x the whole-image path it replaced ("{row}": the same format).
    Goal("jpeg_loader_vs_floor", JPEG_DEVICE_ROWS, "floor", "images_per_cpu_s", 0.95,
         "JPEG pipeline (device normalisation) >= 95% of its floor (the same image_into, 1 process, no loader) "
         "per CPU-second", "images_per_s"),
    # Issue 36: the global train order (block-shuffled partitions) costs <= 5% against today's order.
    Goal("img_global_order_cost", "img/device" + ORDER_GLOBAL, "img/device", "images_per_cpu_s", 0.95,
         "img loader in order=global >= 95% of today's order, per CPU-second", "images_per_s", ("train",)),
    Goal("jpeg_validation_fused_vs_pil", JPEG_DEVICE_ROWS, "{row}-pil", "images_per_cpu_s", 1.40,
         "JPEG validation pipeline (device normalisation, fused decode) >= 1.4x its whole-image PIL path per "
         "CPU-second", "images_per_s", ("validation",)),
)


ROUND_METRICS = ("images_per_s", "images_per_cpu_s")


def round_pairs(row: dict, reference: dict, metric: str) -> list:
    """(row, reference) figures of each round both measured. A goal's ratio is the median of these
    pairs' ratios: the two rows of one round ran minutes apart at most, so the host's drift between
    rounds (±7% here) cancels, as it does not in the ratio of each row's median round."""
    mine, theirs = row.get("by_round", {}).get(metric), reference.get("by_round", {}).get(metric)
    if not mine or not theirs or len(mine) != len(theirs):
        return []
    return [(a, b) for a, b in zip(mine, theirs) if a is not None and b is not None and b > 0]


def evaluate_goals(results: list, split: str) -> list:
    by_id = {r["id"]: r for r in results}
    evaluated = []
    for goal in GOALS:
        # The first JPEG format present stands for "the JPEG pipeline" (img, else folder, ...).
        candidates = [r for r in goal.row.split("|") if r in by_id] or [goal.row.split("|")[0]]
        reference_id = goal.reference.format(row=candidates[0])
        row, reference = by_id.get(candidates[0]), by_id.get(reference_id)
        entry = {"goal": goal.name, "text": goal.text, "row": candidates[0], "reference": reference_id,
                 "metric": goal.metric, "threshold": goal.threshold}
        if goal.splits and split not in goal.splits:
            entry.update(status="not measured", why=f"defined for --split {' or '.join(goal.splits)}")
        elif row is None or reference is None or "error" in row or "error" in reference:
            missing = [name for name, r in ((candidates[0], row), (reference_id, reference))
                       if r is None or "error" in r]
            entry.update(status="not measured", why=f"row(s) {', '.join(missing)} missing or failed")
        else:
            ratio_of_medians = row[goal.metric] / reference[goal.metric]
            pairs = round_pairs(row, reference, goal.metric)
            ratio = statistics.median(a / b for a, b in pairs) if pairs else ratio_of_medians
            entry.update(value=row[goal.metric], reference_value=reference[goal.metric], ratio=ratio,
                         status="met" if ratio >= goal.threshold else "not met")
            if pairs:
                entry.update(rounds_paired=len(pairs), ratio_of_medians=ratio_of_medians)
            if row.get(goal.also) and reference.get(goal.also):
                entry.update(also_metric=goal.also, also_ratio=row[goal.also] / reference[goal.also])
        evaluated.append(entry)
    return evaluated
