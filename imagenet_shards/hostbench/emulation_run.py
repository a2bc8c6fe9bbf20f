"""`host_benchmark.py --accelerators N|auto --profile P`: how many accelerators this host feeds.

Runs emulated accelerators (imagenet_shards/hostbench/accelerators.py) for a fixed N, for each N the
search tries (`auto`: emulate.search_largest), or as one accelerator per rank under torchrun; prints the
table per N, the headline and the notes; writes the JSON and the PNG of AU against N.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

from imagenet_shards.hostbench import emulate
from imagenet_shards.hostbench.accelerators import EmulationSpec, drop_page_cache, run_accelerator, run_local
from imagenet_shards.hostbench.host_info import memory_available_bytes

def usable_cpus() -> int:
    """CPUs this process may run on (as imagenet_shards.cli.args.usable_cpus; hostbench does not import cli)."""
    return max(1, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


STEPS_IN_ALL = 500  # steps over all accelerators of one N, by default (MLPerf Storage's runs are longer)


def workers_for(args, n: int) -> int:
    """DataLoader workers per accelerator: --dataloader-worker, else the host's CPUs shared by the N."""
    return args.dataloader_worker if args.dataloader_worker is not None else max(1, usable_cpus() // n)


def spec_for(args, n: int) -> EmulationSpec:
    steps = args.batches
    if steps is None and args.seconds is None:
        steps = math.ceil(STEPS_IN_ALL / n)
    return EmulationSpec(args.imagenet_data_path, args.split, args.depth, args.profile_resolved, workers_for(args, n),
                         steps=steps, seconds=args.seconds, seed=args.seed, verify=not args.no_verify,
                         normalization=args.normalization_location, decode=args.decode_location,
                         image_size=args.image_size, cache=cache_of(args))


def cache_of(args):
    """--cache-dir as get_data's Cache (the pipeline depth), else None."""
    if not getattr(args, "cache_dir", None):
        return None
    from imagenet_shards.loader.options import Cache

    return Cache(args.cache_dir, limit=args.cache_limit, prefetch=args.cache_prefetch,
                 remote_paths=args.cache_remote_paths)


def measure(args, n: int, instance, collective, progress) -> dict:
    """One run of N accelerators (local processes, or this rank as one of N under a launcher): its summary."""
    spec = spec_for(args, n)
    if args.drop_page_cache and collective.instance.index == 0:
        args.dropped_bytes = drop_page_cache(spec.location, spec.split)
    collective.barrier()
    began = time.perf_counter()
    if instance.count > 1:
        records = collective.gather(run_accelerator(spec, instance.index, instance.count, ready=collective.barrier))
    else:
        records = run_local(spec, n)
    summary = emulate.summarise(records, spec.profile, args.au_threshold)
    summary["workers_per_accelerator"] = spec.workers
    summary["wall_s"] = time.perf_counter() - began
    progress(format_row(summary))
    return summary


def emulate_accelerators(args, instance, collective) -> list:
    """The whole --accelerators run; returns [] (a failed threshold is an answer, not an error)."""
    profile = args.profile_resolved
    reporter = collective.is_reporter

    def progress(text):
        if reporter:
            print(text, flush=True)

    if reporter:
        print_header(args, profile, instance)
        print(TABLE_HEADER, flush=True)
    if args.compare is not None:  # --recommend from measured AU over the formats in DIR
        return recommend(args, instance, collective, progress)
    results, runs = {}, {}
    paired = paired_with_ceiling(args, instance)

    def run(n):
        ceiling = storage_ceiling(args) if paired else None  # just before the run: the same load on the host
        summary = measure(args, n, instance, collective, progress)
        if ceiling:
            summary["ceiling_samples_per_s"] = ceiling["samples_per_s"]
            summary["vs_ceiling"] = summary["samples_per_s"] / ceiling["samples_per_s"]
            progress(f"     (bare read ceiling just before: {ceiling['samples_per_s']:,.0f} samples/s; this run "
                     f"{summary['vs_ceiling']:.2f}x)")
        results.setdefault(n, summary)
        runs.setdefault(n, []).append(summary)
        return summary["passed"]

    if instance.count > 1 or args.accelerators != "auto":
        n = instance.count if instance.count > 1 else int(args.accelerators)
        for _ in range(args.runs):
            run(n)
        best, tried = (n if results[n]["passed"] else 0), [n]
    else:
        best, tried = emulate.search_largest(run, search_cap(args, progress))
        for _ in range(args.runs - 1):  # the answer measured again: its spread
            run(max(best, 1))
    if not reporter:
        return []
    report = build_report(args, profile, instance, results, runs, best, tried)
    print_report(report)
    write_outputs(args, report)
    return []


def search_cap(args, progress) -> int:
    """--max-accelerators, and for the pipeline depth no more accelerators than the split has full batches for
    (the loader hands out whole batches of an instance's share; the storage depth runs on across epochs)."""
    if args.depth != "pipeline":
        return args.max_accelerators
    from imagenet_shards.loader.source_kinds import resolve_source

    samples = resolve_source(args.imagenet_data_path, args.split).total
    cap = max(1, samples // args.profile_resolved.batch_size)
    if cap < args.max_accelerators:
        progress(f"     (the pipeline depth tries at most N = {cap}: {samples} {args.split} samples give each of more "
                 f"accelerators less than a batch of {args.profile_resolved.batch_size})")
    args.split_cap = cap if cap < args.max_accelerators else None
    return min(cap, args.max_accelerators)


def paired_with_ceiling(args, instance) -> bool:
    """The loader's own rate (--compute-time 0), storage depth, local files, one host: each run is paired with a
    bare read ceiling read just before it, and their ratio taken run by run (the host's load drifts)."""
    from imagenet_shards.storage import is_url

    return (args.profile_resolved.compute_s == 0 and args.depth == "storage" and instance.count == 1
            and not is_url(args.imagenet_data_path))


def recommend(args, instance, collective, progress) -> list:
    from imagenet_shards.hostbench.emulate_recommend import format_decision, recommend_by_au

    from imagenet_shards.hostbench.discovery import compared_sources

    sources = getattr(args, "found_sources", None) or compared_sources(args.compare, args.formats)
    result = recommend_by_au(args, sources, usable_cpus(), instance, collective, measure, progress)
    if collective.is_reporter:
        print(format_decision(result))
        write_outputs(args, {"config": {"compare": args.compare, "threshold": args.au_threshold,
                                        "accelerators": args.accelerators, "usable_cpus": usable_cpus(),
                                        "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime()) + " UTC"},
                             "profile": emulate.profile_dict(args.profile_resolved), "recommendation": result,
                             "results": result["rows"], "headline": {"accelerators_fed": None},
                             "tried": [], "notes": []}, plot_it=False)
    return []


def build_report(args, profile, instance, results, runs, best, tried) -> dict:
    cores = usable_cpus()  # this host's; under a launcher over several hosts, per host
    answer = emulate.headline(best, results, profile, cores)
    if best:  # MLPerf counts a result when every one of its runs passes
        answer["runs"] = len(runs[best])
        answer["runs_passed"] = sum(r["passed"] for r in runs[best])
    repeated = {n: rs for n, rs in runs.items() if len(rs) > 1}
    spreads = {str(n): {"runs": len(rs), "samples_per_s": [r["samples_per_s"] for r in rs],
                        "au_mean": [r["au_mean"] for r in rs],
                        "samples_per_s_spread": emulate.spread([r["samples_per_s"] for r in rs]),
                        "au_mean_spread": emulate.spread([r["au_mean"] for r in rs])} for n, rs in repeated.items()}
    notes = report_notes(args, results)
    if best and best == getattr(args, "split_cap", None):
        notes.append(f"N = {best} passed and is the most this split allows the pipeline depth (a batch each): "
                     f"a larger split may feed more")
    return {
        "config": {"source": args.imagenet_data_path, "split": args.split, "depth": args.depth,
                   "threshold": args.au_threshold, "accelerators": args.accelerators, "runs": args.runs,
                   "max_accelerators": args.max_accelerators, "seconds": args.seconds, "steps": args.batches,
                   "normalization": args.normalization_location, "decode": args.decode_location,
                   "cache_dir": getattr(args, "cache_dir", None),
                   "instances": instance.count, "instance_source": instance.source, "usable_cpus": usable_cpus(),
                   "cores_busy_before": getattr(args, "cores_busy_before", None),
                   "memory_available_bytes": memory_available_bytes(),
                   "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime()) + " UTC"},
        "profile": emulate.profile_dict(profile),
        "results": [results[n] for n in sorted(results)],
        "tried": tried, "headline": answer, "repeats": spreads, "notes": notes,
        "ceiling": storage_ceiling(args) if args.depth == "storage" else None,
        "all_runs": [r for n in sorted(runs) for r in runs[n]],
    }


def report_notes(args, results) -> list:
    notes = []
    epochs = max((r["epochs_read"] or 0 for r in results.values()), default=0)
    if epochs > 1:
        notes.append(f"an accelerator's share of the split is smaller than its run: up to {epochs:.1f} epochs "
                     f"of it were read (the same samples again)")
    split_bytes = split_bytes_of(args)
    warning = emulate.page_cache_note(split_bytes, memory_available_bytes()) if split_bytes else None
    if warning:
        how = (f"--drop-page-cache advised the kernel to drop the shards' pages (posix_fadvise DONTNEED) before "
               f"each run, so each run's first epoch came from storage" if getattr(args, "dropped_bytes", None)
               else "admitted: nothing dropped (--drop-page-cache drops the shards' pages before each run)")
        notes.append(f"{warning}; {how}")
    if args.decode_location == "device":
        notes.append(device_decode_note())
    if args.depth == "storage":
        notes.append("storage depth: bytes read and each payload's CRC32C checked, no decode (as MLPerf Storage)")
    return notes


def device_decode_note() -> str:
    import torch

    text = ("JPEGs decoded on the device (nvJPEG): the host's workers did only their part (read, verify, crop boxes); "
            "the decode belongs inside the profile's compute time (a --step-log profile of a --decode device run "
            "has it)")
    if torch.cuda.is_available():
        return text + "; here each accelerator process also decoded on this host's GPU"
    return text + ("; without CUDA the loader's CPU stand-in decoded in each accelerator process, on the host's "
                   "cores: the AU is a lower bound")


def split_bytes_of(args) -> float:
    """The split's stored bytes (its shards), for the page-cache check; 0 when unknown."""
    try:
        from imagenet_shards.loader.source_kinds import resolve_source

        columns = resolve_source(args.imagenet_data_path, args.split).columns
        return float(columns.record_sizes.sum()) if columns is not None else 0.0
    except Exception:
        return 0.0


def storage_ceiling(args) -> dict | None:
    """The bare read ceiling of the split's local shard files (transports.read_ceiling: read once, no CRC,
    in this process), as samples/s at the split's mean record size; None for a remote source."""
    from imagenet_shards.hostbench.transports import read_ceiling
    from imagenet_shards.loader.source_kinds import resolve_source
    from imagenet_shards.storage import is_url

    if is_url(args.imagenet_data_path):
        return None
    source = resolve_source(args.imagenet_data_path, args.split)
    locations = [source.locate(n) for n in source.columns.shard_names]
    sizes = [os.path.getsize(p) for p in locations]
    length = args.seconds or 5.0
    total = seconds = 0.0
    while seconds < length:  # the split again and again, as long as one N's run
        figures = read_ceiling(locations, sizes, max_seconds=length - seconds)
        total, seconds = total + figures["bytes"], seconds + figures["seconds"]
    per_sample = float(source.columns.record_sizes.sum()) / len(source.columns)
    mb_per_s = total / 1e6 / seconds
    return {"mb_per_s": mb_per_s, "samples_per_s": mb_per_s * 1e6 / per_sample, "seconds": seconds,
            "note": f"the split's local shard files read in this process for {seconds:.1f} s, 1 MiB reads, "
                    f"no CRC32C, no decode (transports.read_ceiling)"}


TABLE_HEADER = (f"{'N':>4} {'workers':>7} {'AU mean':>8} {'AU std':>7} {'AU min':>7} {'pass':>5} {'samples/s':>10} "
                f"{'MB/s':>8} {'CPU-ms/smp':>10} {'wait p50/p90 ms':>16} {'wait%':>6} {'late%':>6} {'epochs':>6}")


def format_row(r: dict) -> str:
    def f(value, pattern):
        return "-" if value is None else format(value, pattern)

    cpu = None if r["cpu_s_per_sample"] is None else r["cpu_s_per_sample"] * 1e3
    waits = f"{f(r['wait_ms_p50'], '.1f')}/{f(r['wait_ms_p90'], '.1f')}"
    return (f"{r['accelerators']:>4} {r.get('workers_per_accelerator', '-'):>7} {f(r['au_mean'], '.3f'):>8} "
            f"{f(r['au_std'], '.3f'):>7} {f(r['au_min'], '.3f'):>7} {'yes' if r['passed'] else 'no':>5} "
            f"{r['samples_per_s']:>10,.1f} {r['mb_per_s']:>8,.1f} {f(cpu, '.2f'):>10} {waits:>16} "
            f"{f(pct(r['wait_share']), '.1f'):>6} {f(pct(r['late_share']), '.1f'):>6} {r['epochs_read']:>6.2f}")


def pct(share):
    return None if share is None else 100 * share


def print_header(args, profile, instance) -> None:
    what = (f"the formats in {args.compare} (--recommend: pipeline depth each)" if args.compare is not None
            else f"{args.imagenet_data_path}, {args.depth} depth")
    print(f"host_benchmark --accelerators {args.accelerators}: {what}, {args.split} split, profile {profile.name} "
          f"(batch {profile.batch_size}, {profile.compute_s:g} s compute "
          f"a batch = {profile.samples_per_s:,.0f} samples/s an accelerator; {profile.source}); AU threshold "
          f"{args.au_threshold:g}, first step left out; {instance.describe()}", flush=True)


def print_report(report: dict) -> None:
    answer, profile, config = report["headline"], report["profile"], report["config"]
    print()
    if not profile["compute_s"]:
        rates = [r["samples_per_s"] for r in report.get("all_runs", [])]
        print(f"the loader's own rate (--compute-time 0: no accelerator to keep busy): median "
              f"{statistics.median(rates):,.0f} "
              f"samples/s over {len(rates)} run(s)")
    elif answer["accelerators_fed"]:
        print(f"accelerators fed: {answer['accelerators_fed']} x {profile['name']} at AU >= {config['threshold']:g} "
              f"({config['depth']} depth), {answer['accelerators_fed_per_core']:.2f} per host core "
              f"({answer['host_cores']:g} cores)" + _runs_text(answer))
    else:
        fraction, au = answer.get("fraction_of_one"), answer.get("au_at_1")
        per_core = None if fraction is None else fraction / answer["host_cores"]
        print(f"accelerators fed: 0 x {profile['name']} ({config['depth']} depth): at N = 1 the host delivers "
              f"{_figure(fraction, '.3f')} of one accelerator's rate (AU {_figure(au, '.3f')}), "
              f"{_figure(per_core, '.3f')} of one per host core")
    for n, spread in report["repeats"].items():
        s, a = spread["samples_per_s_spread"], spread["au_mean_spread"]
        print(f"  N = {n}, {spread['runs']} runs: samples/s spread {'-' if s is None else f'{s:.1%}'}, "
              f"AU spread {'-' if a is None else f'{a:.1%}'} ((max - min) / median; MLPerf asks <= 5%)")
    ratios = [r["vs_ceiling"] for r in report.get("all_runs", []) if r.get("vs_ceiling") is not None]
    if ratios:
        print(f"  storage depth / the bare read ceiling read just before it, run by run: "
              f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f}x)")
    ceiling = report.get("ceiling")
    if ceiling:
        rate = profile["samples_per_s"]
        worth = f" = {ceiling['samples_per_s'] / rate:,.1f} accelerators' worth" if rate else ""
        print(f"  bare read ceiling: {ceiling['samples_per_s']:,.0f} samples/s ({ceiling['mb_per_s']:,.0f} MB/s)"
              f"{worth}")
        limited = [r for r in report["results"] if not r["passed"]]  # where the loader, not the sleep, set the pace
        if limited and not ratios:
            fastest = max(r["samples_per_s"] for r in limited)
            print(f"  where the accelerators waited, the storage depth delivered at most {fastest:,.0f} samples/s = "
                  f"{fastest / ceiling['samples_per_s']:.2f}x the bare read ceiling")
    for note in report["notes"]:
        print(f"  note: {note}")


def _runs_text(answer: dict) -> str:
    runs, passed = answer.get("runs", 1), answer.get("runs_passed", 1)
    if runs <= 1:
        return ""
    if passed == runs:
        return f"; passed in all {runs} runs"
    return (f"; but passed in only {passed} of {runs} runs (MLPerf counts an N whose every run passes: "
            f"not a stable answer on this host now)")


def _figure(value, pattern) -> str:
    return "-" if value is None else format(value, pattern)


def write_outputs(args, report: dict, plot_it: bool = True) -> None:
    from imagenet_shards.hostbench.report import sanitize_nan, write_json

    if args.json:
        write_json(args.json, sanitize_nan(report))
        print(f"wrote {args.json}")
    if args.plot and not plot_it:
        print(f"--plot {args.plot}: not written (the recommendation has no AU-against-N chart)", file=sys.stderr)
    elif args.plot:
        if plot(args.plot, report):
            print(f"wrote {args.plot}")
        else:
            print(f"--plot {args.plot}: not written, matplotlib is not installed (pip install matplotlib)",
                  file=sys.stderr)


def plot(path, report: dict) -> bool:
    """AU (mean, with the accelerators' std) against N, with the threshold line. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    rows = [r for r in report["results"] if r["au_mean"] is not None]
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    axes.errorbar([r["accelerators"] for r in rows], [r["au_mean"] for r in rows],
                  yerr=[r["au_std"] or 0 for r in rows], marker="o", capsize=3, label="AU (mean, std)")
    threshold = report["config"]["threshold"]
    axes.axhline(threshold, color="red", linestyle="--", label=f"threshold {threshold:g}")
    axes.set_xlabel("emulated accelerators N")
    axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes.set_ylabel("accelerator utilisation")
    axes.set_ylim(0, 1.05)
    axes.set_title(f"{report['profile']['name']}, {report['config']['depth']} depth: "
                   f"{report['headline']['accelerators_fed']} fed", fontsize=10)
    axes.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return True
