"""The plan of a repartition as a person reads it: `describe_plan`, one table per split (what
distributed_webdataset.py prints, dry run or not). Text only; it reads and writes no file."""

from __future__ import annotations

from imagenet_shards.repartition.plan import SplitRepartition
from imagenet_shards.repartition.source import remainder_format


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _shard_summary(names, limit=4):
    names = list(names)
    if not names:
        return "(no whole shard)"
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[: limit - 1]) + f", ... {names[-1]} ({len(names)} shards)"


def describe_plan(plan: SplitRepartition, fmt: str = "img") -> str:
    """A table: per instance, the shards read whole, the samples copied, the samples and bytes read."""
    finished = remainder_format(fmt).finished_size
    lines = [
        f"{plan.split}: {plan.total_samples} samples over {plan.num_instances} instances, policy {plan.policy}: "
        f"{min(plan.samples_per_instance)}..{max(plan.samples_per_instance)} samples each, "
        f"{plan.copied_samples} copied ({_size(plan.copied_bytes)}), "
        f"{len(plan.dropped_keys)} dropped, {len(plan.padded_keys)} padded",
        f"  {'instance':>8}  {'samples':>8}  {'whole':>6}  {'copied':>6}  {'padded':>6}  {'bytes':>10}  shards",
    ]
    for instance in plan.instances:
        read_bytes = instance.whole_bytes + (finished(instance.copied_bytes) if instance.copied else 0)
        remainder = " + remainder" if instance.copied else ""
        lines.append(
            f"  {instance.instance:>8}  {instance.samples:>8}  {len(instance.shards):>6}  {len(instance.copied):>6}  "
            f"{len(instance.padded_keys):>6}  {_size(read_bytes):>10}  {_shard_summary(instance.shards)}{remainder}"
        )
    if plan.dropped_keys:
        lines.append(f"  dropped: {_key_summary(plan.dropped_keys)}")
    if plan.padded_keys:
        lines.append(f"  padded (repeated): {_key_summary(plan.padded_keys)}")
    return "\n".join(lines)


def _key_summary(keys, limit=8):
    keys = list(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")
