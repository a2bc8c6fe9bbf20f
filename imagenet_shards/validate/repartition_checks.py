"""The checks of a converted dataset's repartitions (`distributed/<N>-instances/`) against their manifest.json.

`plan_repartition_checks` reads every repartition manifest and returns one plan per folder, with
the remainder shards (small: about one shard per instance) as shard tasks for the caller's pool
(imagenet_shards.validate.tasks); once they have run, `check_repartition` checks one plan:
  - the union of the instances' samples is the split (minus the keys named as dropped);
  - instances are disjoint (except for the keys named as padding);
  - counts follow the policy (spread, pad, drop);
  - each instance's index against the split's: whole shards complete and only theirs, remainder
    shards holding byte-identical copies (payload checksum, label, bbox) of their originals;
  - shard lists, the manifest's own digest, and that it was made from this metadata.json (stale
    otherwise);
  - files the manifest does not list are warnings.
The reference loader's remainder files are checked by imagenet_shards.reference.checks, called from here.
Problems are appended to the caller's list (imagenet_shards.formats.shard_check records); nothing prints.
`states` is imagenet_shards.validate.converted's view of each split (shards, index columns, groups, table).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imagenet_shards import metadata_digest
from imagenet_shards.reference import checks as reference_checks
from imagenet_shards.reference.remainders import LOADER_REMAINDERS
from imagenet_shards.fileio import PARTIAL_SUFFIX
from imagenet_shards.dataset_folder import DISTRIBUTED_DIR, REPARTITION_MANIFEST
from imagenet_shards.formats import get_format
from imagenet_shards.formats.shard_check import ShardTask, error, warning
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import ShardRecord
from imagenet_shards.index import ShardGroups
from imagenet_shards.validate.tasks import label_offset_of, read_index


@dataclass
class _RepartitionPlan:
    folder: str  # relative: distributed/<N>-instances
    manifest: dict
    tasks: list
    instance_records: dict  # (split, instance number) -> SampleColumns or None
    expected_files: set


def plan_repartition_checks(root, metadata, metadata_sha256, states, fmt, payload_ext, classes, deep, layout,
                             problems):
    """Read every repartition manifest; return what to check, with the remainder shards as tasks."""
    plans = []
    base = Path(root) / DISTRIBUTED_DIR
    if not base.is_dir():
        return plans
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        relative = f"{DISTRIBUTED_DIR}/{folder.name}"
        manifest_path = folder / REPARTITION_MANIFEST
        manifest_name = f"{relative}/{REPARTITION_MANIFEST}"
        if not manifest_path.is_file():
            continue  # reported as an unfinished folder by converted._check_extra_files
        try:
            manifest = json.loads(manifest_path.read_bytes())
            if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
                raise ValueError("expected an object with 'splits'")
        except (OSError, ValueError) as exc:
            problems.append(error(manifest_name, f"unreadable repartition manifest: {exc}"))
            plans.append(_RepartitionPlan(relative, {}, [], {}, {manifest_name}))
            continue
        status, message = metadata_digest.digest_status(manifest)
        if status in (metadata_digest.EDITED, metadata_digest.MALFORMED):  # absent: made before manifests had one
            problems.append(error(manifest_name, message))
        plan = _RepartitionPlan(relative, manifest, [], {}, {manifest_name})
        plans.append(plan)
        try:
            _plan_one_repartition(root, folder, plan, metadata, metadata_sha256, states, fmt, payload_ext,
                                  classes, deep, layout, problems)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a value of the wrong type
            problems.append(error(manifest_name, f"malformed repartition manifest: {type(exc).__name__}: {exc}"))
            plan.manifest, plan.tasks = {}, []
    return plans


def _relative_path_problem(name):
    """Why a path a manifest names is unsafe to open (absolute, or climbing out with ..), or None."""
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        return f"{name!r} is not a path inside the dataset"
    return None


def _plan_one_repartition(root, folder, plan, metadata, metadata_sha256, states, fmt, payload_ext, classes,
                          deep, layout, problems):
    manifest = plan.manifest
    manifest_name = f"{plan.folder}/{REPARTITION_MANIFEST}"
    match = re.fullmatch(r"(\d+)-instances", folder.name)
    n = manifest.get("num_instances")
    if match is None or n != int(match.group(1)):
        problems.append(error(manifest_name, f"num_instances {n!r} does not match the folder name {folder.name}"))
    if manifest.get("format") != metadata.get("format"):
        problems.append(error(manifest_name, f"format {manifest.get('format')!r}, the dataset is {metadata.get('format')!r}"))
    _expect_repartition_files(plan, manifest)
    if manifest.get("source_metadata_sha256") != metadata_sha256:
        problems.append(error(manifest_name, "stale repartition: made from a different metadata.json (the dataset "
                                             f"was re-converted or edited); re-run distributed_webdataset.py "
                                             f"--num-instances {n}"))
        plan.manifest = {}  # its records describe another dataset: comparing them would only add noise
        return
    for split, entry in manifest["splits"].items():
        state = states.get(split)
        if state is None:
            problems.append(error(manifest_name, f"split {split!r} is not in metadata.json"))
            continue
        for number, instance in enumerate(entry.get("instances") or []):
            index_name = instance.get("index")
            records = None
            unsafe = _relative_path_problem(index_name)
            if unsafe:
                problems.append(error(manifest_name, f"{split} instance {number}: its sample index {unsafe}"))
            else:
                try:
                    records = read_index(Path(root) / index_name, index_name)
                except OSError as exc:
                    problems.append(error(index_name, f"cannot read the instance's sample index: {exc.strerror or exc}"))
                except DatasetError as exc:
                    problems.append(error(index_name, str(exc).removeprefix(f"{index_name}: ")))
            plan.instance_records[(split, number)] = records
            remainder = instance.get("remainder")
            if remainder is None:
                continue
            unsafe = _relative_path_problem(remainder)
            if unsafe:
                problems.append(error(manifest_name, f"{split} instance {number}: its remainder shard {unsafe}"))
                continue
            try:
                remainder_record = ShardRecord.from_json(instance.get("remainder_record"))
            except (KeyError, TypeError, ValueError):
                problems.append(error(manifest_name, f"{split} instance {number}: remainder {remainder} has no valid record"))
                remainder_record = None
            if remainder_record is not None and remainder_record.name != remainder:
                problems.append(error(manifest_name, f"{split} instance {number}: remainder {remainder} but its record "
                                                     f"names {remainder_record.name}"))
            path = Path(root) / remainder
            if not path.is_file():
                problems.append(error(remainder, f"missing remainder shard of {split} instance {number}"))
                continue
            mine = () if records is None else tuple(records.records(records.rows_of_shards([remainder])))
            plan.tasks.append(ShardTask(str(path), remainder, fmt, remainder_record, mine, payload_ext, classes,
                                        True, deep, layout, None, label_offset_of(metadata)))
            plan.expected_files.update(get_format(fmt).companions(remainder))
        remainders = entry.get(LOADER_REMAINDERS)
        if remainders is not None:
            def task(path, shard, mine):
                return ShardTask(str(path), shard.name, fmt, shard, mine, payload_ext, classes, True, deep, layout,
                                 None, label_offset_of(metadata))

            reference_checks.plan_loader_remainders(root, plan, split, remainders, problems, _relative_path_problem,
                                                    task)


def _expect_repartition_files(plan, manifest):
    for entry in (manifest.get("splits") or {}).values():
        for instance in entry.get("instances") or []:
            for name_key in ("index", "remainder", "shard_list"):
                value = instance.get(name_key)
                if isinstance(value, str):
                    plan.expected_files.add(value)


def check_repartition(root, plan, states, problems):
    """Union, disjointness and counts of one repartition, from its manifest and instance indexes."""
    manifest = plan.manifest
    if manifest:
        manifest_name = f"{plan.folder}/{REPARTITION_MANIFEST}"
        for split, entry in manifest["splits"].items():
            state = states.get(split)
            if state is not None:
                _check_repartition_split(root, plan, manifest_name, manifest.get("num_instances"), split, entry,
                                         state, problems)
    _check_repartition_folder_files(root, plan, problems)


class _Reads:
    """Which instances read which samples of a split, without a dict over every key: per instance the
    split rows it reads (arrays), and apart the keys read that are not in the split."""

    def __init__(self):
        self.rows, self.numbers = [], []
        self.strays = defaultdict(list)  # key not in the split -> instance numbers reading it

    def add(self, number, records, found):
        self.rows.append(found[found >= 0])
        self.numbers.append(np.full(int(np.count_nonzero(found >= 0)), number, dtype=np.int64))
        for row in np.flatnonzero(found < 0).tolist():
            self.strays[records.key(row)].append(number)

    def joined(self):
        if not self.rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(self.rows), np.concatenate(self.numbers)


def _check_repartition_split(root, plan, where, n, split, entry, state, problems):
    policy = entry.get("policy")
    instances = entry.get("instances") or []
    if policy not in ("spread", "pad", "drop"):
        problems.append(error(where, f"{split}: unknown policy {policy!r}"))
    if len(instances) != n:
        problems.append(error(where, f"{split}: {len(instances)} instances listed, num_instances is {n}"))
    counts = [instance.get("samples") for instance in instances]
    if entry.get("samples_per_instance") is not None and entry.get("samples_per_instance") != counts:
        problems.append(error(where, f"{split}: samples_per_instance {entry.get('samples_per_instance')} "
                                     f"disagrees with the instances' counts {counts}"))
    split_shards = {shard.name for shard in state.shards}
    reads, padded, dropped = _Reads(), Counter(), set()
    actual_counts = []
    for number, instance in enumerate(instances):
        label = f"{split} instance {number}"
        if instance.get("instance", number) != number:
            problems.append(error(where, f"{label}: numbered {instance.get('instance')}"))
        records = plan.instance_records.get((split, number))
        padded.update(instance.get("padded_keys") or [])
        dropped.update(instance.get("dropped_keys") or [])
        whole = list(instance.get("shards") or [])
        for name in whole:
            if name not in split_shards:
                problems.append(error(where, f"{label} reads {name!r} whole, which is not a {split} shard in metadata"))
        _check_shard_list(root, plan, instance, whole, instance.get("remainder"), label, problems)
        if records is None:
            actual_counts.append(instance.get("samples"))
            continue
        actual_counts.append(len(records))
        if len(records) != instance.get("samples"):
            problems.append(error(instance.get("index"), f"{label}: the index lists {len(records):,} samples, the "
                                                         f"manifest says {instance.get('samples')!r}"))
        found = state.table.rows_of_columns(records)
        _check_instance_index(label, instance, whole, records, found, state, split, problems)
        reads.add(number, records, found)
    for name, instance_keys in (("padded_keys", list(padded.elements())), ("dropped_keys", sorted(dropped))):
        if name in entry and sorted(entry[name]) != sorted(instance_keys):
            problems.append(error(where, f"{split}: the split's {name} differ from its instances' {name}"))
    if "total_samples" in entry and entry["total_samples"] != len(state.columns):
        problems.append(error(where, f"{split}: total_samples {entry['total_samples']!r}, the split has "
                                     f"{len(state.columns):,} samples"))
    _check_union(where, split, policy, state, reads, padded, dropped, problems)
    _check_counts(where, split, policy, actual_counts, len(state.columns), problems)
    if entry.get(LOADER_REMAINDERS) is not None:
        reference_checks.check_loader_remainders(plan, split, entry[LOADER_REMAINDERS], n, state,
                                                 problems)


def _check_instance_index(label, instance, whole, records, found, state, split, problems):
    """An instance's index against the split's: whole shards complete and only theirs, nothing placed in a
    shard the instance does not read, copied samples equal to their originals. `found`: each instance row's
    split row (-1: not in the split)."""
    index_name, remainder = instance.get("index"), instance.get("remainder")
    listed = ShardGroups(records, by_offset=False)
    home = np.where(found >= 0, state.columns.shard_ids[np.maximum(found, 0)], -1) if len(found) else found
    for name in whole:
        mine, want = listed.rows(name), state.groups.rows(name)
        for row in want[~np.isin(want, found[mine])].tolist():
            problems.append(error(index_name, f"{label} reads {name} whole, but its index leaves out "
                                              f"this sample of it", state.columns.key(row)))
        for row in mine[home[mine] != state.groups.ids.get(name, -2)].tolist():
            problems.append(error(index_name, f"{label}: placed in {name}, where the {split} index does not "
                                              f"have it", records.key(row)))
    for name in records.shard_names:
        if name in whole or name == remainder:
            continue
        for row in listed.rows(name).tolist():
            problems.append(error(index_name, f"{label}: placed in {name!r}, which the instance does not read",
                                  records.key(row)))
    for row in listed.rows(remainder).tolist() if remainder else ():
        record = records.record(row)
        if found[row] < 0:
            problems.append(error(remainder, f"{label}: copied sample is not in the {split} split", record.key))
            continue
        source = state.columns.record(found[row])
        if ((source.payload_crc32c, source.label, source.bbox)
                != (record.payload_crc32c, record.label, record.bbox)):
            problems.append(error(remainder, f"{label}: copied sample differs from the original in "
                                             f"{source.shard} (payload checksum, label or bbox)", record.key))


def _check_shard_list(root, plan, instance, whole, remainder, label, problems):
    name = instance.get("shard_list")
    if name is None:
        return
    if _relative_path_problem(name):
        problems.append(error(f"{plan.folder}/{REPARTITION_MANIFEST}", f"{label}: its shard list "
                                                                       f"{_relative_path_problem(name)}"))
        return
    try:
        lines = (Path(root) / name).read_text().split()
    except OSError as exc:
        problems.append(error(name, f"{label}: cannot read its shard list: {exc.strerror or exc}"))
        return
    expected = whole + ([remainder] if remainder else [])
    if lines != expected:
        problems.append(error(name, f"{label}: the shard list differs from the manifest ({len(lines)} names, "
                                    f"expected {len(expected)})"))


def _check_union(where, split, policy, state, reads, padded, dropped, problems):
    rows, numbers = reads.joined()
    counts = np.bincount(rows, minlength=len(state.columns))
    named = sorted(dropped)
    dropped_rows = {key: int(row) for key, row in zip(named, state.table.rows_of_keys(named)) if row >= 0}
    unread = (state.columns.key(row) for row in np.flatnonzero(counts == 0).tolist())
    for key in sorted(key for key in unread if key not in dropped):
        problems.append(error(where, f"{split}: sample is read by no instance and not named as dropped", key))
    for key in sorted(reads.strays):
        problems.append(error(where, f"{split}: an instance reads a sample that is not in the split", key))
    for key in named:
        row = dropped_rows.get(key)
        if row is not None and counts[row]:
            first = int(numbers[np.flatnonzero(rows == row)[0]])
        elif key in reads.strays:
            first = reads.strays[key][0]
        else:
            continue
        problems.append(error(where, f"{split}: named as dropped but read by instance {first}", key))
    for key in named:
        if key not in dropped_rows:
            problems.append(error(where, f"{split}: named as dropped but not in the split", key))
    for key, numbers_of_key in sorted(_repeated_readers(state, reads, rows, numbers, counts, padded).items()):
        repeats = len(numbers_of_key) - 1 - padded.get(key, 0)
        if repeats > 0:
            problems.append(error(where, f"{split}: read by instances {', '.join(map(str, numbers_of_key))}, but "
                                         f"not named as padding", key))
        elif repeats < 0:
            problems.append(error(where, f"{split}: named as padding {padded[key]} times but read "
                                         f"{len(numbers_of_key)} times", key))
    if policy == "spread" and (padded or dropped):
        problems.append(error(where, f"{split}: policy 'spread' keeps every sample once, but the manifest names "
                                     f"{sum(padded.values())} padded and {len(dropped)} dropped keys"))
    if policy == "pad" and dropped:
        problems.append(error(where, f"{split}: policy 'pad' drops nothing, but {len(dropped)} keys are named as dropped"))
    if policy == "drop" and padded:
        problems.append(error(where, f"{split}: policy 'drop' pads nothing, but {sum(padded.values())} keys are padding"))


def _repeated_readers(state, reads, rows, numbers, counts, padded) -> dict:
    """{key: instance numbers reading it} of the keys whose readers padding must account for: read more
    than once, or named as padding, or not in the split."""
    padded_keys = list(padded)
    padded_rows = [int(row) for row in state.table.rows_of_keys(padded_keys) if row >= 0 and counts[row]]
    wanted = np.union1d(np.flatnonzero(counts > 1), np.array(padded_rows, dtype=np.int64))
    readers = {}
    mask = np.isin(rows, wanted)
    for row, number in zip(rows[mask].tolist(), numbers[mask].tolist()):
        readers.setdefault(row, []).append(number)
    out = {state.columns.key(row): found for row, found in readers.items()}
    out.update(reads.strays)
    return out


def _check_counts(where, split, policy, counts, total, problems):
    counts = [c for c in counts if isinstance(c, int)]
    if not counts:
        return
    if policy == "spread" and max(counts) - min(counts) > 1:
        problems.append(error(where, f"{split}: policy 'spread' but instance counts range from {min(counts)} to {max(counts)}"))
    if policy in ("pad", "drop") and len(set(counts)) > 1:
        problems.append(error(where, f"{split}: policy {policy!r} needs equal counts, got {counts}"))
    if policy == "spread" and sum(counts) != total:
        problems.append(error(where, f"{split}: instances read {sum(counts):,} samples, the split has {total:,}"))


def _check_repartition_folder_files(root, plan, problems):
    folder = Path(root) / plan.folder
    for path in sorted(folder.iterdir()):
        relative = f"{plan.folder}/{path.name}"
        if relative in plan.expected_files or path.is_dir():
            continue
        if path.name.endswith(PARTIAL_SUFFIX):
            problems.append(warning(relative, "partial file left by an interrupted write (safe to delete)"))
        elif path.name.endswith(".plan.json"):
            problems.append(warning(relative, "plan stamp of an interrupted re-run (distributed_webdataset.py completes it)"))
        else:
            problems.append(warning(relative, "extra file not listed in the repartition manifest (loaders ignore it)"))

