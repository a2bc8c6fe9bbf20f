"""The plan of a sample: class ids, devkit order, photos per class, and every image's spec.

Everything the build writes follows from the plan, which depends only on the photos found and
the arguments (seed included): the classes' WordNet-like ids, the devkit permutation, train file
numbers, the validation order and where the quirks go.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from imagenet_shards.sample.names import TRAIN_DIR, VAL_DIR, VAL_VALUE_FORMAT, ImageSpec, SampleDatasetError
from imagenet_shards.sample.photos import assign_photos_to_classes, group_near_duplicates
from imagenet_shards.sample.render import QUIRK_KINDS, VAL_QUIRKS


def make_wnids(classes: int):
    """Deterministic, sorted, WordNet-looking ids ("n" + 8 digits), the same for every seed."""
    rng = np.random.default_rng(20120101)
    ids = set()
    while len(ids) < classes:
        ids.update(int(x) for x in rng.integers(1_000_000, 10_000_000, size=classes - len(ids)))
    return [f"n0{number:07d}" for number in sorted(ids)]


def devkit_order(classes: int):
    """devkit number (1-based, position in the list) -> class index; never the sorted order."""
    order = [int(c) for c in np.random.default_rng(1000).permutation(classes)]
    if classes > 1 and order == sorted(order):
        order.reverse()
    return order


def train_file_numbers(count: int, rng):
    """Unique, increasing, non-contiguous numbers like ImageNet's n01440764_10026."""
    return sorted(int(n) for n in rng.choice(np.arange(1, 10 * count + 100), size=count, replace=False))


@dataclass
class Plan:
    wnids: list
    devkit: list  # devkit number - 1 -> class index
    class_photos: list  # class index -> [Photo]
    shared_photos: bool
    specs: list  # class index -> [ImageSpec] (train first, then validation)
    val_labels: list  # validation number - 1 -> class index
    quirks: list = field(default_factory=list)  # ImageSpecs with a quirk
    devkit_id: dict = field(default_factory=dict)  # class index -> devkit number (1-based)

    def __post_init__(self):
        self.devkit_id = {c: n + 1 for n, c in enumerate(self.devkit)}


def make_plan(photos, classes, train_per_class, val_per_class, seed, quirks) -> Plan:
    """The sample's plan from `photos` (find_photos' list); SampleDatasetError when the quirks do not fit."""
    groups = group_near_duplicates(photos)
    class_photos, shared = assign_photos_to_classes(groups, classes, np.random.default_rng([seed, 1]))
    wnids = make_wnids(classes)
    rng = np.random.default_rng([seed, 2])
    # Validation: numbered 1..N, classes interleaved at random as in ILSVRC2012.
    val_labels = [int(c) for c in rng.permutation(np.repeat(np.arange(classes), val_per_class))]
    train_quirks, val_quirks = {}, {}
    if quirks:
        for k, kind in enumerate(QUIRK_KINDS):
            class_index = k % classes
            slot = k // classes
            if slot >= train_per_class:
                raise SampleDatasetError(
                    f"--quirks needs {math.ceil(len(QUIRK_KINDS) / classes)} train images per class "
                    f"with {classes} classes; got --train-per-class {train_per_class}")
            train_quirks[(class_index, slot)] = kind
        for number, kind in enumerate(VAL_QUIRKS[: len(val_labels)]):
            val_quirks[number] = kind
    specs = [[] for _ in range(classes)]
    for c, wnid in enumerate(wnids):
        for k, number in enumerate(train_file_numbers(train_per_class, rng)):
            specs[c].append(ImageSpec(TRAIN_DIR, f"{wnid}_{number}.JPEG", c, k, train_quirks.get((c, k), "")))
    seen = [0] * classes
    for number, c in enumerate(val_labels):
        name = VAL_VALUE_FORMAT.format(number + 1) + ".JPEG"
        specs[c].append(ImageSpec(VAL_DIR, name, c, seen[c], val_quirks.get(number, "")))
        seen[c] += 1
    plan = Plan(wnids, devkit_order(classes), class_photos, shared, specs, val_labels)
    plan.quirks = [s for class_specs in specs for s in class_specs if s.quirk]
    return plan
