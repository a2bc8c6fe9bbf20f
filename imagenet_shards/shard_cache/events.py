"""What a shard cache did, counted per process and reported in the loader's EpochReport (`report.cache`)."""

from __future__ import annotations

import warnings

EVENT_COUNTS = ("hits", "fills", "waited", "evicted", "bytes_fetched")


def new_events() -> dict:
    return {**{name: 0 for name in EVENT_COUNTS}, "refetched": [], "fill_failed": []}


def merge_events(total: dict, more: dict) -> dict:
    """Add one process's events to `total` (both as made by new_events, or {}: no cache)."""
    if not more:
        return total
    for name in EVENT_COUNTS:
        total[name] = total.get(name, 0) + more.get(name, 0)
    for name in ("refetched", "fill_failed"):
        total.setdefault(name, []).extend(more.get(name, []))
    return total


def cache_summary(events: dict, prefix: str = "") -> str:
    """`prefix` + a line of an EpochReport's cache events (and the shards dropped or not cached); "" without a cache."""
    if not events:
        return ""
    text = prefix + (f"shard cache: {events.get('hits', 0)} runs served from it, {events.get('fills', 0)} shards "
                     f"fetched into it "
            f"({events.get('bytes_fetched', 0) / 1e6:.1f} MB from the store), {events.get('waited', 0)} waits for "
            f"another process's fetch, {events.get('evicted', 0)} evicted, {len(events.get('refetched', []))} "
            f"dropped and fetched again, {len(events.get('fill_failed', []))} not cached")
    for item in (events.get("refetched", []) + events.get("fill_failed", []))[:5]:
        text += f"\n  {item['shard']}: {item['reason']}"
    return text


def warn_cache_problems(events: dict) -> None:
    """A warning (as for skipped samples) when an epoch dropped a cached shard or could not cache one."""
    if events.get("refetched") or events.get("fill_failed"):
        warnings.warn(cache_summary(events), stacklevel=3)
