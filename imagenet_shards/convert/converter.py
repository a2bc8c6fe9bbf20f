"""Convert an ImageNet source (folders or archives) into verified, reproducible WebDataset shards: the runner.

Pipeline: list the source (imagenet_shards.convert.imagenet_source) -> plan -> encode and write whole shards in
worker processes -> record each finished shard -> when every shard exists, write the
per-split sample indexes and, last, metadata.json.

Contract: convert(ConvertOptions) -> Summary, or UsageError (exit code 2) / ConversionError (exit
code 1) with a one-line message naming the file and the problem; format_summary is the closing text.
The parts, one job each (their docstrings hold the details and guarantees):
  plan.py          the options and the deterministic plan: order, shards, steps, fingerprint
  encode.py        one sample's payload and json, one whole shard written (in a worker), its members
  target_state.py  the target folder: --overwrite/--resume rules, state records, the lock, finishing
                   (indexes, metadata.json), crash safety
  errors.py        the failures and how a failed write names its file
  this module      seed, tasks, the worker pool, progress and the summary

Shards are independent: shard n's bytes depend only on its samples and the options, so any
worker may write any shard and the output is byte-identical for every --workers value and
instance count. --workers 1 encodes in the main process; N > 1 uses N worker processes
that each encode and write whole shards while the main process records results. Workers
die with the main process (PR_SET_PDEATHSIG), so after a kill -9 none lives on to publish a
shard while a --resume rewrites it.

Several instances (torchrun, poprun, SLURM; imagenet_shards.launcher): instance i writes the shards
whose number is i modulo the count. Every instance plans identically (--seed is required
when there is more than one instance and none was recorded) and whichever instance finds
every shard's record after finishing its own writes the indexes and metadata.json (under an
flock of the target folder, so two that finish together do it once; the other finds that
metadata.json and reports the dataset complete); if none does (an instance crashed), a later
--resume run finishes the job.
"""

import os
import secrets
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from imagenet_shards.convert.dataset_source import open_any_source
from imagenet_shards.convert.encode import EncodeOptions, ShardToWrite, WrittenShard, write_shard
from imagenet_shards.convert.failures import ConversionError, SampleFailure, UsageError, WriteFailure, write_problem
from imagenet_shards.convert.imagenet_source import ImageNetSourceError
from imagenet_shards.convert.plan import ConvertOptions, Plan, make_plan, validate_options
from imagenet_shards.convert.target_state import (
    STATE_DIR,
    check_target,
    complete_metadata,
    finalize,
    load_record,
    prepare_target,
    recorded_plan,
    remove_state,
    restore_state,
    save_record,
    state_dir,
    verify_complete,
)
from imagenet_shards.fileio import human_bytes
from imagenet_shards.formats import get_format
from imagenet_shards.index import CONVERT_STATE_REMOVED
from imagenet_shards.dataset_folder import METADATA_FILE


# ---------------------------------------------------------------- running


@dataclass
class SplitReport:
    split: str
    planned_samples: int = 0  # this instance's share
    shards: int = 0  # this instance's shards
    written: int = 0  # samples written by this run
    skipped: list = field(default_factory=list)
    kept_shards: int = 0
    bytes: int = 0


@dataclass
class Summary:
    options: ConvertOptions
    plan: Plan
    seed: int
    reports: dict
    elapsed: float  # the whole run: listing, planning, encoding, index and metadata
    encode_elapsed: float  # encoding and writing the shards only
    encode_cpu: float  # CPU seconds of that phase, main process and workers
    metadata: dict | None
    missing_shards: int
    already_complete: bool = False  # --resume found this plan's complete dataset: nothing written
    leftover_state_removed: bool = False  # ... and removed the .convert-state/ a crash had left
    incomplete_reason: str | None = None  # why a dataset whose metadata.json has this plan was converted again


def choose_seed(options: ConvertOptions) -> int:
    if options.seed is not None:
        return options.seed
    if options.resume or options.instance.count > 1:
        recorded = recorded_plan(options.target)
        if recorded is not None and isinstance(recorded["options"].get("seed"), int):
            return recorded["options"]["seed"]
    if options.instance.count > 1:
        raise UsageError(
            f"--seed is required with {options.instance.count} instances: every instance must plan the same "
            f"order ({options.instance.describe()})")
    return secrets.randbelow(2**31)


def convert(options: ConvertOptions) -> Summary:
    """Run a conversion (see the module docstring). Raises UsageError or ConversionError."""
    started = time.perf_counter()
    validate_options(options)
    check_target(options)
    seed = choose_seed(options)
    try:
        source = open_any_source(options.source, options.splits, options.source_layout,
                                 sizes=options.max_shard_bytes is not None)
    except ImageNetSourceError as error:
        raise (UsageError if error.usage else ConversionError)(str(error)) from None
    plan = make_plan(options, source, seed)
    instance = options.instance
    incomplete = None
    if (options.resume or instance.count > 1) and not options.overwrite:
        done, incomplete = complete_metadata(options.target, plan)
        if done is not None and (done.get(CONVERT_STATE_REMOVED) or not state_dir(options.target).exists()):
            try:
                incomplete = verify_complete(options, plan, done)
                if incomplete is None:
                    leftover = state_dir(options.target).exists()
                    remove_state(options.target)  # left by a crash after metadata.json was written
                    return Summary(options, plan, seed, {}, time.perf_counter() - started, 0.0, 0.0, done, 0,
                                   already_complete=True, leftover_state_removed=leftover)
                if options.resume:  # (an instance started without it is refused below: nothing written)
                    restore_state(options.target, plan, done)  # the verified shards are kept by the resume below
            except WriteFailure as failure:
                raise ConversionError(str(failure)) from None
            except OSError as error:
                raise ConversionError(f"{error.filename or options.target}: {write_problem(error)}") from None
        # Else not complete; or made by an earlier version that kept .convert-state/ inside the checksum:
        # resumed as usual (every shard verified against its record), metadata.json written without it.
    tasks = {split: [] for split in plan.splits}
    own_names = []
    for split, split_plan in plan.splits.items():
        encode = EncodeOptions(options.format, split_plan.steps, options.image_quality,
                               options.max_image_pixels, options.on_error)
        for number, shard in enumerate(split_plan.shards):
            if number % instance.count != instance.index:
                continue
            name = get_format(options.format).shard_name(split, number, len(split_plan.shards))
            own_names.append(name)
            tasks[split].append(ShardToWrite(split, number, name, shard, encode))
    try:
        prepare_target(options, plan, own_names)
    except WriteFailure as failure:
        raise ConversionError(str(failure)) from None
    except OSError as error:  # creating the folder, removing an earlier run's files
        raise ConversionError(f"{error.filename or options.target}: cannot prepare the target folder: "
                              f"{write_problem(error)}") from None
    reports = {split: SplitReport(split) for split in plan.splits}
    if options.resume or instance.count > 1:
        for split, split_tasks in tasks.items():
            tasks[split] = [_with_expected(options.target, task, plan.fingerprint) for task in split_tasks]
    try:
        encode_started, cpu_started = time.perf_counter(), _cpu_seconds()
        run_all(options, plan, tasks, reports)  # returns after the workers have exited: their CPU is counted
        encode_elapsed, encode_cpu = time.perf_counter() - encode_started, _cpu_seconds() - cpu_started
        metadata, missing = finalize(options, plan)
    except WriteFailure as failure:
        raise ConversionError(str(failure)) from None
    except OSError as error:  # reading state, listing or removing stale files (writes are WriteFailures)
        raise ConversionError(f"{error.filename or options.target}: {write_problem(error)}") from None
    return Summary(options, plan, seed, reports, time.perf_counter() - started, encode_elapsed, encode_cpu,
                   metadata, missing, incomplete_reason=incomplete)


def _cpu_seconds() -> float:
    """CPU time of this process and its exited children (the worker processes)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _with_expected(target: Path, task: ShardToWrite, fingerprint: str) -> ShardToWrite:
    record = load_record(target, task.name, fingerprint)
    if record is None:
        return task
    return ShardToWrite(task.split, task.number, task.name, task.samples, task.encode, record["shard"])


def run_all(options: ConvertOptions, plan: Plan, tasks: dict, reports: dict) -> None:
    from tqdm import tqdm

    target = options.target
    executor = None
    if options.workers > 1 and sum(len(t) for t in tasks.values()) > 1:
        context = get_context("fork") if sys.platform.startswith("linux") else get_context()
        executor = ProcessPoolExecutor(max_workers=options.workers, mp_context=context,
                                       initializer=_worker_init, initargs=(os.getpid(),))
    interactive = sys.stderr.isatty()
    try:
        for split, split_tasks in tasks.items():
            report = reports[split]
            report.shards = len(split_tasks)
            report.planned_samples = sum(len(t.samples) for t in split_tasks)
            bar = tqdm(total=report.planned_samples, desc=f"{split:<10}", unit="img", disable=not options.progress,
                       mininterval=0.5 if interactive else 30, dynamic_ncols=True, file=sys.stderr)

            def record(result: WrittenShard):
                if result.kept:
                    report.kept_shards += 1
                    if executor is not None:
                        bar.update(len(tasks_by_number[result.number].samples))
                else:
                    save_record(target, result, plan.fingerprint)
                    if options.on_published is not None:
                        options.on_published(result.shard)
                    report.written += result.shard.samples
                    report.skipped.extend(result.skipped)
                    report.bytes += result.shard.bytes
                    if executor is not None:
                        bar.update(result.shard.samples + len(result.skipped))

            tasks_by_number = {t.number: t for t in split_tasks}
            try:
                if executor is None:
                    for task in split_tasks:
                        record(write_shard(str(target), task, progress=bar.update))
                else:
                    run_in_pool(executor, str(target), split_tasks, record)
            finally:
                bar.close()
    except SampleFailure as failure:
        raise ConversionError(f"{failure} (--on-error fail stops at the first bad sample; "
                              f"--on-error skip skips and lists it)") from None
    except WriteFailure as failure:
        raise ConversionError(str(failure)) from None
    except BrokenProcessPool:
        raise ConversionError(
            "a worker process died (killed, or out of memory?); finished shards are kept: run again with "
            "--resume, perhaps with fewer --workers") from None
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def _worker_init(parent_pid: int) -> None:
    """Workers die with the main process (Linux): when the job is killed, none lives on to publish a
    shard under a name a --resume run is writing again."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def run_in_pool(executor, target: str, tasks, record) -> None:
    """Run shard tasks in worker processes; record each as it finishes.

    On a failure, pending shards are cancelled, running ones finish and are recorded (so a
    --resume keeps them), then the failure is raised.
    """
    futures = {executor.submit(write_shard, target, task): task for task in tasks}
    try:
        for future in as_completed(futures):
            # Recorded, or tried once (a record that failed is not written again in the cleanup); no longer
            # kept: each result holds its shard's records, all of them together the whole dataset's.
            del futures[future]
            record(future.result())  # raises the worker's exception
    except BaseException:
        for future in futures:
            future.cancel()
        for future in futures:
            if future.cancelled():
                continue
            try:
                record(future.result())
            except BaseException:  # the first failure is the one to report; an unrecorded shard is rewritten
                continue
        raise


# ---------------------------------------------------------------- the closing summary


def format_summary(summary: Summary, max_listed: int = 20) -> str:
    options, plan = summary.options, summary.plan
    instance = options.instance
    if summary.already_complete:
        lengths = ", ".join(f"{split} {entry['length']}" for split, entry in summary.metadata["splits"].items())
        removed = f"; removed the {STATE_DIR}/ left by an interrupted finish" if summary.leftover_state_removed else ""
        return (f"{options.target}: dataset complete: {lengths} samples; its {METADATA_FILE} records this "
                f"conversion (same options and source, plan {plan.fingerprint[:12]}), every shard and index is "
                f"there with its recorded size: nothing written{removed} (validate_dataset.py checks every byte)")
    lines = [
        f"converted {options.source} ({plan.layout} layout) -> {options.target}: format {options.format}, "
        f"shuffle {'on' if options.shuffle else 'off'}, seed {summary.seed}, "
        f"{options.samples_per_shard} samples/shard, {options.workers} worker{'s' if options.workers > 1 else ''}"
        + (f", {instance.describe()}" if instance.count > 1 else ""),
    ]
    if summary.incomplete_reason:
        lines.append(f"  {METADATA_FILE} records this conversion, but {summary.incomplete_reason}: resumed "
                     f"(shards that verify are kept)")
    processed = 0
    written_total = shards_total = bytes_total = skipped_total = 0
    for split, report in summary.reports.items():
        steps = " ".join(plan.splits[split].steps) or "none"
        kept = f", {report.kept_shards} verified shards kept from an earlier run" if report.kept_shards else ""
        lines.append(
            f"  {split:<10} {report.written:>8} samples written, {len(report.skipped)} skipped, "
            f"{report.shards - report.kept_shards} shards, {human_bytes(report.bytes)}{kept}; steps: {steps}")
        processed += report.written + len(report.skipped)
        written_total += report.written
        shards_total += report.shards - report.kept_shards
        bytes_total += report.bytes
        skipped_total += len(report.skipped)
        ignored = plan.splits[split].ignored
        if ignored:
            lines.append(f"  {split:<10} {len(ignored)} files ignored as not images, e.g. {ignored[0]['path']}")
    rate = processed / summary.elapsed if summary.elapsed > 0 else 0.0
    lines.append(
        f"  total      {written_total:>8} samples, {shards_total} shards, {human_bytes(bytes_total)}, "
        f"{skipped_total} skipped, in {summary.elapsed:.1f} s ({rate:.0f} images/s)")
    skipped = [s for r in summary.reports.values() for s in r.skipped]
    for item in skipped[:max_listed]:
        lines.append(f"  skipped: {item['path']}: {item['reason']}")
    if len(skipped) > max_listed:
        lines.append(f"  ... and {len(skipped) - max_listed} more skipped (listed in {METADATA_FILE})")
    if summary.metadata is not None:
        lengths = ", ".join(f"{split} {entry['length']}" for split, entry in summary.metadata["splits"].items())
        lines.append(f"  dataset complete: {lengths} samples; {options.target / METADATA_FILE} written")
    else:
        lines.append(
            f"  {summary.missing_shards} shards of other instances are not finished yet: the last instance to "
            f"finish writes {METADATA_FILE} (or run again with --resume once all have ended)")
    return "\n".join(lines)
