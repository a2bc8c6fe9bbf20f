"""host_benchmark.py --accelerators: its options checked before torch is imported (a UsageError: one line, exit 2)."""

from __future__ import annotations

import os

from imagenet_shards.errors import UsageError
from imagenet_shards.hostbench.emulate import DEFAULT_THRESHOLD, check_threshold, resolve_profile

STORED_SHARDS = ("real", "imagenet")  # the --data values that read a converted dataset's shards
NOT_WITH = {"compare_transport": "--compare-transport", "target_rate": "--target-rate"}


def check_emulation(args) -> None:
    """Fill args for an emulated run (args.profile_resolved, threshold, normalisation) or raise UsageError."""
    for name, flag in NOT_WITH.items():
        if flag and getattr(args, name, None) is not None:
            raise UsageError(f"{flag} does not go with --accelerators (one emulated run at a time)")
    if args.rounds != 1:
        raise UsageError("--rounds applies to --compare: --accelerators repeats with --runs")
    if _recommend(args):
        pass  # the sources are the formats in --compare DIR
    elif args.data not in STORED_SHARDS:
        raise UsageError(f"--accelerators reads a real source, --data {args.data} reads no stored shards: use --data "
                         f"imagenet --imagenet-data-path PATH|URL (a converted dataset)")
    path = args.imagenet_data_path
    if args.compare is None and not path:
        raise UsageError("--accelerators needs --data imagenet --imagenet-data-path PATH|URL")
    if args.compare is None and "://" not in path and not os.path.isfile(os.path.join(path, "metadata.json")):
        raise UsageError(f"--imagenet-data-path {path}: not a converted dataset (no metadata.json): the emulated "
                         f"accelerators read a dataset converted by create_webdataset.py")
    if args.accelerators != "auto":
        try:
            count = int(args.accelerators)
        except ValueError:
            count = 0
        if count < 1:
            raise UsageError(f"--accelerators {args.accelerators}: not a count >= 1 or auto")
    check_cache(args)
    args.max_accelerators = args.max_accelerators or 64
    args.au_threshold = check_threshold(DEFAULT_THRESHOLD if args.au_threshold is None else args.au_threshold)
    profile = resolve_profile(args.profile, args.batch_size, args.compute_time)
    if profile.compute_s == 0 and args.accelerators == "auto":
        raise UsageError("--compute-time 0 has no utilisation to search on: give --accelerators N (the loader's "
                         "own rate)")
    args.profile_resolved = profile
    args.batch_size = profile.batch_size
    if args.normalization_location is None:
        args.normalization_location = "device"  # uint8 batches, as an accelerator that normalises
    elif args.normalization_location == "ipu":
        args.normalization_location = "device"
    if args.decode_location == "device":
        args.normalization_location = "device"
    for name in ("json", "plot"):
        target = getattr(args, name)
        if target and not os.path.isdir(os.path.dirname(os.path.abspath(target))):
            raise UsageError(f"--{name} {target}: the directory {os.path.dirname(os.path.abspath(target))} "
                             f"does not exist")
    if args.disable_async_loading:
        args.dataloader_worker = 0


def check_cache(args) -> None:
    """--cache-dir: the pipeline depth reads through the node's shard cache (get_data's Cache); the storage
    depth reads the source itself (what the storage serves), so the cache is refused there."""
    if args.cache_dir is None:
        if args.cache_limit is not None or args.cache_prefetch or args.cache_remote_paths:
            raise UsageError("--cache-limit, --cache-prefetch and --cache-remote-paths need --cache-dir")
        return
    if args.depth != "pipeline":
        raise UsageError("--cache-dir goes with --depth pipeline (the storage depth reads the storage itself)")
    if args.cache_limit is not None:
        from imagenet_shards.shard_cache import CacheError, parse_size  # light: no torch

        try:
            parse_size(args.cache_limit)
        except CacheError as error:
            raise UsageError(f"--{error}") from None


def _recommend(args) -> bool:
    """--compare DIR --recommend with --accelerators N: the format, decode location and workers chosen from measured
    AU (hostbench/emulate_recommend.py). Otherwise neither option goes with --accelerators."""
    if args.compare is None and args.recommend is None and args.formats is None:
        return False
    if args.compare is None or args.recommend != "":
        raise UsageError("with --accelerators, --compare DIR and --recommend go together (recommend from measured "
                         "AU over the formats in DIR); --recommend SAVED.json does not")
    if args.accelerators == "auto":
        raise UsageError("--recommend with --accelerators needs a count N (the accelerators to feed), not auto")
    if not os.path.isdir(args.compare):
        raise UsageError(f"--compare {args.compare}: no such directory")
    return True
