"""What host_benchmark.py runs: one source measured over iterations, or the format comparison.

`run_host_benchmark` takes the options host_benchmark.py parsed, joins the other instances,
prints the report as the figures arrive (on rank 0 under a launcher), writes the JSON and
the chart, and returns the ids of the comparison rows that failed.
"""

from __future__ import annotations

import math
import statistics
import sys
import time

from imagenet_shards.hostbench import cache_epochs, report, transports
from imagenet_shards.hostbench.decision import make_recommendation
from imagenet_shards.hostbench.timing import SHORT_MEASUREMENT_SECONDS, SHORT_NOTE, BenchmarkError, run_iterations
from imagenet_shards.hostbench.comparison import evaluate_goals, plan_rows, run_comparison
from imagenet_shards.hostbench.pipelines import loader_batches
from imagenet_shards.loader.options import Cache
from imagenet_shards.hostbench.discovery import NothingToCompare, source_bytes_per_image, webdataset_shards
from imagenet_shards.hostbench.discovery import compared_sources as discover_compared_sources
from imagenet_shards.hostbench.collective import Collective
from imagenet_shards.hostbench.host_info import busy_host_warning, cores_busy_now, host_description, memory_available_bytes
from imagenet_shards.launcher import LauncherError, instance_from_args
from imagenet_shards.loader.transform import UNAVAILABLE_REASON, crop_decode_available, jpeg_decode_path
from imagenet_shards.errors import UsageError


class CannotStart(UsageError):
    """This instance cannot take part: the launcher's values are invalid, or the other instances cannot be joined."""


def run_host_benchmark(args, warn) -> list:
    """Measure as `args` (host_benchmark.parse_args) asks; `warn(text)` reports what skews the figures.

    Returns the ids of the rows that failed (none for one source: a failure there raises).
    """
    import torch

    # Every pipeline's torch ops run on one thread per process, as in DataLoader workers (torch
    # sets that there): otherwise rows with --dataloader-worker 0 would use several cores and
    # the loader (which sets it when it runs in-process) would change the rows measured after it.
    torch.set_num_threads(1)
    try:
        instance = instance_from_args(args)
    except LauncherError as error:
        raise CannotStart(str(error)) from None
    try:
        collective = Collective(instance, args.rendezvous)
    except (RuntimeError, ValueError) as error:
        raise CannotStart(f"cannot join the other instances ({instance.describe()}): {error}") from None
    if collective.warning:
        warn(collective.warning)
    # Sampled before any worker starts, so it is other programs' load, not ours.
    args.cores_busy_before = cores_busy_now()
    busy = busy_host_warning(busy=args.cores_busy_before)
    if busy and collective.is_reporter:
        warn(busy)
    try:
        if getattr(args, "accelerators", None) is not None:  # host_benchmark.py --accelerators N|auto
            from imagenet_shards.hostbench.emulation_run import emulate_accelerators

            return emulate_accelerators(args, instance, collective)
        if args.compare is not None:
            return compare_formats(args, instance, collective)
        measure_source(args, instance, collective)
        return []
    finally:
        collective.close()


def config_of(args, instance, **extra) -> dict:
    host = host_description()
    return {
        "cores_busy_before": args.cores_busy_before,
        "split": args.split, "batch_size": args.batch_size, "workers": args.dataloader_worker,
        "warmup_batches": args.warmup_batches, "batches": args.batches, "seconds": args.seconds,
        "seed": args.seed, "instances": instance.count, "instance_source": instance.source,
        "cpus": host["usable_cpus"], "created": time.strftime("%Y-%m-%d %H:%M"), "image_size": args.image_size,
        "memory_available_bytes": memory_available_bytes(),
        "jpeg_train_decode": jpeg_decode_path(), "jpeg_crop_unavailable": UNAVAILABLE_REASON, **extra,
    }


def limit_text(args) -> str:
    if args.batches is not None:
        return f"{args.batches} batches"
    if args.seconds is not None:
        return f"{args.seconds:g} s"
    return "one epoch"


def measure_source(args, instance, collective) -> None:
    """One source (--data), `--iterations` times, each printed as `Throughput of the iteration:<x> img/sec`."""
    # The loader names generated data "synthetic": images made in memory, nothing read.
    source = "synthetic" if args.data == "generated" else args.imagenet_data_path
    bytes_per_image = source_bytes_per_image(args.data, None if args.data == "generated" else source, args.split)
    notes = []
    source = select_webdataset_shards(args, source, notes)
    options = {"use_bbox_info": True} if getattr(args, "use_bbox_info", False) else {}
    if getattr(args, "no_verify", False):
        options["verify"] = False
    if getattr(args, "decode_location", "host") == "device":
        options["jpeg_decode"] = "device"
    if getattr(args, "cache_dir", None):
        options["cache"] = Cache(args.cache_dir, limit=args.cache_limit, prefetch=args.cache_prefetch,
                                 remote_paths=args.cache_remote_paths)
    batches = loader_batches(source, args.split, args.batch_size, args.dataloader_worker,
                             args.normalization_location, instance, seed=args.seed,
                             image_size=args.image_size,
                             rebatch_size=getattr(args, "dataloader_rebatch_size", None), **options)
    loader = batches.make_iterable
    if collective.is_reporter:
        for note in notes:
            print(f"host_benchmark: {note}", flush=True)

    if collective.is_reporter:
        shown = f"{len(source)} shards of {args.imagenet_data_path}" if isinstance(source, list) else source
        print(f"host_benchmark: {shown} ({args.data}), {args.split} split, batch {args.batch_size}, "
              f"{args.dataloader_worker} worker(s), {args.normalization_location} normalisation, JPEGs decoded on the "
              f"{getattr(args, 'decode_location', 'host')}, "
              f"{args.warmup_batches} warm-up batches, then {limit_text(args)} per iteration; {instance.describe()}",
              flush=True)
        print_decode_note()

    def print_iteration(result):
        if not collective.is_reporter:
            return
        aggregate = result["aggregate"]
        label = f"iteration {result['iteration']}"
        if len(result["instances"]) > 1:
            print(report.format_instances(label, result["instances"], aggregate))
        print(f"Throughput of the iteration:{aggregate['images_per_s']:0.1f} img/sec")
        print(f"  {label}: {aggregate['images']} images in {aggregate['seconds']:.2f} s, "
              f"{aggregate['images_per_s_per_worker']:,.1f} img/s per worker, {aggregate['mb_per_s']:,.1f} MB/s, "
              f"batch wait p50 {aggregate['latency_ms_p50']:.1f} ms p99 {aggregate['latency_ms_p99']:.1f} ms, "
              f"CPU {aggregate['cpu_ms_per_image']:.2f} ms/image ({aggregate['cores_busy']:.2f} cores busy), "
              f"batches {aggregate['batch_dtype']} {aggregate['batch_shape']}", flush=True)
        if aggregate["seconds"] < SHORT_MEASUREMENT_SECONDS:
            print("  " + SHORT_NOTE.lstrip("* "), flush=True)

    results = run_iterations(
        loader, iterations=args.iterations, warmup_batches=args.warmup_batches, max_batches=args.batches,
        max_seconds=args.seconds, bytes_per_image=bytes_per_image, workers=args.dataloader_worker,
        collective=collective, on_iteration=print_iteration,
    )
    if not collective.is_reporter:
        return
    decode_ms = device_decode_ms(batches.loader)
    if decode_ms is not None:
        print(f"  device decode (decode, crop, resize of a batch, synchronised): {decode_ms:.1f} ms a batch (p50)")
    rows = []
    for result in results:
        row = {"id": f"iteration_{result['iteration']}", "label": f"iteration {result['iteration']}",
               "kind": "loader", "format": args.data, "normalization": args.normalization_location,
               "decode": getattr(args, "decode_location", "host"), "device_decode_ms_per_batch": decode_ms,
               "workers": args.dataloader_worker, "source": str(source), "note": ""}
        row.update({k: v for k, v in result["aggregate"].items() if k != "waits_s"})
        row["instances"] = [{k: v for k, v in m.items() if k != "waits_s"} for m in result["instances"]]
        rows.append(row)
    config = config_of(args, instance, data=args.data, source=str(source), normalization=args.normalization_location)
    write_outputs(args, rows, [], config)


def device_decode_ms(loader):
    """The median of the decode thread's milliseconds per batch (jpeg_decode="device"), else None."""
    times = getattr(loader, "device_decode_ms", None)
    return statistics.median(times) if times else None


def select_webdataset_shards(args, source, notes):
    """--webdataset-percentage-to-use and --webdataset-memory-cache-ratio, with the reference's meaning:
    the first ceil(P% of the split's shards) are read, and the first ceil(R x those) are read into
    memory (the page cache the loader maps them from) before timing. Returns the source to load."""
    percentage = getattr(args, "webdataset_percentage_to_use", 100.0)
    ratio = getattr(args, "webdataset_memory_cache_ratio", 0.0)
    if percentage >= 100 and ratio <= 0:
        return source
    shards = webdataset_shards(source if args.data != "generated" else None, args.split)
    if not shards:
        notes.append("--webdataset-percentage-to-use and --webdataset-memory-cache-ratio apply to WebDataset "
                     "sources (a folder with metadata.json) only: ignored")
        return source
    if percentage < 100:
        count = max(1, math.ceil(len(shards) * percentage / 100))
        notes.append(f"--webdataset-percentage-to-use {percentage:g}: the first {count} of {len(shards)} "
                     f"{args.split} shards")
        shards = shards[:count]
    if ratio > 0:
        cached = shards[:math.ceil(len(shards) * ratio)]
        size = 0
        for path in cached:
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 22):
                    size += len(chunk)
        notes.append(f"--webdataset-memory-cache-ratio {ratio:g}: {len(cached)} of {len(shards)} shards "
                     f"({size / 1e6:,.1f} MB) read into memory (page cache) before timing")
    return shards if percentage < 100 else source


def compared_sources(args) -> list:
    """The sources in --compare DIR, those of --formats only; CannotStart (exit 2) when DIR or --formats finds none.
    host_benchmark's main found them before importing torch (args.found_sources): not listed again."""
    found = getattr(args, "found_sources", None)
    if found is not None:
        return found
    try:
        return discover_compared_sources(args.compare, args.formats)
    except NothingToCompare as error:
        raise CannotStart(str(error)) from None


def compare_formats(args, instance, collective) -> list:
    """Every format in --compare DIR against the ceiling and the baselines: table, goals; the failed rows' ids."""
    sources = compared_sources(args)
    loader_options = {"verify": False} if getattr(args, "no_verify", False) else None
    rows = plan_rows(sources, args.split, args.batch_size, args.dataloader_worker, instance, seed=args.seed,
                     size=args.image_size, loader_options=loader_options)
    copies = getattr(args, "found_copies", None)  # host_benchmark's main checked them before importing torch
    if copies is None:
        copies = transports.remote_copies(getattr(args, "compare_transport", None) or [], sources)
    rows += transports.plan_transport_rows(copies, args.split, args.batch_size, args.dataloader_worker, instance,
                                           seed=args.seed, loader_options=loader_options, size=args.image_size)
    if collective.is_reporter:
        print_compare_header(args, instance, sources, copies, rows)

    def progress(text):
        if collective.is_reporter:
            print(f"  {text}", file=sys.stderr, flush=True)

    gets_per_epoch = {}
    for copy in copies:  # untimed, before the timed rows (it also warms the server up)
        progress(f"GETs of one epoch from {copy.location}")
        try:
            counted, error = transports.count_epoch_gets(copy, args.split, args.batch_size, args.dataloader_worker,
                                                         instance, seed=args.seed, loader_options=loader_options,
                                                         size=args.image_size), None
        except Exception as exc:  # gathered first, so no instance waits forever for a failed one
            counted, error = None, f"{type(exc).__name__}: {exc}"
        gathered = collective.gather({"gets": counted, "error": error})
        failed = [g["error"] for g in gathered if g["error"]]
        gets_per_epoch[copy.name] = None if failed else sum(g["gets"] for g in gathered)
        if failed:
            progress(f"  failed: {failed[0]}")
    results = run_comparison(rows, warmup_batches=args.warmup_batches, max_batches=args.batches,
                             max_seconds=args.seconds, rounds=args.rounds, gather=collective.gather,
                             progress=progress)
    cache_rows = measure_cache_rows(args, copies, instance, collective, loader_options, progress)
    if getattr(args, "recommend", None) is not None:
        results += local_ceilings(args, sources, copies, instance, collective, progress)
    if copies:
        progress("transport ceilings")
        results += transports.measure_ceilings(copies, args.split, instance, rounds=args.rounds,
                                               max_seconds=args.seconds, gather=collective.gather)
        for copy in copies:
            for result in results:
                if result["id"] == f"{copy.source.name}/device@{copy.name}":
                    result["transport"], result["gets_per_epoch"] = copy.transport, gets_per_epoch[copy.name]
    if not collective.is_reporter:
        return []
    goals = evaluate_goals(results, args.split) + transports.evaluate_transport_goals(results, copies)
    if cache_rows:
        goals += cache_epochs.evaluate_cache_goals(cache_rows, copies)
    if instance.count > 1:
        for result in results:
            if "error" not in result:
                print(report.format_instances(result["label"], result["instances"], result))
    print()
    print(report.format_table([r for r in results if r["kind"] != "transport_ceiling"]))
    if copies:
        print(f"\nTransports ({args.split} split; GETs per epoch: every instance's, over one untimed epoch; "
              f"TTFB: request to response headers):")
        print(report.format_transport_table(transports.transport_rows(results, copies)))
        print(transports.latency_note(copies))
    if cache_rows:
        print(cache_epochs.format_cache_table(cache_rows, f"{args.split} split, cache {args.cache_dir}"))
    print("\nGoals (ratios measured in this run):")
    print(report.format_goals(goals))
    config = config_of(args, instance, compare=str(args.compare), rounds=args.rounds,
                       formats=[s.format for s in sources],
                       sources=sources_config(sources, args.split),
                       compare_transport=[{"location": c.location, "transport": c.transport, "copy_of": str(c.source.path)}
                                          for c in copies])
    decision = make_recommendation(args, results, config) if getattr(args, "recommend", None) is not None else None
    write_outputs(args, results + cache_rows, goals, config, decision)
    return failed_rows(results + cache_rows)


def failed_rows(rows) -> list:
    """The ids of rows that failed. A stock baseline whose library is not installed (an optional extra of the
    pip package) is not a failure: the table names the missing module, and one line says how to add it."""
    unmet = [r for r in rows if r.get("kind") == "baseline" and str(r.get("error", "")).startswith("ModuleNotFoundError")]
    if unmet:
        print(f"note: {len(unmet)} baseline row(s) not measured, their library is not installed "
              f"(pip install 'imagenet-shards[formats]' adds them)")
    return [r["id"] for r in rows if "error" in r and r not in unmet]


def print_decode_note() -> None:
    """The report's line saying that JPEGs decode whole with PIL because `_jpeg_crop` is not built, and how to fix it."""
    if not crop_decode_available():
        print(f"  note: JPEGs are decoded whole with PIL (slower), the native decoder is not built: "
              f"{UNAVAILABLE_REASON}", flush=True)


def print_compare_header(args, instance, sources, copies, rows) -> None:
    print(f"host_benchmark --compare {args.compare}: {args.split} split, batch {args.batch_size}, "
          f"{args.dataloader_worker} worker(s) per loader, {args.warmup_batches} warm-up batches, then "
          f"{limit_text(args)} per row x {args.rounds} round(s); {args.image_size} px output, JPEG "
          f"decode {jpeg_decode_path()}; {instance.describe()}")
    print_decode_note()
    for source in sources:
        print(f"  {source.name:<8} {source.path}  ({source.samples.get(args.split, 0)} {args.split} samples, "
              f"{source.bytes_per_image.get(args.split, 0) / 1e3:,.1f} KB/image stored)")
    for copy in copies:
        print(f"  {copy.source.name}@{copy.name:<4} {copy.location}  (the same shards as {copy.source.path})")
    print(f"measuring {len(rows)} rows ...", flush=True)


def measure_cache_rows(args, copies, instance, collective, loader_options, progress) -> list:
    """--cache-dir with --compare-transport: the shard cache's whole-epoch rows (imagenet_shards/hostbench/cache_epochs.py)."""
    if not copies or not getattr(args, "cache_dir", None):
        return []
    return cache_epochs.cache_epoch_rows(
        copies, args.split, args.batch_size, args.dataloader_worker, instance, args.cache_dir,
        cache_limit=args.cache_limit, cache_prefetch=args.cache_prefetch, seed=args.seed, size=args.image_size,
        loader_options=loader_options, gather=collective.gather, progress=progress, rounds=args.rounds)


def local_ceilings(args, sources, copies, instance, collective, progress) -> list:
    """--recommend's storage side: each source's split read once from the local files (no decode), except
    those a --compare-transport copy already measured."""
    progress("local read ceilings (for --recommend)")
    covered = {f"transport_ceiling/{copy.source.name}@local" for copy in copies}
    return transports.measure_local_ceilings(sources, args.split, instance, rounds=args.rounds,
                                             max_seconds=args.seconds, gather=collective.gather, skip=covered)


def sources_config(sources, split: str) -> dict:
    """What --recommend needs of each source besides its rows: format, samples, stored bytes per image."""
    return {s.name or s.format: {"format": s.format, "samples": s.samples.get(split, 0),
                                 "bytes_per_image": s.bytes_per_image.get(split, 0.0)} for s in sources}


def write_outputs(args, rows, goals, config, decision=None) -> None:
    if args.json:
        written = report.comparison_report(rows, goals, config)
        if decision is not None:
            written["recommendation"] = decision
        report.write_json(args.json, report.sanitize_nan(written))
        print(f"wrote {args.json}")
    if args.plot:
        report.plot_comparison(args.plot, rows, config, goals)
        print(f"wrote {args.plot}")
