"""The checks of a converted dataset (`metadata.json` present, see imagenet_shards.index for the layout).

`validate_converted(root, workers, deep, progress)` returns a `Report` (imagenet_shards.validate.report);
it raises ValidationUsageError only when metadata.json cannot be read. What it checks:
  - metadata.json itself: required keys, lengths that agree with the shard lists, a class table,
    and its own digest (imagenet_shards.metadata_digest: edited is an error, absent a note);
  - every shard against its ShardRecord: present, size, sha256, sample count;
  - the tar structure: header checksums, member names (no absolute paths, no `..`),
    complete samples (`.cls`, `.json` and exactly one payload per key), nothing after the
    end-of-archive marker;
  - every sample against the split's sample index: key, label, byte offsets, payload CRC32C;
  - labels inside the class table and equal to the class the sample's `.json` names;
  - keys unique within a split;
  - repartitions under `distributed/<N>-instances/` (imagenet_shards.validate.repartition_checks);
  - files nobody lists are warnings (a loader never reads them), never corruption;
  - metadata.json's reference `checksum` (checksumdir's md5 dirhash, from the md5s metadata.json records for
    the shards and indexes that verified): a mismatch is a warning naming the likely cause (a
    .convert-state/ a crash left, files added), as the reference validate_dataset.py would say corrupted;
  - with `deep`, every image is decoded (PIL verify + load) and every tensor parsed.

At file-hashing speed. A shard is first hashed alone (one sequential read, at sha256's speed:
what `openssl dgst -sha256` does). When its size and sha256 match metadata.json it is
byte-identical to what the converter wrote, indexed and published, so walking its headers again
would prove nothing: only the index's own account of it is checked (sample count, byte ranges,
labels within the class table; a TFRecord shard's .tfindex). When the size or sha256 differs, the
shard is walked (mapped, page cache) to name the damage: header checksums, structure, every sample
against the index, every payload's CRC32C, every json. Remainder shards of repartitions (small: about
one shard per instance) and, with `deep`, all shards are always walked, `deep` also decoding every
payload. Consequence: with the default check, contents that match a resealed metadata.json (an edited
shard whose new sha256 was written into metadata.json) are trusted; `deep` reads them. A dataset whose
index is of the earlier version (payload sha256) is not checked sample by sample: one line names the
re-index command, and its shards are hashed whole (imagenet_shards.validate.upgrade).
What this costs is measured by benchmarks/validate_benchmark.py (docs/design-figures.md).
The per-format shard check runs as a task (imagenet_shards.validate.tasks).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from imagenet_shards import metadata_digest
from imagenet_shards.reference import checks as reference_checks
from imagenet_shards.fileio import PARTIAL_SUFFIX, hash_file, sha256_bytes
from imagenet_shards.dataset_folder import CONVERT_STATE_DIR, DISTRIBUTED_DIR, REPARTITION_MANIFEST
from imagenet_shards.formats import UnknownFormatError, get_format, payload_extension_of
from imagenet_shards.formats.shard_check import NOT_IN_INDEX, ShardTask, error, warning
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import ShardRecord, parse_metadata
from imagenet_shards.index import KeyTable, SampleColumns, ShardGroups, columns_from_records
from imagenet_shards.index.earlier import EarlierIndexError
from imagenet_shards.validate.repartition_checks import check_repartition, plan_repartition_checks
from imagenet_shards.validate.report import Report, ValidationUsageError, sorted_problems
from imagenet_shards.validate.tasks import label_offset_of, read_index, run_tasks
from imagenet_shards.validate.upgrade import earlier_index_report

# Folders the tools keep in a dataset, never read by a loader: not extra files.
TOOL_FOLDERS = {CONVERT_STATE_DIR}  # create_webdataset.py's resume records


@dataclass
class _SplitState:
    name: str
    shards: list  # ShardRecords (metadata's, in order)
    columns: SampleColumns  # the index (no rows when it could not be read)
    index_ok: bool
    groups: ShardGroups = None  # the index's records per shard, in index order, built when asked for
    _table: KeyTable = None
    earlier: bool = False  # the index is of the earlier version (imagenet_shards.validate.upgrade)

    def __post_init__(self):
        self.groups = ShardGroups(self.columns, by_offset=False)

    @property
    def table(self) -> KeyTable:
        """The rows of the index by key (made once, when a repartition check first needs it)."""
        if self._table is None:
            self._table = KeyTable(self.columns)
        return self._table


def _no_index(split, shards) -> _SplitState:
    return _SplitState(split, shards, columns_from_records([]), False)



def _check_metadata(metadata, problems):
    """Consistency of metadata.json itself; returns {split: [ShardRecord]} of the usable splits."""
    meta = METADATA_FILE
    classes = metadata.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        problems.append(error(meta, "the class table ('classes') is missing, empty or not a list of names"))
    else:
        repeated = sorted(name for name, n in Counter(classes).items() if n > 1)
        if repeated:
            problems.append(error(meta, f"class names appear twice in the class table: {', '.join(repeated[:5])}"))
    splits = metadata.get("splits")
    if not isinstance(splits, dict) or not splits:
        problems.append(error(meta, "'splits' is missing or empty"))
        return {}
    usable = {}
    all_names = Counter()
    for split, entry in splits.items():
        if not isinstance(entry, dict):
            problems.append(error(meta, f"split {split!r}: its entry is not an object"))
            continue
        try:
            shards = [ShardRecord.from_json(s) for s in entry.get("shards", [])]
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(error(meta, f"split {split!r}: malformed shard list ({type(exc).__name__}: {exc})"))
            continue
        if not shards:
            problems.append(error(meta, f"split {split!r} lists no shards"))
        for shard in shards:
            all_names[shard.name] += 1
            if shard.name.startswith("/") or ".." in shard.name.split("/") or "/" in shard.name:
                problems.append(error(meta, f"split {split!r}: shard name {shard.name!r} is not a plain file name"))
            if (shard.samples < 0 or shard.bytes < 0 or not re.fullmatch(r"[0-9a-f]{64}", shard.sha256)
                    or not re.fullmatch(r"(?:[0-9a-f]{32})?", shard.md5)):
                problems.append(error(meta, f"split {split!r}: the record of {shard.name} is malformed: {shard}"))
        total = sum(shard.samples for shard in shards)
        length = entry.get("length")
        if length is not None and length != total:
            problems.append(error(meta, f"split {split!r}: length {length!r}, its shards hold {total:,} samples"))
        top = metadata.get(f"{split}_length")
        if top is not None and top != total:
            problems.append(error(meta, f"{split}_length is {top!r}, the {split} shards hold {total:,} samples"))
        skipped = entry.get("skipped") or []
        source_samples = entry.get("source_samples")
        if source_samples is not None and source_samples != total + len(skipped):
            problems.append(error(meta, f"split {split!r}: {source_samples!r} source samples, but "
                                        f"{total:,} written + {len(skipped):,} skipped = {total + len(skipped):,}"))
        for item in skipped:
            if isinstance(item, dict):
                problems.append(warning(meta, f"{split}: source image skipped at conversion: "
                                              f"{item.get('path')}: {item.get('reason')}"))
        usable[split] = shards
    for shard_name, count in all_names.items():
        if count > 1:
            problems.append(error(meta, f"shard {shard_name} is listed {count} times"))
    return usable


def _load_split_index(root, split, entry, shards, problems) -> _SplitState:
    info = entry.get("index") if isinstance(entry, dict) else None
    if not isinstance(info, dict) or "name" not in info:
        problems.append(error(METADATA_FILE, f"split {split!r} names no sample index: samples cannot be checked one by one"))
        return _no_index(split, shards)
    name = str(info["name"])
    try:
        (sha256,), size = hash_file(Path(root) / name)  # streamed: the index is read as columns below
        columns = read_index(Path(root) / name, name)
    except OSError as exc:
        problems.append(error(name, f"cannot read the sample index: {exc.strerror or exc}"))
        return _no_index(split, shards)
    except DatasetError as exc:
        columns = None
        failure = exc
    if "bytes" in info and size != info["bytes"]:
        problems.append(error(name, f"size {size:,} bytes, metadata says {info['bytes']:,}"))
    if "sha256" in info and sha256 != info["sha256"]:
        problems.append(error(name, "sha256 differs from metadata (the index changed since conversion)"))
    if columns is None and isinstance(failure, EarlierIndexError):
        return _SplitState(split, shards, columns_from_records([]), False, earlier=True)
    if columns is None:
        problems.append(error(name, str(failure).removeprefix(f"{name}: ")))
        return _no_index(split, shards)
    for key, n in columns.duplicate_keys().items():
        problems.append(error(name, f"duplicated key: listed {n} times in the index", key))
    shard_names = {shard.name for shard in shards}
    unknown = [number for number, shard in enumerate(columns.shard_names) if shard not in shard_names]
    for row in np.flatnonzero(np.isin(columns.shard_ids, unknown)).tolist() if unknown else ():
        problems.append(error(name, f"placed in {columns.shard(row)!r}, which metadata does not list for {split}",
                              columns.key(row)))
    state = _SplitState(split, shards, columns, True)
    for shard in shards:
        if state.groups.count(shard.name) != shard.samples:
            problems.append(error(name, f"lists {state.groups.count(shard.name)} samples in {shard.name}, metadata "
                                        f"says {shard.samples}"))
    return state


def _missing_shard_problem(name, shard: ShardRecord, records):
    keys = [r.key for r in records]
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    lost = f"; its samples are lost: {shown}" if keys else ""
    return error(name, f"missing shard: listed in metadata with {shard.samples:,} samples{lost}")



def check_metadata_digest(metadata_bytes, problems, notes):
    """metadata.json against its own digest (imagenet_shards.metadata_digest): edited is an error, absent a note."""
    try:
        metadata = json.loads(metadata_bytes)
    except ValueError:
        return  # parse_metadata names it
    status, message = metadata_digest.digest_status(metadata)
    if status == metadata_digest.ABSENT:
        notes.append(message)
    elif status != metadata_digest.OK:
        problems.append(error(METADATA_FILE, message))


def validate_converted(root, workers=1, deep=False, progress=None) -> Report:
    root = Path(root)
    started = time.perf_counter()
    report = Report(str(root), "converted")
    problems = report.problems
    try:
        metadata_bytes = (root / METADATA_FILE).read_bytes()
    except OSError as exc:
        raise ValidationUsageError(f"{root / METADATA_FILE}: cannot read: {exc.strerror or exc}") from None
    check_metadata_digest(metadata_bytes, problems, report.notes)
    try:
        metadata = parse_metadata(metadata_bytes, METADATA_FILE)
    except DatasetError as exc:
        problems.append(error(METADATA_FILE, str(exc).removeprefix(f"{METADATA_FILE}: ")))
        report.verdicts["Dataset"] = False
        report.stats = {"seconds": round(time.perf_counter() - started, 3)}
        return report
    metadata_sha256, fmt = sha256_bytes(metadata_bytes), metadata.get("format")
    try:
        get_format(fmt)  # an unknown format is named here, before any shard is checked
    except UnknownFormatError as exc:
        problems.append(error(METADATA_FILE, str(exc)))
        report.verdicts["Dataset"] = False
        return report
    payload_ext = payload_extension_of(metadata)
    classes = tuple(metadata["classes"]) if isinstance(metadata.get("classes"), list) else ()  # else named below
    layout = metadata.get("tensor_layout")
    try:
        split_shards = _check_metadata(metadata, problems)
        states = {}
        for split, shards in split_shards.items():
            states[split] = _load_split_index(root, split, metadata["splits"][split], shards, problems)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a value of the wrong type
        problems.append(error(METADATA_FILE, f"malformed: {type(exc).__name__}: {exc}"))
        report.problems = sorted_problems(problems)
        report.verdicts["Dataset"] = False
        return report
    earlier = [str(metadata["splits"][split]["index"]["name"]) for split, state in states.items() if state.earlier]
    if earlier:  # one line naming the re-index command, not every shard's missing samples
        shards = [shard for state in states.values() for shard in state.shards]
        return earlier_index_report(root, report, earlier, shards, workers, started)

    tasks, expected_files = _shard_tasks(root, metadata, states, payload_ext, deep, problems)
    repartitions = plan_repartition_checks(root, metadata, metadata_sha256, states, fmt, payload_ext,
                                            classes, deep, layout, problems)
    for plan in repartitions:
        tasks += [(task, None) for task in plan.tasks]

    results = {}
    for result in run_tasks(tasks, workers, progress, "shards"):
        result.keys = _KeyList(result.keys)  # ~30 bytes a key, not a str object each
        results[result.name] = result
    _explain_foreign_samples(states, results)
    for result in results.values():
        problems.extend(result.problems)

    _cross_shard_checks(states, results, problems)
    for plan in repartitions:
        try:
            check_repartition(root, plan, states, problems)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a value of the wrong type
            problems.append(error(f"{plan.folder}/{REPARTITION_MANIFEST}",
                                  f"malformed repartition manifest: {type(exc).__name__}: {exc}"))
    _check_extra_files(root, expected_files, repartitions, problems)
    reference_checks.check_folder_checksum(root, metadata, states, results, problems, report.notes)

    report.problems = sorted_problems(problems)
    report.verdicts["Dataset"] = report.ok
    report.stats = _converted_stats(fmt, states, results, repartitions, workers, deep, time.perf_counter() - started)
    return report


def _shard_tasks(root, metadata, states, payload_ext, deep, problems):
    """(the shard checks to run as (task, ShardGroups) pairs, the files metadata.json accounts for); a
    missing shard is a problem, not a task."""
    fmt, classes, layout = metadata.get("format"), tuple(metadata.get("classes") or ()), metadata.get("tensor_layout")
    tasks, expected_files = [], {METADATA_FILE}
    for split, state in states.items():
        info = metadata["splits"][split].get("index")
        if isinstance(info, dict) and "name" in info:
            expected_files.add(str(info["name"]))
        for shard in state.shards:
            expected_files.add(shard.name)
            expected_files.update(get_format(fmt).companions(shard.name))
            path = Path(root) / shard.name
            if not path.is_file():
                problems.append(_missing_shard_problem(shard.name, shard, state.groups[shard.name]))
                continue
            tasks.append((ShardTask(str(path), shard.name, fmt, shard, (), payload_ext, classes, deep, deep, layout,
                                    split, label_offset_of(metadata)), state.groups))
    return tasks, expected_files


def _converted_stats(fmt, states, results, repartitions, workers, deep, seconds) -> dict:
    checked = sum(r.bytes_read for r in results.values())
    return {
        "format": fmt,
        "splits": {s: {"shards": len(st.shards), "samples": sum(x.samples for x in st.shards)} for s, st in states.items()},
        "shards_checked": len(results),
        "samples_checked": sum(len(r.keys) for r in results.values()),
        "bytes_checked": checked,
        "payloads_hashed": sum(r.payloads_hashed for r in results.values()),
        "payloads_decoded": sum(r.payloads_decoded for r in results.values()),
        "repartitions": [p.folder for p in repartitions],
        "workers": workers,
        "deep": deep,
        "seconds": round(seconds, 3),
        "mb_per_s": round(checked / seconds / 1e6, 1) if seconds > 0 else None,
    }


class _KeyList:
    """A checked shard's keys (ShardResult.keys, in shard order) as one utf-8 buffer and their hashes:
    ~30 bytes a key where a list of str takes ~70, for the cross-shard checks of a whole split."""

    def __init__(self, keys):
        encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
        self.data = b"".join(encoded)
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(key) for key in encoded], out=self.offsets[1:])
        self.hashes = np.array([hash(key) for key in encoded], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.hashes)

    def __getitem__(self, i) -> str:
        return self.data[self.offsets[i]:self.offsets[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _explain_foreign_samples(states, results):
    """A sample the index places in another shard says which: shards swapped, renamed or mixed."""
    for state in states.values():
        affected = [results.get(shard.name) for shard in state.shards]
        affected = [r for r in affected if r is not None and any(p.problem == NOT_IN_INDEX for p in r.problems)]
        if not affected:
            continue
        wanted = {p.key for result in affected for p in result.problems if p.problem == NOT_IN_INDEX}
        home = {key: state.columns.shard(rows[-1]) for key, rows in state.columns.rows_with_keys(wanted).items()}
        for result in affected:
            result.problems = [
                error(p.file, f"sample belongs to {home[p.key]} according to the sample index (shards swapped, "
                              f"renamed or mixed?)", p.key)
                if p.problem == NOT_IN_INDEX and home.get(p.key, p.file) != p.file else p
                for p in result.problems
            ]


def _cross_shard_checks(states, results, problems):
    """Keys unique across the shards of a split; swapped or renamed shards named by their content."""
    by_sha = {}
    for state in states.values():
        for shard in state.shards:
            by_sha.setdefault(shard.sha256, []).append(shard.name)
    for state in states.values():
        checked = []
        for shard in state.shards:
            result = results.get(shard.name)
            if result is None:
                continue
            checked.append((shard.name, result.keys))
            if result.sha256 and result.sha256 != shard.sha256:
                others = [n for n in by_sha.get(result.sha256, []) if n != shard.name]
                if others:
                    problems.append(error(shard.name, f"its content is that of {', '.join(others)} in metadata: "
                                                      f"shards swapped, renamed or copied over one another"))
        for key, shards in _keys_in_several_shards(checked).items():
            if len(shards) > 1:
                for name in shards[1:]:
                    problems.append(error(name, f"duplicated key: the {state.name} split also has this key in {shards[0]}", key))


def _keys_in_several_shards(checked) -> dict:
    """{key: [shard names, in order]} of the keys found in more than one of `checked` ((name, _KeyList)),
    in order of first appearance: hashes first (numpy), then the few candidates' keys themselves."""
    if len(checked) < 2:
        return {}
    hashes = np.concatenate([keys.hashes for _, keys in checked])
    if not len(hashes):
        return {}
    owners = np.repeat(np.arange(len(checked)), [len(keys) for _, keys in checked])
    order = np.lexsort((owners, hashes))
    hashes, owners = hashes[order], owners[order]
    distinct = hashes[np.r_[True, (hashes[1:] != hashes[:-1]) | (owners[1:] != owners[:-1])]]
    candidates = np.unique(distinct[1:][distinct[1:] == distinct[:-1]])
    where = {}
    for name, keys in checked:
        hits = np.flatnonzero(np.isin(keys.hashes, candidates)).tolist() if len(candidates) else []
        for key in dict.fromkeys(keys[i] for i in hits):
            where.setdefault(key, []).append(name)
    return where


def _check_extra_files(root, expected, repartitions, problems):
    """Files nobody lists are warnings only: no loader reads them."""
    root = Path(root)
    repartition_folders = {p.folder for p in repartitions}
    for folder, dirs, names in os.walk(root):
        relative_folder = os.path.relpath(folder, root)
        if relative_folder == ".":
            relative_folder = ""
        if relative_folder in TOOL_FOLDERS:
            dirs[:] = []
            continue
        if relative_folder == DISTRIBUTED_DIR:
            for name in sorted(dirs):
                if f"{DISTRIBUTED_DIR}/{name}" in repartition_folders:
                    continue
                made_elsewhere = reference_checks.repartition_folder_problem(Path(folder) / name)
                if made_elsewhere:
                    problems.append(warning(f"{DISTRIBUTED_DIR}/{name}", made_elsewhere))
                else:
                    problems.append(warning(f"{DISTRIBUTED_DIR}/{name}", "repartition folder without a manifest.json "
                                                                         "(unfinished; distributed_webdataset.py completes it)"))
            dirs[:] = []  # each repartition folder is checked against its manifest
        for name in names:
            relative = f"{relative_folder}/{name}" if relative_folder else name
            if relative in expected:
                continue
            if name.endswith(PARTIAL_SUFFIX):
                problems.append(warning(relative, "partial file left by an interrupted write (safe to delete)"))
            else:
                problems.append(warning(relative, "extra file not listed in metadata.json (loaders ignore it)"))
