"""`repartition()`: one repartition from request to manifest, in the order that keeps it safe.

    load and check the dataset and the request  (imagenet_shards.repartition.source, .request)
    decide against the existing manifest         a conflict without overwrite: RepartitionUsageError
    plan every split to build                    (imagenet_shards.repartition.plan); a dry run stops here
    verify the shards copied from                before anything is written
    lock DIR/distributed/<N>-instances/, decide again under the lock, write (imagenet_shards.repartition.write)

Contract: RepartitionUsageError (exit code 2) for wrong arguments and DatasetError (exit code 1) for
bad data, both before anything is written; a second run for the same N while one holds the lock
is a RepartitionUsageError. A re-run with nothing to build is a no-op (RepartitionResult.no_op).
The original shards, indexes and metadata.json are only read.
"""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import REPARTITION_MANIFEST, repartition_dir
from imagenet_shards.repartition.plan import RepartitionUsageError, plan_split
from imagenet_shards.repartition.request import Decision, decide, read_manifest, resolve_request
from imagenet_shards.repartition.source import SourceDataset, load_dataset, load_split, shards_to_verify, verify_shards
from imagenet_shards.repartition.write import remove_plan_stamps, write_repartition


@dataclass
class RepartitionResult:
    output: Path
    plans: list  # SplitPlans built (or, in a dry run, that would be built)
    kept_splits: list  # splits already up to date
    dry_run: bool
    no_op: bool
    stale_replaced: bool
    verified_shards: int
    verified_bytes: int
    elapsed: float
    manifest: Optional[dict] = None
    format: str = "img"
    conflicts: list = field(default_factory=list)  # (split, existing policy, requested policy)


def repartition(
    target,
    num_instances: int,
    splits=None,
    policies=None,
    dry_run: bool = False,
    overwrite: bool = False,
    verify: str = "copied",
    progress=None,
) -> RepartitionResult:
    """Plan and (unless dry_run) write the repartition of `target` for `num_instances` instances.

    Raises RepartitionUsageError for wrong arguments and DatasetError for bad data; in both cases
    before anything is written. `progress(event, **info)` is called as work is done (events:
    "verified", "copied", "written", "kept", "written_reference"), e.g. to drive a progress bar.
    """
    started = time.perf_counter()
    dataset = load_dataset(target)
    request = resolve_request(dataset, num_instances, splits, policies)
    out = repartition_dir(dataset.target, num_instances)
    existing = read_manifest(dataset.target, num_instances)
    decision = decide(existing, request, dataset.metadata_sha256, dataset.format)
    if decision.conflicts and not overwrite and not dry_run:
        _refuse_conflicts(decision, out)
    kept = [split for split in request.policies if split in decision.keep]
    if not decision.build:
        result = RepartitionResult(
            out, [], kept, dry_run, True, False, 0, 0, time.perf_counter() - started, existing, dataset.format
        )
        if not dry_run:
            remove_plan_stamps(out)  # left if a run was killed right after its manifest
        return result

    plans = _plan_splits(dataset, decision.build, num_instances, request.policies)
    if dry_run:
        return RepartitionResult(
            out, plans, kept, True, False, decision.stale, 0, 0, time.perf_counter() - started, None,
            dataset.format, decision.conflicts,
        )

    to_verify = shards_to_verify(dataset, plans, verify)
    verify_shards(dataset, to_verify, progress)  # before anything is written
    verified_bytes = sum(shard.bytes for _, shard in to_verify)

    out.mkdir(parents=True, exist_ok=True)
    with _locked(out, num_instances):
        # Decide again under the lock: another run may have finished since the first look.
        existing = read_manifest(dataset.target, num_instances)
        decision = decide(existing, request, dataset.metadata_sha256, dataset.format)
        if not decision.build:
            return RepartitionResult(out, [], kept, False, True, False, len(to_verify), verified_bytes,
                                     time.perf_counter() - started, existing, dataset.format)
        manifest = write_repartition(dataset, plans, decision, existing, out, num_instances, verify, progress)
    return RepartitionResult(
        out,
        plans,
        kept,
        False,
        False,
        decision.stale,
        len(to_verify),
        verified_bytes,
        time.perf_counter() - started,
        manifest,
        dataset.format,
    )


def _refuse_conflicts(decision: Decision, out: Path):
    """The RepartitionUsageError for splits already repartitioned with other policies (no --overwrite)."""
    details = "; ".join(f"{s}: made with {old!r}, asked for {new!r}" for s, old, new in decision.conflicts)
    raise RepartitionUsageError(
        f"{out / REPARTITION_MANIFEST} already repartitions these splits with other policies ({details}); "
        f"pass --overwrite to replace them"
    )


def _plan_splits(dataset: SourceDataset, splits, num_instances: int, policies: dict) -> list:
    """Load, check and plan each split to build (reads each index and stats each shard; writes nothing)."""
    plans = []
    for split in splits:
        shards, by_shard = load_split(dataset, split)
        plans.append(plan_split(split, shards, by_shard, num_instances, policies[split]))
    return plans


@contextmanager
def _locked(out: Path, num_instances: int):
    """Hold an exclusive lock on the repartition folder; a RepartitionUsageError if another run holds it."""
    lock = os.open(out, os.O_RDONLY)  # lock the folder itself: no lock file left behind
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RepartitionUsageError(f"{out}: another repartition for {num_instances} instances is running") from None
        yield
    finally:
        os.close(lock)
