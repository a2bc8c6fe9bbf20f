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
import json
import os
import random
import shutil
import signal
import tracemalloc
import warnings

import pytest
from conftest import damage, reseal_index, run_main, tree

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


# ---------------------------------------------------------------- the hostile mode (issue 45, docs/security.md)
# A dataset written by an attacker, not damaged by chance: names with `..`, absolute paths and URLs in every file
# that holds names; claimed sizes and pixel counts at their maxima; links in its folder; a planted cache. Oracle:
# nothing written, changed or deleted outside the dataset, the cache and the staging folder (the tree listed
# before and after), Python's peak allocation under HOSTILE_PEAK, and every failure one line, an Error naming the
# file, never a traceback. Each case is one line of HOSTILE.

HOSTILE_PEAK = 256 << 20  # bytes: tracemalloc's peak (numpy's buffers included) while one case is read


def _tree(root) -> dict:
    return {path: entry for path, entry in tree(root).items() if entry[0] != "dir"}


def _reseal(dataset, edit):
    from imagenet_shards.index import write_metadata

    metadata = json.loads((dataset / "metadata.json").read_text())
    edit(metadata)
    metadata.pop("metadata_digest", None)
    write_metadata(dataset, metadata)


def _names(where, old, new):
    """metadata.json ("metadata") or the validation index ("index"): `old` becomes `new`, re-sealed."""
    def make(dataset, outside):
        new_name = new.replace("OUTSIDE", str(outside))
        if where == "index":
            index = dataset / "samples-validation.index.tsv"
            index.write_text(index.read_text().replace(old, new_name))
            reseal_index(dataset, "validation")
        else:
            _reseal(dataset, lambda m: _rename(m, old, new_name))
    return make


def _rename(node, old, new):
    """Every dict key and string value equal to `old` in metadata.json's tree becomes `new`."""
    if isinstance(node, dict):
        for key in list(node):
            value = node.pop(key)
            node[new if key == old else key] = new if value == old else _rename(value, old, new)
    elif isinstance(node, list):
        node[:] = [new if item == old else _rename(item, old, new) for item in node]
    return node


def _member_size_max(dataset, outside):
    """The first member of validation-000000.tar claims 8 GiB - 1 bytes (its header checksum made right)."""
    with open(dataset / "validation-000000.tar", "r+b") as handle:
        header = bytearray(handle.read(512))
        header[124:136] = b"77777777777\0"
        header[148:156] = b" " * 8
        header[148:156] = f"{sum(header):06o}\0 ".encode()
        handle.seek(0)
        handle.write(header)


def _pixels_max(dataset, outside):
    """The first sample's JPEG claims 65535 x 65535 (same length; its CRC32C in the index updated, re-sealed)."""
    import crc32c

    index = dataset / "samples-validation.index.tsv"
    lines = index.read_text().splitlines()
    fields = lines[1].split("\t")
    offset, size = int(fields[5]), int(fields[6])
    with open(dataset / fields[1], "r+b") as handle:
        handle.seek(offset)
        payload = bytearray(handle.read(size))
        at = 2
        while payload[at + 1] not in (0xC0, 0xC1, 0xC2):
            at += 2 + int.from_bytes(payload[at + 2:at + 4], "big")
        payload[at + 5:at + 9] = b"\xff\xff\xff\xff"
        handle.seek(offset)
        handle.write(payload)
    fields[7] = f"{crc32c.crc32c(bytes(payload)):08x}"
    lines[1] = "\t".join(fields)
    index.write_text("\n".join(lines) + "\n")
    reseal_index(dataset, "validation")


def _tfrecord_length_max(dataset, outside):
    """The first record of the first validation TFRecord claims 2^64 - 1 bytes (its length CRC made right)."""
    from imagenet_shards.formats.tfrecord import masked_crc32c

    shard = sorted(dataset.glob("validation-*-of-*[0-9]"))[0]
    with open(shard, "r+b") as handle:
        length = b"\xff" * 8
        handle.write(length + masked_crc32c(length).to_bytes(4, "little"))


def _linked_shard(dataset, outside):
    """validation-000001.tar is a link to a file outside the dataset."""
    secret = outside / "secret.tar"
    secret.write_bytes((dataset / "validation-000001.tar").read_bytes()[:1024])
    (dataset / "validation-000001.tar").unlink()
    (dataset / "validation-000001.tar").symlink_to(secret)


def _planted_cache(dataset, outside, cache):
    """Dangling links where the cache keeps its side files, and a folder link beside its own."""
    from imagenet_shards.shard_cache import dataset_key

    folder = cache / dataset_key(json.loads((dataset / "metadata.json").read_text()))
    folder.mkdir(parents=True, mode=0o700)
    for shard in ("validation-000000.tar", "validation-000001.tar"):
        for suffix in (".lock", ".pin", ".meta", f".meta.{os.getpid()}"):
            (folder / (shard + suffix)).symlink_to(outside / (shard + suffix))
    (cache / "other").symlink_to(outside, target_is_directory=True)


SHARD0, SHARD1, INDEX = "validation-000000.tar", "validation-000001.tar", "samples-validation.index.tsv"
HOSTILE = [  # (case, format, a word every reader's report holds or None, what is done to a copy)
    ("split named ../../escaped", "img", "unsafe", _names("metadata", "validation", "../../escaped")),
    ("split named by an absolute path", "img", "unsafe", _names("metadata", "train", "OUTSIDE/escaped")),
    ("shard named ../x", "img", "unsafe", _names("metadata", SHARD0, "../" + SHARD0)),
    ("shard named by an absolute path", "img", "unsafe", _names("metadata", SHARD0, "/etc/hostname")),
    ("shard named by a URL", "img", "unsafe", _names("metadata", SHARD0, "http://127.0.0.1:9/x.tar")),
    ("index named ../x", "img", "unsafe", _names("metadata", INDEX, "../samples.tsv")),
    ("index named by a URL", "img", "unsafe", _names("metadata", INDEX, "http://127.0.0.1:9/i")),
    ("index row naming an absolute path", "img", "unsafe", _names("index", SHARD0, "/etc/hostname")),
    ("index row naming ../x", "img", "unsafe", _names("index", SHARD1, "../" + SHARD1)),
    ("index row naming a URL", "img", "unsafe", _names("index", SHARD0, "http://127.0.0.1:9/x.tar")),
    ("checksum ..", "img", None, lambda d, o: _reseal(d, lambda m: m.update(checksum=".."))),
    ("checksum an absolute path", "img", None, lambda d, o: _reseal(d, lambda m: m.update(checksum=str(o)))),
    ("tar member claiming 8 GiB", "img", "truncated", _member_size_max),
    ("JPEG claiming 65535x65535 pixels", "img", "pixels", _pixels_max),
    ("TFRecord claiming 2^64 bytes", "tfrecord", "truncated", _tfrecord_length_max),
    ("a shard that is a link outside", "img", None, _linked_shard),
    ("a planted cache", "img", None, None),
]


def _hostile_read(dataset, transport, cache):
    """The loader's validation epoch (through the cache), then, locally, the validator: [one-line failures]."""
    from http_range_server import serve

    from imagenet_shards.cli.validate_dataset import main as validate
    from imagenet_shards.errors import Error
    from imagenet_shards.loader import Cache, get_data

    said = []
    server, location = serve(dataset) if transport == "http" else (None, str(dataset))
    try:
        loader = get_data(location, "validation", 4, 0, normalization="device", instance=Instance(0, 1, "fuzz"),
                          cache=Cache(cache, remote_paths=True))
        for _ in loader:
            pass
        said += [f"{s.shard}: {s.reason}" for s in loader.report.skipped]
    except Error as error:
        said.append(str(error))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    if transport == "local":
        result = run_main(validate, dataset, "--workers", 1)
        assert result.returncode in (0, 1) and "Traceback" not in result.stderr, result.stderr
    return said


@pytest.mark.parametrize("transport", ["local", "http"])
@pytest.mark.parametrize("case,fmt,word,make", HOSTILE, ids=[case for case, *_ in HOSTILE])
def test_a_hostile_dataset_writes_nothing_outside_stays_bounded_and_says_so_in_one_line(converted, tmp_path, case,
                                                                                       fmt, word, make, transport):
    dataset, cache, outside = tmp_path / "dataset", tmp_path / "cache", tmp_path / "outside"
    shutil.copytree(converted(fmt), dataset)
    outside.mkdir()
    (outside / "precious").write_text("keep")
    if make is None:
        _planted_cache(dataset, outside, cache)
    else:
        make(dataset, outside)
    before = _tree(tmp_path)
    tracemalloc.start()
    try:
        said = _hostile_read(dataset, transport, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    changed = {p for p in before.keys() | _tree(tmp_path).keys() if before.get(p) != _tree(tmp_path).get(p)}
    escaped = sorted(p for p in changed if not p.startswith(("dataset" + os.sep, "cache" + os.sep)))
    assert not escaped, f"{case}: written or deleted outside the dataset and the cache: {escaped}"
    assert peak < HOSTILE_PEAK, f"{case}: {peak / 1e6:.0f} MB allocated at the peak"
    assert all(len(line.splitlines()) == 1 for line in said), f"{case}: {said}"
    assert word is None or any(word in line for line in said), f"{case}: no reader said {word!r}: {said}"
