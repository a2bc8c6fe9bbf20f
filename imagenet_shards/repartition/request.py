"""What a repartition is asked to do, and what that means given the repartition already on disk.

`resolve_request` checks N, the splits and the policies against the dataset (a
RepartitionUsageError, exit code 2, before anything is read beyond metadata.json). `decide` (pure)
compares the request with the existing manifest (`read_manifest`) of DIR/distributed/<N>-instances/:
  * a re-run with the same N, splits and policies, over an unchanged metadata.json, builds nothing;
  * a split already repartitioned with another policy is a conflict: rebuilt only with overwrite;
  * a manifest made from an older metadata.json (the dataset was re-converted), for another N or
    format, or unreadable, is stale: everything is rebuilt and the old entries go.
A different N gets its own folder (`imagenet_shards.dataset_folder.repartition_dir`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from imagenet_shards.balance import default_policy
from imagenet_shards.dataset_folder import REPARTITION_MANIFEST, repartition_dir
from imagenet_shards.repartition.plan import RepartitionUsageError, known_policy
from imagenet_shards.repartition.source import SourceDataset, split_length


@dataclass(frozen=True)
class Request:
    target: Path
    num_instances: int
    policies: dict  # split -> policy, for the splits to repartition, in order


def resolve_request(dataset: SourceDataset, num_instances: int, splits=None, policies=None) -> Request:
    """Check N, the splits and the policies against the dataset; a RepartitionUsageError otherwise.

    `policies` maps a split to a policy; the key None (or "*") applies to every split not named.
    """
    if not isinstance(num_instances, int) or num_instances < 1:
        raise RepartitionUsageError(f"the number of instances must be at least 1, got {num_instances}")
    available = list(dataset.metadata["splits"])
    splits = list(splits) if splits else available
    for split in splits:
        if split not in available:
            raise RepartitionUsageError(
                f"{dataset.target}: has no split {split!r} (it has {', '.join(available)})"
            )
    policies = dict(policies or {})
    for name in policies:
        if name not in (None, "*") and name not in available:
            raise RepartitionUsageError(f"--remainder names split {name!r}, which the dataset does not have")
    resolved = {}
    for split in dict.fromkeys(splits):
        policy = policies.get(split) or policies.get(None) or policies.get("*") or default_policy(split)
        known_policy(policy)
        length = split_length(dataset, split)
        if length < num_instances:
            raise RepartitionUsageError(
                f"{split} has {length} samples, fewer than the {num_instances} instances: some would get none"
            )
        resolved[split] = policy
    return Request(dataset.target, num_instances, resolved)


@dataclass
class Decision:
    build: list  # splits to (re)build
    keep: dict  # split -> existing manifest entry kept as it is
    drop_manifest_splits: list  # splits removed from the existing manifest before rebuilding them
    stale: bool  # the existing manifest was made from another metadata.json
    conflicts: list  # (split, existing policy, requested policy) that need overwrite


def decide(existing: Optional[dict], request: Request, source_sha256: str, fmt: str) -> Decision:
    """What to do given an existing manifest (pure)."""
    if existing is None:
        return Decision(list(request.policies), {}, [], False, [])
    if not isinstance(existing.get("splits"), dict):
        return Decision(list(request.policies), {}, [], True, [])  # unusable: replace it
    if (
        existing.get("source_metadata_sha256") != source_sha256
        or existing.get("num_instances") != request.num_instances
        or existing.get("format") != fmt
    ):
        return Decision(list(request.policies), {}, list(existing.get("splits", {})), True, [])
    old_splits = existing.get("splits", {})
    build, conflicts = [], []
    keep = {split: entry for split, entry in old_splits.items() if split not in request.policies}
    for split, policy in request.policies.items():
        if split in old_splits and old_splits[split].get("policy") == policy:
            keep[split] = old_splits[split]
        elif split in old_splits:
            conflicts.append((split, old_splits[split].get("policy"), policy))
            build.append(split)
        else:
            build.append(split)
    return Decision(build, keep, [s for s, _, _ in conflicts], False, conflicts)


def read_json_or_none(path: Path):
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # written atomically, so this only happens if someone edited it: rebuild


def read_manifest(target, num_instances: int) -> Optional[dict]:
    """The complete repartition manifest for N instances, or None if there is none (yet)."""
    manifest = read_json_or_none(repartition_dir(target, num_instances) / REPARTITION_MANIFEST)
    return manifest if isinstance(manifest, dict) else None
