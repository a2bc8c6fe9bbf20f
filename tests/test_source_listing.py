"""The converter's columnar source listing (datasets/convert/source_listing.py): its memory per sample,
its canonical order, the shuffle's order and what a worker receives."""

import hashlib
import pickle
import tracemalloc

import pytest

from datasets.convert.imagenet_source import ImageNetSourceError, open_source
from datasets.convert.source_listing import SourceSample

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


def _held(root):
    """(listing, bytes the listing of `root` holds once made), as tracemalloc counts them: only blocks
    allocated under datasets/convert/ (another thread of this process - a test server, pytest-xdist's
    channel - may allocate meanwhile)."""
    tracemalloc.start(8)
    try:
        listing = open_source(root, ("train",)).splits["train"].samples
        ours = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, "*/datasets/convert/*",
                                                                              all_frames=True)])
        return listing, sum(stat.size for stat in ours.statistics("filename"))
    finally:
        tracemalloc.stop()


def test_the_listing_holds_under_150_bytes_a_sample(tmp_path):
    """SourceSample objects took ~460 bytes a sample (600 MB for ImageNet); the columns ~90. Measured as
    the growth from 1,500 to 4,500 samples a class, after a first listing (the fixed part - caches,
    free lists - cancels)."""
    _held(_folder_source(tmp_path / "warm", 1500))  # the first listing's one-time costs (caches, free lists)
    small, small_held = _held(_folder_source(tmp_path / "small", 1500))
    large, large_held = _held(_folder_source(tmp_path / "large", 4500))
    assert (len(small), len(large)) == (3 * 1500, 3 * 4500)
    per_sample = (large_held - small_held) / (len(large) - len(small))
    assert per_sample < 150, per_sample
    assert large.nbytes / len(large) < 150, large.nbytes / len(large)


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
