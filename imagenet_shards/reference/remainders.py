"""The files the reference harness's loader reads of a repartitioned split, beside the shards.

Under N > 1 instances that loader (Graphcore's webdataset_format.py, its DistributeNode) does not
read this package's shares: it reads the shards dealt whole plus one remainder file per instance,
distributed/<N>-instances/<split>-<i:06d>.tar. imagenet_shards.repartition.write writes them (for a format whose
`reference_loader_reads` is set) from `reference_remainders`, and imagenet_shards.validate checks them
against it: one definition of what the files hold.
"""

from __future__ import annotations

from pathlib import Path

from imagenet_shards.index import ShardRecord, write_sample_index
from imagenet_shards.dataset_folder import DISTRIBUTED_DIR

LOADER_REMAINDERS = "reference_loader"  # a split's key in a repartition manifest: these files' entry


def reference_remainders(shards, records_by_shard, num_instances: int):
    """What the reference harness's loader (Graphcore's webdataset_format.py, its DistributeNode)
    reads of a split under N > 1 instances, beside the shards: it takes the shards in name order,
    deals all but the last r of them out whole (r = S mod N, or N when that is 0), and gives
    instance i the file distributed/<N>-instances/<split>-<i:06d>.tar, which must hold the i-th
    contiguous slice of the last r shards' samples (count // N each, one more for the first
    count mod N, as its distributed_webdataset.py writes them). Returns [[SampleRecord]] per instance."""
    names = sorted(shard.name for shard in shards)
    last = len(names) % num_instances or num_instances
    pool = [record for name in names[-last:] for record in records_by_shard[name]]
    slices, start = [], 0
    for instance in range(num_instances):
        count = len(pool) // num_instances + (1 if instance < len(pool) % num_instances else 0)
        slices.append(pool[start:start + count])
        start += count
    return slices


def reference_remainder_names(split: str, num_instances: int):
    """(file names of the reference loader's remainder shards, their sample index), in the repartition folder."""
    return [f"{split}-{instance:06d}.tar" for instance in range(num_instances)], f"{split}-reference.index.tsv"


def write_loader_remainders(split: str, n: int, shards, records_by_shard, out: Path, fmt, reader, progress,
                            place, writing) -> dict:
    """Copy, byte for byte, the files the reference harness's loader reads (`reference_remainders`)
    into the repartition folder `out`; return their manifest entry (LOADER_REMAINDERS). The samples
    are also in the repartition's own shares: a dataset repartitioned here reads under both loaders.

    The repartitioner (imagenet_shards.repartition) passes in its reader (`reader.read(record)`: the
    record's bytes), `place(records, shard)` (the records as copied into `shard` from offset 0)
    and `writing(path)` (a context turning a failed write into its DatasetError)."""
    names, index_name = reference_remainder_names(split, n)
    slices = reference_remainders(shards, records_by_shard, n)
    records, remainders = [], []
    for name, copied in zip(names, slices):
        path = out / name
        placed = place(copied, _relative(n, name))
        with writing(path), fmt.open_writer(path) as writer:
            for record, where in zip(copied, placed):
                if writer.add_raw_record(reader.read(record)) != where.record_offset:
                    raise AssertionError("reference remainder offsets disagree with the plan")
                if progress:
                    progress("copied", split=split, key=record.key, bytes=record.record_size)
        if progress:
            progress("written_reference", split=split, name=name, bytes=writer.bytes_written)
        remainders.append(ShardRecord(_relative(n, name), len(copied), writer.bytes_written, writer.sha256,
                                      writer.md5).to_json())
        records += placed
    with writing(out / index_name):
        write_sample_index(out / index_name, records)
    whole = sorted(shard.name for shard in shards)[: len(shards) - (len(shards) % n or n)]
    return {"shards": whole, "remainders": remainders, "index": _relative(n, index_name)}


def _relative(num_instances: int, name: str) -> str:
    return f"{DISTRIBUTED_DIR}/{num_instances}-instances/{name}"
