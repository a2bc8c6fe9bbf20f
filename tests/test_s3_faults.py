"""s3:// reads and uploads under faults: a fault-injecting proxy (testing_rigs/fault_proxy.py) in front of
the real SeaweedFS, and a server killed mid-epoch. Nothing is mocked: botocore, urllib3 and the
server do what they do; the proxy only drops, throttles or corrupts bytes between them."""

import json
import re

import pytest
import torch

from conftest import run_script
from imagenet_shards import storage
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.launcher import Instance
from imagenet_shards.loader import get_data
from testing_rigs.fault_proxy import FaultProxy
from test_s3 import read_all, upload_cli

SINGLE = Instance(0, 1, "test")


@pytest.fixture
def dataset(s3_server, converted, s3_bucket):
    """The img sample dataset under a fresh bucket (so tests may replace its objects)."""
    local = converted("img")
    result = upload_cli(s3_server, local, f"s3://{s3_bucket}/ds")
    assert result.returncode == 0, result.stdout + result.stderr
    return local, f"s3://{s3_bucket}/ds"


@pytest.fixture
def proxy(s3_server, monkeypatch):
    """A proxy in front of the session server; this process's S3 endpoint is the proxy."""
    from testing_rigs.s3_server import client_environment

    proxy = FaultProxy(s3_server.endpoint)
    with client_environment(monkeypatch, s3_server, proxy.endpoint, retries=4):
        yield proxy
    proxy.close()


def epoch(source, split="validation", **kwargs):
    return read_all(get_data(str(source), split, 4, 0, normalization="device", instance=SINGLE, with_keys=True,
                             **kwargs))


def shard_names(local, split):
    return [s["name"] for s in json.loads((local / METADATA_FILE).read_text())["splits"][split]["shards"]]


def test_one_get_per_run(dataset, proxy):
    local, remote = dataset
    expected = epoch(local)
    got = epoch(remote)
    assert got[0] == expected[0] and torch.equal(got[2], expected[2])
    shard_gets = proxy.gets(".tar")
    # validation is read in dataset order: one contiguous run per shard, one GET per run
    assert len(shard_gets) == len(shard_names(local, "validation"))
    assert all(r[2] is not None and r[2].startswith("bytes=") for r in shard_gets)


def test_slowdown_is_retried_and_the_epoch_is_identical(dataset, proxy):
    local, remote = dataset
    expected = epoch(local, split="train", epoch=1)
    proxy.slowdown = 3
    loader = get_data(remote, "train", 4, 0, normalization="device", instance=SINGLE, with_keys=True, epoch=1)
    got = read_all(loader)
    assert [f[0] for f in proxy.faults] == ["slowdown"] * 3
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
    assert not loader.report.skipped


def test_body_cut_mid_shard_is_resumed_byte_identical(dataset, proxy):
    local, remote = dataset
    expected = epoch(local)
    proxy.cut_body = 2
    proxy.cut_fraction = 0.4
    proxy.cut_path = ".tar"
    loader = get_data(remote, "validation", 4, 0, normalization="device", instance=SINGLE, with_keys=True)
    got = read_all(loader)
    assert [f[0] for f in proxy.faults] == ["cut_body", "cut_body"]
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
    assert not loader.report.skipped
    resumed = [r for r in proxy.gets(".tar") if r[3] is not None]  # If-Match: the resumes
    assert len(resumed) >= 2 and all(r[3].strip('"') for r in resumed)


def test_object_replaced_during_a_read_is_changed_while_reading(dataset, proxy, s3_server):
    local, remote = dataset
    bucket = remote[len("s3://"):].split("/")[0]
    shard = shard_names(local, "validation")[0]
    client = s3_server.client()
    seen = []

    def replace_before_the_resume(path):
        if path.split("?")[0].endswith(shard):
            seen.append(path)
            if len(seen) == 2:  # the first GET was cut; a new version lands before the resume
                client.put_object(Bucket=bucket, Key=f"ds/{shard}", Body=(local / shard).read_bytes() + b"\0" * 1024)

    proxy.on_get = replace_before_the_resume
    proxy.cut_body = 1
    proxy.cut_path = shard
    loader = get_data(remote, "validation", 4, 0, normalization="device", instance=SINGLE, with_keys=True)
    read_all(loader)
    reasons = {s.reason for s in loader.report.skipped}
    assert loader.report.skipped and all(s.shard == shard for s in loader.report.skipped)
    assert any("shard changed while reading" in r for r in reasons), reasons


def test_flipped_byte_in_an_upload_is_rejected_then_sent_again(s3_server, converted, s3_bucket):
    proxy = FaultProxy(s3_server.endpoint)
    try:
        local = converted("img")
        proxy.flip_put = 1
        result = run_script("upload_dataset.py", local, f"s3://{s3_bucket}/ds", "--s3-endpoint", proxy.endpoint,
                            "--no-progress", "--workers", 1, env=s3_server.env())
        assert result.returncode == 0, result.stdout + result.stderr
        flipped = proxy.faults[0][1].split("?")[0].rsplit("/", 1)[-1]
        assert "sent again after the server rejected their checksum: " + flipped in result.stdout
        stored = s3_server.client().get_object(Bucket=s3_bucket, Key=f"ds/{flipped}")["Body"].read()
        assert stored == (local / flipped).read_bytes()
    finally:
        proxy.close()


def test_upload_corrupted_every_time_is_reported_and_never_stored(s3_server, converted, s3_bucket):
    proxy = FaultProxy(s3_server.endpoint)
    try:
        proxy.flip_put = 1000
        result = run_script("upload_dataset.py", converted("img"), f"s3://{s3_bucket}/ds", "--s3-endpoint",
                            proxy.endpoint, "--no-progress", env=s3_server.env())
        assert result.returncode == 1, result.stdout + result.stderr
        assert "the server rejected the bytes twice" in result.stdout
        assert f"{METADATA_FILE} was not uploaded" in result.stdout
        listing = s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="ds/")
        assert not listing.get("Contents")
    finally:
        proxy.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_server_killed_mid_epoch_stops_the_epoch_naming_endpoint_and_shard(tmp_path, converted, monkeypatch, workers):
    """The server dies as the loader asks for its third shard (a proxy in front only to time the kill):
    the epoch stops with StorageUnavailable naming endpoint and shard, not a hang, not a short epoch."""
    from testing_rigs.s3_server import SeaweedServer

    server = SeaweedServer(tmp_path / "doomed").start()
    proxy = FaultProxy(server.endpoint)
    try:
        server.create_bucket("doomed")
        result = upload_cli(server, converted("img"), "s3://doomed/ds")
        assert result.returncode == 0, result.stdout + result.stderr
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(storage.ENDPOINT_VARIABLE, proxy.endpoint)
        monkeypatch.setenv(storage.RETRIES_VARIABLE, "1")
        storage._clients.clear()
        shard_gets = []

        def kill_at_the_third_shard(path):
            if ".tar" in path:
                shard_gets.append(path)
                if len(shard_gets) == 3:
                    server.stop()

        proxy.on_get = kill_at_the_third_shard
        loader = get_data("s3://doomed/ds", "train", 4, workers, normalization="device", instance=SINGLE,
                          with_keys=True)
        with pytest.raises(storage.StorageUnavailable) as error:  # from a DataLoader worker too
            read_all(loader)
        message = str(error.value)
        assert proxy.endpoint in message
        named = re.findall(r"s3://doomed/ds/(train-\d{6}\.tar)", message)
        # the shard whose read failed: asked for at or after the kill (workers race for the order)
        assert named and named[0] in {path.split("?")[0].rsplit("/", 1)[-1] for path in shard_gets[2:]}
    finally:
        proxy.close()
        server.stop()
        storage._clients.clear()


def test_wrong_secret_is_one_request_not_retried(dataset, proxy, monkeypatch):
    local, remote = dataset
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    storage._clients.clear()
    with pytest.raises(storage.StorageUnavailable, match="SignatureDoesNotMatch"):
        get_data(remote, "validation", 4, 0, instance=SINGLE)
    assert len(proxy.requests) == 1  # refused credentials are not retried (RETRIES_VARIABLE is 4 here)


@pytest.mark.parametrize("mid_body", [False, True])
def test_a_stall_past_the_read_timeout_is_retried_and_the_epoch_is_identical(dataset, proxy, monkeypatch, mid_body):
    """The store stops answering one GET (before its headers, or half-way through its body) for longer
    than DATASETS_READ_TIMEOUT: the read gives up, asks again, and the epoch is the same. With the
    default 60 s timeout the client would wait the stall out and never ask again."""
    local, remote = dataset
    expected = epoch(local)
    monkeypatch.setenv(storage.READ_TIMEOUT_VARIABLE, "1")
    proxy.stall, proxy.stall_seconds, proxy.stall_mid_body, proxy.stall_path = 1, 4.0, mid_body, ".tar"
    loader = get_data(remote, "validation", 4, 0, normalization="device", instance=SINGLE, with_keys=True)
    got = read_all(loader)
    assert [f[0] for f in proxy.faults] == ["stall_mid_body" if mid_body else "stall"]
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])
    assert not loader.report.skipped
    assert len(proxy.gets(".tar")) == len(shard_names(local, "validation")) + 1  # the stalled GET, asked again


def test_an_outage_within_the_retries_is_absorbed(dataset, proxy):
    local, remote = dataset
    expected = epoch(local)
    proxy.outage(requests=2)  # the next two requests, whenever the client makes them
    loader = get_data(remote, "validation", 4, 0, normalization="device", instance=SINGLE, with_keys=True)
    got = read_all(loader)
    assert proxy.faults and {f[0] for f in proxy.faults} == {"outage"}
    assert got[0] == expected[0] and torch.equal(got[2], expected[2]) and not loader.report.skipped


def test_an_outage_past_the_retries_stops_naming_the_store_and_the_next_epoch_carries_on(dataset, proxy,
                                                                                          monkeypatch):
    local, remote = dataset
    expected = epoch(local)
    monkeypatch.setenv(storage.RETRIES_VARIABLE, "1")
    loader = get_data(remote, "validation", 4, 0, normalization="device", instance=SINGLE, with_keys=True)
    proxy.outage(600)
    with pytest.raises(storage.StorageUnavailable) as error:
        read_all(loader)
    assert proxy.endpoint in str(error.value) and "\n" not in str(error.value)
    proxy.restore()
    got = read_all(loader)
    assert got[0] == expected[0] and torch.equal(got[2], expected[2]) and not loader.report.skipped


def test_a_read_timeout_that_is_not_a_number_is_named():
    for bad in ("soon", "0", "-3"):
        with pytest.raises(ValueError, match=f"{storage.READ_TIMEOUT_VARIABLE}='{bad}'"):
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv(storage.READ_TIMEOUT_VARIABLE, bad)
                storage.read_timeout()


@pytest.mark.parametrize("workers", [0, 2])
def test_the_training_example_stops_on_a_store_outage_with_one_line_naming_the_store(dataset, proxy, monkeypatch,
                                                                                     tmp_path, capsys, workers):
    """Found by the soak (benchmarks/soak.py --steps 24 --seed 1): a store down past the retries made
    examples/train_imagenet.py end with a traceback (StorageUnavailable is a RuntimeError, which it did not
    catch); a DataLoader worker's error is re-raised by torch with the worker's whole traceback in it.
    Now: exit 1 and one line naming the endpoint, whether the main process or a worker met the outage."""
    from test_train_example import load_example

    local, remote = dataset
    monkeypatch.setenv(storage.RETRIES_VARIABLE, "0")
    example = load_example()
    options = ["--data", remote, "--arch", "resnet18", "--image-size", "16", "--batch-size", "4", "--workers",
               str(workers), "--no-val", "--max-steps", "2", "--checkpoint", str(tmp_path / "c.pt")]
    if workers:  # the store goes down once the loader has read the dataset's description: a worker meets it
        proxy.on_get = lambda path: proxy.outage(600) if ".tar" in path else None
    else:
        proxy.outage(600)
    with torch.random.fork_rng(), pytest.raises(SystemExit) as exited:
        example.main(options)
    proxy.restore()
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 1, err
    assert err.count("\n") == 0 and err.startswith("train_imagenet.py: ") and proxy.endpoint in err, err
