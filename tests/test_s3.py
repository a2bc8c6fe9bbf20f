"""s3:// datasets against a real SeaweedFS on loopback (testing_rigs/s3_server.py): upload, load, fail loudly."""

import json

import pytest
import torch

from conftest import run_script, run_scripts
from imagenet_shards import storage
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.launcher import Instance
from imagenet_shards.loader import Order, get_data

SINGLE = Instance(0, 1, "test")
DATASET_BUCKET = "datasets"


@pytest.fixture
def s3_env(s3_server, monkeypatch):
    """This process talks to the session server (credentials from the environment, --s3-endpoint)."""
    from testing_rigs.s3_server import client_environment

    with client_environment(monkeypatch, s3_server, s3_server.endpoint, retries=2):
        yield s3_server


@pytest.fixture(scope="session")
def uploaded(s3_server, converted):
    """uploaded(fmt, *extra) -> s3:// location of converted(fmt, *extra), uploaded once per session."""
    s3_server.create_bucket(DATASET_BUCKET)
    cache = {}

    def upload(fmt="img", *extra):
        if (fmt, extra) not in cache:
            target = f"s3://{DATASET_BUCKET}/{fmt}{len(cache)}"
            result = upload_cli(s3_server, converted(fmt, *extra), target)
            assert result.returncode == 0, result.stdout + result.stderr
            cache[fmt, extra] = target
        return cache[fmt, extra]

    return upload


def upload_cli(server, local, target, *args, secret=None):
    return run_script("upload_dataset.py", local, target, "--s3-endpoint", server.endpoint, "--no-progress",
                      *args, env=server.env(secret))


def read_all(loader):
    keys, labels, images = [], [], []
    for batch_images, batch_labels, batch_keys in loader:
        keys += batch_keys
        labels += batch_labels.tolist()
        images.append(batch_images)
    return keys, labels, torch.cat(images)


@pytest.mark.parametrize("fmt", ["img", "tensor", "tfrecord"])
def test_get_data_over_s3_equals_local(s3_env, converted, uploaded, fmt):
    local = read_all(get_data(str(converted(fmt)), "validation", 5, 0, normalization="device", instance=SINGLE,
                              with_keys=True))
    remote = read_all(get_data(uploaded(fmt), "validation", 5, 0, normalization="device", instance=SINGLE,
                               with_keys=True))
    assert remote[0] == local[0] and remote[1] == local[1]
    assert torch.equal(remote[2], local[2])
    assert len(local[0]) == 12


def test_get_data_over_s3_with_forked_workers(s3_env, converted, uploaded):
    """Forked DataLoader workers make their own clients; the epoch is the local one."""
    local = read_all(get_data(str(converted("img")), "train", 4, 2, normalization="device", instance=SINGLE,
                              with_keys=True, epoch=1))
    remote = read_all(get_data(uploaded("img"), "train", 4, 2, normalization="device", instance=SINGLE,
                               with_keys=True, epoch=1))
    assert remote[0] == local[0] and remote[1] == local[1] and torch.equal(remote[2], local[2])


def test_upload_refuses_an_existing_dataset_and_resume_skips_what_matches(s3_server, converted, s3_bucket):
    target = f"s3://{s3_bucket}/ds"
    first = upload_cli(s3_server, converted("img"), target)
    assert first.returncode == 0, first.stdout + first.stderr
    again = upload_cli(s3_server, converted("img"), target)
    assert again.returncode == 2 and "already holds a complete dataset" in again.stderr and "--resume" in again.stderr
    resumed = upload_cli(s3_server, converted("img"), target, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert " 0 files uploaded" in resumed.stdout and "10 already there and matching" in resumed.stdout


def test_interrupted_upload_then_resume_uploads_only_the_rest(s3_server, converted, s3_bucket):
    """An upload that stopped half-way (no metadata.json yet): --resume sends only what is missing."""
    local = converted("img")
    target = f"s3://{s3_bucket}/ds"
    client = s3_server.client()
    names = sorted(p.name for p in local.iterdir() if p.name.endswith(".tar"))
    for name in names[:3]:  # what the interrupted run had stored
        client.put_object(Bucket=s3_bucket, Key=f"ds/{name}", Body=(local / name).read_bytes())
    refused = upload_cli(s3_server, local, target)
    assert refused.returncode == 2 and "3 objects (an incomplete upload?)" in refused.stderr
    resumed = upload_cli(s3_server, local, target, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    total = sum(1 for p in local.iterdir() if p.is_file())
    assert f"{total - 3} files uploaded" in resumed.stdout and "3 already there and matching" in resumed.stdout
    stored = client.get_object(Bucket=s3_bucket, Key=f"ds/{METADATA_FILE}")["Body"].read()
    assert stored == (local / METADATA_FILE).read_bytes()


def test_resume_replaces_an_object_that_does_not_match(s3_server, converted, s3_bucket):
    local = converted("img")
    target = f"s3://{s3_bucket}/ds"
    client = s3_server.client()
    shard = sorted(p.name for p in local.iterdir() if p.name.endswith(".tar"))[0]
    data = bytearray((local / shard).read_bytes())
    data[5000] ^= 0xFF  # same size, other bytes
    client.put_object(Bucket=s3_bucket, Key=f"ds/{shard}", Body=bytes(data))
    resumed = upload_cli(s3_server, local, target, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert client.get_object(Bucket=s3_bucket, Key=f"ds/{shard}")["Body"].read() == (local / shard).read_bytes()


def test_upload_of_a_locally_damaged_shard_is_refused_by_the_server(s3_server, converted, s3_bucket, tmp_path):
    """The PUT carries the sha256 recorded at conversion: bytes that changed since never get stored."""
    import shutil

    local = tmp_path / "copy"
    shutil.copytree(converted("img"), local)
    shard = sorted(local.glob("*.tar"))[0]
    data = bytearray(shard.read_bytes())
    data[3000] ^= 0x01
    shard.write_bytes(bytes(data))
    result = upload_cli(s3_server, local, f"s3://{s3_bucket}/ds")
    assert result.returncode == 1
    assert f"FAILED {shard.name}" in result.stdout and "no longer matches the sha256" in result.stdout
    assert f"{METADATA_FILE} was not uploaded" in result.stdout
    listing = s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="ds/").get("Contents", [])
    assert shard.name not in {item["Key"].split("/")[-1] for item in listing}
    assert METADATA_FILE not in {item["Key"].split("/")[-1] for item in listing}


def test_wrong_secret_fails_fast_naming_the_credential_source(s3_env, uploaded, monkeypatch):
    location = uploaded("img")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    storage._clients.clear()
    with pytest.raises(storage.StorageUnavailable) as error:
        get_data(location, "validation", 4, 0, instance=SINGLE)
    message = str(error.value)
    assert "SignatureDoesNotMatch" in message and "credentials from env" in message
    assert s3_env.endpoint in message and location in message


def test_missing_bucket_and_missing_dataset_are_named(s3_env):
    with pytest.raises(storage.StorageUnavailable, match="no such bucket 'no-such-bucket'"):
        get_data("s3://no-such-bucket/ds", "validation", 4, 0, instance=SINGLE)
    from imagenet_shards.loader.sources import SourceError

    with pytest.raises(SourceError, match=f"s3://{DATASET_BUCKET}/nothing-here/: not a converted dataset"):
        get_data(f"s3://{DATASET_BUCKET}/nothing-here", "validation", 4, 0, instance=SINGLE)


def test_missing_shard_object_is_a_skipped_sample_not_an_outage(s3_env, converted, s3_bucket):
    """A data problem goes through on_error: each sample of the missing shard is named and counted."""
    local = converted("img")
    client = s3_env.client()
    for path in local.iterdir():
        if path.is_file():
            client.put_object(Bucket=s3_bucket, Key=f"ds/{path.name}", Body=path.read_bytes())
    metadata = json.loads((local / METADATA_FILE).read_text())
    gone = metadata["splits"]["validation"]["shards"][0]
    client.delete_object(Bucket=s3_bucket, Key=f"ds/{gone['name']}")
    loader = get_data(f"s3://{s3_bucket}/ds", "validation", 4, 0, instance=SINGLE, with_keys=True)
    keys = read_all(loader)[0]
    skipped = loader.report.skipped
    assert len(skipped) == gone["samples"] and len(keys) == 12 - gone["samples"]
    assert all(s.shard == gone["name"] and "no such object" in s.reason for s in skipped)


def validate_cli(server, location, *args):
    return run_script("validate_dataset.py", location, "--s3-endpoint", server.endpoint, "--no-progress", "--workers",
                      1, *args, env=server.env())


@pytest.mark.parametrize("fmt", ["img", "tensor", "tfrecord"])
def test_convert_upload_validate(s3_server, uploaded, fmt):
    location = uploaded(fmt)
    full = validate_cli(s3_server, location)
    assert full.returncode == 0, full.stdout + full.stderr
    assert full.stdout.startswith("Dataset OK.") and "streamed once each" in full.stdout
    quick = validate_cli(s3_server, location, "--quick")
    assert quick.returncode == 0, quick.stdout + quick.stderr
    assert quick.stdout.startswith("Dataset OK.") and "--quick: object sizes and the checksums" in quick.stdout
    assert "warning:" not in quick.stdout  # SeaweedFS keeps the SHA256 sent with each PUT


@pytest.fixture(scope="module")
def repartitioned(tmp_path_factory, converted):
    import shutil

    target = tmp_path_factory.mktemp("s3-repartition") / "img"
    shutil.copytree(converted("img"), target)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 2, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    return target


def test_repartition_upload_validate_and_load(s3_env, repartitioned, s3_bucket):
    target = f"s3://{s3_bucket}/img"
    result = upload_cli(s3_env, repartitioned, target, "--workers", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    listing = s3_env.client().list_objects_v2(Bucket=s3_bucket, Prefix="img/distributed/")["Contents"]
    assert any(item["Key"].endswith("2-instances/manifest.json") for item in listing)
    checked = validate_cli(s3_env, target)
    assert checked.returncode == 0 and checked.stdout.startswith("Dataset OK."), checked.stdout + checked.stderr
    for index in range(2):
        instance = Instance(index, 2, "test")
        local = read_all(get_data(str(repartitioned), "train", 3, 0, normalization="device", instance=instance,
                                  with_keys=True, order=Order(policy="drop")))
        remote = read_all(get_data(target, "train", 3, 0, normalization="device", instance=instance,
                                   with_keys=True, order=Order(policy="drop")))
        assert remote[0] == local[0] and torch.equal(remote[2], local[2])
        assert local[0]


def test_validator_names_a_damaged_object(s3_server, converted, s3_bucket):
    """An object whose bytes differ from what was converted (same size): full and quick name it."""
    import base64
    import hashlib

    local = converted("img")
    target = f"s3://{s3_bucket}/ds"
    assert upload_cli(s3_server, local, target).returncode == 0
    shard = json.loads((local / METADATA_FILE).read_text())["splits"]["train"]["shards"][1]["name"]
    data = bytearray((local / shard).read_bytes())
    data[len(data) // 2] ^= 0x40
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    s3_server.client().put_object(Bucket=s3_bucket, Key=f"ds/{shard}", Body=bytes(data), ChecksumSHA256=checksum)
    full = validate_cli(s3_server, target)
    assert full.returncode == 1 and full.stdout.startswith("Dataset is corrupted.")
    assert f"error: {shard}" in full.stdout
    quick = validate_cli(s3_server, target, "--quick")
    assert quick.returncode == 1 and f"error: {shard}: the SHA256 the server stored differs" in quick.stdout


def test_validator_names_missing_and_extra_objects(s3_server, converted, s3_bucket):
    local = converted("img")
    target = f"s3://{s3_bucket}/ds"
    assert upload_cli(s3_server, local, target).returncode == 0
    client = s3_server.client()
    shard = json.loads((local / METADATA_FILE).read_text())["splits"]["validation"]["shards"][0]["name"]
    client.delete_object(Bucket=s3_bucket, Key=f"ds/{shard}")
    client.put_object(Bucket=s3_bucket, Key="ds/stray.bin", Body=b"stray")
    for args in ((), ("--quick",)):
        result = validate_cli(s3_server, target, *args)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"error: {shard}" in result.stdout and "warning: stray.bin" in result.stdout


def test_validator_exits_2_when_the_endpoint_is_unreachable(s3_server):
    from testing_rigs.s3_server import free_port_pairs

    dead = f"http://127.0.0.1:{free_port_pairs(1)[0]}"
    result = run_script("validate_dataset.py", f"s3://{DATASET_BUCKET}/img0", "--s3-endpoint", dead, "--s3-retries", 1,
                        "--no-progress", env=s3_server.env())
    assert result.returncode == 2, result.stdout + result.stderr
    assert dead in result.stderr and "failed after the retries" in result.stderr


def test_host_benchmark_reads_s3(s3_server, uploaded):
    result = run_script("host_benchmark.py", "--data", "real", "--imagenet-data-path", uploaded("img"), "--split",
                        "validation", "--batch-size", 4, "--dataloader-worker", 0, "--batches", 2,
                        "--warmup-batches", 1, "--s3-endpoint", s3_server.endpoint, env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput of the iteration:" in result.stdout and " 0.0 MB/s" not in result.stdout


RANK_SCRIPT = """
import json, sys
import torch
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import Order, get_data

local, remote, out_dir = sys.argv[1:4]
instance = detect_instance()
result = {}
for workers in (0, 2):
    for split, policy in (("validation", "spread"), ("train", "drop")):
        got = {}
        for name, source in (("local", local), ("s3", remote)):
            keys, labels, checksum = [], [], 0
            loader = get_data(source, split, 3, workers, normalization="device", with_keys=True,
                              order=Order(policy=policy), epoch=1, seed=3, instance=instance)
            for images, batch_labels, batch_keys in loader:
                keys += batch_keys
                labels += batch_labels.tolist()
                checksum += int(images.to(torch.int64).sum())
            got[name] = {"keys": keys, "labels": labels, "pixels": checksum, "skipped": len(loader.report.skipped)}
        result[f"{workers}/{split}"] = got
with open(f"{out_dir}/rank{instance.index}.json", "w") as handle:
    json.dump(result, handle)
"""


def test_torchrun_two_ranks_read_s3_like_local(s3_server, converted, uploaded, tmp_path):
    """2 torchrun ranks x DataLoader workers 0 and 2: the same keys, labels and pixels over s3 as locally."""
    script = tmp_path / "rank_script.py"
    script.write_text(RANK_SCRIPT)
    env = dict(s3_server.env(), OMP_NUM_THREADS="1", **{storage.ENDPOINT_VARIABLE: s3_server.endpoint})
    result = run_script("-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 2, script,
                        converted("img"), uploaded("img"), tmp_path, timeout=240, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    seen = {}
    for rank in range(2):
        for config, got in json.loads((tmp_path / f"rank{rank}.json").read_text()).items():
            assert got["s3"] == got["local"], (rank, config)
            assert got["s3"]["keys"] and got["s3"]["skipped"] == 0
            seen.setdefault(config, []).extend(got["s3"]["keys"])
    for workers in (0, 2):
        assert sorted(seen[f"{workers}/validation"]) == sorted(set(seen[f"{workers}/validation"]))
        assert len(seen[f"{workers}/validation"]) == 12


def test_create_webdataset_to_s3_uploads_shards_as_published_and_metadata_last(s3_server, sample_source, s3_bucket,
                                                                               converted, tmp_path):
    target = f"s3://{s3_bucket}/img"
    staging = tmp_path / "staging"
    args = ("--source", sample_source, "--target", target, "--staging", staging, "--format", "img",
            "--samples-per-shard", 8, "--seed", 0, "--s3-endpoint", s3_server.endpoint, "--no-progress")
    result = run_script("create_webdataset.py", *args, env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 already there and matching" in result.stdout
    checked = validate_cli(s3_server, target)
    assert checked.returncode == 0 and checked.stdout.startswith("Dataset OK."), checked.stdout + checked.stderr
    client = s3_server.client()
    stored = client.get_object(Bucket=s3_bucket, Key=f"img/{METADATA_FILE}")["Body"].read()
    assert stored == (staging / METADATA_FILE).read_bytes()
    # the same conversion as a local one (seeded): the same metadata, byte for byte
    assert json.loads(stored)["splits"] == json.loads((converted("img") / METADATA_FILE).read_text())["splits"]
    again = run_script("create_webdataset.py", *args, env=s3_server.env())
    assert again.returncode == 2 and "--resume or --overwrite" in again.stderr


def test_brace_pattern_of_s3_shards_finds_the_index_beside_them(s3_env, converted, uploaded):
    from collections import Counter

    local = read_all(get_data(str(converted("img")), "validation", 5, 0, instance=SINGLE, with_keys=True))
    pattern = uploaded("img") + "/validation-{000000..000001}.tar"
    remote = read_all(get_data(pattern, "validation", 5, 0, instance=SINGLE, with_keys=True))
    assert Counter(remote[0]) == Counter(local[0]) and len(local[0]) == 12


def test_head_check_without_a_stored_checksum_falls_back_to_the_md5_etag(converted):
    """For servers that keep no SHA256: size plus ETag = md5 (single-part only; multipart ETags refused)."""
    import hashlib

    from imagenet_shards.tools.upload import local_files, object_matches

    item = next(f for f in local_files(converted("img")) if f.name.endswith(".tar"))
    md5 = hashlib.md5(item.path.read_bytes()).hexdigest()
    assert object_matches({"ContentLength": item.size, "ETag": f'"{md5}"'}, item) == (True, "")
    assert not object_matches({"ContentLength": item.size, "ETag": '"0' + md5[1:] + '"'}, item)[0]
    assert "multipart" in object_matches({"ContentLength": item.size, "ETag": f'"{md5}-2"'}, item)[1]
    assert not object_matches({"ContentLength": item.size + 1, "ETag": f'"{md5}"'}, item)[0]
    assert object_matches(None, item) == (False, "missing")


def test_endpoint_resolution_order(s3_server, monkeypatch):
    """--s3-endpoint, then AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (botocore's own), then S3_ENDPOINT_URL."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in (storage.ENDPOINT_VARIABLE, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)

    def endpoint():
        storage._clients.clear()
        client = storage.s3_client()
        return client.endpoint, client.client.meta.config.s3.get("addressing_style")

    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:1")
    assert endpoint() == ("http://127.0.0.1:1", "path")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:2")
    assert endpoint() == ("http://127.0.0.1:2", "path")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:3")
    assert endpoint() == ("http://127.0.0.1:3", "path")
    monkeypatch.setenv(storage.ENDPOINT_VARIABLE, s3_server.endpoint)
    assert endpoint() == (s3_server.endpoint, "path")
    storage._clients.clear()


def test_overwrite_replaces_the_dataset_and_deletes_what_it_does_not_have(s3_server, converted, s3_bucket):
    target = f"s3://{s3_bucket}/ds"
    assert upload_cli(s3_server, converted("tensor"), target).returncode == 0
    client = s3_server.client()
    client.put_object(Bucket=s3_bucket, Key="ds/stray.bin", Body=b"stray")
    result = upload_cli(s3_server, converted("img"), target, "--overwrite")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stray.bin" in result.stdout
    checked = validate_cli(s3_server, target)
    assert checked.returncode == 0 and checked.stdout.startswith("Dataset OK.") and "warning:" not in checked.stdout
    stored = client.get_object(Bucket=s3_bucket, Key=f"ds/{METADATA_FILE}")["Body"].read()
    assert stored == (converted("img") / METADATA_FILE).read_bytes()


def test_loader_names_a_sample_corrupted_at_rest(s3_env, converted, s3_bucket):
    """A payload byte changed in the stored object (the object's own checksum recomputed, as a silent
    disk or copy error would leave it): the loader's per-sample CRC32C names the shard and key."""
    import base64
    import hashlib

    from imagenet_shards.index import read_metadata
    from imagenet_shards.index import read_sample_index

    local = converted("img")
    target = f"s3://{s3_bucket}/ds"
    assert upload_cli(s3_env, local, target).returncode == 0
    metadata = read_metadata(local)
    record = read_sample_index(local / metadata["splits"]["validation"]["index"]["name"])[2]
    data = bytearray((local / record.shard).read_bytes())
    data[record.payload_offset + record.payload_size - 100] ^= 0x01  # a low bit in the scan data: still decodes
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    s3_env.client().put_object(Bucket=s3_bucket, Key=f"ds/{record.shard}", Body=bytes(data), ChecksumSHA256=checksum)

    with pytest.raises(Exception, match=rf"{record.shard}.*{record.key}|{record.key}.*{record.shard}"):
        read_all(get_data(target, "validation", 4, 0, normalization="device", with_keys=True, instance=SINGLE,
                          on_error="fail"))
    loader = get_data(target, "validation", 4, 0, normalization="device", with_keys=True, instance=SINGLE,
                      on_error="skip")
    keys, _, _ = read_all(loader)
    assert record.key not in keys and len(keys) == metadata["splits"]["validation"]["length"] - 1
    assert [s.key for s in loader.report.skipped] == [record.key]
    assert "CRC32C" in loader.report.skipped[0].reason or "crc32c" in loader.report.skipped[0].reason.lower()


@pytest.mark.parametrize("workers", [0, 2])
def test_host_benchmark_compares_the_same_dataset_locally_over_http_and_over_s3(s3_server, converted, uploaded,
                                                                               tmp_path, workers):
    """--compare-transport: the img device row over each copy, GETs per epoch, TTFB and the transport ceilings;
    every GET the report counts is one the servers saw (a proxy in front of SeaweedFS, a counting http server),
    DataLoader workers' GETs included."""
    from testing_rigs.fault_proxy import FaultProxy
    from http_range_server import RangeHandler, serve

    local, remote = converted("img"), uploaded("img")
    shards = len(json.loads((local / METADATA_FILE).read_text())["splits"]["validation"]["shards"])
    http_server, http_base = serve(local)
    proxy = FaultProxy(s3_server.endpoint)
    ranges_before = RangeHandler.ranges_served
    out = tmp_path / "compare.json"
    try:
        result = run_script("host_benchmark.py", "--compare", local, "--split", "validation", "--batch-size", 4,
                            "--dataloader-worker", workers, "--batches", 1, "--warmup-batches", 1, "--compare-transport",
                            http_base, remote, "--s3-endpoint", proxy.endpoint, "--json", out, env=s3_server.env())
        http_ranges = RangeHandler.ranges_served - ranges_before
        s3_gets = len(proxy.gets(".tar"))
    finally:
        http_server.shutdown()
        http_server.server_close()
        proxy.close()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Loopback hides network latency" in result.stdout and "Transports (validation split" in result.stdout
    rows = {row["id"]: row for row in json.loads(out.read_text())["rows"]}
    for copy, seen in (("http", http_ranges), ("s3", s3_gets)):
        row = rows[f"img/device@{copy}"]
        assert row["transport"] == copy and row["images"] == 4 and row["images_per_cpu_s"] > 0
        assert row["mb_per_s"] > 0 and 0 < row["ttfb_ms_p50"] <= row["ttfb_ms_p99"]
        # validation is read in order: one GET per shard per epoch (workers may split a shard's run)
        assert row["gets_per_epoch"] == shards if workers == 0 else row["gets_per_epoch"] >= shards
        ceiling = rows[f"transport_ceiling/img@{copy}"]
        assert ceiling["gets"] == shards and ceiling["mb_per_s"] > 0 and ceiling["ttfb_ms_p99"] > 0
        assert ceiling["bytes"] == sum(s["bytes"] for s in json.loads((local / METADATA_FILE).read_text())
                                       ["splits"]["validation"]["shards"])
        assert seen == row["gets_per_epoch"] + row["gets"] + ceiling["gets"]  # nothing uncounted, nothing invented
    assert rows["transport_ceiling/img@local"]["mb_per_s"] > 0 and "gets_per_epoch" not in rows["img/device"]
    goals = {g["goal"]: g for g in json.loads(out.read_text())["goals"]}
    assert goals["s3_vs_local@s3"]["status"] in ("met", "not met") and "transport_ceiling@s3" in goals


def test_host_benchmark_refuses_a_copy_of_another_dataset(s3_server, converted, uploaded):
    other = converted("img", "--samples-per-shard", 5)
    result, result_other, bad = run_scripts(
        ("host_benchmark.py", "--compare", converted("img"), "--split", "validation", "--batches", 1,
         "--compare-transport", uploaded("tensor"), "--s3-endpoint", s3_server.endpoint),
        ("host_benchmark.py", "--compare", other, "--split", "validation", "--batches", 1,
         "--compare-transport", uploaded("img"), "--s3-endpoint", s3_server.endpoint),
        ("host_benchmark.py", "--compare", other, "--compare-transport", str(other)), env=s3_server.env())
    assert result.returncode == 1 and uploaded("tensor") in result.stderr and "'tensor'" in result.stderr
    assert result_other.returncode == 1 and f"not a copy of {other}" in result_other.stderr, result_other.stderr
    assert bad.returncode == 2 and "not an http(s):// or s3://" in bad.stderr


def test_a_downloaded_copy_matches_the_reference_checksum(s3_env, converted, uploaded, tmp_path):
    """upload_dataset.py skips hidden files: the copy downloaded back holds every file of the converted folder
    (no .convert-state/ is left there to miss), and checksumdir's dirhash of it is metadata.json's checksum,
    what the reference validate_dataset.py compares."""
    from reference_layout import folder_dirhash

    location = uploaded("img")
    copy = tmp_path / "downloaded"
    for name in storage.list_objects(location):
        path = copy / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(storage.read_bytes(storage.join_location(location, name)))
    local = converted("img")
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == sorted(p.relative_to(local) for p in local.rglob("*"))
    assert folder_dirhash(copy) == json.loads((copy / METADATA_FILE).read_text())["checksum"]
