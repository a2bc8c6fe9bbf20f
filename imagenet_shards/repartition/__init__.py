"""Give every instance of a distributed job an equal share of a converted dataset, moving as little as possible.

A split of T samples in S shards, read by N instances, rarely divides evenly: S is not a multiple
of N, or the last shard is partial. This package plans and writes a repartition:

    DIR/distributed/<N>-instances/
        manifest.json                       written last: its presence means the repartition is complete
        <split>-remainder-0000.tar ...      per instance, the samples copied to balance it (or none)
        <split>-instance-0000.txt ...       per instance, the shards it reads, one path (relative to DIR) a line
        <split>-instance-0000.index.tsv     per instance, a sample index (imagenet_shards.index format) of exactly
                                            its samples in read order, `shard` relative to DIR
        <split>-000000.tar ...              img only, N > 1: what the reference harness's loader reads
        <split>-reference.index.tsv           (see `reference_remainders`); their sample index

One module per job, each importing only those above it here:

    plan.py      the pure planner: whole shards per instance, the samples copied, dropped, padded
                 (plan_split, remainder_records, RepartitionUsageError)
    source.py    the input: metadata.json, the split's index and shards, checked before anything is
                 written; the reader of sample bytes (load_dataset, load_split, group_records_by_shard)
    request.py   N, splits and policies checked, and what to do given the existing manifest
                 (resolve_request, decide, read_manifest)
    write.py     remainder shards, shard lists, indexes and the manifest, atomically and resumably
    run.py       repartition(): the steps above in order, under the folder's lock
    report.py    describe_plan: the plan as a table

The drop/pad/spread counts are imagenet_shards.balance's, shared with the loader. The original shards,
indexes and metadata.json are only read. distributed_webdataset.py is the command.
"""
