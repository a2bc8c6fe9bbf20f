"""The same dataset read locally and from other copies of it (http(s)://, s3://): host_benchmark --compare's
transport rows, and benchmarks/s3_benchmark.py's.

A copy (`--compare-transport URL`) must be the same dataset as one of the compared folders:
the same format and, per split, the same shards (name, bytes, sha256) in its metadata.json
(`find_local_original`). For each copy:

  loader row         the format's device row (get_data, device normalisation, the same batch size,
                     workers and seed) reading the copy: images/s, images per CPU-second and MB/s as
                     every row, plus the time to first byte p50/p99 of the GETs it made (request ->
                     response headers, every process's, warm-up included) and its GETs per epoch.
  GETs per epoch     counted over one whole untimed epoch of that loader, before the timed rows
                     (every process's GETs: `RequestLog`, a imagenet_shards.storage_hooks observer).
  transport ceiling  every shard of the split read once, start to end, by one ranged GET each in
                     this process (imagenet_shards.storage.open_byte_range, the loader's path), 1 MiB at a
                     time into one buffer, nothing decoded: MB/s. One row for the local files too.

Loopback hides network latency: a server on this host answers in about a millisecond and shares
its cores with the loader. On a network, every GET adds a round trip: GETs per epoch x RTT per
epoch per worker, unless the reads overlap.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
import urllib.parse
from dataclasses import dataclass

import numpy as np

from imagenet_shards import storage, storage_hooks
from imagenet_shards.hostbench.discovery import BenchmarkSource, folder_split_dir, list_folder_images
from imagenet_shards.hostbench.timing import BenchmarkError
from imagenet_shards.dataset_folder import METADATA_FILE

CHUNK = 1 << 20  # bytes per read of the transport ceiling
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class RemoteCopy:
    location: str  # http(s)://... or s3://... (the dataset's folder)
    transport: str  # "http" or "s3"
    source: BenchmarkSource  # the local dataset it is a copy of
    name: str  # row-id suffix: "http", "s3", "http2", ...

    @property
    def host(self) -> str:
        """Where the bytes come from: the URL's host, or the S3 endpoint's."""
        if self.transport == "s3":
            return urllib.parse.urlparse(storage.s3_client().endpoint).hostname or ""
        return urllib.parse.urlparse(self.location).hostname or ""


def transport_of(location: str) -> str:
    if storage.is_s3(location):
        return "s3"
    if storage.is_url(location):
        return "http"
    raise BenchmarkError(f"{location}: not an http(s):// or s3:// location")


def shard_signature(metadata: dict) -> dict:
    """{split: [(shard name, bytes, sha256)]} of a metadata.json: what makes two copies the same dataset."""
    return {split: [(s["name"], int(s["bytes"]), s.get("sha256")) for s in info.get("shards", [])]
            for split, info in metadata.get("splits", {}).items()}


def find_local_original(location: str, sources: list) -> BenchmarkSource:
    """The compared local dataset `location` is a copy of; BenchmarkError naming what differs if none."""
    try:
        remote = json.loads(storage.read_bytes(storage.join_location(location, METADATA_FILE)))
    except FileNotFoundError as error:
        raise BenchmarkError(f"--compare-transport {location}: no {METADATA_FILE} there ({error})") from None
    except storage.ShardReadError as error:
        raise BenchmarkError(f"--compare-transport {location}: {error}") from None
    except ValueError as error:
        raise BenchmarkError(f"--compare-transport {location}: {METADATA_FILE} is not JSON ({error})") from None
    signature = shard_signature(remote)
    same_format = [s for s in sources if s.metadata is not None and s.format == remote.get("format")]
    for source in same_format:
        if shard_signature(source.metadata) == signature:
            return source
    if not same_format:
        raise BenchmarkError(f"--compare-transport {location}: a {remote.get('format')!r} dataset, and no compared "
                             f"folder holds that format (found: {', '.join(s.format for s in sources)})")
    local = shard_signature(same_format[0].metadata)
    differing = sorted(split for split in set(local) | set(signature) if local.get(split) != signature.get(split))
    raise BenchmarkError(f"--compare-transport {location}: not a copy of {same_format[0].path}: the shards (names, "
                         f"sizes or sha256) of split(s) {', '.join(differing)} differ")


def remote_copies(locations: list, sources: list) -> list:
    copies, seen = [], {}
    for location in locations:
        transport = transport_of(location)
        seen[transport] = seen.get(transport, 0) + 1
        name = transport if seen[transport] == 1 else f"{transport}{seen[transport]}"
        copies.append(RemoteCopy(location.rstrip("/"), transport, find_local_original(location, sources), name))
    return copies


# ---------------------------------------------------------------- counting requests across processes


class RequestLog:
    """While open, this process and every DataLoader worker forked from it append their remote requests
    to one file, through the storage hook it installs (imagenet_shards.storage_hooks): "kind<TAB>value" lines,
    one short O_APPEND write each, so lines of processes do not mix. `entries` holds them once closed."""

    def __init__(self):
        self.entries = []

    def __enter__(self):
        handle, self.path = tempfile.mkstemp(prefix="requests-", suffix=".log")
        os.close(handle)
        storage_hooks.install(self.append)
        return self

    def append(self, kind: str, value) -> None:
        text = "-" if value is None else f"{value:.6f}" if isinstance(value, float) else str(value)
        with open(self.path, "a") as handle:
            handle.write(f"{kind}\t{text}\n")

    def __exit__(self, *exc):
        storage_hooks.uninstall(self.append)
        self.entries = read_request_log(self.path)
        os.unlink(self.path)
        return False

    def figures(self) -> dict:
        """GETs made, the bytes their answers carried (Content-Length) and their time to first byte p50/p99 (ms)."""
        ttfb = [t for kind, t in self.entries if kind == storage_hooks.TTFB_KIND]
        return {"gets": sum(1 for kind, _ in self.entries if kind in storage_hooks.GET_KINDS),
                "store_bytes": int(sum(n for kind, n in self.entries if kind == storage_hooks.BYTES_KIND)),
                "ttfb_ms_p50": float(np.percentile(ttfb, 50) * 1e3) if ttfb else None,
                "ttfb_ms_p99": float(np.percentile(ttfb, 99) * 1e3) if ttfb else None}


def read_request_log(path) -> list:
    """[(kind, value or None)] of a request log: one (kind, None) per request as it was sent, one
    (TTFB_KIND, seconds) per GET answered and one (BYTES_KIND, bytes) per GET answer whose length was
    known (imagenet_shards.storage_hooks); [] if there is none."""
    try:
        text = open(path).read()
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        kind, _, value = line.partition("\t")
        entries.append((kind, None if value in ("", "-") else float(value)))
    return entries


def observe_requests():
    """For RowPlan.observe: a row's requests and time to first byte, added to its figures."""

    @contextlib.contextmanager
    def observe():
        extra = {}
        with RequestLog() as log:
            yield extra
        extra.update(log.figures())

    return observe


# ---------------------------------------------------------------- rows


def plan_transport_rows(copies: list, split: str, batch_size: int, workers: int, instance, seed: int = 0,
                        loader_options: dict | None = None, size: int = 224) -> list:
    """One loader row per copy: its format's device row, reading the copy (ids `<format>/device@<name>`)."""
    # imported here: host_benchmark checks the copies (remote_copies) before it imports torch
    from imagenet_shards.hostbench.comparison import RowPlan
    from imagenet_shards.hostbench.pipelines import loader_batches

    # read_ahead off: the GETs a row counts are those of the batches it measured, none made for
    # the next epoch after its window closed
    options = {"image_size": size, "read_ahead": False, **(loader_options or {})}
    rows = []
    for copy in copies:
        source = copy.source
        rows.append(RowPlan(
            f"{source.name}/device@{copy.name}", f"{source.label} over {copy.transport}, device normalisation",
            "loader", source.format, "device", workers, source.bytes_per_image.get(split, 0.0), copy.location,
            lambda c=copy: loader_batches(c.location, split, batch_size, workers, "device", instance, seed=seed,
                                          **options),
            f"{copy.source.format} shards read from {copy.location} via imagenet_shards.loader.get_data",
            observe=observe_requests(),
        ))
    return rows


def count_epoch_gets(copy: RemoteCopy, split: str, batch_size: int, workers: int, instance, seed: int = 0,
                     loader_options: dict | None = None, size: int = 224) -> int:
    """GETs of one whole untimed epoch of the copy's loader row (this instance's share), every process's."""
    from imagenet_shards.hostbench.pipelines import loader_batches  # torch: imported when a row is measured

    batches = loader_batches(copy.location, split, batch_size, workers, "device", instance, seed=seed,
                             image_size=size, read_ahead=False, **(loader_options or {}))
    batches.max_epochs = 1
    with RequestLog() as log:
        for _ in batches:
            pass
    return log.figures()["gets"]


def read_ceiling(locations: list, sizes: list, max_seconds: float | None = None) -> dict:
    """Every location read once, start to end (ranged GETs when remote), CHUNK bytes at a time into one
    buffer, in this process; stops early after `max_seconds`. MB/s, GETs and their TTFB."""
    buffer = bytearray(CHUNK)
    total = 0
    with RequestLog() as log:
        began = time.perf_counter()
        cpu = time.process_time()
        for location, size in zip(locations, sizes):
            opened = (storage.open_byte_range(location, 0, size) if storage.is_url(location)
                      else open(location, "rb", buffering=0))
            with opened as stream:
                while count := stream.readinto(buffer):
                    total += count
            if max_seconds is not None and time.perf_counter() - began >= max_seconds:
                break
        seconds = max(time.perf_counter() - began, 1e-9)
        cpu = time.process_time() - cpu
    remote = any(storage.is_url(location) for location in locations)
    return {"bytes": total, "seconds": seconds, "mb_per_s": total / 1e6 / seconds, "cpu_seconds": cpu,
            **(log.figures() if remote else {"gets": None, "store_bytes": None, "ttfb_ms_p50": None,
                                                 "ttfb_ms_p99": None})}


def measure_ceilings(copies: list, split: str, instance, rounds: int = 1, max_seconds: float | None = None,
                     gather=None) -> list:
    """Transport-ceiling rows: the local files of each copied dataset, then each copy; the median of
    `rounds` by MB/s. This instance reads its share of the shards (every count-th from its index)."""
    gather = gather or (lambda figures: [figures])
    plans, seen = [], set()
    for copy in copies:
        shards = copy.source.metadata["splits"].get(split, {}).get("shards", [])[instance.index::instance.count]
        sizes = [int(s["bytes"]) for s in shards]
        if copy.source.path not in seen:
            seen.add(copy.source.path)
            plans.append((f"transport_ceiling/{copy.source.name}@local", f"{copy.source.label} local files, "
                          "read only", "local", str(copy.source.path), [str(copy.source.path / s["name"])
                                                                         for s in shards], sizes))
        plans.append((f"transport_ceiling/{copy.source.name}@{copy.name}", f"{copy.source.label} {copy.transport} "
                      f"ranged GETs, read only", copy.transport, copy.location,
                      [storage.join_location(copy.location, s["name"]) for s in shards], sizes))
    return _measure_plans(plans, rounds, max_seconds, gather)


def measure_local_ceilings(sources: list, split: str, instance, rounds: int = 1, max_seconds: float | None = None,
                           gather=None, skip=()) -> list:
    """Local transport-ceiling rows (`transport_ceiling/<source>@local`) of `sources` (converted: the split's
    shards; the image folder: its files), except the row ids in `skip`: the storage side of
    `--recommend` when no remote copy was named. This instance reads every count-th file from its index."""
    gather = gather or (lambda figures: [figures])
    plans = []
    for source in sources:
        row_id = f"transport_ceiling/{source.name or source.format}@local"
        if row_id in skip:
            continue
        if source.metadata is not None:
            files = [(source.path / s["name"], int(s["bytes"]))
                     for s in source.metadata["splits"].get(split, {}).get("shards", [])]
        else:
            folder = folder_split_dir(source.path, split)
            files = [] if folder is None else [(path, path.stat().st_size) for path, _ in list_folder_images(folder)]
        files = files[instance.index::instance.count]
        if files:
            plans.append((row_id, f"{source.label} local files, read only", "local", str(source.path),
                          [str(path) for path, _ in files], [size for _, size in files]))
    return _measure_plans(plans, rounds, max_seconds, gather)


def _measure_plans(plans: list, rounds: int, max_seconds, gather) -> list:
    """Each plan (row id, label, transport, location, locations, sizes) read `rounds` times: ceiling rows."""
    measured = {plan[0]: [] for plan in plans}
    for _ in range(rounds):
        for row_id, _, _, _, locations, sizes in plans:
            try:
                figures, error = read_ceiling(locations, sizes, max_seconds), None
            except Exception as exc:  # one broken transport must not hide the others' figures
                figures, error = None, f"{type(exc).__name__}: {exc}"
            gathered = gather({"figures": figures, "error": error})
            errors = [g["error"] for g in gathered if g["error"]]
            measured[row_id].append({"error": errors[0]} if errors else
                                    combine_ceilings([g["figures"] for g in gathered]))
    rows = []
    for row_id, label, transport, location, _, _ in plans:
        row = {"id": row_id, "label": label, "kind": "transport_ceiling", "transport": transport,
               "source": location, "workers": 0, "note": f"one ranged GET per shard, {CHUNK >> 20} MiB reads, "
               "no decode" if transport != "local" else "the local shard files read once, no decode"}
        good = sorted((r for r in measured[row_id] if "error" not in r), key=lambda r: r["mb_per_s"])
        if good:
            row.update(good[len(good) // 2])
            row["rounds_mb_per_s"] = [r["mb_per_s"] for r in good]
        else:
            row["error"] = measured[row_id][0]["error"]
        rows.append(row)
    return rows


def combine_ceilings(per_instance: list) -> dict:
    """Instances read at once: total bytes / the slowest instance's time; GETs summed; TTFB the worst."""
    if len(per_instance) == 1:
        return dict(per_instance[0])
    total, seconds = sum(f["bytes"] for f in per_instance), max(f["seconds"] for f in per_instance)
    worst = {key: max((f[key] for f in per_instance if f[key] is not None), default=None)
             for key in ("ttfb_ms_p50", "ttfb_ms_p99")}
    return {"bytes": total, "seconds": seconds, "mb_per_s": total / 1e6 / seconds,
            "cpu_seconds": sum(f["cpu_seconds"] for f in per_instance),
            "gets": None if per_instance[0]["gets"] is None else sum(f["gets"] for f in per_instance),
            "store_bytes": None if per_instance[0].get("store_bytes") is None
            else sum(f["store_bytes"] for f in per_instance), **worst}


# ---------------------------------------------------------------- the transports table and goals


def transport_rows(results: list, copies: list) -> list:
    """The rows of the transports table, in order: per copied dataset its local device row, then each
    copy's loader row, then the ceilings (local files first)."""
    by_id = {r["id"]: r for r in results}
    ordered, seen = [], set()
    for copy in copies:
        local = f"{copy.source.name}/device"
        if local in by_id and local not in seen:
            seen.add(local)
            ordered.append({**by_id[local], "transport": "local"})
        remote = by_id.get(f"{local}@{copy.name}")
        if remote is not None:
            ordered.append(remote)
    ordered += [r for r in results if r.get("kind") == "transport_ceiling"]
    return ordered


def latency_note(copies: list) -> str:
    hosts = sorted({copy.host for copy in copies})
    remote = [h for h in hosts if h not in LOOPBACK_HOSTS]
    if not remote:
        return ("Loopback hides network latency: the servers answer from this host within milliseconds and share\n"
                "its cores with the loader; over a network every GET adds a round trip (GETs per epoch x RTT per\n"
                "epoch per worker, unless reads overlap).")
    return (f"Measured over the network to {', '.join(remote)}"
            + (" (and loopback to the others, which hides network latency)" if len(remote) < len(hosts) else "")
            + ": GETs per epoch x RTT is what latency costs per epoch per worker, unless reads overlap.")


# "Per worker": the ceiling is read by one process, one GET at a time.
CEILING_MB_PER_S = 500.0
S3_VS_LOCAL = 0.9


def evaluate_transport_goals(results: list, copies: list) -> list:
    """Issue 13's goals, for each s3 copy: its loader row >= 0.9x the local one in images per CPU-second,
    and its transport ceiling >= 500 MB/s per worker. Same dicts as comparison.evaluate_goals."""
    by_id = {r["id"]: r for r in results}
    goals = []
    for copy in copies:
        if copy.transport != "s3":
            continue
        local, remote = f"{copy.source.name}/device", f"{copy.source.name}/device@{copy.name}"
        entry = {"goal": f"s3_vs_local@{copy.name}", "row": remote, "reference": local, "metric": "images_per_cpu_s",
                 "threshold": S3_VS_LOCAL, "text": f"{copy.source.label} over s3 >= {S3_VS_LOCAL:g}x local, per "
                 "CPU-second (device normalisation)"}
        row, reference = by_id.get(remote), by_id.get(local)
        if row is None or reference is None or "error" in row or "error" in reference:
            entry.update(status="not measured", why=f"row {remote} or {local} missing or failed")
        else:
            ratio = row["images_per_cpu_s"] / reference["images_per_cpu_s"]
            entry.update(value=row["images_per_cpu_s"], reference_value=reference["images_per_cpu_s"], ratio=ratio,
                         status="met" if ratio >= S3_VS_LOCAL else "not met", also_metric="images_per_s",
                         also_ratio=row["images_per_s"] / reference["images_per_s"])
        goals.append(entry)
        ceiling = by_id.get(f"transport_ceiling/{copy.source.name}@{copy.name}")
        entry = {"goal": f"transport_ceiling@{copy.name}", "row": f"transport_ceiling/{copy.source.name}@{copy.name}",
                 "reference": None, "metric": "mb_per_s", "threshold": CEILING_MB_PER_S,
                 "text": f"s3 transport ceiling >= {CEILING_MB_PER_S:g} MB/s per worker"}
        if ceiling is None or "error" in ceiling:
            entry.update(status="not measured", why="the ceiling row is missing or failed")
        else:
            entry.update(value=ceiling["mb_per_s"], status="met" if ceiling["mb_per_s"] >= CEILING_MB_PER_S
                         else "not met")
        goals.append(entry)
    return goals
