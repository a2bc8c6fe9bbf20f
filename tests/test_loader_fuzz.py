"""A seeded fuzz of what the loader reads, for every format (issue 35): each trial damages one file of a
converted dataset's validation split (a shard, its .tfindex, the sample index, metadata.json) at a
seeded byte position, and reads the split with get_data.

The oracle: the loader's output (key, label and a digest of the pixels of every sample) compared with
the undamaged dataset's. A trial passes when the damage is named (an error naming the file, or the
damaged samples skipped and reported with the shard's name, or a warning naming the file) or the
output is unchanged. It fails on an error that does not name the file (a traceback for the user), a
hang, or a changed output with no word. The validator's own fuzz is in test_metadata_digest.py.
"""

import hashlib
import random
import shutil
import signal
import warnings

import pytest
from conftest import damage

from imagenet_shards.launcher import Instance

TRIALS = 24  # per format: every file of the split at least once, then drawn; ~0.1-0.3 s a trial


def _read(dataset):
    """[(key, label, sha256 of the pixels)], [skip reasons with their shard], [warning texts]."""
    from imagenet_shards.loader import ValidationCrop, get_data

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = get_data(str(dataset), "validation", 4, 0, normalization="device",
                          transform=ValidationCrop(image_size=32), with_keys=True, instance=Instance(0, 1, "fuzz"))
        samples = []
        for images, labels, keys in loader:
            for image, label, key in zip(images, labels.tolist(), keys):
                samples.append((key, label, hashlib.sha256(image.contiguous().numpy().tobytes()).hexdigest()))
    skipped = [f"{s.shard}: {s.reason}" for s in loader.report.skipped]
    return samples, skipped, [str(w.message) for w in caught]


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


@pytest.mark.parametrize("fmt", ["img", "tensor", "tfrecord", "lmdb"])
def test_damage_to_any_file_the_loader_reads_is_named_or_changes_nothing(converted, tmp_path, fmt):
    source = converted(fmt)
    reference, skipped, _ = _read(source)
    assert reference and not skipped
    files = sorted(p.name for p in source.iterdir() if p.name.startswith(("validation", "samples-validation"))
                   or p.name == "metadata.json")
    rng = random.Random(f"fuzz-{fmt}")
    failures = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for trial in range(TRIALS):
            dataset = tmp_path / f"trial-{trial}"
            shutil.copytree(source, dataset)
            name = files[trial % len(files)] if trial < len(files) else rng.choice(files)
            what = damage(dataset / name, rng)
            signal.alarm(60)  # a hang, not a timing: a trial takes well under a second
            try:
                samples, skipped, warned = _read(dataset)
            except _Hang:
                failures.append(f"{what}: the loader hung")
                continue
            except Exception as error:  # noqa: BLE001 - the oracle judges every exception
                if name not in str(error):
                    failures.append(f"{what}: {type(error).__name__} not naming the file: {error}")
                continue
            finally:
                signal.alarm(0)
            named = any(name in text for text in skipped + warned)
            if samples != reference and not named:
                failures.append(f"{what}: the output changed with no word ({len(samples)} samples, "
                                f"{sum(a != b for a, b in zip(samples, reference))} differ; skipped {skipped})")
            shutil.rmtree(dataset)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert not failures, "\n".join(failures)
