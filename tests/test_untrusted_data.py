"""Untrusted datasets (issue 45, docs/security.md): each of the review's twelve findings, proved by a test that
failed on the code before the fix. Real servers only: the tests' http range server and SeaweedFS."""

import io
import json
import os
import struct
import shutil
from pathlib import Path

import pytest

from conftest import run_script, tree
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError, Error
from imagenet_shards.index import write_metadata
from imagenet_shards.launcher import Instance

SINGLE = Instance(0, 1, "test")




def outside(before: dict, after: dict, *allowed) -> list:
    """Paths written, changed or deleted outside the folders `allowed` (relative paths)."""
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    return sorted(p for p in changed if not any(p == a or p.startswith(a + os.sep) for a in allowed))


def hostile(converted, tmp_path, edit, fmt="img", name="dataset") -> Path:
    """A copy of a converted dataset whose metadata.json `edit(metadata)` changed, re-sealed (its digest is a
    checksum, not a signature: anyone can seal what they wrote)."""
    dataset = tmp_path / name
    shutil.copytree(converted(fmt), dataset)
    metadata = json.loads((dataset / METADATA_FILE).read_text())
    edit(metadata)
    metadata.pop("metadata_digest", None)
    write_metadata(dataset, metadata)
    return dataset


@pytest.fixture
def http_dataset():
    """serve(folder) -> base URL of `folder` on the tests' http range server (stopped after the test)."""
    from http_range_server import serve

    servers = []

    def start(folder):
        server, url = serve(folder)
        servers.append(server)
        return url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def read_split(location, split="validation", **options):
    from imagenet_shards.loader import get_data

    loader = get_data(str(location), split, 4, 0, normalization="device", with_keys=True, instance=SINGLE, **options)
    keys = [key for _, _, batch_keys in loader for key in batch_keys]
    return keys, loader


# ---------------------------------------------------------------- 1: S3 keys under a prefix


class _AwsListing:
    """A pass-through proxy in front of SeaweedFS whose listings say `ds//...` where the store holds `ds/...`:
    AWS S3 keeps such keys (and `..` ones) as given, SeaweedFS refuses `..` and folds `//`, and a GET of the
    `//` key still reaches the object (SeaweedFS folds it). Requests go upstream unchanged (SigV4 holds)."""

    def __init__(self, upstream: str, fold: bytes):
        import http.client
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        host = urlsplit(upstream)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                connection = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
                connection.request("GET", self.path, headers=dict(self.headers))
                answer = connection.getresponse()
                body = answer.read()
                if "list-type=2" in self.path:
                    body = body.replace(b"<Key>" + fold, b"<Key>" + fold.replace(b"/", b"//", 1))
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_1_validate_s3_never_writes_a_listed_key_outside_its_staging_folder(s3_server, converted, s3_bucket,
                                                                            tmp_path):
    from imagenet_shards.storage import configure_s3, put_object
    from imagenet_shards.validate.remote import validate_s3
    from test_s3 import upload_cli

    result = upload_cli(s3_server, converted("img"), f"s3://{s3_bucket}/ds")
    assert result.returncode == 0, result.stderr
    os.environ.update(s3_server.env())
    configure_s3(endpoint=s3_server.endpoint)
    escaped = tmp_path / "escaped"
    put_object(f"s3://{s3_bucket}/ds{escaped}", b"the attacker's bytes")  # listed as ds//tmp/.../escaped
    store = _AwsListing(s3_server.endpoint, f"ds{tmp_path}".encode())
    try:
        configure_s3(endpoint=store.endpoint)
        (tmp_path / "staging").mkdir()
        before = tree(tmp_path)
        report = validate_s3(f"s3://{s3_bucket}/ds", staging=str(tmp_path / "staging"))
    finally:
        store.close()
        configure_s3(endpoint=s3_server.endpoint)
    assert not escaped.exists() and outside(before, tree(tmp_path)) == []
    assert not report.verdicts["Dataset"]
    assert any("unsafe name" in p.problem and str(escaped) in p.problem for p in report.problems)


# ---------------------------------------------------------------- 2: the cache key


def test_2_a_hostile_checksum_never_names_the_cache_folder(converted, tmp_path, http_dataset):
    dataset = hostile(converted, tmp_path, lambda m: m.update(checksum=".."))
    (tmp_path / "cache").mkdir()
    cache = tmp_path / "cache" / "inner"
    before = tree(tmp_path)
    keys, _ = read_split(http_dataset(dataset), cache=cache)
    assert keys and outside(before, tree(tmp_path), os.path.join("cache", "inner")) == []


# ---------------------------------------------------------------- 3: eviction


def test_3_eviction_removes_only_its_own_entries_follows_no_link_and_counts_allocated_blocks(tmp_path):
    from imagenet_shards.shard_cache import ShardCache

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_bytes(b"x" * 10_000)
    with open(victim / "sparse.img", "wb") as handle:  # 1 TiB claimed, nothing allocated
        handle.truncate(1 << 40)
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / "link").symlink_to(victim, target_is_directory=True)
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_bytes(b"y" * 10_000)  # a folder of the user's, not the cache's
    cache = ShardCache(root, "k", {"a.tar": (1 << 30, "0" * 64)}, limit=1 << 20)
    with open(cache.path("a.tar"), "wb") as handle:  # an entry of its own: 1 GiB, 64 KiB of it allocated
        handle.write(b"z" * 65536)
        handle.truncate(1 << 30)
    stat = os.stat(cache.path("a.tar"))
    Path(f"{cache.path('a.tar')}.meta").write_text(json.dumps({"size": 1 << 30, "mtime_ns": stat.st_mtime_ns,
                                                                "sha256": "0" * 64}))
    before = tree(tmp_path)
    cache.evict()
    assert tree(tmp_path) == before  # 1 GiB claimed, 64 KiB allocated: under the limit, nothing removed
    cache.limit = 0
    cache.evict()
    assert not cache.path("a.tar").exists()  # its own entry, over the limit: removed
    assert outside(before, tree(tmp_path), os.path.join("cache", "k")) == []


# ---------------------------------------------------------------- 4: split names


@pytest.mark.parametrize("command", ["distributed_webdataset", "tar_tools"])
def test_4_a_split_named_dotdot_is_refused_in_one_line_and_writes_nothing(converted, tmp_path, command):
    evil = "../../../../../escaped"
    dataset = hostile(converted, tmp_path, lambda m: m["splits"].update({evil: m["splits"].pop("validation")}))
    before = tree(tmp_path)
    if command == "distributed_webdataset":
        result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2)
    else:
        result = run_script("tar_tools.py", "cat", dataset, "--split", "train", "--out", tmp_path / "out")
        if result.returncode == 0:  # the train split is safe; the hostile split's name reaches the output's
            result = run_script("tar_tools.py", "cat", dataset / "validation-000000.tar", "--out", tmp_path / "out2")
    assert result.returncode != 0, result.stdout
    lines = result.stderr.strip().splitlines()
    assert "unsafe name" in lines[0] and METADATA_FILE in lines[0] and evil in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert outside(before, tree(tmp_path), "out", "out2") == [] and not (tmp_path.parent / "escaped").exists()


# ---------------------------------------------------------------- 5: the pixel limit


def _claiming(jpeg: bytes, width: int, height: int) -> bytes:
    """`jpeg` with its frame header (SOF) claiming width x height."""
    data = bytearray(jpeg)
    at = 2
    while data[at] == 0xFF and data[at + 1] not in (0xC0, 0xC1, 0xC2):
        at += 2 + struct.unpack(">H", data[at + 2:at + 4])[0]
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def test_5_a_jpeg_claiming_32768_squared_is_refused_from_its_header():
    from PIL import Image

    from imagenet_shards.loader.transform import jpeg_crop
    from imagenet_shards.pixel_limit import ImageTooLargeError

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, "JPEG", progressive=True)
    bomb = _claiming(buffer.getvalue(), 32768, 32768)
    if jpeg_crop.available():
        with pytest.raises(ImageTooLargeError, match="32768x32768"):
            jpeg_crop.jpeg_size(bomb)
        with pytest.raises(ImageTooLargeError):
            jpeg_crop.decode_canvas(bomb, 1, 0, 0, 8, 8)
    from imagenet_shards.loader.transform.pipeline import open_image

    with pytest.raises(ImageTooLargeError):
        open_image(bomb)


@pytest.mark.parametrize("path", ["crop-train", "crop-validation", "pil-train", "device-train", "device-usertransform"])
def test_5_every_decode_path_skips_and_names_a_sample_over_the_pixel_limit(converted, monkeypatch, path):
    from imagenet_shards.loader import SampleError, get_data

    dataset = str(converted("img"))  # converted before the limit is set: the converter takes it too
    decode, split = path.split("-")
    options = {}
    if split == "usertransform":  # a torchvision transform: its leading crop fused in the decoder or the device
        from imagenet_shards.torchvision_cpu import transforms_v2 as v2

        split, options["transform"] = "train", v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip()])
    monkeypatch.setenv("DATASETS_MAX_IMAGE_PIXELS", "100")  # every sample image is larger
    if decode == "pil":
        monkeypatch.setenv("DATASETS_JPEG_DECODE", "pil")
    loader = get_data(dataset, split, 4, 0, normalization="device", instance=SINGLE, on_error="fail",
                      jpeg_decode="device" if decode == "device" else None, **options)
    with pytest.raises(SampleError, match=r"over the limit of 100 \(DATASETS_MAX_IMAGE_PIXELS\)") as raised:
        next(iter(loader))
    assert len(str(raised.value).splitlines()) == 1 and ".tar" in str(raised.value)


def test_5_the_converter_takes_the_same_pixel_limit(sample_source, tmp_path):
    result = run_script("create_webdataset.py", "--source", sample_source, "--target", tmp_path / "out",
                        "--format", "img", "--splits", "validation", "--on-error", "fail",
                        env={"DATASETS_MAX_IMAGE_PIXELS": "100"})
    assert result.returncode == 1 and "exceeds the limit of 100" in result.stderr, result.stderr


# ---------------------------------------------------------------- 6: a planted cache


def _cache_key_folder(dataset, root) -> Path:
    from imagenet_shards.shard_cache import dataset_key

    return Path(root) / dataset_key(json.loads((Path(dataset) / METADATA_FILE).read_text()))


def test_6_links_planted_beside_cache_entries_write_nothing_outside(converted, tmp_path, http_dataset):
    dataset = converted("img")
    root = tmp_path / "cache"
    folder = _cache_key_folder(dataset, root)
    folder.mkdir(parents=True, mode=0o700)
    os.chmod(root, 0o700)
    target = tmp_path / "target"
    target.mkdir()
    for shard in ("validation-000000.tar", "validation-000001.tar"):
        for suffix in (".lock", ".pin", f".meta.{os.getpid()}", f".part.{os.getpid()}.{os.getpid()}"):
            (folder / (shard + suffix)).symlink_to(target / (shard + suffix))  # dangling: O_CREAT would make it
    (target / "victim").write_text("keep")
    (folder / "validation-000000.tar.meta").symlink_to(target / "victim")
    reference, _ = read_split(dataset)
    before = tree(tmp_path)
    keys, _ = read_split(http_dataset(dataset), cache=root)
    assert keys == reference
    assert tree(target) == {"victim": before[os.path.join("target", "victim")]}
    assert (target / "victim").read_text() == "keep"


def test_6_a_cache_folder_that_is_a_link_or_another_users_is_refused_in_one_line(converted, tmp_path, http_dataset):
    from imagenet_shards.shard_cache import CacheError

    dataset = converted("img")
    url = http_dataset(dataset)
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _cache_key_folder(dataset, root).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(CacheError, match="not a folder") as raised:
        read_split(url, cache=root)
    assert len(str(raised.value).splitlines()) == 1 and not any(elsewhere.iterdir())
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    os.chown(shared, 12345, 12345)  # a second user's folder (the suite runs as root)
    with pytest.raises(CacheError, match="owned by uid 12345"):
        read_split(url, cache=shared)
    writable = tmp_path / "writable"
    writable.mkdir()
    os.chmod(writable, 0o777)
    with pytest.raises(CacheError, match="writable by other users"):
        read_split(url, cache=writable)


def test_6_an_entry_changed_under_the_cache_is_hashed_before_a_new_process_serves_it(converted, tmp_path,
                                                                                     http_dataset):
    dataset = converted("img")
    url = http_dataset(dataset)
    root = tmp_path / "cache"
    reference, _ = read_split(url, cache=root)
    entry = _cache_key_folder(dataset, root) / "validation-000000.tar"
    stat = entry.stat()
    with open(entry, "r+b") as handle:  # the end-of-archive padding: no sample's CRC covers it
        handle.seek(stat.st_size - 1)
        handle.write(b"\x01")
    os.utime(entry, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and mtime as the .meta records
    keys, loader = read_split(url, cache=root)  # a new ShardCache: hashes each entry once before serving it
    assert keys == reference
    assert [e["shard"] for e in loader.report.cache["refetched"]] == ["validation-000000.tar"]
    assert entry.read_bytes() == (dataset / "validation-000000.tar").read_bytes()


# ---------------------------------------------------------------- 7: uploads


def test_7_upload_sends_no_link_and_nothing_metadata_does_not_name(s3_server, converted, s3_bucket, tmp_path):
    from imagenet_shards.storage import configure_s3, list_objects
    from test_s3 import upload_cli

    dataset = tmp_path / "dataset"
    shutil.copytree(converted("img"), dataset)
    secret = tmp_path / "secret.txt"
    secret.write_text("a private key")
    (dataset / "README.txt").symlink_to(secret)
    (dataset / "notes.txt").write_text("not part of the dataset")
    result = upload_cli(s3_server, dataset, f"s3://{s3_bucket}/ds")
    assert result.returncode == 0, result.stderr
    assert "README.txt: a link: not uploaded" in result.stderr and "notes.txt: not uploaded" in result.stderr
    os.environ.update(s3_server.env())
    configure_s3(endpoint=s3_server.endpoint)
    names = set(list_objects(f"s3://{s3_bucket}/ds"))
    assert "README.txt" not in names and "notes.txt" not in names and METADATA_FILE in names


# ---------------------------------------------------------------- 8: claimed sizes


class _Raw(io.RawIOBase):
    def __init__(self, data):
        self.data, self.position = data, 0

    def readable(self):
        return True

    def readinto(self, buffer):
        count = min(len(buffer), len(self.data) - self.position)
        buffer[:count] = self.data[self.position:self.position + count]
        self.position += count
        return count


def test_8_a_claimed_tar_member_or_tfrecord_length_is_never_allocated():
    import tarfile

    from imagenet_shards.formats.tar import TarFormatError, iter_tar_members
    from imagenet_shards.formats.tfrecord import TFRecordFormatError, iter_tfrecord_records

    header = bytearray(tarfile.TarInfo("a.jpg").tobuf(format=tarfile.GNU_FORMAT))
    header[124:136] = b"\x80" + (1 << 80).to_bytes(11, "big")  # GNU base-256: ~10^24 bytes claimed
    header[148:156] = b"        "
    header[148:155] = f"{sum(header):06o}\0".encode()
    stream = io.BufferedReader(_Raw(bytes(header) + b"x" * 4096))
    with pytest.raises(TarFormatError, match="truncated"):
        list(iter_tar_members("hostile.tar", stream=stream))
    record = struct.pack("<Q", (1 << 62)) + b"\0" * 4 + b"x" * 100
    with pytest.raises(TFRecordFormatError, match="truncated"):
        list(iter_tfrecord_records("hostile.tfrecord", stream=io.BufferedReader(_Raw(record)), verify_crc=False))


# ---------------------------------------------------------------- 9: the .npy header cache


def test_9_the_npy_header_cache_is_bounded():
    import numpy as np

    from imagenet_shards.formats import npy

    for n in range(3000):
        npy.decode_npy(npy.encode_npy(np.zeros((1, n + 1), np.uint8)))
    assert len(npy._header_cache) <= 64  # 3,000 distinct headers added 185 MB before


# ---------------------------------------------------------------- 10: names in metadata.json and indexes


@pytest.mark.parametrize("name", ["/etc/hostname", "../validation-000000.tar", "http://127.0.0.1:9/x.tar"])
def test_10_a_shard_name_outside_the_dataset_is_refused_in_one_line(converted, tmp_path, name):
    def edit(metadata):
        metadata["splits"]["validation"]["shards"][0]["name"] = name

    dataset = hostile(converted, tmp_path, edit)
    with pytest.raises(DatasetError, match="unsafe name") as raised:
        read_split(dataset)
    assert METADATA_FILE in str(raised.value) and name in str(raised.value)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1 and "unsafe name" in result.stdout + result.stderr


def test_10_an_index_naming_a_shard_outside_the_dataset_is_refused(converted, tmp_path):
    from conftest import reseal_index

    from imagenet_shards.convert.dataset_source import open_dataset_source
    from imagenet_shards.convert.imagenet_source import ImageNetSourceError

    dataset = tmp_path / "dataset"
    shutil.copytree(converted("img"), dataset)
    index = dataset / "samples-validation.index.tsv"
    index.write_text(index.read_text().replace("validation-000000.tar", "/etc/hostname"))
    reseal_index(dataset, "validation")
    with pytest.raises(Error, match="unsafe shard name '/etc/hostname'") as raised:
        read_split(dataset)
    assert "samples-validation.index.tsv" in str(raised.value)
    with pytest.raises(ImageNetSourceError, match="unsafe shard name"):
        open_dataset_source(str(dataset), ["validation"])


# ---------------------------------------------------------------- 11: locations recorded and printed


def test_11_userinfo_and_query_strings_are_never_recorded_or_printed(converted, tmp_path, http_dataset):
    from imagenet_shards.safe_names import redact
    from imagenet_shards.storage import ShardReadError, read_bytes

    assert redact("https://user:pass@host:8443/a/b?X-Amz-Signature=s&X-Amz-Security-Token=t") == "https://host:8443/a/b"
    assert redact("s3://bucket/key?versionId=1") == "s3://bucket/key" and redact("/a?b") == "/a?b"
    with pytest.raises(ShardReadError) as raised:
        read_bytes("http://127.0.0.1:9/x.tar?X-Amz-Signature=SECRET")
    assert "SECRET" not in str(raised.value)
    shards = http_dataset(converted("img")) + "validation-00000{0,1}.tar?X-Amz-Signature=SECRET"
    _, loader = read_split(shards, transform=None, on_error="skip")  # a shard list of presigned-style URLs
    assert "SECRET" not in loader.report.summary() + repr(loader.report.skipped)
    url = http_dataset(converted("img")) + "validation-000000.tar?token=SECRET"
    result = run_script("tar_tools.py", "cat", url, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "SECRET" not in (tmp_path / "out" / METADATA_FILE).read_text() and "SECRET" not in result.stderr


# ---------------------------------------------------------------- 12: size caps and links on written files


def test_12_remote_metadata_and_indexes_have_size_caps(converted, http_dataset, monkeypatch):
    from imagenet_shards import storage

    url = http_dataset(converted("img"))
    monkeypatch.setattr(storage, "METADATA_READ_LIMIT", 100)
    with pytest.raises(Error, match="metadata.json: larger than 100 bytes"):
        read_split(url)
    monkeypatch.undo()
    monkeypatch.setenv("DATASETS_MAX_READ_BYTES", "1000")
    with pytest.raises(DatasetError, match="index.tsv: larger than 1,000 bytes"):
        storage.read_bytes(url + "samples-validation.index.tsv")


def test_12_a_partial_or_ledger_temporary_file_planted_as_a_link_is_never_written_through(converted, tmp_path):
    from imagenet_shards.fileio import HashingAtomicWriter, atomic_write_bytes

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out.json.partial").symlink_to(victim)
    (tmp_path / "shard.tar.partial").symlink_to(victim)
    atomic_write_bytes(tmp_path / "out.json", b"{}")
    with HashingAtomicWriter(tmp_path / "shard.tar") as writer:
        writer.write(b"data")
    assert victim.read_text() == "keep" and (tmp_path / "shard.tar").read_bytes() == b"data"
    _, loader = read_split(converted("img"))
    (tmp_path / f"ledger.json.tmp{os.getpid()}").symlink_to(victim)
    loader.write_ledger(str(tmp_path / "ledger.json"))
    assert victim.read_text() == "keep" and json.loads((tmp_path / "ledger.json").read_text())["entries"]


def test_the_index_mismatch_line_escapes_the_shards_bytes():
    from imagenet_shards.formats.webdataset import _name_mismatch

    line = _name_mismatch(memoryview(b"\x19\x1b[31m\xff" + b"\0" * 100), 0, b"key.jpg")
    assert line.isascii() and "\\x19\\x1b[31m\\xff" in line and "\x1b" not in line
