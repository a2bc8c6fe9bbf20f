"""The files the reference harness's loader reads of a repartitioned split, beside the shards.

Under N > 1 instances that loader (Graphcore's webdataset_format.py, its DistributeNode) does not
read this package's shares: it reads the shards dealt whole plus one remainder file per instance,
distributed/<N>-instances/<split>-<i:06d>.tar. datasets.repartition writes them (for a format whose
`reference_loader_reads` is set) from `reference_remainders`, and datasets.validate checks them
against it: one definition of what the files hold.
"""

from __future__ import annotations


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
