"""Reading: a worker's run of samples from shards into raw samples, checked (read_loop, shard_reader,
epoch_runs, index_trust, worker_shards).

shard_reader is the light part (numpy only) that the tools and inspect/ read shards with.
"""

from imagenet_shards.loader.faces import lazy_exports

_EXPORTS = {
    **{name: "read_loop" for name in ("ReadLoop", "SampleError", "ON_ERROR")},
    "EpochRuns": "epoch_runs",
    **{name: "shard_reader" for name in ("Run", "iter_run", "scan_shard", "payload_extension", "sample_label",
                                          "is_url", "PAYLOAD_PREFERENCE")},
    **{name: "worker_shards" for name in ("is_worker_death", "WorkerDiedError")},
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
