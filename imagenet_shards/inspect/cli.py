"""inspect_dataset.py's work: what a dataset holds, a contact sheet of it, and one sample's exact bytes.

    python inspect_dataset.py PATH [--split S] [--sample N] [--seed S] [--json]
    python inspect_dataset.py PATH --png FILE [--count N] [--as-trained] [--synsets FILE]
    python inspect_dataset.py PATH --key KEY [--out FILE | --out -]

PATH: a converted dataset (local, http(s)://, s3://), a dataset of the reference harness, TF-slim
TFRecords, a folder or list of tar shards, an extracted ImageNet folder (see imagenet_shards.inspect.reading).
Only the index and the samples shown (or sampled for the statistics) are read.
Exit codes: 0 shown; 1 a data problem (unreadable dataset, index or sample: one line naming the file
and the problem; the statistics still print when only some sampled samples are unreadable); 2 usage
error (bad option, no such path).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from imagenet_shards.errors import EXIT_DATA, EXIT_OK, EXIT_USAGE, Error, exit_code
from imagenet_shards.fileio import human_bytes
from imagenet_shards.index import payload_problem
from imagenet_shards.inspect import reading, statistics
from imagenet_shards.dataset_folder import SPLITS
from imagenet_shards.storage import StorageUnavailable, is_url



def run(args) -> int:
    """Carry out a parsed command line (inspect_dataset.py's options); the exit code."""
    if not is_url(args.path) and "{" not in args.path and not Path(args.path).exists():
        print(f"{args.path}: no such file or directory", file=sys.stderr)
        return EXIT_USAGE
    try:
        opened = reading.open_dataset(args.path, (args.split,) if args.split else SPLITS, args.synsets,
                                      args.label_offset)
        if args.key:
            return show_key(opened, args)
        return show_dataset(opened, args)
    except StorageUnavailable as error:
        print(f"{args.path}: {error}", file=sys.stderr)
        return EXIT_DATA
    except (Error, OSError) as error:
        print(str(error) if str(error).startswith(str(args.path).rstrip("/")) else f"{args.path}: {error}",
              file=sys.stderr)
        return exit_code(error)


def show_dataset(opened, args) -> int:
    report = {"path": opened.path, "splits": {}}
    unreadable = 0
    for split, view in opened.splits.items():
        shown = list(reading.read_rows(view, reading.pick_rows(view, args.sample, args.seed)))
        index_stats = statistics.index_statistics(view, opened.synsets, shown)
        sample_stats = statistics.sample_statistics(view, shown)
        unreadable += len(sample_stats["unreadable"])
        report["splits"][split] = {"description": view.source.description, "format": _format_of(view),
                                   "steps": [str(s) for s in view.source.stored_steps], "notes": view.notes,
                                   **index_stats, "sample": sample_stats}
    if args.png:
        split = args.split or ("train" if "train" in opened.splits else next(iter(opened.splits)))
        report["png"] = write_sheet(opened, opened.splits[split], report["splits"][split], args)
    if args.json:
        print(json.dumps(_without_raw(report), indent=1))
    else:
        print(format_report(report, opened.synsets))
    return EXIT_DATA if unreadable else EXIT_OK


def write_sheet(opened, view, split_report, args) -> str:
    import matplotlib.pyplot as plt

    from imagenet_shards.fileio import atomic_open
    from imagenet_shards.inspect.sheet import contact_sheet

    shown = list(reading.read_rows(view, reading.pick_rows(view, args.count, args.seed)))
    # --sample 0: the tiles' own resolutions, so the resolution panel is never empty
    sample_stats = split_report["sample"] if split_report["sample"]["sampled"] else \
        statistics.sample_statistics(view, shown)
    figure = contact_sheet(view, shown, opened.synsets, split_report, sample_stats, args.as_trained, args.seed)
    try:
        with atomic_open(args.png, "wb") as handle:
            figure.savefig(handle, format="png")
    finally:
        plt.close(figure)
    return str(args.png)


def show_key(opened, args) -> int:
    view, row = reading.find_key(opened, args.key)
    (shown,) = reading.read_rows(view, [row])
    if shown.error is not None:
        print(shown.error, file=sys.stderr)
        return EXIT_DATA
    problem = payload_problem(shown.record, shown.payload) if shown.record is not None else None
    name = reading.class_name(view, shown.label)
    metadata = {"key": shown.key, "split": view.split, "shard": shown.shard, "label": shown.label, "class": name,
                "words": opened.synsets.get(name, ""), "payload": {"extension": shown.ext, "bytes": len(shown.payload)},
                "json": shown.info, "index": _index_entry(view, shown)}
    if problem is not None:
        print(f"{shown.shard}: sample {shown.key!r}: {problem}", file=sys.stderr)
        return EXIT_DATA
    if args.out == "-":
        sys.stdout.buffer.write(shown.payload)
        sys.stdout.flush()
        print(json.dumps(metadata, indent=1), file=sys.stderr)
        return EXIT_OK
    if args.out:
        from imagenet_shards.fileio import atomic_write_bytes

        atomic_write_bytes(args.out, shown.payload)
        metadata["out"] = args.out
    print(json.dumps(metadata, indent=1))
    return EXIT_OK


def _index_entry(view, shown):
    """The sample's index record (its bbox column where the index has one), None for an image folder."""
    if shown.record is None:
        return None
    entry = {k: v for k, v in shown.record._asdict().items() if k != "bbox"}
    columns = view.source.columns
    if columns.has_boxes:
        entry["bbox"] = columns.box(shown.row)
    return entry


def _format_of(view) -> str:
    metadata = view.source.metadata or {}
    if metadata.get("format"):
        return metadata["format"]
    fmt = view.source.shard_format
    return fmt.name if fmt is not None else ("image folder" if view.source.columns is None else "tar")


def _without_raw(report: dict) -> dict:
    """The report without the per-sample lists the sheet draws (widths, sizes): JSON keeps the figures."""
    splits = {}
    for split, entry in report["splits"].items():
        sample = {k: v for k, v in entry["sample"].items() if k not in ("resolutions", "sampled_sizes")}
        splits[split] = {**entry, "sample": sample}
    return {**report, "splits": splits}


def _spread(figures, unit="") -> str:
    if not figures:
        return "-"
    return (f"p0 {figures['p0']:,.0f}{unit}  p5 {figures['p5']:,.0f}{unit}  median {figures['p50']:,.0f}{unit}  "
            f"p95 {figures['p95']:,.0f}{unit}  max {figures['p100']:,.0f}{unit}  (mean {figures['mean']:,.0f}{unit})")


def format_report(report: dict, synsets: dict) -> str:
    lines = [f"{report['path']}"]
    header = f"  {'split':<11} {'samples':>9} {'shards':>7} {'bytes':>11} {'classes':>8}  per class min/median/max"
    lines.append(header)
    for split, entry in report["splits"].items():
        per = entry["per_class"]
        lines.append(f"  {split:<11} {entry['samples']:>9,} {entry['shards']:>7,} {human_bytes(entry['bytes']):>11} "
                     f"{entry['classes']:>8,}  {per['min']:,} / {per['median']:,.0f} / {per['max']:,}")
    for split, entry in report["splits"].items():
        sample = entry["sample"]
        lines.append(f"{split}: {entry['description']}")
        lines.append(f"  format {entry['format']}; stored steps: {' '.join(entry['steps']) or 'none'}")
        for note in entry["notes"]:
            lines.append(f"  note: {note}")
        if entry["unlabelled"]:
            lines.append(f"  {entry['unlabelled']:,} samples without a label in the index: per-class counts "
                         f"from {entry['class_counts_from']}")
        rare = ", ".join(f"{c['class']}{' (' + c['words'][:30] + ')' if c['words'] else ''} {c['samples']}"
                         for c in entry["rarest"])
        lines.append(f"  rarest classes: {rare or '-'}")
        lines.append(f"  payload bytes ({entry['payload_bytes_from']}): "
                     f"{_spread(entry['payload_bytes'] or sample['sampled_payload_bytes'])}")
        lines.append(f"  width  ({sample['sampled']} sampled): {_spread(sample['width'], ' px')}")
        lines.append(f"  height ({sample['sampled']} sampled): {_spread(sample['height'], ' px')}")
        quirks = ", ".join(f"{name} {q['count']} (e.g. {q['example']})" for name, q in sample["quirks"].items())
        lines.append(f"  quirks in {sample['sampled']} sampled: {quirks or 'none'}")
        for bad in sample["unreadable"]:
            lines.append(f"  unreadable: {bad['problem']}")
    if report.get("png"):
        lines.append(f"wrote {report['png']}")
    return "\n".join(lines)
