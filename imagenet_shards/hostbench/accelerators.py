"""Emulated accelerators that run: each one a process with its own loader, taking a batch then sleeping
the profile's compute time (imagenet_shards/hostbench/emulate.py holds the arithmetic).

Two depths of loader:
    storage    the accelerator's share of the split's shards read in sequence (local files, or one ranged
               GET per shard part over http(s)/s3; LMDB by key, locally), each sample's payload checked
               against its CRC32C in the sample index; no decode, and only the counts cross to the accelerator (as MLPerf
               Storage measures: bytes from storage). In a DataLoader with the accelerator's workers.
    pipeline   the project's loader (get_data): region decode, crop, flip, batches in shared memory.

`run_local(spec, n)` starts n processes on this host (fork) that start consuming together; under
torchrun (or poprun/SLURM) each rank runs `run_accelerator` as one accelerator and the figures are
gathered to rank 0.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from dataclasses import dataclass
from queue import Empty

from imagenet_shards.errors import DatasetError
from imagenet_shards.hostbench.emulate import Profile
from imagenet_shards.hostbench.timing import close_iterator

START_TIMEOUT_S = 600  # the most an accelerator waits for the others to be ready


class EmulationError(DatasetError):
    """An accelerator that could not run (its loader failed, a sample's CRC32C differed): exit 1."""


@dataclass(frozen=True)
class EmulationSpec:
    location: str  # a converted dataset: folder, http(s):// or s3://
    split: str
    depth: str  # "storage" | "pipeline"
    profile: Profile
    workers: int  # DataLoader workers per accelerator (0: in the accelerator's process)
    steps: int | None = None  # steps per accelerator after the first (else `seconds`)
    seconds: float | None = None
    seed: int = 0
    verify: bool = True
    normalization: str = "device"
    decode: str = "host"
    image_size: int = 224
    cache: object = None  # pipeline depth: imagenet_shards.loader.options.Cache (the node's shard cache), or None


# ---------------------------------------------------------------- the storage depth


def share_rows(total: int, index: int, count: int) -> tuple:
    """The contiguous row range [start, stop) of part `index` of `count` (rows in shard order)."""
    return total * index // count, total * (index + 1) // count


def shard_runs(columns, start: int, stop: int) -> list:
    """Rows [start, stop) split where the shard changes: [(shard name, first row, end row)]."""
    runs, ids = [], columns.shard_ids
    first = start
    for row in range(start + 1, stop + 1):
        if row == stop or ids[row] != ids[first]:
            runs.append((columns.shard_names[int(ids[first])], first, row))
            first = row
    return runs


CHUNK = 8 << 20  # bytes read at once: whole records, up to this much (one syscall or GET read, not one a sample)


def read_run(location: str, columns, first: int, end: int, buffer: bytearray, verify: bool):
    """Rows [first, end) of one shard read in one sequential pass, CHUNK bytes of whole records at a time;
    yields (records, bytes) per chunk after each payload's CRC32C is checked against the index
    (EmulationError naming the shard and key otherwise). `buffer` holds CHUNK + the largest record."""
    from crc32c import crc32c

    from imagenet_shards.storage import is_url, open_byte_range

    offsets = columns.record_offsets[first:end].tolist()
    ends = (columns.record_offsets[first:end] + columns.record_sizes[first:end]).tolist()
    check = verify and columns.has_checksums
    if check:
        payloads = (columns.payload_offsets[first:end]).tolist()
        payload_ends = (columns.payload_offsets[first:end] + columns.payload_sizes[first:end]).tolist()
        expected = columns.checksums[first:end].tolist()
    start, stop = offsets[0], ends[-1]
    remote = is_url(location)
    stream = open_byte_range(location, start, stop) if remote else open(location, "rb", buffering=0)
    with stream:
        if not remote:
            stream.seek(start)
        row, count = 0, len(offsets)
        while row < count:
            group_start, last = offsets[row], row
            while last + 1 < count and ends[last + 1] - group_start <= CHUNK:
                last += 1
            view = memoryview(buffer)[:ends[last] - group_start]
            _read_exactly(stream, view, location)
            if check:
                for i in range(row, last + 1):
                    if crc32c(view[payloads[i] - group_start:payload_ends[i] - group_start]) != expected[i]:
                        raise EmulationError(f"{location}: sample {columns.key(first + i)!r}: payload CRC32C "
                                             f"differs from the sample index")
            yield last + 1 - row, len(view)
            row = last + 1


def read_by_key(location: str, columns, first: int, end: int, shard_format, verify: bool):
    """Rows [first, end) of a local shard whose records are not byte ranges (LMDB: values looked up by key, one
    cursor walk), through the format's own `read_run`; yields (records, bytes) per CHUNK, CRC32C checked."""
    import numpy as np
    from crc32c import crc32c

    from imagenet_shards.formats.runs import ShardBytes

    checksums = columns.checksums if columns.has_checksums else None
    count = size = 0
    for row, _, payload, _, _, reason in shard_format.read_run(ShardBytes(location), columns, np.arange(first, end)):
        if reason is not None:
            raise EmulationError(reason)
        if verify and checksums is not None and (columns.checksum_known is None or columns.checksum_known[row]) \
                and crc32c(payload) != int(checksums[row]):
            raise EmulationError(f"{location}: sample {columns.key(row)!r}: payload CRC32C differs from the sample index")
        count, size = count + 1, size + int(columns.record_sizes[row])
        if size >= CHUNK:
            yield count, size
            count = size = 0
    if count:
        yield count, size


def _read_exactly(stream, view, location) -> None:
    done = 0
    while done < len(view):
        count = stream.readinto(view[done:])
        if not count:
            raise EmulationError(f"{location}: ends before the sample index says")
        done += count


def _storage_dataset_class():
    import torch

    class StorageShare(torch.utils.data.IterableDataset):
        """An accelerator's rows of the split, read endlessly (epoch after epoch) in batches of
        `batch_size`: each batch is {samples, bytes}. Workers split the rows again, contiguously."""

        def __init__(self, source, start, stop, batch_size, verify, seed):
            self.source, self.start, self.stop = source, start, stop
            self.batch_size, self.verify, self.seed = batch_size, verify, seed
            self.by_range = getattr(source.shard_format, "records_are_byte_ranges", True)

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            part, parts = (info.id, info.num_workers) if info else (0, 1)
            first, last = share_rows(self.stop - self.start, part, parts)
            columns = self.source.columns
            runs = shard_runs(columns, self.start + first, self.start + last)
            if not runs:
                return
            buffer = bytearray(CHUNK + int(columns.record_sizes.max())) if self.by_range else None
            samples = size = epoch = 0
            while True:
                order = list(runs)
                random.Random(self.seed * 1000003 + epoch * 7919 + part).shuffle(order)  # the runs' order per epoch
                for shard, begin, end in order:
                    location = self.source.locate(shard)
                    chunks = (read_run(location, columns, begin, end, buffer, self.verify) if self.by_range else
                              read_by_key(location, columns, begin, end, self.source.shard_format, self.verify))
                    for count, got in chunks:
                        samples, size = samples + count, size + got
                        while samples >= self.batch_size:  # bytes shared out by records (a chunk may span batches)
                            share = size * self.batch_size // samples
                            yield {"samples": self.batch_size, "bytes": share}
                            samples, size = samples - self.batch_size, size - share
                epoch += 1

    return StorageShare


def storage_batches(spec: EmulationSpec, index: int, count: int):
    """The storage depth's loader for accelerator `index` of `count`: (batches, samples in its share)."""
    import torch

    from imagenet_shards.loader.source_kinds import resolve_source
    from imagenet_shards.storage import is_url

    source = resolve_source(spec.location, spec.split)
    if source.columns is None:
        raise EmulationError(f"{spec.location}: the storage depth reads converted datasets (a sample index), not "
                             f"{source.description}")
    if not getattr(source.shard_format, "records_are_byte_ranges", True) and is_url(spec.location):
        raise EmulationError(f"{spec.location}: {source.shard_format.name} is read from local files only")
    start, stop = share_rows(len(source.columns), index, count)
    if stop - start < max(1, spec.workers):
        raise EmulationError(f"{spec.location}: {len(source.columns)} {spec.split} samples cannot be shared by "
                             f"{count} accelerator(s) x {max(1, spec.workers)} worker(s)")
    dataset = _storage_dataset_class()(source, start, stop, spec.profile.batch_size, spec.verify, spec.seed + index)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=spec.workers,
                                         persistent_workers=False, prefetch_factor=2 if spec.workers else None)
    return loader, stop - start


def pipeline_batches(spec: EmulationSpec, index: int, count: int):
    """The pipeline depth's loader (get_data) for accelerator `index` of `count`: (batches, samples in its share)."""
    from imagenet_shards.hostbench.pipelines import loader_batches
    from imagenet_shards.launcher import Instance

    instance = Instance(index, count, "explicit", evidence="emulated accelerator")
    options = {"jpeg_decode": "device"} if spec.decode == "device" else {}
    if spec.cache is not None:
        options["cache"] = spec.cache
    batches = loader_batches(spec.location, spec.split, spec.profile.batch_size, spec.workers, spec.normalization,
                             instance, seed=spec.seed, image_size=spec.image_size, verify=spec.verify, **options)
    return batches, batches.loader.samples_per_epoch


# ---------------------------------------------------------------- one accelerator


def consume(batches, compute_s: float, *, steps: int | None = None, seconds: float | None = None,
            clock=time.perf_counter, sleep=time.sleep, on_step=None, size_of=None) -> dict:
    """Take a batch, then sleep `compute_s` (less what `on_step` took), until `steps` steps after the first
    (or `seconds` of them). Returns the record emulate.summarise reads: per step the wait for the batch and the
    step's whole time (both measured) and the compute time (the profile's); samples and bytes after the first."""
    if steps is None and seconds is None:
        raise ValueError("consume needs steps or seconds")
    size_of = size_of or (lambda batch: (batch["samples"], batch["bytes"]))
    record = {"waits": [], "steps": [], "computes": [], "samples": 0, "bytes": 0, "seconds": 0.0,
              "samples_all": 0}
    iterator = iter(batches)
    try:
        return _consume(iterator, record, compute_s, steps, seconds, clock, sleep, on_step, size_of)
    finally:
        close_iterator(iterator)


def _consume(iterator, record, compute_s, steps, seconds, clock, sleep, on_step, size_of) -> dict:
    while True:
        t0 = clock()
        batch = next(iterator, None)
        if batch is None:
            raise EmulationError("the loader ended without a full batch (an accelerator's share smaller than the "
                                 "profile's batch, or an empty split)")
        t1 = clock()
        if on_step is not None:
            on_step()
        left = compute_s - (clock() - t1)
        if left > 0:
            sleep(left)
        t2 = clock()
        samples, size = size_of(batch)
        del batch
        record["samples_all"] += samples
        if record["steps"]:  # the first step is left out of the figures
            record["samples"] += samples
            record["bytes"] += size
            record["seconds"] += t2 - t0
        record["waits"].append(t1 - t0)
        record["steps"].append(t2 - t0)
        record["computes"].append(compute_s)
        done = len(record["steps"]) - 1
        if (steps is not None and done >= steps) or (seconds is not None and done and record["seconds"] >= seconds):
            return record


def run_accelerator(spec: EmulationSpec, index: int, count: int, ready=None) -> dict:
    """Accelerator `index` of `count`: build its loader, wait for `ready()` (the others), consume; its record,
    with its process tree's CPU seconds and the epochs of its share read."""
    import torch

    from imagenet_shards.hostbench.timing import CpuMeter

    torch.set_num_threads(1)
    make = storage_batches if spec.depth == "storage" else pipeline_batches
    batches, share = make(spec, index, count)
    size_of = None
    if spec.depth == "pipeline":
        per_image = spec_bytes_per_image(spec)

        def size_of(batch):
            return len(batch[1]), len(batch[1]) * per_image
    meter = CpuMeter()
    if ready is not None:
        ready()
    meter.start()
    seen = []

    def on_step():  # the workers start at the first batch: found then, and sampled every step while alive
        if not seen:
            seen.append(meter.discover())
        meter.sample()

    record = consume(batches, spec.profile.compute_s, steps=spec.steps, seconds=spec.seconds,
                     on_step=on_step, size_of=size_of)
    meter.sample()
    own, children, _ = meter.used()
    record["cpu_s"] = own + children
    record["share_samples"] = share
    record["epochs"] = record["samples_all"] / share if share else None
    return record


def spec_bytes_per_image(spec: EmulationSpec) -> float:
    from imagenet_shards.hostbench.discovery import source_bytes_per_image

    return source_bytes_per_image("real", spec.location, spec.split)


def _child(spec, index, count, barrier, queue) -> None:
    try:
        record = run_accelerator(spec, index, count, ready=lambda: barrier.wait(START_TIMEOUT_S))
        queue.put((index, record, None))
    except BaseException as error:  # reported by the parent, one line
        try:
            barrier.abort()
        except Exception:
            pass
        text = str(error).strip().splitlines()
        queue.put((index, None, f"{type(error).__name__}: {text[-1] if text else ''}"))


def run_local(spec: EmulationSpec, count: int) -> list:
    """`count` accelerators as processes of this host, started together; their records in index order."""
    context = multiprocessing.get_context("fork")
    barrier, queue = context.Barrier(count), context.Queue()
    processes = [context.Process(target=_child, args=(spec, i, count, barrier, queue), daemon=False)
                 for i in range(count)]
    for process in processes:
        process.start()
    results, errors = {}, []
    try:
        while len(results) + len(errors) < count:
            try:
                index, record, error = queue.get(timeout=5)
            except Empty:  # a process killed (out of memory, a signal) sends nothing: say which
                dead = [i for i, p in enumerate(processes) if p.exitcode not in (None, 0) and i not in results]
                if dead:
                    errors.append(f"accelerator {dead[0]}: its process ended with exit code "
                                  f"{processes[dead[0]].exitcode}")
                    break
                continue
            if error:
                errors.append(f"accelerator {index}: {error}")
            else:
                results[index] = record
    finally:
        for process in processes:
            if len(results) < count and process.is_alive():  # a failed or interrupted run: the rest wait in vain
                process.kill()
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()
    real = [e for e in errors if "BrokenBarrierError" not in e] or errors
    if real:
        raise EmulationError(real[0])
    return [results[i] for i in range(count)]


def drop_page_cache(location: str, split: str) -> int | None:
    """posix_fadvise(DONTNEED) on the split's local shard files, so the next run reads them from storage
    (clean pages only; no root needed). Bytes advised, or None where it cannot apply (remote, no fadvise)."""
    from imagenet_shards.loader.source_kinds import resolve_source
    from imagenet_shards.storage import is_url

    if is_url(location) or not hasattr(os, "posix_fadvise"):
        return None
    source = resolve_source(location, split)
    total = 0
    for name in source.columns.shard_names if source.columns is not None else ():
        path = source.locate(name)
        try:
            with open(path, "rb") as handle:
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(handle.fileno()).st_size
        except OSError:
            return None
    return total
