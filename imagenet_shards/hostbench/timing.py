"""How a batch is timed: the measurement core of the host benchmark.

`measure_batches` pulls batches from any iterable of `(images, labels)`, excludes warm-up
batches, stops after a set number of batches or seconds (or at the end of the data), and
returns a plain dict of figures. `run_iterations` repeats it with fresh workers, as epochs
do, and gathers every instance's figures.

What the figures mean, and how they are counted:

images/s        images in the measured batches / wall time from the end of warm-up to the
                arrival of the last measured batch.
per worker      images/s / max(1, DataLoader workers). The bare decode+augment row is one
                process, so its per-worker rate is its rate.
img/CPU-s       images / CPU seconds: "per core". CPU seconds = this process (all its
                threads, `time.process_time`) + every live descendant process (the
                DataLoader workers), read from /proc/<pid>/stat (utime + stime) after each
                batch. `resource.getrusage(RUSAGE_CHILDREN)` cannot do this: it only
                counts children that have exited and been waited for, and the workers are
                alive while they work. Workers are found by scanning /proc for processes
                whose parent chain leads here, once per new iterator (the DataLoader
                starts its workers in `iter()`). A worker's CPU is counted from its first
                sighting (or the start of the measurement) to its last sighting, so work
                on batches prefetched before the start and after the end of the
                measurement roughly cancels in steady state. Without /proc only this
                process is counted, and `cpu_scope` says so. The meter's own reads of
                /proc (a few per batch, a scan of every process per new iterator) are
                not counted: they are the measurement's cost, not the pipeline's.
MB/s            images/s x the source's mean stored bytes per image: for shards, the
                split's shard bytes / samples from metadata.json (tar headers, .cls and
                .json members included: everything a reader fetches); for a folder, the
                mean file size. It is the read rate the storage (disk, NFS, HTTP) must
                sustain to keep up, whether or not the page cache served it here.
                Generated data reads nothing: 0.
latency p50/p99 time the consumer waits in `next()` for each measured batch, in ms.

The rest of the host benchmark (imagenet_shards/hostbench/), one job per module:
  discovery.py         what to read: the formats compared (COMPARED_FORMATS), discovery of a comparison directory
  stock_baselines.py   how the usual library reads each format, by format name (STOCK_BASELINES)
  pipelines.py         what is timed: bare decode+augment, the baselines (BASELINES), the loader
  comparison.py        the format comparison: rows to measure, interleaved rounds, goals
  transports.py        --compare-transport: remote copies, requests counted (RequestLog), transport ceilings
  cache_epochs.py      the shard cache's cold and warm epochs
  recommend.py         --recommend's arithmetic; decision.py the command around it
  report.py            table, JSON and bar chart of the figures
  run.py               what host_benchmark.py runs: one source over iterations, or the comparison
  collective.py        gathering each instance's figures to rank 0
  host_info.py         the host the figures come from, and how busy other programs keep it
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from imagenet_shards.hostbench.collective import Collective
from imagenet_shards.launcher import Instance
from imagenet_shards.errors import Error


class BenchmarkError(Error):
    """A benchmark that cannot run as asked: the message names the directory, row or value."""


# ---------------------------------------------------------------- CPU time of this process and its workers

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
HAVE_PROC = Path("/proc/self/stat").exists()


def read_proc_stat(pid: int):
    """(parent pid, CPU seconds used so far) of a live process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after the last ")".
    rest = data[data.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime field 14, stime field 15.
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / CLOCK_TICKS


def descendant_pids(root: int) -> list:
    """Every live process whose chain of parents leads to `root` (one scan of /proc)."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        stat = read_proc_stat(int(name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return sorted(found)


class CpuMeter:
    """CPU seconds of this process plus its live descendants since `start()` (see module doc)."""

    # Iterators may start their workers lazily (at the first next()), and an epoch boundary
    # replaces them: look for new processes after each epoch's first batch and at this period.
    REDISCOVER_SECONDS = 1.0  # a scan of /proc costs ~2 ms here

    def __init__(self):
        self._discovered_at = 0.0
        self.scope = "process and DataLoader workers (/proc)" if HAVE_PROC else "this process only (no /proc)"
        self._own_start = 0.0
        self._first = {}  # pid -> CPU seconds at first sighting (0 for pids born after start)
        self._last = {}  # pid -> CPU seconds at last sighting
        self._started = False
        self.metering_seconds = 0.0  # this process's CPU spent reading /proc since start(): not counted

    def start(self) -> None:
        self._first, self._last = {}, {}
        self._started = True
        self._discover(born_before_start=True)
        self._own_start, self.metering_seconds = time.process_time(), 0.0

    def discover(self, born_before_start: bool = False) -> None:
        """Pick up new worker processes (call after a DataLoader iterator is created)."""
        began = time.process_time()
        self._discover(born_before_start)
        self.metering_seconds += time.process_time() - began

    def _discover(self, born_before_start: bool) -> None:
        self._discovered_at = time.perf_counter()
        if not HAVE_PROC:
            return
        for pid in descendant_pids(os.getpid()):
            if pid in self._first:
                continue
            stat = read_proc_stat(pid)
            if stat is None:
                continue
            # A worker seen at start() counts from that moment; one started later counts from birth.
            self._first[pid] = stat[1] if born_before_start or not self._started else 0.0
            self._last[pid] = stat[1]

    def sample(self) -> None:
        began = time.process_time()
        if time.perf_counter() - self._discovered_at >= self.REDISCOVER_SECONDS:
            self._discover(False)
        for pid in self._first:
            stat = read_proc_stat(pid)
            if stat is not None:
                self._last[pid] = stat[1]
        self.metering_seconds += time.process_time() - began

    def used(self) -> tuple:
        """(CPU seconds of this process, of its descendants, number of descendants counted) since
        start; this process's seconds without the meter's own (`metering_seconds`)."""
        own = time.process_time() - self._own_start - self.metering_seconds
        children = sum(self._last[pid] - self._first[pid] for pid in self._first)
        return own, children, len(self._first)


# ---------------------------------------------------------------- the measurement loop


class EpochBatches:
    """Iterate `make_iterable(epoch)` epoch after epoch, calling `on_new_iterator` at each epoch's first batch.

    The hook lets the CPU meter find the worker processes a DataLoader starts in `iter()`.
    `max_epochs` None repeats forever (the measurement stops by batches or seconds).
    """

    def __init__(self, make_iterable: Callable, max_epochs: int | None = 1, first_epoch: int = 0):
        self.make_iterable = make_iterable
        self.max_epochs = max_epochs
        self.first_epoch = first_epoch
        self.on_new_iterator = lambda: None
        self.epochs_started = 0

    def __iter__(self):
        epoch = self.first_epoch
        while self.max_epochs is None or epoch < self.first_epoch + self.max_epochs:
            iterator = iter(self.make_iterable(epoch))
            self.epochs_started += 1
            produced = False
            try:
                for batch in iterator:
                    if not produced:
                        # Workers exist by now even if iter() started them lazily.
                        self.on_new_iterator()
                    produced = True
                    yield batch
            finally:
                close_iterator(iterator)
            if not produced:
                return  # an empty epoch: repeating would loop forever
            epoch += 1


def close_iterator(iterator) -> None:
    """Stop an iterator's worker processes now, not whenever garbage collection gets to it.

    A DataLoader iterator left alive would be inherited by the next row's forked workers,
    whose exit then tries to shut down processes that are not theirs.
    """
    close = getattr(iterator, "close", None)  # generators (e.g. the project's loader)
    if close is not None:
        close()
    shutdown = getattr(iterator, "_shutdown_workers", None)  # torch DataLoader's multi-process iterator
    if shutdown is not None:
        shutdown()


def percentile_ms(values, q) -> float:
    return float(np.percentile(np.asarray(values), q) * 1000.0) if len(values) else float("nan")


def describe_batch(batch) -> tuple:
    """(dtype, shape) of a batch's images, as text; a list of arrays reads "uint8", "64x224x224x3 (list)"."""
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(images, list):
        first = images[0] if images else None
        dtype = str(getattr(first, "dtype", type(first).__name__))
        inner = "x".join(str(s) for s in getattr(first, "shape", ()))
        return dtype, f"{len(images)}x{inner} (list)" if inner else f"{len(images)} (list)"
    dtype = str(getattr(images, "dtype", type(images).__name__)).replace("torch.", "")
    shape = "x".join(str(s) for s in getattr(images, "shape", ()))
    return dtype, shape


def measure_batches(batches: Iterable, *, warmup_batches: int = 2, max_batches: int | None = None,
                    max_seconds: float | None = None, bytes_per_image: float = 0.0, workers: int = 0,
                    on_batch: Callable | None = None) -> dict:
    """Time `batches` (an iterable of `(images, labels)`); return the figures as a dict.

    Warm-up batches (worker start-up, first file opens) are pulled first and not counted.
    Then batches are counted until `max_batches`, `max_seconds` or the end of the data.
    An `EpochBatches` gets the CPU meter's discovery hook so new workers are counted.
    """
    if warmup_batches < 0:
        raise BenchmarkError(f"warm-up batches must be >= 0, got {warmup_batches}")
    meter = CpuMeter()
    if isinstance(batches, EpochBatches):
        batches.on_new_iterator = meter.discover
    iterator = iter(batches)
    try:
        return _measure(iterator, meter, warmup_batches, max_batches, max_seconds, bytes_per_image, workers,
                        on_batch)
    finally:
        close_iterator(iterator)


def _measure(iterator, meter, warmup_batches, max_batches, max_seconds, bytes_per_image, workers, on_batch):
    for number in range(warmup_batches):
        try:
            next(iterator)
        except StopIteration:
            raise BenchmarkError(
                f"the data ran out after {number} batches, during the {warmup_batches} warm-up batches: "
                f"use a smaller --batch-size or fewer --warmup-batches"
            ) from None
    meter.start()
    waits, images, count = [], 0, 0
    first_batch = None
    started = last = time.perf_counter()
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        arrived = time.perf_counter()
        meter.sample()
        waits.append(arrived - asked)
        images += len(batch[0])
        count += 1
        last = arrived
        if first_batch is None:
            first_batch = batch
        if on_batch is not None:
            on_batch(batch)
        if max_batches is not None and count >= max_batches:
            break
        if max_seconds is not None and arrived - started >= max_seconds:
            break
    if count == 0:
        raise BenchmarkError(
            f"no batch left to measure after {warmup_batches} warm-up batches: the data is too small "
            f"for this batch size; use a smaller --batch-size or fewer --warmup-batches"
        )
    seconds = last - started
    main_cpu, worker_cpu, processes = meter.used()
    dtype, shape = describe_batch(first_batch)
    return measurement_figures(
        images=images, batches=count, seconds=seconds, cpu_seconds=main_cpu + worker_cpu, waits=waits,
        bytes_per_image=bytes_per_image, workers=workers, warmup_batches=warmup_batches,
        batch_dtype=dtype, batch_shape=shape, cpu_scope=meter.scope, processes_counted=1 + processes,
        # Where the CPU went: the consuming process (receiving batches) vs the worker processes.
        main_cpu_ms_per_image=1000.0 * main_cpu / images, worker_cpu_ms_per_image=1000.0 * worker_cpu / images,
    )


def measurement_figures(*, images, batches, seconds, cpu_seconds, waits, bytes_per_image, workers, instances=1,
                        **extra) -> dict:
    seconds = max(seconds, 1e-9)
    rate = images / seconds
    return {
        "images": images,
        "batches": batches,
        "seconds": seconds,
        "images_per_s": rate,
        # workers=0 loads in the consuming process itself: one process does the work.
        "images_per_s_per_worker": rate / (max(1, workers) * instances),
        "workers": workers,
        "instances": instances,
        "cpu_seconds": cpu_seconds,
        "cpu_ms_per_image": 1000.0 * cpu_seconds / images,
        "images_per_cpu_s": images / cpu_seconds if cpu_seconds > 0 else float("nan"),
        "cores_busy": cpu_seconds / seconds,
        "bytes_per_image": bytes_per_image,
        "mb_per_s": rate * bytes_per_image / 1e6,
        "latency_ms_p50": percentile_ms(waits, 50),
        "latency_ms_p99": percentile_ms(waits, 99),
        "waits_s": list(waits),
        **extra,
    }


def combine_instances(per_instance: list) -> dict:
    """Aggregate over instances: total images / the slowest instance's time; CPU summed."""
    if len(per_instance) == 1:
        return dict(per_instance[0])
    first = per_instance[0]
    images = sum(m["images"] for m in per_instance)
    waits = [w for m in per_instance for w in m["waits_s"]]
    combined = measurement_figures(
        images=images,
        batches=sum(m["batches"] for m in per_instance),
        seconds=max(m["seconds"] for m in per_instance),
        cpu_seconds=sum(m["cpu_seconds"] for m in per_instance),
        waits=waits,
        bytes_per_image=first["bytes_per_image"],
        workers=first["workers"],
        instances=len(per_instance),
        **{k: first[k] for k in ("warmup_batches", "batch_dtype", "batch_shape", "cpu_scope") if k in first},
    )
    combined["processes_counted"] = sum(m.get("processes_counted", 1) for m in per_instance)
    for key in ("main_cpu_ms_per_image", "worker_cpu_ms_per_image"):
        if all(key in m for m in per_instance):
            combined[key] = sum(m[key] * m["images"] for m in per_instance) / images
    if all("gets" in m for m in per_instance):  # a remote row's requests: GETs summed, TTFB the worst instance's
        combined["gets"] = sum(m["gets"] for m in per_instance)
        if all(m.get("store_bytes") is not None for m in per_instance):
            combined["store_bytes"] = sum(m["store_bytes"] for m in per_instance)
        for key in ("ttfb_ms_p50", "ttfb_ms_p99"):
            combined[key] = max((m[key] for m in per_instance if m.get(key) is not None), default=None)
    return combined


# A measurement this short gives coarse CPU figures: the table and the report say so.
SHORT_MEASUREMENT_SECONDS = 1.0
SHORT_NOTE = (f"* measured for less than {SHORT_MEASUREMENT_SECONDS:g} s: CPU figures are coarse (the kernel counts "
              f"CPU in {1000 // CLOCK_TICKS} ms ticks per process) and prefetching skews them; measure longer")


# ---------------------------------------------------------------- one source, several iterations


def run_iterations(make_epoch: Callable, *, iterations: int, warmup_batches: int, max_batches=None,
                   max_seconds=None, bytes_per_image=0.0, workers=0, collective: Collective | None = None,
                   on_iteration: Callable | None = None) -> list:
    """Measure `iterations` times; each starts a fresh iterator (new workers), as an epoch does.

    Without a batch or time limit an iteration is one whole epoch (the reference harness's
    behaviour). Returns per iteration {"instances": [...], "aggregate": {...}}.
    """
    collective = collective or Collective(Instance(0, 1, "single"))
    limited = max_batches is not None or max_seconds is not None
    results = []
    next_epoch = 0  # iteration n continues where n-1 stopped, so each sees a new shuffle
    for iteration in range(iterations):
        batches = EpochBatches(make_epoch, max_epochs=None if limited else 1, first_epoch=next_epoch)
        collective.barrier()
        try:
            figures, error = measure_batches(batches, warmup_batches=warmup_batches, max_batches=max_batches,
                                             max_seconds=max_seconds, bytes_per_image=bytes_per_image,
                                             workers=workers), None
        except Exception as exc:  # gathered first, so no instance waits forever for a failed one
            figures, error = None, f"{type(exc).__name__}: {exc}"
        next_epoch += max(1, batches.epochs_started)
        gathered = collective.gather({"figures": figures, "error": error, "index": collective.instance.index})
        failed = [f"instance {g['index']}: {g['error']}" for g in gathered if g["error"]]
        if failed:
            raise BenchmarkError("; ".join(failed))
        per_instance = [g["figures"] for g in gathered]
        result = {"iteration": iteration + 1, "instances": per_instance, "aggregate": combine_instances(per_instance)}
        results.append(result)
        if on_iteration is not None:
            on_iteration(result)
    return results
