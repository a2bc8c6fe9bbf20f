"""What the validator checks of the reference harness's expectations, and its report of a
reference dataset: metadata.json's folder checksum, the repartition files its loader reads, a
repartition folder it made, and `check_dataset` (check, then adopt).

The validator (imagenet_shards.validate: converted, repartition_checks, validator) calls these with its
own records and problem list; problems are imagenet_shards.formats.shard_check's. Nothing here imports
the validator: it passes in the two helpers the remainder check needs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import CONVERT_STATE_DIR, DISTRIBUTED_DIR, REPARTITION_MANIFEST
from imagenet_shards.formats.shard_check import ERROR, WARNING, error, warning
from imagenet_shards.index import CONVERT_STATE_REMOVED, ShardRecord
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.reference.checksum import file_md5s, reference_checksum
from imagenet_shards.reference.layout import adopt, check_reference_dataset, is_reference_repartition
from imagenet_shards.reference.remainders import reference_remainders
from imagenet_shards.index import ShardGroups, parse_sample_columns


def repartition_folder_problem(folder) -> Optional[str]:
    """The warning for a distributed/<N>-instances folder without a manifest.json that the
    reference harness made, or None (the validator then calls it unfinished)."""
    if is_reference_repartition(folder):
        return ("a repartition made by the reference harness (its loader reads it, this one does not; "
                "distributed_webdataset.py --num-instances N makes one for this loader)")
    return None


def check_folder_checksum(root, metadata, states, results, problems, notes):
    """metadata.json's `checksum` (the reference harness's md5 folder checksum, imagenet_shards.reference.checksum)
    against the folder, from the md5s metadata.json records for the shards and indexes, which verified by
    sha256 (only the other files are read); checked when nothing else is wrong. A mismatch is a warning
    (every file here is checked by its own record), but the reference validate_dataset.py says "Dataset is
    corrupted.": the warning names the likely cause, e.g. a .convert-state/ left by a crash."""
    expected = metadata.get("checksum")
    if not isinstance(expected, str) or any(p.severity == ERROR for p in problems):
        return
    known = {}
    for split, state in states.items():
        index = metadata["splits"][split].get("index") or {}
        if not index.get("md5"):
            return  # written before md5s were recorded: the check would read every shard
        if not isinstance(index["md5"], str) or not re.fullmatch(r"[0-9a-f]{32}", index["md5"]):
            problems.append(error(METADATA_FILE, f"split {split!r}: the index's md5 {index['md5']!r} is not an md5 "
                                                 f"hex digest"))
            return
        known[index["name"]] = index["md5"]
        for shard in state.shards:
            result = results.get(shard.name)
            if not shard.md5 or result is None or result.sha256 != shard.sha256:
                return
            known[shard.name] = shard.md5
    root = Path(root)
    added_later = [folder for folder in (CONVERT_STATE_DIR, DISTRIBUTED_DIR) if (root / folder).is_dir()]
    base = list(file_md5s(root, known, skip_folders=added_later).values())
    if reference_checksum(base) == expected:
        counted = []
    else:
        inside = {folder: list(file_md5s(root / folder).values()) for folder in added_later}
        candidates = [[CONVERT_STATE_DIR], [DISTRIBUTED_DIR], [CONVERT_STATE_DIR, DISTRIBUTED_DIR]]
        counted = next((folders for folders in candidates if set(folders) <= set(added_later) and
                        reference_checksum(base + [md5 for f in folders for md5 in inside[f]]) == expected),
                       None)
    state = f"{CONVERT_STATE_DIR}/"
    if counted is None:
        extra = sorted({p.file for p in problems if p.severity == WARNING and p.file and p.file != METADATA_FILE})
        causes = ([f"{state} left by create_webdataset.py (create_webdataset.py --resume with the same options "
                   f"removes it)"] if CONVERT_STATE_DIR in added_later else [])
        causes += [f"files added after the conversion ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''})"] if extra else []
        if "plan_fingerprint" in metadata and CONVERT_STATE_REMOVED not in metadata and CONVERT_STATE_DIR not in added_later:
            causes.append(f"made by an earlier create_webdataset.py, whose checksum counted its {state}, since "
                          f"deleted or not copied")
        problems.append(warning("", f"the reference folder checksum (md5 dirhash) differs from metadata.json's "
                                    f"checksum {expected}: the reference validate_dataset.py says \"Dataset is "
                                    f"corrupted.\" though every file checked here is intact; likely cause: "
                                    + ("; ".join(causes) if causes else "a file the reference counts changed (e.g. a "
                                                                          ".tfindex), or the checksum was edited")))
        return
    if CONVERT_STATE_DIR in added_later and CONVERT_STATE_DIR not in counted:
        problems.append(warning(state, "left by a conversion stopped after writing metadata.json, whose checksum "
                                       "does not count it: the reference validate_dataset.py counts hidden files and "
                                       "says \"Dataset is corrupted.\"; create_webdataset.py --resume with the same "
                                       "options removes it (or delete the folder)"))
    if CONVERT_STATE_DIR in counted:
        notes.append(f"metadata.json's checksum counts {state} (written by an earlier create_webdataset.py): deleting "
                     f"it, or a copy without hidden files (upload_dataset.py makes one), fails the reference "
                     f"validator; create_webdataset.py --resume with the same options rewrites metadata.json "
                     f"without it and removes it")
    if DISTRIBUTED_DIR in added_later and DISTRIBUTED_DIR not in counted:
        notes.append(f"the reference folder checksum matches without {DISTRIBUTED_DIR}/, added after metadata.json "
                     f"was written (the reference validate_dataset.py counts it and says corrupted)")


def plan_loader_remainders(root, plan, split, reference, problems, unsafe_path, make_task):
    """The shards a repartition writes for the reference harness's loader (`reference_remainders`):
    each checked as a shard against its record and their sample index. `reference` is the split's
    LOADER_REMAINDERS entry in the repartition manifest; the validator passes its path check
    (`unsafe_path(name)`: why a path is unsafe, or None) and `make_task(path, shard_record, records)`,
    its ShardTask for one shard, appended to `plan.tasks`."""
    manifest_name = f"{plan.folder}/{REPARTITION_MANIFEST}"
    index_name = reference.get("index")
    unsafe = unsafe_path(index_name)
    if unsafe:
        problems.append(error(manifest_name, f"{split}: the reference loader's sample index {unsafe}"))
        return
    plan.expected_files.add(index_name)
    try:
        with open(Path(root) / index_name, "rb") as stream:
            records = parse_sample_columns(stream, index_name)
    except OSError as exc:
        problems.append(error(index_name, f"cannot read the reference loader's sample index: {exc.strerror or exc}"))
        records = None
    except DatasetError as exc:
        problems.append(error(index_name, str(exc).removeprefix(f"{index_name}: ")))
        records = None
    plan.instance_records[(split, "reference")] = records
    for item in reference.get("remainders") or []:
        shard = ShardRecord.from_json(item)
        unsafe = unsafe_path(shard.name)
        if unsafe:
            problems.append(error(manifest_name, f"{split}: a reference loader's remainder shard {unsafe}"))
            continue
        plan.expected_files.add(shard.name)
        path = Path(root) / shard.name
        if not path.is_file():
            problems.append(error(shard.name, f"missing: the reference harness's loader reads it ({split})"))
            continue
        mine = () if records is None else tuple(records.records(records.rows_of_shards([shard.name])))
        plan.tasks.append(make_task(path, shard, mine))


def check_loader_remainders(plan, split, reference, n, state, problems):
    """What the reference harness's loader reads under n instances: the split's shards but the last
    r whole, and remainder i = the i-th slice of the last r shards' samples (`reference_remainders`);
    each sample once, byte-identical to its original. `state` is the validator's view of the split:
    `shards`, `columns` (its index, SampleColumns), `groups` (ShardGroups of them) and `table` (a
    KeyTable of them); the remainders' index is SampleColumns in `plan.instance_records`."""
    records = plan.instance_records.get((split, "reference"))
    if records is None:
        return
    where = reference.get("index")
    if not isinstance(n, int) or n < 2:
        problems.append(error(where, f"{split}: reference loader remainders for num_instances {n!r}"))
        return
    slices = reference_remainders(state.shards, state.groups, n)
    from_slices = {record.shard for share in slices for record in share}
    whole = [shard.name for shard in sorted(state.shards, key=lambda shard: shard.name) if shard.name not in from_slices]
    if reference.get("shards") != whole:
        problems.append(error(f"{plan.folder}/{REPARTITION_MANIFEST}", f"{split}: the shards the reference loader "
                                                                       f"reads whole are not those its layout implies"))
    remainders = [item.get("name") for item in reference.get("remainders") or []]
    listed = ShardGroups(records, by_offset=False)
    for name, share in zip(remainders, slices):
        have = [records.key(row) for row in listed.rows(name).tolist()]
        if have != [record.key for record in share]:
            problems.append(error(name, f"{split}: holds {len(have)} samples; the reference loader expects its "
                                        f"{len(share)}-sample slice of the split's last shards, in order"))
    found = state.table.rows_of_columns(records)
    for row, record in enumerate(records.iter_records()):
        source = state.columns.record(found[row]) if found[row] >= 0 else None
        if source is None or ((source.payload_crc32c, source.label)
                              != (record.payload_crc32c, record.label)):
            problems.append(error(record.shard, f"{split}: copied sample is not in the split or differs from the "
                                                f"original (payload checksum or label)", record.key))
    if len(remainders) != n:
        problems.append(error(where, f"{split}: {len(remainders)} reference loader remainders, num_instances is {n}"))


def check_dataset(root, deep=False, adopt_it=False, progress=None):
    """A dataset made by the reference harness: its folder checksum, every shard walked; with
    `adopt_it`, once intact, this project's indexes and metadata written. Returns (problems as
    (severity, file, key, problem), notes, stats without timing) for the validator's report."""
    check = check_reference_dataset(root, deep, progress)
    notes = ["a dataset made by the reference harness (Graphcore's create_webdataset.py): its md5 folder "
             "checksum and every shard's structure, members and counts were checked"] + check.notes
    adopted = bool(adopt_it and not check.errors)
    if adopted:
        written = adopt(root, check)
        notes.append(f"adopted: wrote {', '.join(written)} beside the shards (no shard changed); "
                     f"per-shard and per-sample hashes are checked from now on")
    elif adopt_it:
        notes.append("not adopted: fix or replace the damaged files first (an intact copy adopts)")
    stats = {
        "format": check.fmt, "reference_layout": True, "adopted": adopted,
        "shards_checked": sum(len(scans) for scans in check.shards.values()),
        "samples_checked": sum(len(s.records) for scans in check.shards.values() for s in scans),
        "payloads_decoded": sum(s.decoded for scans in check.shards.values() for s in scans),
        "bytes_checked": check.bytes_read, "workers": 1, "deep": deep,
    }
    return check.problems, notes, stats
