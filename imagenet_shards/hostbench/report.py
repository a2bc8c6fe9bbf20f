"""The host benchmark's figures as a table, the goals as text, a JSON report and a bar chart (PNG)."""

from __future__ import annotations

import json
import math
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from imagenet_shards.hostbench.timing import SHORT_MEASUREMENT_SECONDS, SHORT_NOTE, BenchmarkError
from imagenet_shards.hostbench.comparison import METRIC_UNITS
from imagenet_shards.hostbench.discovery import COMPARED_FORMATS
from imagenet_shards.hostbench.host_info import host_description


def _num(value, digits=0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


TABLE_COLUMNS = (
    ("row", 36, lambda r: r["label"]),
    ("img/s", 8, lambda r: _num(r.get("images_per_s"))),
    ("/worker", 8, lambda r: _num(r.get("images_per_s_per_worker"))),
    ("img/CPU-s", 9, lambda r: _num(r.get("images_per_cpu_s"))),
    ("CPU ms/img", 10, lambda r: _num(r.get("cpu_ms_per_image"), 2)),
    ("main ms", 7, lambda r: _num(r.get("main_cpu_ms_per_image"), 2)),
    ("MB/s", 7, lambda r: _num(r.get("mb_per_s"), 1)),
    ("p50 ms", 7, lambda r: _num(r.get("latency_ms_p50"), 1)),
    ("p99 ms", 7, lambda r: _num(r.get("latency_ms_p99"), 1)),
    ("batch", 0, lambda r: f"{r.get('batch_dtype', '')} {r.get('batch_shape', '')}".strip()),
)


def _with_label_width(columns, rows, marker=""):
    """`columns` with the first ("row") column widened to the longest label (+ `marker`), so that
    long labels do not push their row's figures out of line."""
    (name, width, cell), *rest = columns
    longest = max((len(row["label"] + marker) for row in rows), default=0)
    return ((name, max(width, longest), cell), *rest)


def format_table(results: list) -> str:
    columns = _with_label_width(TABLE_COLUMNS, results, " *")

    def line(cells):
        parts = []
        for (name, width, _), cell in zip(columns, cells):
            parts.append(cell.ljust(width) if name in ("row", "batch") else cell.rjust(width))
        return "  ".join(parts).rstrip()

    lines = [line([c[0] for c in columns]), line(["-" * max(c[1], 5) for c in columns])]
    short = False
    for result in results:
        if "error" in result:
            lines.append(f"{result['label']:<{columns[0][1]}}  FAILED: {result['error']}")
            continue
        cells = [c[2](result) for c in TABLE_COLUMNS]
        if result["seconds"] < SHORT_MEASUREMENT_SECONDS:
            cells[0], short = cells[0] + " *", True
        lines.append(line(cells))
    if short:
        lines.append(SHORT_NOTE)
    return "\n".join(lines)


TRANSPORT_COLUMNS = (
    ("row", 44, lambda r: r["label"]),
    ("via", 5, lambda r: r.get("transport", "")),
    ("img/s", 8, lambda r: _num(r.get("images_per_s"))),
    ("img/CPU-s", 9, lambda r: _num(r.get("images_per_cpu_s"))),
    ("MB/s", 8, lambda r: _num(r.get("mb_per_s"), 1)),
    ("GETs/epoch", 10, lambda r: _num(r.get("gets_per_epoch"))),
    ("GETs", 5, lambda r: _num(r.get("gets"))),
    ("TTFB p50 ms", 11, lambda r: _num(r.get("ttfb_ms_p50"), 1)),
    ("p99 ms", 7, lambda r: _num(r.get("ttfb_ms_p99"), 1)),
)


def format_transport_table(rows: list) -> str:
    """The same dataset locally and over each transport: loader rows, then the read-only ceilings.
    GETs: those the row made while measured (warm-up included)."""
    columns = _with_label_width(TRANSPORT_COLUMNS, rows)

    def line(cells):
        return "  ".join(cell.ljust(width) if name in ("row", "via") else cell.rjust(width)
                         for (name, width, _), cell in zip(columns, cells)).rstrip()

    lines = [line([c[0] for c in columns]), line(["-" * max(c[1], 5) for c in columns])]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['label']:<{columns[0][1]}}  FAILED: {row['error']}")
        else:
            lines.append(line([c[2](row) for c in columns]))
    return "\n".join(lines)


def format_goals(goals: list) -> str:
    lines = []
    for goal in goals:
        if goal["status"] == "not measured":
            lines.append(f"  [not measured] {goal['text']}: {goal['why']}")
            continue
        unit = METRIC_UNITS.get(goal["metric"], goal["metric"])
        if goal.get("reference") is None:  # an absolute threshold
            lines.append(f"  [{goal['status']}] {goal['text']}: {goal['row']} {goal['value']:,.0f} {unit} "
                         f"(needs {goal['threshold']:,.0f})")
            continue
        paired = goal.get("rounds_paired", 0)
        how = f" (the median of {paired} rounds' ratios)" if paired > 1 else ""
        line = (f"  [{goal['status']}] {goal['text']}: {goal['row']} {goal['value']:,.0f} vs {goal['reference']} "
                f"{goal['reference_value']:,.0f} {unit} = {goal['ratio']:.2f}x{how} (needs {goal['threshold']:.2f}x)")
        if "also_ratio" in goal:
            line += f"; by {METRIC_UNITS.get(goal['also_metric'], goal['also_metric'])}: {goal['also_ratio']:.2f}x"
        lines.append(line)
    return "\n".join(lines)


def format_instances(label: str, per_instance: list, aggregate: dict) -> str:
    """Each instance's figures and the aggregate, as rank 0 prints them."""
    lines = []
    for index, m in enumerate(per_instance):
        lines.append(
            f"{label} instance {index}: {m['images']} images in {m['seconds']:.2f} s = {m['images_per_s']:,.1f} img/s, "
            f"{m['images_per_cpu_s']:,.0f} img/CPU-s, p50 {m['latency_ms_p50']:.1f} ms, p99 {m['latency_ms_p99']:.1f} ms"
        )
    lines.append(
        f"{label} aggregate over {len(per_instance)} instance(s): {aggregate['images']} images / "
        f"{aggregate['seconds']:.2f} s (slowest instance) = {aggregate['images_per_s']:,.1f} img/s"
    )
    return "\n".join(lines)


def comparison_report(results, goals, config) -> dict:
    return {
        "kind": "host_benchmark comparison",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host_description(),
        "config": config,
        "how_counted": {
            "images_per_s": "images in measured batches / wall time after warm-up; instances: total / slowest",
            "images_per_s_per_worker": "images_per_s / max(1, DataLoader workers x instances)",
            "images_per_cpu_s": "images / CPU seconds of the process and its live DataLoader workers (/proc/<pid>/stat)",
            "mb_per_s": "images_per_s x mean stored bytes per image of the source (shard bytes / samples; folder: file sizes)",
            "latency_ms": "time the consumer waits in next() per measured batch",
            "main_cpu_ms_per_image": "CPU of the consuming process alone (with workers: receiving batches)",
            "worker_cpu_ms_per_image": "CPU of the DataLoader worker processes",
            "gets_per_epoch": "--compare-transport rows: GETs of one whole untimed epoch, every process and instance",
            "gets": "GETs a remote row made while measured (warm-up included; not the loader's set-up reads)",
            "ttfb_ms": "time from a GET's request to its response headers, over the row's GETs",
            "store_bytes": "--compare-transport rows: bytes the store's GET answers carried (Content-Length), every process's",
            "cache_epoch": "--cache-dir: whole epochs (every batch counted, no warm-up) of the local, uncached and cached "
                           "loaders; cache: the shard cache's events (fills, hits, evictions) in that epoch",
            "transport_ceiling": "each shard of the split read once by one ranged GET (1 MiB reads, no decode) in "
                                 "one process: bytes / wall time",
        },
        "rows": results,
        "goals": goals,
    }


def write_json(path, report: dict) -> None:
    from imagenet_shards.fileio import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(report, indent=1, allow_nan=False, default=_json_default) + "\n").encode())


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def sanitize_nan(obj):
    """JSON has no NaN: turn NaN into None throughout."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: sanitize_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [sanitize_nan(v) for v in obj]
    return obj


GOAL_SHORT = {"jpeg_vs_bare": "vs bare per worker",
              "jpeg_vs_imagefolder": "vs ImageFolder",
              "tensor_vs_stock_npy": "vs stock .npy per core",
              "jpeg_crop_decode_vs_bare": "crop decode vs bare",
              "img_verify_cost": "verify on vs off",
              "tensor_verify_cost": "verify on vs off",
              "jpeg_user_transform_fused": "user RRC+flip fused per core",
              "jpeg_loader_vs_floor": "loader vs floor",
              "jpeg_validation_fused_vs_pil": "fused vs PIL validation"}
PLOT_DPI = 110
TITLE_WIDTH = 120  # characters a title line holds on the 14-inch-wide figure at fontsize 10 (with margin)
KIND_COLOURS = {"ceiling": "#2e7d32", "floor": "#66bb6a", "baseline": "#9e9e9e"}
NORMALIZATION_COLOURS = {"host": "#1f77b4", "device": "#ff7f0e"}


def plot_comparison(path, results: list, config: dict, goals: list | None = None) -> None:
    """Write `comparison_figure` as a PNG at `path` (atomically)."""
    import matplotlib.pyplot as plt

    from imagenet_shards.fileio import atomic_open

    figure = comparison_figure(results, config, goals)
    try:
        with atomic_open(path, "wb") as handle:
            figure.savefig(handle, format="png", dpi=PLOT_DPI)
    finally:
        plt.close(figure)


def comparison_figure(results: list, config: dict, goals: list | None = None):
    """Two horizontal bar panels: images/s and images per CPU-second; baselines grey and hatched.

    The ceiling (bare decode+augment in one process) is a green bar, and on the images/s
    panel a dashed line at ceiling x workers: what a JPEG loader with no overhead of its
    own could reach. A failed row is listed with "failed" instead of a bar.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    # Ceilings (MB/s only) and the cache's whole-epoch rows: in their tables, not the chart.
    results = [r for r in results if r["kind"] not in ("transport_ceiling", "cache_epoch")]
    if not results:
        raise BenchmarkError("no rows: nothing to plot")
    measured = [r for r in results if "error" not in r]
    if not measured:
        raise BenchmarkError("every row failed: nothing to plot")
    labels = [r["label"] for r in results]
    colours = [KIND_COLOURS.get(r["kind"]) or NORMALIZATION_COLOURS.get(r["normalization"], "#1f77b4") for r in results]
    height = 2.0 + 0.42 * len(results)
    figure, axes = plt.subplots(1, 2, figsize=(14, height), sharey=True, layout="constrained")
    positions = np.arange(len(results))[::-1]
    workers = int(config.get("workers", 0) or 0)
    panels = (
        ("images_per_s", "images per second (higher is better)",
         lambda r: f" {r['images_per_s']:,.0f}" + (f"  ({r['images_per_s_per_worker']:,.0f} per worker)"
                                                    if r["kind"] != "ceiling" and r["workers"] > 1 else "")),
        ("images_per_cpu_s", "images per CPU-second of all processes (per-core efficiency)",
         lambda r: f" {r['images_per_cpu_s']:,.0f}" if r.get("images_per_cpu_s") else " -"),
    )
    ceiling = next((r for r in measured if r["kind"] == "ceiling"), None)
    # The dashed ceiling x workers line (images/s panel) is drawn inside the axis too, with its label.
    scaled = ceiling["images_per_s"] * max(1, workers) if ceiling is not None else 0.0
    for axis, (metric, xlabel, text) in zip(axes, panels):
        values = [(r.get(metric) or 0.0) if "error" not in r else 0.0 for r in results]
        top = max(values + ([scaled / 1.2] if metric == "images_per_s" else [])) or 1.0
        bars = axis.barh(positions, values, color=colours, edgecolor="#424242", linewidth=0.6, height=0.7)
        for bar, result, position, value in zip(bars, results, positions, values):
            if result["kind"] == "baseline":
                bar.set_hatch("//")
            label = " failed (see the table)" if "error" in result else text(result)
            axis.annotate(label.strip(), (value, position), xytext=(4, 0), textcoords="offset points", va="center",
                          ha="left", fontsize=8, color="#b71c1c" if "error" in result else "black",
                          bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})
        axis.set_xlabel(xlabel)
        axis.set_xlim(0, top * 1.45)
        axis.grid(axis="x", linestyle=":", alpha=0.6)
        axis.set_axisbelow(True)
    if ceiling is not None:
        # The ceiling holds for JPEG rows only: mark it across those rows, not the tensor ones.
        jpeg = COMPARED_FORMATS["img"]
        jpeg_rows = [p for p, r in zip(positions, results)
                     if r["kind"] != "ceiling" and COMPARED_FORMATS.get(r["format"], jpeg).payload == "jpeg"]
        for position in jpeg_rows:
            axes[0].vlines(scaled, position - 0.45, position + 0.45, color=KIND_COLOURS["ceiling"],
                           linestyle="--", linewidth=1.2)
        if jpeg_rows:
            # Right of the line while there is room, else left of it (it may lie near the axis' end).
            right_half = scaled > 0.5 * axes[0].get_xlim()[1]
            axes[0].text(scaled, max(jpeg_rows) + 0.45, f" ceiling x {max(1, workers)} worker(s) = {scaled:,.0f} ",
                         color=KIND_COLOURS["ceiling"], fontsize=8, va="bottom", ha="right" if right_half else "left")
    for axis in axes:  # a thin rule between format groups
        for upper, lower, position in zip(results, results[1:], positions[1:]):
            if upper["format"] != lower["format"]:
                axis.axhline(position + 0.5, color="#bdbdbd", linewidth=0.8)
    axes[0].set_yticks(positions, labels)
    axes[0].set_ylim(-0.6, len(results) - 0.1)
    legend = [Patch(facecolor=KIND_COLOURS["ceiling"], label="bare decode+augment, 1 process (ceiling for JPEG)"),
              Patch(facecolor=KIND_COLOURS["baseline"], hatch="//", edgecolor="#424242", label="baseline (stock pipeline)"),
              Patch(facecolor=NORMALIZATION_COLOURS["host"], label="this loader, host normalisation (float batches)"),
              Patch(facecolor=NORMALIZATION_COLOURS["device"], label="this loader, device normalisation (uint8 batches)")]
    figure.legend(handles=legend, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    figure.suptitle(_title(config, goals, workers), fontsize=10)
    return figure


def _title(config: dict, goals, workers: int) -> str:
    """The run on one line, then one line per measured goal, each wrapped to fit the figure: the goals
    joined on one line ran off both edges of the image."""
    instances = int(config.get("instances", 1) or 1)
    title = (f"Host data loading, {config.get('split')} split: batch {config.get('batch_size')}, {workers} DataLoader "
             f"worker(s)" + (f" x {instances} instances" if instances > 1 else "")
             + f", {config.get('cpus')} CPUs ({config.get('created', '')})")
    measured_goals = [g for g in goals or () if g["status"] != "not measured" and "ratio" in g]
    lines = [title] + [f"{g['row']} {GOAL_SHORT.get(g['goal'], g['goal'])}: {g['ratio']:.2f}x "
                       f"(goal {g['threshold']:.2g}x, {g['status']})" for g in measured_goals]
    return "\n".join(textwrap.fill(line, TITLE_WIDTH) for line in lines)
