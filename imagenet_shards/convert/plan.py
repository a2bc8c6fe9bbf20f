"""The plan of a conversion: ConvertOptions and a listed source -> Plan (main process, deterministic).

Contract: the same options and source listing give the same Plan, whatever --workers, the instance
count, the listing order or the Python/numpy version; its `fingerprint` (sha256 over the options and
every shard's samples) is equal exactly when the output bytes are. validate_options refuses bad
options (UsageError) before anything is read.

  * order: with shuffle (the default), the samples of a split sorted by a keyed hash,
    blake2b(key=f"{seed}:{split}", data=sample key): one global permutation drawn from the
    seed, the same whatever the listing order, the Python or numpy version. Without shuffle,
    class index then source path (ImageFolder's order). The seed is drawn when not given
    and always recorded.
  * shards: consecutive runs of that order, at most --samples-per-shard samples each, and,
    with --max-shard-bytes, a new shard starts before the estimated size would pass the
    limit. The estimate comes from the listing only (never from encoding, so the plan is
    known before any worker starts and does not depend on --workers): tar headers + the
    source file size for `img` (exact for passthrough payloads, approximate for re-encoded
    ones), the exact array size for `tensor` when the steps end in a fixed size. A single
    sample larger than the limit gets a shard of its own.
  * memory: the listing is columns (imagenet_shards.convert.source_listing, ~90 bytes a sample), the
    order one int64 array, a shard a view of it; a worker receives its shard's samples only.
  * steps: canonical text; when a split has none, the format's defaults (for tensor, Resize(256)
    CenterCrop(256) for train, Resize(256) CenterCrop(224) for validation).
"""

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from imagenet_shards.convert.failures import UsageError
from imagenet_shards.convert.source_listing import ListingShards
from imagenet_shards.formats import format_names, get_format
from imagenet_shards.formats.tar import BLOCK, RECORD, padding
from imagenet_shards.pixel_limit import PIL_DEFAULT
from imagenet_shards.dataset_folder import SPLITS
from imagenet_shards.launcher import Instance
from imagenet_shards.preprocess import PreprocessError, canonical, output_size, parse_steps

DEFAULT_SAMPLES_PER_SHARD = 1024
DEFAULT_IMAGE_QUALITY = 95
DEFAULT_MAX_IMAGE_PIXELS = PIL_DEFAULT  # PIL's default Image.MAX_IMAGE_PIXELS (imagenet_shards.pixel_limit)
ON_ERROR = ("skip", "fail")


@dataclass(frozen=True)
class ConvertOptions:
    """What a conversion is asked to do: create_webdataset.py's arguments (checked by validate_options)."""

    source: Path
    target: Path
    format: str = "img"
    splits: tuple = SPLITS
    shuffle: bool = True
    seed: int | None = None
    samples_per_shard: int = DEFAULT_SAMPLES_PER_SHARD
    max_shard_bytes: int | None = None
    image_quality: int = DEFAULT_IMAGE_QUALITY
    train_steps: tuple = ()
    validation_steps: tuple = ()
    workers: int = 1
    resume: bool = False
    overwrite: bool = False
    on_error: str = "skip"
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    source_layout: str = "auto"
    instance: Instance = Instance(0, 1, "single")
    progress: bool = True
    on_published: Optional[Callable] = None  # called with each ShardRecord once its shard is published


def validate_options(options: ConvertOptions) -> None:
    """UsageError (naming the flag) for options no conversion can run with; checked before any listing."""
    if options.format not in format_names():
        raise UsageError(f"--format {options.format!r}: expected one of {', '.join(format_names())}")
    if options.samples_per_shard < 1:
        raise UsageError(f"--samples-per-shard must be at least 1, got {options.samples_per_shard}")
    if options.max_shard_bytes is not None and options.max_shard_bytes < 1:
        raise UsageError(f"--max-shard-bytes must be positive, got {options.max_shard_bytes}")
    if not 1 <= options.image_quality <= 100:
        raise UsageError(f"--image-quality must be between 1 and 100, got {options.image_quality}")
    if options.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {options.workers}")
    if options.seed is not None and not 0 <= options.seed < 2**63:
        raise UsageError(f"--seed must be between 0 and 2**63-1, got {options.seed}")
    if options.on_error not in ON_ERROR:
        raise UsageError(f"--on-error {options.on_error!r}: expected skip or fail")
    if options.max_image_pixels < 1:
        raise UsageError(f"--max-image-pixels must be positive, got {options.max_image_pixels}")
    if not options.splits or any(s not in SPLITS for s in options.splits):
        raise UsageError(f"--splits: expected one or both of {', '.join(SPLITS)}, got {list(options.splits)}")
    if len(set(options.splits)) != len(options.splits):
        raise UsageError(f"--splits lists a split twice: {list(options.splits)}")
    for split in SPLITS:
        try:
            steps_for(options, split)
        except PreprocessError as error:
            flag = "--train-preprocess-steps" if split == "train" else "--validation-preprocess-steps"
            raise UsageError(f"{flag}: {error}") from None


# ---------------------------------------------------------------- planning


def shuffle_order(samples, seed: int, split: str) -> np.ndarray:
    """One global permutation of the split (a SourceListing) from the seed: its rows sorted by
    (blake2b(key=f"{seed}:{split}", data=sample key, 16 bytes), key)."""
    return samples.keyed_hash_order(f"{seed}:{split}".encode())


def estimated_sample_bytes(sample, fmt: str, fixed_size) -> int:
    """Bytes the sample will take in a tar shard, from the listing only (see the module doc)."""
    payload = get_format(fmt).estimated_payload_bytes(sample.size or 0, fixed_size)
    info = 400 + len(sample.source) + len(sample.class_name)  # json fields: a safe bound
    return 3 * BLOCK + BLOCK + (info + padding(info)) + (payload + padding(payload))


def plan_shards(count: int, samples_per_shard: int, max_shard_bytes, estimate) -> list:
    """Split `count` ordered samples into shards: consecutive runs bounded by count and estimated bytes
    (`estimate(position)`). Returns the shards' start positions followed by `count`."""
    if max_shard_bytes is None:
        return list(range(0, count, samples_per_shard)) + [count]
    budget = max_shard_bytes - (2 * BLOCK + RECORD)
    bounds, current, current_bytes = [0], 0, 0
    for position in range(count):
        size = estimate(position)
        if current >= samples_per_shard or (current and current_bytes + size > budget):
            bounds.append(position)
            current, current_bytes = 0, 0
        current += 1
        current_bytes += size
    return bounds + [count] if count else bounds


@dataclass
class SplitConversion:
    split: str
    steps: tuple  # canonical
    shards: ListingShards  # a sequence of shards, each a sequence of SourceSample (built when read)
    ignored: list

    @property
    def samples(self) -> int:
        return sum(len(s) for s in self.shards)


@dataclass
class Plan:
    options: dict  # everything that decides the output bytes
    classes: list
    layout: str
    splits: dict  # split -> SplitConversion
    fingerprint: str = ""
    provenance: dict = field(default_factory=dict)  # written to metadata.json as it is (a parent dataset)


def steps_for(options: ConvertOptions, split: str):
    """Canonical steps for a split, with the tensor defaults (see the module doc)."""
    given = options.train_steps if split == "train" else options.validation_steps
    steps = canonical(parse_steps(list(given)))
    if not steps:
        steps = list(get_format(options.format).default_steps.get(split, ()))
    return tuple(steps)


def make_plan(options: ConvertOptions, source, seed: int) -> Plan:
    split_plans = {}
    for split in options.splits:
        steps = steps_for(options, split)
        fixed = output_size(parse_steps(list(steps)))
        samples = source.splits[split].samples  # a SourceListing: rows in canonical order
        order = shuffle_order(samples, seed, split) if options.shuffle else np.arange(len(samples))
        bounds = plan_shards(len(order), options.samples_per_shard, options.max_shard_bytes,
                             lambda at: estimated_sample_bytes(samples.sample(int(order[at])), options.format, fixed))
        split_plans[split] = SplitConversion(split, steps, ListingShards(samples, order, bounds),
                                             source.splits[split].ignored)
    recorded = {
        "format": options.format, "shuffle": options.shuffle, "seed": seed,
        "samples_per_shard": options.samples_per_shard, "max_shard_bytes": options.max_shard_bytes,
        "image_quality": options.image_quality, "max_image_pixels": options.max_image_pixels,
        "splits": list(options.splits), "steps": {split: list(p.steps) for split, p in split_plans.items()},
        "source_layout": source.layout,
    }
    plan = Plan(recorded, list(source.classes), source.layout, split_plans, provenance=source.provenance)
    plan.fingerprint = plan_fingerprint(plan)
    return plan


def plan_fingerprint(plan: Plan) -> str:
    """sha256 over the options and every shard's samples: equal fingerprints, equal output."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"options": plan.options, "classes": plan.classes}, sort_keys=True).encode())
    for split, split_plan in plan.splits.items():
        for number, shard in enumerate(split_plan.shards):
            digest.update(f"\n{split} {number}\n".encode())
            for s in shard:
                box = f"\t{s.bbox}" if s.bbox else ""  # only when there are boxes: earlier plans keep their fingerprint
                digest.update(f"{s.key}\t{s.label}\t{s.source}{box}\n".encode())
    return digest.hexdigest()
