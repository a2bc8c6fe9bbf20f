"""Writing a planned repartition: remainder shards, shard lists, sample indexes, the manifest.

The files (DIR/distributed/<N>-instances/, listed in imagenet_shards.repartition's docstring) are written
from SplitRepartitions (imagenet_shards.repartition.plan) by `write_repartition`, which
imagenet_shards.repartition.run calls under the folder's lock once every input check has passed.

Each planned sample's whole byte range (SampleRecord.record_offset/record_size) is copied verbatim
into the instance's remainder shard: tar headers and TFRecord framing hold no offsets, so the copy
is valid as it is, and every payload stays byte-identical. Nothing is decoded or re-encoded. Each
copied payload's sha256 is checked against the index while copying (SourceReader). The writer is
the dataset format's own (imagenet_shards.formats).

Safety:
  * Files are written atomically (imagenet_shards.fileio), the manifest last: its presence means the
    repartition is complete. A failed write is a DatasetError naming the file (exit code 1).
  * A per-split plan stamp (`<split>.plan.json`, removed once the manifest is written) lets a
    re-run after a crash or SIGKILL keep the remainder shards it already finished for the same
    plan, and discard anything from another plan.
  * The manifest never points at a file that is being rewritten: entries about to change are
    removed from it first; a stale manifest (another metadata.json) is removed with the files of
    its splits that are not rebuilt.
  * metadata.json is hashed again before the manifest is written: a dataset that changed meanwhile
    gets no manifest.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from contextlib import contextmanager
from pathlib import Path

from imagenet_shards.metadata_digest import sealed
from imagenet_shards.fileio import PARTIAL_SUFFIX, atomic_write_bytes, atomic_write_json, hash_file, sha256_file
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import ShardRecord, write_sample_index
from imagenet_shards.dataset_folder import DISTRIBUTED_DIR, REPARTITION_MANIFEST
from imagenet_shards.reference.remainders import LOADER_REMAINDERS, write_loader_remainders
from imagenet_shards.repartition.plan import InstanceShare, SplitRepartition, remainder_records
from imagenet_shards.repartition.request import Decision, read_json_or_none
from imagenet_shards.repartition.source import SourceDataset, SourceReader, remainder_format

MANIFEST_VERSION = 1


def write_repartition(dataset: SourceDataset, plans, decision: Decision, existing, out: Path, num_instances: int,
                      verify: str, progress=None) -> dict:
    """Write every planned split and then the manifest (under the caller's lock); return the manifest."""
    manifest_path = out / REPARTITION_MANIFEST
    if decision.stale:
        manifest_path.unlink(missing_ok=True)
        for split in set(existing.get("splits") or {}) - set(decision.build):
            _remove_split_files(out, split)  # made from the old metadata.json and not rebuilt now
    elif existing is not None and decision.drop_manifest_splits:
        # The manifest must never point at files that are about to be rewritten.
        trimmed = dict(existing, splits=dict(decision.keep))
        with _writing(manifest_path):
            atomic_write_json(manifest_path, sealed(trimmed))
    entries = dict(decision.keep)
    for plan in plans:
        entries[plan.split] = write_split(dataset, plan, out, progress)
    if sha256_file(dataset.target / METADATA_FILE)[0] != dataset.metadata_sha256:
        raise DatasetError(
            f"{dataset.target / METADATA_FILE}: changed while repartitioning; the manifest was not written, re-run"
        )
    ordered = {split: entries[split] for split in dataset.metadata["splits"] if split in entries}
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "created_by": "distributed_webdataset.py",
        "num_instances": num_instances,
        "format": dataset.format,
        "source_metadata_sha256": dataset.metadata_sha256,
        "verified_shards": verify,
        "splits": ordered,
    }
    with _writing(manifest_path):
        atomic_write_json(manifest_path, sealed(manifest))  # its own digest, as metadata.json
    remove_plan_stamps(out)
    return manifest


def remove_plan_stamps(out: Path):
    """Remove the per-split plan stamps: the manifest is written (or a killed run left them after it)."""
    for path in out.glob("*.plan.json"):
        path.unlink(missing_ok=True)


def _relative(num_instances: int, name: str) -> str:
    return f"{DISTRIBUTED_DIR}/{num_instances}-instances/{name}"


def instance_file_names(split: str, instance: int, suffix: str):
    stem = f"{split}-instance-{instance:04d}"
    return f"{split}-remainder-{instance:04d}{suffix}", f"{stem}.txt", f"{stem}.index.tsv"


def _plan_stamp(plan: SplitRepartition, source_sha256: str, fmt: str) -> dict:
    digest = hashlib.sha256()
    for instance in plan.instances:
        digest.update(f"{instance.instance}\0{','.join(instance.shards)}\0".encode())
        for record in instance.copied:
            digest.update(f"{record.key}\0{record.shard}\0{record.record_offset}\0{record.record_size}\n".encode())
    return {
        "split": plan.split,
        "policy": plan.policy,
        "num_instances": plan.num_instances,
        "format": fmt,
        "source_metadata_sha256": source_sha256,
        "plan_sha256": digest.hexdigest(),
    }


def _remove_split_files(out: Path, split: str):
    for path in out.iterdir():
        name = path.name
        if (name.startswith((f"{split}-remainder-", f"{split}-instance-", f"{split}-reference."))
                or name.startswith(f"{split}.plan.json") or re.fullmatch(rf"{re.escape(split)}-\d{{6}}\.tar", name)):
            path.unlink(missing_ok=True)


@contextmanager
def _writing(path):
    """Turn a failed write (a full disk, a read-only mount) into a DatasetError naming the file."""
    try:
        yield
    except OSError as error:
        raise DatasetError(
            f"{path}: cannot write: {error.strerror or error}; no manifest was written, so no loader uses this "
            f"repartition; re-run once fixed (finished remainder shards are kept)"
        ) from None


def write_split(dataset: SourceDataset, plan: SplitRepartition, out: Path, progress=None) -> dict:
    """Write one split's remainder shards, shard lists and indexes; return its manifest entry."""
    fmt = remainder_format(dataset.format)
    n = plan.num_instances
    stamp = _plan_stamp(plan, dataset.metadata_sha256, dataset.format)
    stamp_path = out / f"{plan.split}.plan.json"
    if read_json_or_none(stamp_path) != stamp:
        _remove_split_files(out, plan.split)  # anything here was made for another plan
        with _writing(stamp_path):
            atomic_write_json(stamp_path, stamp)
    for path in out.glob(f"{plan.split}-*{PARTIAL_SUFFIX}"):
        path.unlink(missing_ok=True)  # left by a killed run

    shards, records_by_shard = dataset.splits[plan.split]
    reader = SourceReader(dataset.target, fmt)
    entries = []
    try:
        for instance in plan.instances:
            remainder_name, list_name, index_name = instance_file_names(plan.split, instance.instance, fmt.remainder_suffix)
            remainder_record, copied_records = None, []
            if instance.copied:
                remainder_record, copied_records = _write_remainder(out, plan, instance, remainder_name, fmt, reader,
                                                                    progress)
            read_order = itertools.chain((r for name in instance.shards for r in records_by_shard[name]),
                                         copied_records)  # streamed into the index, one shard at a time
            with _writing(out / index_name):
                write_sample_index(out / index_name, read_order)
            index_sha256, index_bytes = sha256_file(out / index_name)
            shard_list = list(instance.shards) + ([remainder_record.name] if remainder_record else [])
            with _writing(out / list_name):
                atomic_write_bytes(out / list_name, "".join(f"{name}\n" for name in shard_list).encode())
            entries.append(
                {
                    "instance": instance.instance,
                    "shards": list(instance.shards),
                    "remainder": remainder_record.name if remainder_record else None,
                    "remainder_record": remainder_record.to_json() if remainder_record else None,
                    "samples": instance.samples,
                    "bytes": instance.whole_bytes + (remainder_record.bytes if remainder_record else 0),
                    "copied_samples": len(instance.copied),
                    "copied_bytes": instance.copied_bytes,
                    "padded_keys": list(instance.padded_keys),
                    "dropped_keys": list(instance.dropped_keys),
                    "index": _relative(n, index_name),
                    # the loader holds the index against these: it lists what this instance reads
                    "index_record": {"bytes": index_bytes, "sha256": index_sha256},
                    "shard_list": _relative(n, list_name),
                }
            )
        loader_remainders = None
        if fmt.reference_loader_reads and n > 1:
            loader_remainders = write_loader_remainders(plan.split, n, shards, records_by_shard, out, fmt, reader,
                                                        progress, remainder_records, _writing)
    finally:
        reader.close()
    entry = {
        "policy": plan.policy,
        "total_samples": plan.total_samples,
        "samples_per_instance": plan.samples_per_instance,
        "copied_samples": plan.copied_samples,
        "copied_bytes": plan.copied_bytes,
        "padded_keys": list(plan.padded_keys),
        "dropped_keys": list(plan.dropped_keys),
        "instances": entries,
    }
    if loader_remainders is not None:
        entry[LOADER_REMAINDERS] = loader_remainders
    return entry


def _write_remainder(out: Path, plan: SplitRepartition, instance: InstanceShare, remainder_name: str, fmt, reader,
                     progress):
    """Copy an instance's planned samples into its remainder shard (kept when an earlier run of this plan
    finished it); return (its ShardRecord, the copied samples' index records)."""
    n = plan.num_instances
    remainder_path = out / remainder_name
    expected_size = fmt.finished_size(instance.copied_bytes)
    copied_records = remainder_records(instance.copied, _relative(n, remainder_name))
    if remainder_path.is_file() and remainder_path.stat().st_size == expected_size:
        # Finished by an earlier run of this same plan (it has its final name, so it is whole).
        (digest, md5), size = hash_file(remainder_path, ("sha256", "md5"))
        if progress:
            progress("kept", split=plan.split, name=remainder_name, bytes=size)
    else:
        with _writing(remainder_path), fmt.open_writer(remainder_path) as writer:
            for record, placed in zip(instance.copied, copied_records):
                offset = writer.add_raw_record(reader.read(record))
                if offset != placed.record_offset:
                    raise AssertionError("remainder offsets disagree with the plan")
                if progress:
                    progress("copied", split=plan.split, key=record.key, bytes=record.record_size)
        digest, md5, size = writer.sha256, writer.md5, writer.bytes_written
        if progress:
            progress("written", split=plan.split, name=remainder_name, bytes=size)
    return ShardRecord(_relative(n, remainder_name), len(instance.copied), size, digest, md5), copied_records
