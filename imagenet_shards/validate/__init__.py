"""Is a dataset intact? One module per job; `validator.validate` is the entry.

    validator.py           the entry: which check a folder gets (converted, reference harness, raw), usage errors
    converted.py           a converted dataset: metadata.json, shards, sample indexes, extra files
    repartition_checks.py  its repartitions (distributed/<N>-instances/) against their manifests
    tasks.py               shard checks as worker tasks (the format registry's check_shard) and their pool
    raw.py                 a raw image folder: the reference checksum, ImageNet counts, its manifest
    raw_checksum.py        the raw folder's manifest (path, size, sha256 per file)
    remote.py              a converted dataset on S3 (streamed and checked as locally, or --quick)
    report.py              the Report every check returns, its exit code and JSON

Nothing here prints; validate_dataset.py renders the report.
"""
