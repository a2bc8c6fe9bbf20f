"""The target folder and the conversion's state in it: prepare, record, resume, finish.

Contract: the target holds this tool's files only under their final names once complete; the state
(.convert-state/: plan.json and one record per published shard) says which shards of which plan
exist, so a --resume keeps exactly the shards that verify; metadata.json is written last, by
finalize, once every planned shard has a record and a file, and the state is removed right after
it. Writes that fail are WriteFailures naming the file; a target that must not be touched, or a
different plan in it, is a UsageError. Instances coordinate through the files and an flock of the
target folder (target_lock), never through each other.

Crash safety and resume. Every shard is written as <name>.partial, fsynced and renamed.
After a shard is published, the main process writes .convert-state/<shard>.json (shard
record, sample records, skipped samples, plan fingerprint). --resume recomputes the plan,
refuses a different one (different options or source), and for each shard keeps the file
only if a record of this plan exists and the file's sha256 matches it; everything else is
rewritten, stale .partial files are removed, and shards that are not in the plan are deleted
before metadata.json is written. metadata.json is removed when a run starts and written last;
its `checksum` (the reference folder checksum) leaves .convert-state/ out, and the state is
removed right after it, so nothing hidden is left and a copy without hidden files (as
upload_dataset.py makes) still matches. metadata.json keeps the plan: `plan_fingerprint`, the
options, and `convert_state_removed: true`. --resume of a complete dataset (this plan's
metadata.json, every shard and index there at its recorded size) reads every shard (with several
instances, each its own) and the indexes against metadata.json's sha256: when all match it
writes nothing and says "dataset complete" (a repartition beside it, distributed/, which records
metadata.json's sha256, stays valid); when one differs, the state records are rebuilt from
metadata.json and the indexes and the resume keeps every shard that verifies and rewrites the
rest (a shard missing or resized: every shard is written again). Other options are refused as
above (--overwrite replaces). A crash between writing metadata.json and removing the state
leaves a complete dataset with a stale .convert-state/: --resume removes it (validate_dataset.py
names it as what breaks the reference checksum). A dataset of an earlier version (state kept,
inside its checksum) is resumed as usual: every shard verified against its record, metadata.json
rewritten without the state, state removed.
A failed write (full disk, permissions) of any file - shard, state record, sample index,
metadata.json - stops the run (exit 1) with "<that file>: cannot write the <what>: <why>";
its .partial is removed, so every file under a final name is complete, and a shard whose
record could not be written is rewritten by the --resume that finishes the job.
--overwrite deletes only what this tool writes (shards, indexes, metadata, state) plus a
repartition of the replaced dataset (distributed/, now stale); other files are kept and named.
"""

import json
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

from imagenet_shards.convert.encode import WrittenShard
from imagenet_shards.convert.failures import UsageError, WriteFailure, writing
from imagenet_shards.convert.plan import ConvertOptions, Plan
from imagenet_shards.fileio import PARTIAL_SUFFIX, atomic_write_json, sha256_file
from imagenet_shards.formats import get_format, is_any_shard_file
from imagenet_shards.index import (CONVERT_STATE_REMOVED, FORMAT_VERSION, SampleRecord, ShardRecord, bbox_text,
                            sample_index_name, split_of_index_name, write_metadata, write_sample_index)
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.dataset_folder import CONVERT_STATE_DIR, DISTRIBUTED_DIR
from imagenet_shards.reference.checksum import folder_checksum
from imagenet_shards.index import ShardGroups, read_sample_columns

STATE_DIR = CONVERT_STATE_DIR
PLAN_FILE = "plan.json"


# ---------------------------------------------------------------- the target folder and its state


def state_dir(target: Path) -> Path:
    return target / STATE_DIR


def record_path(target: Path, shard_name: str) -> Path:
    return state_dir(target) / f"{shard_name}.json"


def is_converter_output(name: str) -> bool:
    return (is_any_shard_file(name) or name == METADATA_FILE or name == STATE_DIR
            or name.endswith(".index.tsv") or name.endswith(".index.tsv" + PARTIAL_SUFFIX)
            or name == METADATA_FILE + PARTIAL_SUFFIX)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def check_target(options: ConvertOptions) -> None:
    """Refuse what must not be touched, before the (possibly long) listing of the source."""
    target = options.target
    if target.exists() and not target.is_dir():
        raise UsageError(f"--target {target} exists and is not a folder")
    if options.resume and options.overwrite:
        raise UsageError("--resume and --overwrite exclude each other: resume keeps verified shards, "
                         "overwrite deletes them")
    if not target.is_dir() or options.resume or options.overwrite or options.instance.count > 1:
        return
    entries = sorted(os.listdir(target))
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UsageError(
            f"--target {target} is not empty ({len(entries)} entries: {shown}); pass --resume to finish an "
            f"interrupted conversion into it, --overwrite to replace its converted dataset, or choose an "
            f"empty folder")


def read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def prepare_target(options: ConvertOptions, plan: Plan, own_shards) -> None:
    """Apply --overwrite / --resume / the multi-instance rules; write the plan record."""
    options.target.mkdir(parents=True, exist_ok=True)
    with target_lock(options.target):
        _prepare_target(options, plan, own_shards)


def _prepare_target(options: ConvertOptions, plan: Plan, own_shards) -> None:
    target, instance = options.target, options.instance
    state = state_dir(target)
    recorded = recorded_plan(target)
    same_plan = recorded is not None and recorded.get("fingerprint") == plan.fingerprint
    own_names = {task_name for task_name in own_shards}
    if options.overwrite:
        # A repartition of the replaced dataset (distributed_webdataset.py) names its shards: stale.
        if (target / DISTRIBUTED_DIR).is_dir():
            shutil.rmtree(target / DISTRIBUTED_DIR, ignore_errors=True)
            print(f"note: --overwrite removed {target / DISTRIBUTED_DIR}: it repartitioned the replaced dataset",
                  file=sys.stderr)
        if instance.count == 1:
            for entry in sorted(os.listdir(target)):
                if is_converter_output(entry):
                    remove_path(target / entry)
            others = [e for e in os.listdir(target)]
            if others:
                print(f"note: --overwrite kept {len(others)} entries it did not write in {target}: "
                      f"{', '.join(sorted(others)[:3])}{', ...' if len(others) > 3 else ''}", file=sys.stderr)
        else:  # peers are writing their own shards now: touch only ours
            for name in own_names:
                (target / name).unlink(missing_ok=True)
                record_path(target, name).unlink(missing_ok=True)
    elif recorded is not None and not same_plan and (options.resume or instance.count > 1):
        raise UsageError(
            f"--target {target} holds a conversion with other options or another source "
            f"({describe_plan_difference(recorded.get('options', {}), plan.options)}); "
            f"pass --overwrite to replace it")
    elif instance.count > 1 and not options.resume:
        present = [n for n in own_names if (target / n).exists() or record_path(target, n).exists()]
        foreign = [e for e in os.listdir(target) if not is_converter_output(e)]
        # A state folder alone, without plan.json, is a peer creating it (where there is no flock).
        earlier = [e for e in os.listdir(target) if is_converter_output(e) and e != STATE_DIR]
        if present or foreign or (recorded is None and earlier):
            raise UsageError(
                f"--target {target} already holds files of this instance or of another conversion; pass "
                f"--resume to finish an interrupted conversion, or --overwrite")
    state.mkdir(exist_ok=True)
    with writing(state / PLAN_FILE, "conversion plan record"):
        atomic_write_json(state / PLAN_FILE, {"fingerprint": plan.fingerprint, "options": plan.options})
    (target / METADATA_FILE).unlink(missing_ok=True)  # written again, last, when every shard exists
    for name in own_names:
        (target / (name + PARTIAL_SUFFIX)).unlink(missing_ok=True)


def recorded_plan(target: Path):
    """{"fingerprint", "options"} of the conversion in `target`: its state's plan.json while it runs,
    else what a complete metadata.json records (the state is removed then); None if neither."""
    recorded = read_json(state_dir(target) / PLAN_FILE)
    if isinstance(recorded, dict) and isinstance(recorded.get("options"), dict):
        return recorded
    return plan_of_metadata(read_json(target / METADATA_FILE))


def plan_of_metadata(metadata):
    """plan.json's {"fingerprint", "options"} as a complete metadata.json of this converter records
    them (build_metadata), or None for any other metadata (the reference harness's, an adoption)."""
    if (not isinstance(metadata, dict) or not isinstance(metadata.get("plan_fingerprint"), str)
            or not isinstance(metadata.get("splits"), dict)):
        return None
    splits = metadata["splits"]
    options = {key: metadata.get(key) for key in ("format", "shuffle", "seed", "samples_per_shard", "max_shard_bytes",
                                                   "image_quality", "max_image_pixels")}
    options.update(splits=list(splits), source_layout=metadata.get("source_layout"),
                   steps={split: entry.get("transform_pipeline", []) if isinstance(entry, dict) else []
                          for split, entry in splits.items()})
    return {"fingerprint": metadata["plan_fingerprint"], "options": options}


def complete_metadata(target: Path, plan: Plan):
    """(metadata, None) when `target` holds this plan's complete dataset: a metadata.json with this plan's
    fingerprint whose shards and indexes are all there with their recorded sizes (stat only: sha256
    checks are validate_dataset.py's). Else (None, why not) - why is None when there is no such
    metadata.json at all."""
    metadata = read_json(target / METADATA_FILE)
    if not isinstance(metadata, dict) or metadata.get("plan_fingerprint") != plan.fingerprint:
        return None, None
    try:
        for entry in metadata["splits"].values():
            for name, size in [(s["name"], s["bytes"]) for s in entry["shards"]] + [(entry["index"]["name"],
                                                                                     entry["index"]["bytes"])]:
                path = target / name
                if not path.is_file():
                    return None, f"{path}: missing"
                if path.stat().st_size != size:
                    return None, f"{path}: {path.stat().st_size:,} bytes, {METADATA_FILE} says {size:,}"
    except (AttributeError, KeyError, TypeError) as error:
        return None, f"{target / METADATA_FILE}: malformed ({type(error).__name__}: {error})"
    return metadata, None


def verify_complete(options: ConvertOptions, plan: Plan, metadata: dict):
    """None if this instance's shards (all of them with one instance) and the indexes match metadata.json's
    sha256; else what differs (the first one)."""
    target, instance = options.target, options.instance
    for entry in metadata["splits"].values():
        checks = [(entry["index"]["name"], entry["index"]["sha256"])]
        checks += [(shard["name"], shard["sha256"]) for number, shard in enumerate(entry["shards"])
                   if number % instance.count == instance.index]
        for name, expected in checks:
            if sha256_file(target / name)[0] != expected:
                return f"{target / name} differs from its sha256 in {METADATA_FILE}"
    return None


def restore_state(target: Path, plan: Plan, metadata: dict) -> None:
    """Write .convert-state/ records of every shard from a complete metadata.json and its sample
    indexes (sha256-checked first): a resume then keeps each shard whose file still verifies. An
    index without CRC32Cs (the earlier version) restores nothing: its shards are written again."""
    for split, entry in metadata["splits"].items():
        index_path = target / entry["index"]["name"]
        if sha256_file(index_path)[0] != entry["index"]["sha256"]:
            continue
        try:
            columns = read_sample_columns(index_path)
        except DatasetError:
            continue
        if not columns.has_checksums or columns.checksum_known is not None:
            continue
        by_shard = ShardGroups(columns, by_offset=False)  # one shard's records at a time
        split_plan = plan.splits[split]
        shard_of_source, skipped_paths = {}, {item["path"] for item in entry["skipped"]}  # a few, not every sample
        for number, samples in enumerate(split_plan.shards):
            name = get_format(plan.options["format"]).shard_name(split, number, len(split_plan.shards))
            shard_of_source.update((sample.source, name) for sample in samples if sample.source in skipped_paths)
        skipped = {}
        for item in entry["skipped"]:
            skipped.setdefault(shard_of_source.get(item["path"]), []).append(item)
        state_dir(target).mkdir(exist_ok=True)
        for shard in entry["shards"]:
            shard_record = ShardRecord.from_json(shard)
            save_record(target, WrittenShard(split, -1, shard_record, by_shard.get(shard_record.name, []),
                                             skipped.get(shard_record.name, [])), plan.fingerprint)


def remove_state(target: Path) -> None:
    """Remove .convert-state/ (another instance may be removing it too). WriteFailure if it stays."""
    def tolerate_gone(function, path, exc_info):
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    try:
        shutil.rmtree(state_dir(target), onerror=tolerate_gone)
    except OSError as error:
        raise WriteFailure(state_dir(target), f"cannot remove the conversion state: {error.strerror or error}; the "
                                              f"dataset is complete, but the reference validate_dataset.py counts "
                                              f"these hidden files in its checksum: delete the folder, or run "
                                              f"again with --resume") from None


@contextmanager
def target_lock(target: Path):
    """An exclusive flock on the target folder while one instance prepares the target (checks it, writes
    plan.json) or finalizes: instances started together see each other's plan.json, not a half-made state,
    and a peer that finalizes second finds metadata.json written and the state removed. Where the
    filesystem has no flock (some network mounts), unlocked: both steps also tolerate a peer's work."""
    try:
        import fcntl

        descriptor = os.open(target, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(descriptor)  # releases the lock


def describe_plan_difference(old: dict, new: dict) -> str:
    changed = [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
               if old.get(key) != new.get(key)]
    return "; ".join(changed) if changed else "same options, different source listing"


# The per-sample checksum a state record holds; a record of the earlier version (payload sha256)
# is not reused, so one index never mixes the two (its shard is simply written again).
_STATE_CHECKSUM = "crc32c"


def load_record(target: Path, shard_name: str, fingerprint: str):
    record = read_json(record_path(target, shard_name))
    if (not isinstance(record, dict) or record.get("fingerprint") != fingerprint
            or record.get("checksum") != _STATE_CHECKSUM):
        return None
    return record


def save_record(target: Path, result: WrittenShard, fingerprint: str) -> None:
    """Record a published shard. If this fails the shard has no record, so --resume rewrites it."""
    path = record_path(target, result.shard.name)
    with writing(path, f"state record of {result.shard.name}"):
        atomic_write_json(path, {
            "fingerprint": fingerprint,
            "checksum": _STATE_CHECKSUM,
            "shard": result.shard.to_json(),
            "samples": [[r.key, r.label, r.record_offset, r.record_size, r.payload_offset, r.payload_size,
                         r.payload_crc32c, r.members] for r in result.samples],
            "skipped": result.skipped,
        }, indent=None)  # compact: json's C encoder, ~3.7x faster than with an indent (one per shard)


def records_from_json(record: dict):
    shard = record["shard"]["name"]
    return [SampleRecord(key, shard, label, ro, rs, po, ps, crc, members)
            for key, label, ro, rs, po, ps, crc, members in record["samples"]]


# ---------------------------------------------------------------- finishing: indexes and metadata


def finalize(options: ConvertOptions, plan: Plan):
    """Write the indexes and metadata.json if every planned shard has a record and a file, then
    remove .convert-state/ (outside metadata.json's checksum). Another instance finalizing at the
    same time (or before) finds metadata.json of this plan and reports the dataset complete.

    Returns the metadata, or None (with the number of missing shards) when not complete.
    """
    target = options.target
    with target_lock(target):
        done, _ = complete_metadata(target, plan)  # a peer instance finished it
        if done is None:
            done, missing = write_indexes_and_metadata(options, plan)
            if done is None:  # its records may be gone because a peer finished meanwhile (no lock)
                done = complete_metadata(target, plan)[0]
                if done is None:
                    return None, missing
        remove_state(target)  # a crash before this: --resume finds metadata.json complete and removes it
    return done, 0


def write_indexes_and_metadata(options: ConvertOptions, plan: Plan):
    """finalize's writes: (metadata, 0), or (None, missing shards) when some shard has no record or file."""
    target = options.target
    split_entries, missing = {}, 0
    shards_by_split = {}  # split -> [(state record name, its shard's record, its skipped)]: no samples held
    for split, split_plan in plan.splits.items():
        shards = []
        for number in range(len(split_plan.shards)):
            name = get_format(options.format).shard_name(split, number, len(split_plan.shards))
            record = load_record(target, name, plan.fingerprint)
            path = target / name
            if record is None or not path.is_file() or path.stat().st_size != record["shard"]["bytes"]:
                missing += 1
                continue
            shards.append((name, record["shard"], record["skipped"]))
        shards_by_split[split] = shards
    if missing:
        return None, missing
    planned = {get_format(options.format).shard_name(split, n, len(p.shards))
               for split, p in plan.splits.items() for n in range(len(p.shards))}
    for entry in os.listdir(target):  # stale shards of an earlier run never mix in
        if is_any_shard_file(entry) and get_format(options.format).shard_of_file(entry) not in planned:
            (target / entry).unlink(missing_ok=True)
        elif split_of_index_name(entry) is not None and entry != sample_index_name(split_of_index_name(entry)):
            (target / entry).unlink(missing_ok=True)  # the earlier name (<split>.index.tsv)
        elif split_of_index_name(entry) is not None and split_of_index_name(entry) not in plan.splits:
            (target / entry).unlink(missing_ok=True)
    for split, shards in shards_by_split.items():
        split_plan = plan.splits[split]
        skipped = [s for _, _, shard_skipped in shards for s in shard_skipped]
        index_path = target / sample_index_name(split)
        with writing(index_path, f"{split} sample index"):
            written = [0]
            index = write_sample_index(index_path, _index_records(target, plan, split_plan, shards, written))
        length = written[0]
        split_entries[split] = {
            "length": length,
            "source_samples": length + len(skipped),
            "skipped": skipped,
            "ignored": split_plan.ignored,
            "transform_pipeline": list(split_plan.steps),
            "shards": [shard for _, shard, _ in shards],
            "index": index,
        }
    metadata = build_metadata(plan, split_entries)
    # The reference harness's folder checksum, from the md5s taken while shards and indexes were
    # written; only small files (.tfindex) are read. .convert-state/ is left out: it is removed next.
    known = {entry["index"]["name"]: entry["index"]["md5"] for entry in split_entries.values()}
    known.update((shard["name"], shard.get("md5")) for entry in split_entries.values() for shard in entry["shards"])
    metadata["checksum"] = folder_checksum(target, known, skip_folders=(STATE_DIR,))
    with writing(target / METADATA_FILE, "metadata"):
        write_metadata(target, metadata)
    return metadata, 0


def _index_records(target: Path, plan: Plan, split_plan, shards, written: list):
    """A split's index records, streamed: one shard's state record read at a time (not the split's samples
    at once). Each sample's box as its json holds it (the plan's, which the fingerprint covers), "" for
    none: the index always has the bbox column, so the loader never reads a json member for it. written[0]
    counts the records."""
    for (name, _, _), shard_samples in zip(shards, split_plan.shards):  # both in shard number order
        record = load_record(target, name, plan.fingerprint)
        if record is None:  # removed since it was checked: the index would be incomplete
            raise WriteFailure(record_path(target, name), "the state record vanished while the index was written")
        boxes = {sample.key: sample.bbox for sample in shard_samples}
        for r in records_from_json(record):
            written[0] += 1
            yield r._replace(bbox=bbox_text(boxes[r.key]))


def build_metadata(plan: Plan, split_entries: dict) -> dict:
    o = plan.options
    return {
        # The reference harness's keys.
        "train_length": split_entries.get("train", {}).get("length", 0),
        "validation_length": split_entries.get("validation", {}).get("length", 0),
        "format": o["format"],
        "shuffle": o["shuffle"],
        "train_transform_pipeline": o["steps"].get("train", []),
        "validation_transform_pipeline": o["steps"].get("validation", []),
        "seed": o["seed"],
        "image_quality": o["image_quality"],
        # Added (see imagenet_shards/index.py).
        "format_version": FORMAT_VERSION,
        "classes": plan.classes,
        "tensor_layout": None,
        **get_format(o["format"]).metadata_fields(),
        "samples_per_shard": o["samples_per_shard"],
        "max_shard_bytes": o["max_shard_bytes"],
        "max_image_pixels": o["max_image_pixels"],
        "source_layout": o["source_layout"],
        "exif_orientation": "recorded in each sample's json, not applied (as PIL and torchvision's ImageFolder)",
        "plan_fingerprint": plan.fingerprint,
        **plan.provenance,
        CONVERT_STATE_REMOVED: True,
        "splits": split_entries,
    }
