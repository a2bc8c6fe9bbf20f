"""The `--recommend` command around imagenet_shards.hostbench.recommend: its inputs from this run (or a saved
`--json` report), the table and decision printed, the chart and the JSON written.

Light to import (no torch): `host_benchmark.py --recommend SAVED.json` measures nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from imagenet_shards.fileio import atomic_write_bytes
from imagenet_shards.hostbench import recommend
from imagenet_shards.hostbench.host_info import memory_available_bytes
from imagenet_shards.hostbench.timing import BenchmarkError


def make_recommendation(args, rows: list, config: dict) -> dict:
    """--recommend over `rows` (this run's, or a saved report's) with `config` (its split, CPUs, memory,
    sources): prints the table and the decision, writes --recommend-plot; returns the decision."""
    sources = config.get("sources") or {}
    by_format = {}
    for entry in sources.values():  # the first source of each format (row ids `<format>/...`)
        by_format.setdefault(entry["format"], entry)
    instances = args.instances
    cores = args.cores_per_instance or max(1.0, (config.get("cpus") or os.cpu_count() or 1) / instances)
    images = {fmt: args.dataset_images if args.dataset_images else entry.get("samples", 0)
              for fmt, entry in by_format.items()}
    page_cache = config.get("memory_available_bytes") or memory_available_bytes() or 0
    decision = recommend.recommend(rows, target_rate=args.target_rate, instances=instances,
                                   cores_per_instance=cores, split_images=images, page_cache_bytes=page_cache,
                                   bytes_per_image={fmt: e.get("bytes_per_image") for fmt, e in by_format.items()})
    decision["split"] = config.get("split")
    print()
    print(recommend.format_recommendation(decision))
    if args.recommend_plot:
        recommend.plot_recommendation(args.recommend_plot, decision)
        print(f"wrote {args.recommend_plot}")
    return decision


def recommend_from_saved(args) -> None:
    """--recommend SAVED.json without --compare: the decision from a saved report's rows (nothing measured)."""
    try:
        saved = json.loads(Path(args.recommend).read_bytes())
        rows, config = saved["rows"], saved["config"]
        if not isinstance(rows, list) or not isinstance(config, dict):
            raise TypeError("rows is not a list or config not an object")
    except OSError as error:
        raise BenchmarkError(f"--recommend {args.recommend}: cannot read: {error.strerror or error}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise BenchmarkError(f"--recommend {args.recommend}: not a saved `host_benchmark.py --compare --json` "
                             f"report ({type(error).__name__}: {error})") from None
    print(f"host_benchmark --recommend {args.recommend}: the rows of the run of {config.get('created', '?')} "
          f"({config.get('split')} split, {config.get('cpus')} CPUs, {config.get('workers')} worker(s) per row)")
    decision = make_recommendation(args, rows, config)
    if args.json:
        saved["recommendation"] = decision
        atomic_write_bytes(args.json, (json.dumps(saved, indent=1, allow_nan=False) + "\n").encode())
        print(f"wrote {args.json}")
