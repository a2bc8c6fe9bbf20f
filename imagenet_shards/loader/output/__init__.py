"""What leaves the workers: batches in shared memory (batch_ring) and the epoch's reports (reports)."""

from imagenet_shards.loader.faces import lazy_exports

_EXPORTS = {
    **{name: "batch_ring" for name in ("BatchRing", "BatchBuilder", "RingMessage", "SharedFlags")},
    **{name: "reports" for name in ("EpochReport", "WorkerReport", "Skipped", "Batch")},
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
