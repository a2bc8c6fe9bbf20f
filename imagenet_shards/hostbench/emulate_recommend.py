"""`host_benchmark.py --compare DIR --recommend --accelerators N --profile P`: the format, decode location and
workers per accelerator for N accelerators of a profile, chosen from measured AU (the pipeline depth run for each
combination), not from rates extrapolated per core as `--recommend --target-rate` does (recommend.py).

The choice: among the combinations whose every accelerator reached the threshold, the one with the fewest host
CPU-seconds per sample (then the fewest workers); where none did, the highest lowest-AU, and by how much it falls short.
"""

from __future__ import annotations

import copy

from imagenet_shards.hostbench import emulate


def combinations(args, sources, n: int, cpus: int, cuda: bool) -> list:
    """(source, decode location, workers per accelerator) to measure: each format's source; the host decode, and
    the device's where CUDA is here; --dataloader-worker, else 1 and the CPUs shared by the N."""
    workers = [args.dataloader_worker] if args.dataloader_worker is not None else sorted({1, max(1, cpus // n)})
    decodes = ["host", "device"] if cuda else ["host"]
    return [(source, decode, w) for source in sources for decode in decodes for w in workers]


def choose(rows: list, threshold: float) -> dict:
    """The decision over measured rows (format, decode, workers, au_min, cpu_s_per_sample, passed)."""
    fed = [r for r in rows if r["passed"]]
    if fed:
        best = min(fed, key=lambda r: (r["cpu_s_per_sample"] or float("inf"), r["workers"]))
        return {"chosen": best["id"], "fed": True,
                "why": f"every accelerator at AU >= {threshold:g} with the fewest host CPU-ms a sample "
                       f"({best['cpu_s_per_sample'] * 1e3:.2f})"}
    measured = [r for r in rows if r["au_min"] is not None]
    if not measured:
        return {"chosen": None, "fed": False, "why": "nothing measured"}
    best = max(measured, key=lambda r: r["au_min"])
    return {"chosen": best["id"], "fed": False,
            "why": f"no combination feeds them: the best keeps its slowest accelerator at AU {best['au_min']:.3f} "
                   f"(threshold {threshold:g}); fewer accelerators per host, more cores, or a lighter format"}


def recommend_by_au(args, sources, cpus, instance, collective, measure, progress) -> dict:
    """Measure every combination of `sources` (--compare DIR's) at N = --accelerators (pipeline depth) with
    `measure(args, n, ...)` (emulation_run.measure) on a host of `cpus`; returns {rows, decision}."""
    import torch

    n = instance.count if instance.count > 1 else int(args.accelerators)
    rows = []
    for source, decode, workers in combinations(args, sources, n, cpus, torch.cuda.is_available()):
        trial = copy.copy(args)
        trial.imagenet_data_path, trial.decode_location, trial.dataloader_worker = str(source.path), decode, workers
        trial.depth = "pipeline"
        if decode == "device":
            trial.normalization_location = "device"
        row_id = f"{source.name or source.format}/{decode}/{workers}w"
        progress(f"{row_id}:")
        try:
            summary = measure(trial, n, instance, collective, progress)
        except Exception as error:  # one format that cannot be read must not hide the others
            progress(f"  failed: {type(error).__name__}: {error}")
            continue
        rows.append({"id": row_id, "format": source.format, "source": str(source.path), "decode": decode,
                     "workers": workers, **summary})
    decision = choose(rows, args.au_threshold)
    decision.update(accelerators=n, profile=emulate.profile_dict(args.profile_resolved))
    return {"rows": rows, "decision": decision}


def format_decision(result: dict) -> str:
    decision = result["decision"]
    lines = [f"\nRecommendation for {decision['accelerators']} x {decision['profile']['name']} (measured AU, pipeline "
             f"depth; lowest AU / CPU-ms a sample per combination):"]
    for row in result["rows"]:
        cpu = "-" if row["cpu_s_per_sample"] is None else f"{row['cpu_s_per_sample'] * 1e3:.2f}"
        au = "-" if row["au_min"] is None else f"{row['au_min']:.3f}"
        mark = " <- chosen" if row["id"] == decision["chosen"] else ""
        lines.append(f"  {row['id']:<24} AU min {au:>6}  {cpu:>6} CPU-ms/sample  {row['samples_per_s']:>9,.0f} "
                     f"samples/s{mark}")
    lines.append(f"  {'fed' if decision['fed'] else 'not fed'}: {decision['chosen'] or '-'}: {decision['why']}")
    return "\n".join(lines)
