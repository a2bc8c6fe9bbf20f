"""Whole epochs through the node's shard cache: host_benchmark --compare-transport URL --cache-dir DIR.

For each remote copy, three loaders (the format's device row: get_data, device normalisation, the
same batch size, workers and seed) each read two whole epochs, every batch counted from the first:

  local      the local folder; its second epoch (page cache warm, workers running) is the reference
  uncached   the copy, read as without a cache (ranged GETs per run)
  cache      the copy through a fresh cache folder under DIR: epoch 1 is cold (every shard fetched
             into the cache while it is read), epoch 2 warm (read from the cache)

Per epoch: seconds, images/s, images per CPU-second (this process and its workers, see timing.py),
GETs and the bytes their answers carried (every process's: storage's request log), and the cache's
events (shards fetched into it, runs served from it, evictions).

With --rounds R, each round uses a fresh cache folder, and every row reports the round with the median
images per CPU-second.

Goals (issue 24), per copy: warm >= 0.95x local images per CPU-second; warm store bytes 0 (when the
dataset fits the limit); cold >= 0.9x the uncached first epoch in images per CPU-second.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from imagenet_shards.hostbench.pipelines import loader_batches
from imagenet_shards.loader.options import Cache
from imagenet_shards.hostbench.timing import combine_instances, measure_batches
from imagenet_shards.hostbench.transports import RequestLog, read_request_log

WARM_VS_LOCAL = 0.95
COLD_VS_UNCACHED = 0.9
EPOCH_NAMES = {"local": ("first", "second"), "uncached": ("first", "second"), "cache": ("cold", "warm")}


def measure_epochs(row_id: str, label: str, location: str, split: str, batch_size: int, workers: int, instance,
                   options: dict, gather, bytes_per_image: float, kind: str) -> list:
    """Two whole epochs of one loader: a row per epoch (every instance's figures combined)."""
    # read_ahead off: an epoch's requests and CPU are its own, none made ahead for the next one
    batches = loader_batches(location, split, batch_size, workers, "device", instance, read_ahead=False, **options)
    loader = batches.make_iterable(0)  # the loader itself (no rebatching here): its report holds the cache events
    rows = []
    # One request log for both epochs (the persistent workers keep the log file they were started with);
    # each epoch's requests are the lines added while it ran (fills end before a worker's last report).
    with RequestLog() as log:
        seen = 0
        for epoch, name in enumerate(EPOCH_NAMES[kind]):
            batches.first_epoch, batches.max_epochs = epoch, 1
            try:
                figures = measure_batches(batches, warmup_batches=0, bytes_per_image=bytes_per_image, workers=workers)
                entries = read_request_log(log.path)
                part = RequestLog()
                part.entries, seen = entries[seen:], len(entries)
                figures.update(part.figures())
                figures["cache"] = dict(loader.report.cache) if kind == "cache" else {}
                error = None
            except Exception as exc:  # one failed row must not hide the others
                figures, error = None, f"{type(exc).__name__}: {exc}"
            rows.append(_epoch_row(f"{row_id}/{name}", f"{label}, {name} epoch", kind, name, location, workers,
                                   gather({"figures": figures, "error": error})))
    return rows


def _epoch_row(row_id, label, kind, name, location, workers, gathered) -> dict:
    row = {"id": row_id, "label": label, "kind": "cache_epoch", "loader": kind, "epoch": name, "source": location,
           "workers": workers, "normalization": "device"}
    failed = [g["error"] for g in gathered if g["error"]]
    if failed:
        row["error"] = failed[0]
        return row
    per_instance = [g["figures"] for g in gathered]
    row.update(combine_instances(per_instance) if len(per_instance) > 1 else per_instance[0])
    row["store_bytes"] = sum(f.get("store_bytes") or 0 for f in per_instance) + sum(
        f["cache"].get("bytes_fetched", 0) for f in per_instance if storage_free_fill(f, location))
    row["cache"] = _merged_cache(per_instance)
    return row


def storage_free_fill(figures: dict, location: str) -> bool:
    """Whether the cache's fetched bytes are missing from the request log (a remote-marked local path
    reads no URL): then they are added to the store bytes."""
    return bool(figures.get("cache")) and "://" not in location


def _merged_cache(per_instance: list) -> dict:
    from imagenet_shards.shard_cache import merge_events

    merged = {}
    for figures in per_instance:
        if figures.get("cache"):
            merged = merge_events(merged, figures["cache"])
    return merged


def cache_epoch_rows(copies: list, split: str, batch_size: int, workers: int, instance, cache_dir, *,
                     cache_limit=None, cache_prefetch: int = 0, seed: int = 0, size: int = 224,
                     loader_options: dict | None = None, gather=None, progress=None, rounds: int = 1) -> list:
    """local / uncached / cache epoch rows for every copy (see the module docstring), `rounds` times
    (interleaved, a fresh cache each round): per row the round with the median images per CPU-second."""
    measured = {}
    for number in range(rounds):
        for row in _one_round(copies, split, batch_size, workers, instance, cache_dir, cache_limit, cache_prefetch,
                              {"seed": seed, "image_size": size, **(loader_options or {})}, gather,
                              progress or (lambda text: None), f"{number + 1}/{rounds}"):
            measured.setdefault(row["id"], []).append(row)
    rows = []
    for tries in measured.values():
        good = sorted((r for r in tries if "error" not in r), key=lambda r: r["images_per_cpu_s"])
        row = dict(good[len(good) // 2]) if good else tries[0]
        row["rounds_images_per_cpu_s"] = [r["images_per_cpu_s"] for r in tries if "error" not in r]
        rows.append(row)
    return rows


def _one_round(copies, split, batch_size, workers, instance, cache_dir, cache_limit, cache_prefetch, options, gather,
               progress, round_text) -> list:
    rows = []
    for copy in copies:
        source = copy.source
        per_image = source.bytes_per_image.get(split, 0.0)
        # A fresh folder per round and copy: the cold epoch starts from an empty cache.
        folder = Path(cache_dir) / f"host_benchmark-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{copy.name}"
        cache_options = {**options, "cache": Cache(folder, limit=cache_limit, prefetch=cache_prefetch)}
        base = f"{source.name}/epochs"
        for kind, row_id, label, location, extra in (
                ("local", f"{base}@local", f"{source.label} local files", str(source.path), options),
                ("uncached", f"{base}@{copy.name}", f"{source.label} over {copy.transport}", copy.location, options),
                ("cache", f"{base}@{copy.name}+cache", f"{source.label} over {copy.transport} via the cache",
                 copy.location, cache_options)):
            if kind == "local" and any(r["id"].startswith(f"{row_id}/") for r in rows):
                continue
            progress(f"round {round_text}: two whole epochs: {label}")
            rows += measure_epochs(row_id, label, location, split, batch_size, workers, instance, extra, gather,
                                   per_image, kind)
    return rows


def evaluate_cache_goals(rows: list, copies: list) -> list:
    """Issue 24's goals per copy, as comparison.evaluate_goals's dicts."""
    by_id = {r["id"]: r for r in rows}
    goals = []
    for copy in copies:
        base = f"{copy.source.name}/epochs"
        local, uncached = by_id.get(f"{base}@local/second"), by_id.get(f"{base}@{copy.name}/first")
        cold, warm = by_id.get(f"{base}@{copy.name}+cache/cold"), by_id.get(f"{base}@{copy.name}+cache/warm")
        goals.append(_ratio_goal(f"cache_warm_vs_local@{copy.name}", warm, local, WARM_VS_LOCAL,
                                 f"warm epoch from the {copy.transport} cache >= {WARM_VS_LOCAL:g}x local, per "
                                 "CPU-second"))
        goals.append(_ratio_goal(f"cache_cold_vs_uncached@{copy.name}", cold, uncached, COLD_VS_UNCACHED,
                                 f"cold epoch via the cache >= {COLD_VS_UNCACHED:g}x uncached {copy.transport}, per "
                                 "CPU-second"))
        entry = {"goal": f"cache_warm_store_bytes@{copy.name}", "row": f"{base}@{copy.name}+cache/warm",
                 "reference": None, "metric": "store_bytes", "threshold": 0,
                 "text": "bytes from the store in the warm epoch = 0 (the dataset fits the limit)"}
        if warm is None or "error" in warm:
            entry.update(status="not measured", why="the warm row is missing or failed")
        else:
            entry.update(value=warm["store_bytes"], status="met" if warm["store_bytes"] == 0 else "not met")
        goals.append(entry)
    return goals


def _ratio_goal(name: str, row, reference, threshold: float, text: str) -> dict:
    entry = {"goal": name, "row": row and row["id"], "reference": reference and reference["id"],
             "metric": "images_per_cpu_s", "threshold": threshold, "text": text}
    if row is None or reference is None or "error" in row or "error" in reference:
        entry.update(status="not measured", why="a row is missing or failed")
        return entry
    ratio = row["images_per_cpu_s"] / reference["images_per_cpu_s"]
    entry.update(value=row["images_per_cpu_s"], reference_value=reference["images_per_cpu_s"], ratio=ratio,
                 status="met" if ratio >= threshold else "not met", also_metric="images_per_s",
                 also_ratio=row["images_per_s"] / reference["images_per_s"])
    return entry


def format_cache_table(rows: list, what: str = "") -> str:
    """The epoch rows as a table, under a title naming `what` was read."""
    header = f"{'row':<44} {'images':>7} {'s':>7} {'img/s':>8} {'img/CPU-s':>10} {'GETs':>6} {'store MB':>9} " \
             f"{'fills':>6} {'hits':>5} {'evicted':>7}"
    title = (f"\nShard cache ({what + '; ' if what else ''}two whole epochs per loader, every batch counted; GETs and "
             f"store bytes: every process's, per epoch):")
    lines = [title, header, "-" * len(header)]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['label']:<44} FAILED: {row['error']}")
            continue
        cache = row.get("cache") or {}
        lines.append(f"{row['label'][:44]:<44} {row['images']:>7} {row['seconds']:>7.2f} {row['images_per_s']:>8.1f} "
                     f"{row['images_per_cpu_s']:>10.1f} {row.get('gets') or 0:>6} {row['store_bytes'] / 1e6:>9.1f} "
                     f"{cache.get('fills', '-'):>6} {cache.get('hits', '-'):>5} {cache.get('evicted', '-'):>7}")
    return "\n".join(lines)
