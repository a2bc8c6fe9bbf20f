"""A dataset of an earlier layout that this version cannot check sample by sample: one line naming what
to run, never "corrupted".

The layouts this project has written since 3a4a4fc are listed in docs/on-disk-format.md; each validates
as it is except the pre-CRC32C sample index (`payload_sha256`, imagenet_shards.index.earlier). A
dataset with such an index in any split gets one error line naming the re-index command as the user has
it (`reindex_command`, with the dataset's path) and exit 1, nothing else about its samples: this
version's sample checks need the CRC32Cs. Its shards are still hashed whole against metadata.json
(size and sha256: the first step of every shard check), so a shard changed since conversion is named
and an intact one says nothing; the index's own sha256s are checked payload by payload by the re-index
itself, which refuses a damaged shard and leaves the index as it was.
"""

from __future__ import annotations

import time
from pathlib import Path

from imagenet_shards.fileio import hash_file
from imagenet_shards.formats.shard_check import error
from imagenet_shards.index.earlier import reindex_command
from imagenet_shards.validate.report import Report, sorted_problems


def earlier_index_report(root, report: Report, indexes, shards, workers: int, started: float) -> Report:
    """`report` finished for a dataset whose sample indexes `indexes` (names) are of the earlier version:
    the problems found so far (metadata.json, the indexes' own size and sha256), the one line naming the
    re-index command, and each of `shards` (ShardRecords) that is missing or differs from metadata.json.
    No verdict line (the dataset is not known to be corrupt) and no notes (re-indexing reseals
    metadata.json); `report.upgrade` holds the command."""
    command = reindex_command(root)
    plural = len(indexes) > 1
    first = error(", ".join(indexes), f"{'sample indexes' if plural else 'a sample index'} of the earlier version "
                                      f"(payload sha256, no CRC32C), not damage: run `{command}` (it checks every "
                                      f"payload against its sha256), then validate again")
    checked = 0
    for problem, size in _whole_shard_problems(Path(root), shards, workers):
        checked += 1 if size is not None else 0
        report.problems += [problem] if problem is not None else []
        report.stats["bytes_checked"] = report.stats.get("bytes_checked", 0) + (size or 0)
    report.problems = [first] + sorted_problems(report.problems)
    report.verdicts, report.notes, report.upgrade = {}, [], command
    seconds = time.perf_counter() - started
    report.stats.update(shards_checked=checked, samples_checked=0, workers=workers, seconds=round(seconds, 3))
    return report


def _whole_shard_problems(root: Path, shards, workers: int):
    """(problem or None, bytes read or None) for each shard: its size and sha256 against its record."""
    jobs = [(str(root / shard.name), shard.name, shard.bytes, shard.sha256) for shard in shards]
    if workers <= 1 or len(jobs) <= 1:
        yield from map(_shard_problem, jobs)
        return
    import multiprocessing

    with multiprocessing.Pool(min(workers, len(jobs))) as pool:
        yield from pool.imap_unordered(_shard_problem, jobs)


def _shard_problem(job):
    path, name, size, sha256 = job
    try:
        (digest,), read = hash_file(path)
    except FileNotFoundError:
        return error(name, "missing shard: listed in metadata"), None
    except OSError as exc:
        return error(name, f"cannot read the shard: {exc.strerror or exc}"), None
    if read != size:
        return error(name, f"size {read:,} bytes, metadata says {size:,} (truncated, extended or replaced)"), read
    if digest != sha256:
        return error(name, f"sha256 {digest[:16]}... differs from metadata ({sha256[:16]}...): changed since "
                           f"conversion (re-indexing names a damaged payload)"), read
    return None, read
