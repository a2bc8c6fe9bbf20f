"""A node-local cache of whole shards read from s3://, http(s):// or a local path marked remote (NFS).

    cache = ShardCache.for_dataset(directory, metadata, limit="200GB", remote_paths=False, prefetch=0)
    with cache.serve(name, shard) as (served, fill): ...   # formats.runs.ShardBytes: the entry (fill None) or the fill

Layout: `<directory>/<dataset key>/<shard name>` (the key is a sha256 of the dataset's identity, its `checksum`
and shard records, never a string from it, so two datasets, or a re-uploaded one, never share entries; both
folders are this user's, mode 0700, and another user's or a writable one is refused: docs/shard-cache.md's
trust model) with, beside each shard:
    <shard>.meta     {"size", "mtime_ns", "sha256"} of the entry, written after the rename: an entry is
                     served only while the file's size and mtime equal these and sha256 equals metadata.json's;
    <shard>.lock     the fill lock (flock LOCK_EX, held by the process fetching the shard: one fetch per
                     shard per node; a process that finds it held waits, then reads the finished entry);
    <shard>.pin      the in-use lock (LOCK_SH while any process reads the entry; eviction takes LOCK_EX
                     without waiting and skips what it cannot get); its mtime is the entry's last use (LRU);
    <shard>.part.*   a fill in progress: never served by name; a killed fill leaves one behind, removed by the
                     next fill of that shard (under the fill lock, so it is never someone's live file).

A fill is one GET of the whole shard in a thread of the process that first needs it: every chunk is
written to the part file and hashed, and the run being read follows the part file as it grows (the
same streaming pass, no second GET). At the end the size and sha256 are compared with metadata.json's
record: equal -> renamed into place (atomic) and the cache trimmed to its limit (LRU by bytes, pinned
entries never evicted); different -> the part file is removed, the event reported, and nothing cached.
The bytes a failed fill served are the store's bytes, exactly what an uncached read gets: the
loader's per-sample CRC32C checks name the damaged samples as they always do.

On a hit the loader reads the local file through the format's fast path and still checks every
sample's CRC32C. A sample of a cached shard that fails (CRC, framing) drops the entry; the shard is
fetched again and the rest of the rows read from the new copy (`read_rows`); the event is reported. The
same holds for a run read while following a fetch that proved good (its bytes matched metadata.json):
its failure is the local file's, changed on the disk under the reader.
An entry whose size or mtime changed is dropped and fetched again too. Events are counted per
process (`take_events`) and reported in the loader's EpochReport.

Not fsynced: a cache survives a killed process (the page cache holds the bytes), not necessarily a
power cut; what a power cut could damage is caught by the size/mtime and CRC32C checks above.
"""

from imagenet_shards.shard_cache.cache import CacheError, ShardCache, dataset_key, open_cache, parse_size
from imagenet_shards.shard_cache.events import cache_summary, merge_events, new_events, warn_cache_problems

__all__ = ["CacheError", "ShardCache", "cache_summary", "dataset_key", "merge_events", "new_events", "open_cache",
           "parse_size", "warn_cache_problems"]
