"""Shard checks as worker tasks: what a `ShardTask` needs, and the pool that runs them.

The per-format check of one shard is chosen in one place, the format registry
(`imagenet_shards.formats.get_format(name).check_shard`); `run_shard_task` is what a worker runs.
`run_tasks` runs (task, ShardGroups) pairs over `workers` processes, largest shard first, and
yields each `ShardResult` as it finishes; a task's sample records are attached just before it
runs, so the pool never holds every shard's records at once. `read_index` reads a sample index
naming it as the report does; `label_offset_of` is the
label shift metadata.json records. Used by imagenet_shards.validate.converted and
imagenet_shards.validate.repartition_checks.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from imagenet_shards.formats import get_format
from imagenet_shards.formats.shard_check import ShardResult, ShardTask
from imagenet_shards.index import SampleColumns, parse_sample_columns


def label_offset_of(metadata) -> int:
    """metadata.json's label_offset (shards that store label + 1, as TF-slim's); 0 when absent."""
    value = metadata.get("label_offset", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def run_shard_task(task: ShardTask) -> ShardResult:
    return get_format(task.format).check_shard(task)



def read_index(path: Path, name: str) -> SampleColumns:
    """The index at `path` as columns ; errors name it by `name`."""
    with open(path, "rb") as stream:
        return parse_sample_columns(stream, name)



def _ready(item) -> ShardTask:
    """A task with its shard's records: (task, None) is ready; (task without them, ShardGroups) gets them now,
    just before it runs (the pool's feeder takes tasks as workers free up: never all shards' records at once)."""
    task, groups = item
    return task if groups is None else dataclasses.replace(task, samples=tuple(groups[task.name]))


def run_tasks(items, workers, progress, description):
    """Run shard tasks ((task, groups) as `_ready` takes them) over `workers` processes, largest first;
    yields results as they finish."""
    items = sorted(items, key=lambda item: -(item[0].record.bytes if item[0].record else 0))
    tasks = [task for task, _ in items]
    total = sum(_task_bytes(t) for t in tasks)
    bar = progress(total, description) if progress else None
    try:
        if workers <= 1 or len(tasks) <= 1:
            for item in items:
                result = run_shard_task(_ready(item))
                if bar is not None:
                    bar.update(_task_bytes(item[0]))
                yield result
        else:
            import multiprocessing

            with multiprocessing.Pool(min(workers, len(tasks))) as pool:
                for result in pool.imap_unordered(run_shard_task, map(_ready, items)):
                    if bar is not None:
                        bar.update(result.bytes_read or 0)
                    yield result
    finally:
        if bar is not None:
            bar.close()


def _task_bytes(task):
    try:
        return os.stat(task.path).st_size
    except OSError:
        return 0

