"""The converter's columnar source listing (imagenet_shards/convert/source_listing.py): its memory per sample,
its canonical order, the shuffle's order and what a worker receives."""

import hashlib
import os
import pickle
import subprocess

import pytest

from conftest import PYTHON, REPO
from imagenet_shards.convert.imagenet_source import ImageNetSourceError, open_source
from imagenet_shards.convert.source_listing import SourceSample

CLASSES = ("n01440764", "n01443537", "n01484850")


def _folder_source(root, per_class, nested=False):
    for label, wnid in enumerate(CLASSES):
        folder = root / "train" / wnid
        folder.mkdir(parents=True)
        for n in range(per_class):
            where = folder / "sub" if nested and n % 3 == 0 else folder
            where.mkdir(exist_ok=True)
            (where / f"{wnid}_{n}.JPEG").write_bytes(b"")
    return root


HELD = """
import sys, tracemalloc
from imagenet_shards.convert.imagenet_source import open_source

def held(root):
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    listing = open_source(root, ("train",)).splits["train"].samples
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return listing, grown

held(sys.argv[1])  # the first listing's one-time costs (caches, free lists)
small, small_held = held(sys.argv[2])
large, large_held = held(sys.argv[3])
print(len(small), len(large), (large_held - small_held) / (len(large) - len(small)), large.nbytes / len(large))
"""


def test_the_listing_holds_under_150_bytes_a_sample(tmp_path):
    """SourceSample objects took ~460 bytes a sample (600 MB for ImageNet); the columns ~90. Measured as
    the growth from 1,500 to 4,500 samples a class, after a first listing (the fixed part - caches,
    free lists - cancels), in a fresh interpreter: inside the whole suite's process the same
    measurement read 939 bytes a sample, alone 85 (what the earlier tests leave behind was not found)."""
    roots = [_folder_source(tmp_path / name, count) for name, count in (("warm", 1500), ("small", 1500),
                                                                         ("large", 4500))]
    result = subprocess.run([PYTHON, "-c", HELD, *map(str, roots)], capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    assert result.returncode == 0, result.stderr
    small, large, per_sample, column_bytes = result.stdout.split()
    assert (int(small), int(large)) == (3 * 1500, 3 * 4500)
    assert float(per_sample) < 150, per_sample
    assert float(column_bytes) < 150, column_bytes


def test_the_listing_is_in_class_then_source_order_and_builds_samples(tmp_path):
    root = _folder_source(tmp_path, 40, nested=True)  # os.walk lists a subfolder's files after the folder's
    listing = open_source(root, ("train",)).splits["train"].samples
    samples = list(listing)
    assert [(s.label, s.source) for s in samples] == sorted((s.label, s.source) for s in samples)
    first = samples[0]
    assert first == SourceSample("n01440764_1", 0, "n01440764", "train/n01440764/n01440764_1.JPEG",
                                 first.location, None, None)
    assert first.location.path == str(root / first.source) and first.read_bytes() == b""
    assert listing[-1] == samples[-1] and listing[len(samples) - 1] == samples[-1]


def test_a_repeated_key_is_named_with_both_files(tmp_path):
    root = _folder_source(tmp_path, 5)
    (root / "train" / CLASSES[2] / "n01440764_3.png").write_bytes(b"")
    with pytest.raises(ImageNetSourceError, match=r"train/n01440764/n01440764_3.JPEG.*same sample key"):
        open_source(root, ("train",))


def test_the_shuffle_is_the_keyed_hash_sort(tmp_path):
    """Rows in the order of sorted(samples, key=(blake2b(key=secret, data=key, 16 bytes), key)), the plan's
    definition since the first version: the same seed gives the same shards."""
    listing = open_source(_folder_source(tmp_path, 50), ("train",)).splits["train"].samples
    secret = b"7:train"
    expected = sorted(listing, key=lambda s: (hashlib.blake2b(s.key.encode(), key=secret, digest_size=16).digest(),
                                              s.key))
    assert [listing[int(row)] for row in listing.keyed_hash_order(secret)] == expected


def test_a_shard_pickles_as_its_samples(tmp_path):
    listing = open_source(_folder_source(tmp_path, 20), ("train",)).splits["train"].samples
    rows = listing.rows(listing.keyed_hash_order(b"1:train")[5:9])
    sent = pickle.loads(pickle.dumps(rows))
    assert type(sent) is tuple and list(sent) == list(rows) and len(sent) == 4
    assert len(pickle.dumps(rows)) < 4 * 400  # the four samples, not the listing
