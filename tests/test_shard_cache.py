"""The node-local shard cache (imagenet_shards/shard_cache/, get_data(cache=...)) against the real SeaweedFS
(testing_rigs/s3_server.py), with the fault proxy (testing_rigs/fault_proxy.py, test_s3_faults' fixture) in front of it
counting every GET by key."""

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import torch

from conftest import PYTHON, REPO, run_script
from imagenet_shards import storage
from imagenet_shards.index import read_metadata
from imagenet_shards.index import read_sample_index
from imagenet_shards.launcher import Instance
from imagenet_shards.loader import Cache, Order, get_data
from imagenet_shards.shard_cache import CacheError, ShardCache, parse_size
from test_s3 import upload_cli
from test_s3_faults import proxy  # noqa: F401  (the fault proxy in front of the session server, as the fixture)

SINGLE = Instance(0, 1, "test")
OPTIONS = {"normalization": "device", "with_keys": True}


def upload(server, local, target, *args):
    result = upload_cli(server, local, target, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return target


@pytest.fixture
def dataset(s3_server, converted, s3_bucket):
    """(s3:// location, local folder) of the img dataset, uploaded to a fresh bucket."""
    local = converted("img")
    return upload(s3_server, local, f"s3://{s3_bucket}/ds"), local


def read_epoch(loader, epoch):
    loader.set_epoch(epoch)
    keys, labels, images = [], [], []
    for batch in loader:
        keys += batch.keys
        labels += batch.labels.tolist()
        images.append(batch.images)
    return keys, labels, torch.cat(images)


def same(got, expected) -> bool:
    return got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def shard_gets(requests) -> dict:
    """{shard file name: GETs} among proxy requests."""
    counts = {}
    for method, path, _, _ in requests:
        name = path.split("?")[0].rsplit("/", 1)[-1]
        if method == "GET" and name.endswith(".tar"):
            counts[name] = counts.get(name, 0) + 1
    return counts


def shard_names(local, split="train") -> list:
    return [s["name"] for s in read_metadata(local)["splits"][split]["shards"]]


def entries(cache_dir) -> dict:
    """{shard name: bytes} of the complete entries (shard file + .meta) under a cache directory."""
    return {p.name: p.stat().st_size for p in Path(cache_dir).glob("*/*.tar") if Path(f"{p}.meta").exists()}


@pytest.mark.parametrize("read_ahead", [False, True])
def test_cold_epoch_fills_each_shard_once_and_warm_epochs_fetch_nothing(proxy, dataset, tmp_path, read_ahead):
    """Without read-ahead each epoch's report is exact: the first fills every shard, the rest only hit. With
    it, a worker that went on into epoch 1 may fill a shard the other worker had not reached yet in epoch 0
    (reported with epoch 1): the totals are exact, and every epoch's batches."""
    target, local = dataset
    cached = get_data(target, "train", 4, 2, instance=SINGLE, cache=tmp_path / "cache", read_ahead=read_ahead,
                      **OPTIONS)
    reference = get_data(str(local), "train", 4, 2, instance=SINGLE, **OPTIONS)
    shards = shard_names(local)
    reports = []
    for epoch in range(3):
        before = len(proxy.requests)
        assert same(read_epoch(cached, epoch), read_epoch(reference, epoch)), epoch
        gets = shard_gets(proxy.requests[before:])
        events = cached.report.cache
        reports.append(events)
        if not read_ahead and epoch == 0:  # both workers read the shard their shares split: still one GET of it
            assert gets == {name: 1 for name in shards}
            assert events["fills"] == len(shards)
            assert events["bytes_fetched"] == sum(entries(tmp_path / "cache").values())
        elif not read_ahead:
            assert gets == {} and events["fills"] == 0 and events["bytes_fetched"] == 0
            assert events["hits"] >= len(shards)
        assert not events["refetched"] and not events["fill_failed"]
    assert shard_gets(proxy.requests) == {name: 1 for name in shards}
    assert sum(r["fills"] for r in reports) == len(shards)
    assert sum(r["bytes_fetched"] for r in reports) == sum(entries(tmp_path / "cache").values())
    assert sorted(entries(tmp_path / "cache")) == sorted(shards)


RANK_SCRIPT = """
import json, os, sys
from imagenet_shards.loader import get_data
target, local, cache, out, mode = sys.argv[1:6]
out = out.replace("RANK", os.environ.get("RANK", ""))  # torchrun: one file per rank
instance = (0, 1) if mode == "whole" else None  # "whole": each process reads the whole split
# read_ahead=False: a worker reading ahead into the epoch after the last one read may fill a shard and is
# never asked for its report; without it every fill is in one of the two epochs' reports.
loader = get_data(target, "train", 4, 2, normalization="device", with_keys=True, cache=cache, instance=instance,
                  read_ahead=False)
reference = get_data(local, "train", 4, 2, normalization="device", with_keys=True, instance=instance)
result = []
for epoch in range(2):
    loader.set_epoch(epoch)
    reference.set_epoch(epoch)
    got = [(b.keys, b.labels.tolist(), int(b.images.sum())) for b in loader]
    expected = [(b.keys, b.labels.tolist(), int(b.images.sum())) for b in reference]
    keys = [k for batch in got for k in batch[0]]
    result.append({"same": got == expected, "keys": keys, "cache": loader.report.cache})
with open(out, "w") as handle:
    json.dump(result, handle)
"""


@pytest.mark.parametrize("mode", ["torchrun", "whole"])
def test_two_processes_with_two_workers_fetch_each_shard_once(s3_server, proxy, dataset, tmp_path, mode):
    """torchrun: 2 ranks x 2 workers sharing one cache directory. whole: 2 independent processes x 2 workers
    reading the whole split at the same time (every shard wanted by 4 readers at once)."""
    target, local = dataset
    script = tmp_path / "reader.py"
    script.write_text(RANK_SCRIPT)
    env = dict(os.environ, **s3_server.env(), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               **{storage.ENDPOINT_VARIABLE: proxy.endpoint})
    cache = tmp_path / "cache"
    if mode == "torchrun":
        command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
                   target, str(local), str(cache), str(tmp_path / "out-RANK.json"), mode]
        processes = [subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)]
    else:
        processes = [subprocess.Popen([PYTHON, str(script), target, str(local), str(cache),
                                       str(tmp_path / f"out-{n}.json"), mode],
                                      env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                     for n in range(2)]
    for process in processes:
        output = process.communicate(timeout=300)[0].decode(errors="replace")
        assert process.returncode == 0, output[-3000:]
    results = [json.loads((tmp_path / f"out-{n}.json").read_text()) for n in range(2)]
    shards = shard_names(local)
    assert shard_gets(proxy.requests) == {name: 1 for name in shards}
    # Counted over both epochs: with nothing synchronising the readers, a rank that finished epoch 0 first
    # may fill in epoch 1 a shard the other had not reached yet. Still one fill and one GET a shard in all.
    reports = [epoch["cache"] for result in results for epoch in result]
    assert sum(r.get("fills", 0) for r in reports) == len(shards)
    assert sum(r.get("bytes_fetched", 0) for r in reports) == sum(entries(cache).values())
    assert not any(r.get("refetched") or r.get("fill_failed") for r in reports)
    for result in results:
        assert all(epoch["same"] for epoch in result)
    if mode == "torchrun":  # the ranks' shares: 18 samples each, 4 batches of 4 (drop_last), none twice
        keys = results[0][0]["keys"] + results[1][0]["keys"]
        assert sorted(keys) == sorted(set(keys)) and len(keys) == 32


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_limit_below_the_dataset_evicts_and_every_epoch_stays_exact(proxy, dataset, tmp_path, read_ahead):
    """Without read-ahead each epoch's GETs are exactly its fills; with it (the default) the workers
    fill the next epoch's shards while this one ends, and every epoch's batches are still exact."""
    target, local = dataset
    sizes = sorted(s["bytes"] for s in read_metadata(local)["splits"]["train"]["shards"])
    limit = sizes[-1] + sizes[-2]  # room for two shards of five
    cached = get_data(target, "train", 4, 2, instance=SINGLE, cache=Cache(tmp_path / "cache", limit=limit),
                      read_ahead=read_ahead, **OPTIONS)
    reference = get_data(str(local), "train", 4, 2, instance=SINGLE, **OPTIONS)
    evicted = 0
    for epoch in range(3):
        before = len(proxy.requests)
        assert same(read_epoch(cached, epoch), read_epoch(reference, epoch)), epoch
        evicted += cached.report.cache["evicted"]
        if not read_ahead:
            assert sum(shard_gets(proxy.requests[before:]).values()) == cached.report.cache["fills"]
            assert sum(entries(tmp_path / "cache").values()) <= limit  # nothing is pinned once the epoch ended
    assert evicted >= 3


def _flip_keeping_mtime(path: Path, offset: int) -> None:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_corrupted_or_changed_cached_shard_is_dropped_fetched_again_and_reported(proxy, dataset, tmp_path):
    target, local = dataset
    cache_dir = tmp_path / "cache"
    cached = get_data(target, "validation", 4, 0, instance=SINGLE, cache=cache_dir, on_error="fail", **OPTIONS)
    reference = read_epoch(get_data(str(local), "validation", 4, 0, instance=SINGLE, **OPTIONS), 0)
    assert same(read_epoch(cached, 0), reference)
    metadata = read_metadata(local)
    record = read_sample_index(local / metadata["splits"]["validation"]["index"]["name"])[9]
    entry = next(cache_dir.glob(f"*/{record.shard}"))
    # A bit flipped at rest with the mtime put back: only the sample's CRC32C can tell.
    _flip_keeping_mtime(entry, record.payload_offset + record.payload_size - 100)
    before = len(proxy.requests)
    with pytest.warns(UserWarning, match="dropped and fetched again"):
        assert same(read_epoch(cached, 1), reference)  # on_error="fail": no sample was served bad
    assert shard_gets(proxy.requests[before:]) == {record.shard: 1}
    refetched = cached.report.cache["refetched"]
    assert [item["shard"] for item in refetched] == [record.shard]
    assert "failed its check" in refetched[0]["reason"] and "CRC32C" in refetched[0]["reason"]
    assert entry.read_bytes() == (local / record.shard).read_bytes()
    # A cached file whose size changed is not even opened: dropped before the read.
    other = next(name for name in shard_names(local, "validation") if name != record.shard)
    with open(next(cache_dir.glob(f"*/{other}")), "r+b") as handle:
        handle.truncate(1024)
    before = len(proxy.requests)
    with pytest.warns(UserWarning, match="size or mtime changed"):
        assert same(read_epoch(cached, 2), reference)
    assert shard_gets(proxy.requests[before:]) == {other: 1}
    assert [item["shard"] for item in cached.report.cache["refetched"]] == [other]


KILLED_SCRIPT = """
import sys
from imagenet_shards.loader import get_data
loader = get_data(sys.argv[1], "validation", 4, 0, normalization="device", instance=(0, 1), cache=sys.argv[2])
for batch in loader:
    pass
"""


def test_a_fill_killed_midway_leaves_nothing_servable(s3_server, proxy, dataset, tmp_path):
    """kill -9 while a shard is half in the part file (its GET cut, the resume held by the proxy):
    no entry appears; the next reader removes the part file, fetches the shard and serves it whole."""
    target, local = dataset
    first = shard_names(local, "validation")[0]
    resumed, release = threading.Event(), threading.Event()

    def hold_the_resume(path):
        if first in path and shard_gets(proxy.requests).get(first, 0) >= 2:  # the resume of the cut GET
            resumed.set()
            release.wait(60)

    proxy.cut_body, proxy.cut_path, proxy.on_get = 1, first, hold_the_resume
    cache_dir = tmp_path / "cache"
    env = dict(os.environ, **s3_server.env(), PYTHONPATH=str(REPO), **{storage.ENDPOINT_VARIABLE: proxy.endpoint,
                                                                        storage.RETRIES_VARIABLE: "2"})
    reader = subprocess.Popen([PYTHON, "-c", KILLED_SCRIPT, target, str(cache_dir)], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert resumed.wait(120), reader.stdout.read1().decode(errors="replace") if reader.poll() is not None else ""
        parts = list(cache_dir.glob(f"*/{first}.part.*"))
        assert len(parts) == 1 and 0 < parts[0].stat().st_size < (local / first).stat().st_size
        os.kill(reader.pid, signal.SIGKILL)
        reader.wait(30)
    finally:
        proxy.on_get = None
        release.set()
        if reader.poll() is None:
            reader.kill()
    folder = parts[0].parent
    assert not (folder / first).exists() and not (folder / f"{first}.meta").exists()
    cached = get_data(target, "validation", 4, 0, instance=SINGLE, cache=cache_dir, on_error="fail", **OPTIONS)
    reference = get_data(str(local), "validation", 4, 0, instance=SINGLE, **OPTIONS)
    assert same(read_epoch(cached, 0), read_epoch(reference, 0))
    assert not list(folder.glob("*.part.*"))
    assert (folder / first).read_bytes() == (local / first).read_bytes()


def test_a_reuploaded_dataset_does_not_reuse_the_old_entries(s3_server, proxy, converted, s3_bucket, tmp_path):
    """The same prefix and the same shard names, other bytes (a new checksum): fetched again, never mixed."""
    cache_dir = tmp_path / "cache"
    target = upload(s3_server, converted("img"), f"s3://{s3_bucket}/ds")
    read_epoch(get_data(target, "validation", 4, 0, instance=SINGLE, cache=cache_dir, **OPTIONS), 0)
    old = {p: p.read_bytes() for p in cache_dir.glob("*/*.tar")}
    replacement = converted("tensor")
    assert set(shard_names(replacement, "validation")) == set(shard_names(converted("img"), "validation"))
    upload(s3_server, replacement, target, "--overwrite")
    before = len(proxy.requests)
    cached = get_data(target, "validation", 4, 0, instance=SINGLE, cache=cache_dir, **OPTIONS)
    reference = get_data(str(replacement), "validation", 4, 0, instance=SINGLE, **OPTIONS)
    assert same(read_epoch(cached, 0), read_epoch(reference, 0))
    assert shard_gets(proxy.requests[before:]) == {name: 1 for name in shard_names(replacement, "validation")}
    assert cached.report.cache["fills"] == 2 and cached.report.cache["hits"] == 0
    assert len([p for p in cache_dir.iterdir() if p.is_dir()]) == 2
    assert {p: p.read_bytes() for p in old} == old  # the old dataset's entries untouched


def test_a_shard_whose_stored_bytes_differ_from_metadata_is_never_cached(s3_server, proxy, converted, s3_bucket,
                                                                          tmp_path):
    """A payload byte changed in the stored object: read as without a cache (the CRC32C names the sample),
    reported as not cached, and fetched again by the next epoch."""
    import base64
    import hashlib

    local = converted("img")
    target = upload(s3_server, local, f"s3://{s3_bucket}/ds")
    metadata = read_metadata(local)
    record = read_sample_index(local / metadata["splits"]["validation"]["index"]["name"])[2]
    data = bytearray((local / record.shard).read_bytes())
    data[record.payload_offset + record.payload_size - 100] ^= 0x01
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"ds/{record.shard}", Body=bytes(data), ChecksumSHA256=checksum)
    cached = get_data(target, "validation", 4, 0, instance=SINGLE, cache=tmp_path / "cache", **OPTIONS)
    for epoch in range(2):
        before = len(proxy.requests)
        with pytest.warns(UserWarning):
            keys = read_epoch(cached, epoch)[0]
        assert record.key not in keys and len(keys) == 11
        assert [s.key for s in cached.report.skipped] == [record.key] and "CRC32C" in cached.report.skipped[0].reason
        failed = cached.report.cache["fill_failed"]
        assert [item["shard"] for item in failed] == [record.shard] and "sha256" in failed[0]["reason"]
        assert shard_gets(proxy.requests[before:]).get(record.shard) == 1
    assert record.shard not in entries(tmp_path / "cache")


def test_prefetch_fetches_the_next_shards_ahead_once_each(proxy, dataset, tmp_path):
    """Cache(prefetch=2): opening a shard starts the fetch of the next two of the reader's plan; still one GET
    per shard, and the epoch is the local one."""
    target, local = dataset
    cached = get_data(target, "train", 4, 0, instance=SINGLE, cache=Cache(tmp_path / "cache", prefetch=2), **OPTIONS)
    reference = get_data(str(local), "train", 4, 0, instance=SINGLE, **OPTIONS)
    before = len(proxy.requests)
    assert same(read_epoch(cached, 0), read_epoch(reference, 0))
    shards = shard_names(local)
    assert shard_gets(proxy.requests[before:]) == {name: 1 for name in shards}
    assert cached.report.cache["fills"] == len(shards) and sorted(entries(tmp_path / "cache")) == sorted(shards)


def test_local_paths_marked_remote_are_cached(converted, tmp_path):
    local = converted("img")
    cached = get_data(str(local), "validation", 4, 0, instance=SINGLE,
                      cache=Cache(tmp_path / "cache", remote_paths=True), **OPTIONS)
    reference = read_epoch(get_data(str(local), "validation", 4, 0, instance=SINGLE, **OPTIONS), 0)
    assert same(read_epoch(cached, 0), reference) and cached.report.cache["fills"] == 2
    assert same(read_epoch(cached, 1), reference) and cached.report.cache["hits"] == 2
    assert sorted(entries(tmp_path / "cache")) == shard_names(local, "validation")
    unmarked = get_data(str(local), "validation", 4, 0, instance=SINGLE, cache=tmp_path / "other", **OPTIONS)
    read_epoch(unmarked, 0)
    assert unmarked.report.cache["fills"] == 0 and not entries(tmp_path / "other")


def test_a_cached_shard_truncated_while_a_worker_holds_its_payloads_is_refetched_not_a_dead_worker(converted, tmp_path):
    # the soak (seed 5, 640 steps): an entry truncated on its disk while a worker held payloads of its map
    # in the shuffle buffer killed the worker with SIGBUS (a page past the new end of a mapped file); cache
    # entries are now read into the worker's own memory, and the truncation is named when next served
    local = converted("img")
    options = dict(instance=SINGLE, order=Order(shuffle_buffer=64), **OPTIONS)
    cached = get_data(str(local), "train", 4, 1, cache=Cache(tmp_path / "cache", remote_paths=True), **options)
    reference = get_data(str(local), "train", 4, 1, **options)
    assert same(read_epoch(cached, 0), read_epoch(reference, 0))  # fills the cache
    cached.set_epoch(1)
    keys, labels, images = [], [], []
    for number, batch in enumerate(cached):
        if number == 0:
            for entry in Path(tmp_path / "cache").glob("*/*.tar"):
                os.truncate(entry, 0)
        keys += batch.keys
        labels += batch.labels.tolist()
        images.append(batch.images)
    assert same((keys, labels, torch.cat(images)), read_epoch(reference, 1))
    assert same(read_epoch(cached, 2), read_epoch(reference, 2))  # served again: the truncation is named
    assert cached.report.cache["refetched"] and "size or mtime changed" in str(cached.report.cache["refetched"])


def test_an_entry_truncated_while_a_reader_follows_its_fetch_is_fetched_again_not_samples_lost(converted, tmp_path,
                                                                                              monkeypatch):
    # the soak (seed 5, 640 steps): an entry truncated on its disk while a reader still followed the fetch
    # through the part file's descriptor; its remaining samples failed and were replaced. The fetch's bytes
    # had matched metadata.json, so the damage was local: the run is now read again from a fresh fetch.
    from imagenet_shards.shard_cache import fill as fill_module

    local = converted("img")
    follow = fill_module.Follower.readinto
    truncated = []

    def truncate_once_the_fetch_ended(self, buffer):
        if not truncated:
            self.fill.wait()  # the entry renamed into place, the reader still on the part file's descriptor
            entry = self.fill.cache.path(self.fill.name)
            os.truncate(entry, entry.stat().st_size // 2)
            truncated.append(self.fill.name)
        return follow(self, buffer)

    monkeypatch.setattr(fill_module.Follower, "readinto", truncate_once_the_fetch_ended)
    cached = get_data(str(local), "validation", 4, 0, instance=SINGLE,
                      cache=Cache(tmp_path / "cache", remote_paths=True), **OPTIONS)
    reference = get_data(str(local), "validation", 4, 0, instance=SINGLE, **OPTIONS)
    assert same(read_epoch(cached, 0), read_epoch(reference, 0)) and truncated
    assert not cached.report.skipped and not cached.report.substituted
    assert [item["shard"] for item in cached.report.cache["refetched"]] == truncated
    assert cached.report.cache["fills"] == 3  # the truncated shard fetched twice, the other once


def test_lmdb_shards_are_never_cached_and_the_warning_says_why(converted, tmp_path):
    # LMDB reads a shard by path (a map), never from a stream: the cache used to fill an entry, then every
    # sample failed ("LMDB shards are read from local files only")
    local = converted("lmdb")
    with pytest.warns(UserWarning, match="not cached .*lmdb shards are read from local files by path"):
        cached = get_data(str(local), "validation", 4, 0, instance=SINGLE,
                          cache=Cache(tmp_path / "cache", remote_paths=True), **OPTIONS)
    reference = read_epoch(get_data(str(local), "validation", 4, 0, instance=SINGLE, **OPTIONS), 0)
    assert same(read_epoch(cached, 0), reference)
    assert not (tmp_path / "cache").exists() or not entries(tmp_path / "cache")


def test_cache_options_are_checked():
    assert parse_size("200GB") == 200 * 10**9 and parse_size("512MiB") == 512 * 2**20 and parse_size(1000) == 1000
    for bad in ("lots", "-5GB", "0"):
        with pytest.raises(CacheError, match="cache limit"):
            parse_size(bad)
    with pytest.raises(CacheError, match="cannot create"):
        ShardCache("/proc/no-such-cache", "key", {})


def test_host_benchmark_measures_cold_and_warm_epochs_through_the_cache(s3_server, converted, tmp_path, s3_bucket):
    """--compare-transport with --cache-dir: two whole epochs of the local, uncached and cached loaders; the
    cold epoch fetches every shard once into the cache (store bytes = the split's shard bytes), the warm one
    nothing; every GET counted is one the server saw."""
    from testing_rigs.fault_proxy import FaultProxy

    local = converted("img")
    remote = upload(s3_server, local, f"s3://{s3_bucket}/ds")
    shards = read_metadata(local)["splits"]["validation"]["shards"]
    proxy = FaultProxy(s3_server.endpoint)
    out = tmp_path / "compare.json"
    try:
        result = run_script("host_benchmark.py", "--compare", local, "--split", "validation", "--batch-size", 4,
                            "--dataloader-worker", 2, "--batches", 1, "--warmup-batches", 1, "--compare-transport",
                            remote, "--s3-endpoint", proxy.endpoint, "--cache-dir", tmp_path / "cache", "--json", out,
                            env=s3_server.env())
        cached_gets = len(proxy.gets(".tar"))
    finally:
        proxy.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Shard cache (validation split" in result.stdout
    report = json.loads(out.read_text())
    rows = {row["id"]: row for row in report["rows"]}
    cold, warm = rows["img/epochs@s3+cache/cold"], rows["img/epochs@s3+cache/warm"]
    assert cold["images"] == warm["images"] == rows["img/epochs@local/second"]["images"] == 12
    assert cold["gets"] == len(shards) and cold["store_bytes"] == sum(s["bytes"] for s in shards)
    assert cold["cache"]["fills"] == len(shards) and warm["cache"]["hits"] >= len(shards)
    assert warm["gets"] == 0 and warm["store_bytes"] == 0
    uncached = rows["img/epochs@s3/first"]
    # uncached: each run's byte range (the samples, not the tar's end blocks)
    assert uncached["gets"] >= len(shards) and 0 < uncached["store_bytes"] <= sum(s["bytes"] for s in shards)
    counted = sum(r.get("gets") or 0 for r in report["rows"] if r.get("transport") == "s3" or "@s3" in r["id"])
    assert cached_gets == counted + rows["img/device@s3"]["gets_per_epoch"]
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["cache_warm_store_bytes@s3"]["status"] == "met"
    assert goals["cache_warm_vs_local@s3"]["status"] in ("met", "not met")
    assert goals["cache_cold_vs_uncached@s3"]["status"] in ("met", "not met")


def test_host_benchmark_cache_options_are_checked(converted, tmp_path):
    cache = str(tmp_path / "c")
    for args, message in ((("--cache-limit", "lots"), "need --cache-dir"),
                          (("--cache-dir", cache, "--cache-limit", "lots"), "not a size"),
                          (("--compare", converted("img"), "--cache-dir", cache), "--compare-transport")):
        result = run_script("host_benchmark.py", *(args if "--compare" in args else
                                                   ("--imagenet-data-path", converted("img"), *args)))
        assert result.returncode == 2 and message in result.stderr, result.stderr
