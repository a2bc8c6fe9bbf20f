"""The validator's check of one TFRecord shard (the tfrecord format's check_shard, imagenet_shards.formats.tfslim).

One sequential pass over the mapped shard: every record's length CRC and data CRC (masked
CRC32C; the `tfrecord` package never checks them, so this is the guarantee), the whole-shard
sha256 fed record by record, and each record compared with the sample index: key, byte range,
payload range, label (stored label minus metadata's `label_offset`), the class table and the
record's own image/class/synset. Payload sha256 values are compared when the validator asks
for it (`hash_payloads`, `deep`) or when the shard's size or sha256 differs, to name the
damaged samples; with `deep` every image is decoded. The shard's `.tfindex` must list exactly
the records found (a loader that trusts it would otherwise read wrong byte ranges).

A record whose data CRC fails still has a trusted length (its length CRC passed), so the walk
goes on and names every damaged record. A bad length CRC or a truncation ends the walk: the
records after it cannot be delimited, and each index entry from there on is reported.
"""

from __future__ import annotations

import hashlib

from imagenet_shards.index import payload_problem
from imagenet_shards.formats.tf_example import ExampleFormatError, example_feature_spans
from imagenet_shards.formats.tfrecord import (
    CRC_SIZE,
    FRAMING_SIZE,
    HEADER_SIZE,
    TFRecordFormatError,
    _check_data,
    _check_header,
    read_tfrecord_index,
    tfrecord_index_path,
)
from imagenet_shards.formats.tfslim_imagenet import (
    FEATURE_ENCODED,
    FEATURE_FILENAME,
    FEATURE_KEY,
    FEATURE_LABEL,
    FEATURE_SYNSET,
    example_key,
)
from imagenet_shards.formats.shard_check import (
    MappedShard,
    ShardResult,
    ShardTask,
    check_mapped_shard,
    decode_problem,
    error,
    metadata_mismatches,
    sample_field_problems,
)

CHECKED_FEATURES = frozenset({FEATURE_ENCODED, FEATURE_LABEL, FEATURE_SYNSET, FEATURE_KEY, FEATURE_FILENAME})


def check_tfrecord_shard(task: ShardTask) -> ShardResult:
    return check_mapped_shard(task, "records", _check_tfrecord_contents, _check_companion_of_intact_shard)


def _check_companion_of_intact_shard(task, ordered):
    """The .tfindex of a shard whose bytes are as written: it must list the index's records."""
    return _check_companion_index(task, [(r.record_offset, r.record_size) for r in ordered], True)


def _check_tfrecord_contents(task: ShardTask, shard: MappedShard, result: ShardResult):
    walk = _Walk(task, shard.view, shard.size, strict=task.hash_payloads or task.deep or shard.size_differs)
    walk.run()
    result.sha256 = walk.digest.hexdigest()
    sha_differs = task.record is not None and result.sha256 != task.record.sha256
    if sha_differs and not walk.strict:
        walk = _Walk(task, shard.view, shard.size, strict=True)  # hash every payload to name the damaged samples
        walk.run()
    unchanged = not walk.damaged_keys and not shard.size_differs
    detail = "; every record's CRCs and every sample still match the index, so metadata's record of the shard changed" if unchanged else ""
    result.problems = (walk.problems + shard.problems + metadata_mismatches(task, result.sha256, walk.records, "records", detail)
                       + _check_companion_index(task, walk.entries, walk.complete))
    return walk


def _check_companion_index(task, entries, complete):
    index_path = tfrecord_index_path(task.path)
    index_name = tfrecord_index_path(task.name).as_posix()
    if not index_path.is_file():
        return [error(index_name, "missing: the shard's record index (tfrecord2idx format) is not there")]
    try:
        listed = read_tfrecord_index(index_path)
    except (OSError, TFRecordFormatError) as exc:
        return [error(index_name, f"unreadable record index: {exc}")]
    if complete and listed != entries:
        first = next((i for i, (a, b) in enumerate(zip(listed, entries)) if a != b), min(len(listed), len(entries)))
        return [error(index_name, f"lists {len(listed)} records, the shard holds {len(entries)}; first difference at record {first}")]
    return []


class _Walk:
    def __init__(self, task, view, size, strict):
        self.task, self.view, self.size, self.strict = task, view, size, strict
        self.by_key = {}
        for entry in task.samples:
            self.by_key.setdefault(entry.key, entry)
        self.by_offset = {entry.record_offset: entry for entry in task.samples}
        self.label_offset = task.label_offset
        self.digest = hashlib.sha256()
        self.problems = []
        self.found = []  # keys in shard order
        self.seen = set()
        self.damaged_keys = set()
        self.entries = []  # (offset, size) of every delimited record
        self.records = 0
        self.complete = False  # the walk delimited every record itself, to the end of the file
        self.payloads_hashed = 0
        self.payloads_decoded = 0

    def problem(self, text, key=None):
        self.problems.append(error(self.task.name, text, key))
        if key is not None:
            self.damaged_keys.add(key)

    def run(self):
        view, size, name = self.view, self.size, self.task.name
        offset, number, hashed = 0, 0, 0
        while offset < size:
            if offset + HEADER_SIZE > size:
                self.fail_rest(offset, number, f"truncated: the record header needs {HEADER_SIZE} bytes, only {size - offset} remain")
                break
            try:
                length = _check_header(view[offset : offset + HEADER_SIZE], name, number, offset, True)
            except TFRecordFormatError as exc:
                resume = self.resume_after(offset)
                if resume is None:
                    self.fail_rest(offset, number, exc.problem)
                    break
                # The index knows where this record ends: name it, and go on checking the rest.
                entry = self.by_offset[offset]
                self.problem(f"record {number} (at byte {offset:,}): {exc.problem}", entry.key)
                self.found.append(entry.key)
                self.seen.add(entry.key)
                self.records += 1
                offset, number = resume, number + 1
                continue
            end = offset + FRAMING_SIZE + length
            if end > size:
                self.fail_rest(offset, number, f"truncated: a record of {length} bytes needs {FRAMING_SIZE + length} bytes, only {size - offset} remain")
                break
            self.digest.update(view[hashed:end])  # the whole file, in order, as the walk advances
            hashed = end
            self.entries.append((offset, end - offset))
            self.records += 1
            data = view[offset + HEADER_SIZE : end - CRC_SIZE]
            try:
                _check_data(data, view[end - CRC_SIZE : end], name, number, offset, True)
            except TFRecordFormatError as exc:
                entry = self.by_offset.get(offset)
                self.problem(f"record {number} (at byte {offset:,}): {exc.problem}", entry.key if entry else None)
                if entry is not None:
                    self.found.append(entry.key)
                    self.seen.add(entry.key)
            else:
                self.check_sample(offset, end - offset, number, data)
            offset, number = end, number + 1
        else:
            self.complete = len(self.entries) == self.records  # no record was skipped over by the index
        self.digest.update(view[hashed:])  # whatever follows a broken record is still part of the file
        for entry in self.task.samples:
            if entry.key not in self.seen and entry.key not in self.damaged_keys:
                self.problem("listed in the sample index but not in the shard", entry.key)

    def resume_after(self, offset):
        """Where the next record starts according to the index, if the index knows this one."""
        entry = self.by_offset.get(offset)
        if entry is None:
            return None
        resume = entry.record_offset + entry.record_size
        return resume if resume == self.size or resume in self.by_offset else None

    def fail_rest(self, offset, number, text):
        """The records from `offset` on cannot be delimited: name the break and every sample lost."""
        entry = self.by_offset.get(offset)
        self.problem(f"record {number} (at byte {offset:,}): {text}", entry.key if entry else None)
        for later in self.task.samples:
            if later.record_offset > offset and later.key not in self.seen:
                self.problem(f"unreadable: the shard breaks at record {number} (byte {offset:,}) before this sample", later.key)

    def check_sample(self, offset, record_size, number, data):
        task = self.task
        where = f"record {number} (at byte {offset:,})"
        try:
            spans = example_feature_spans(data, CHECKED_FEATURES)
        except ExampleFormatError as exc:
            entry = self.by_offset.get(offset)
            self.problem(f"{where}: not a tf.train.Example: {exc}", entry.key if entry else None)
            return
        features = {k: ([data[a:b] for a, b in v] if kind == "bytes" else v) for k, (kind, v) in spans.items()}
        key = example_key(features, task.name, number)
        self.found.append(key)
        if key in self.seen:
            self.problem(f"{where}: duplicated key: a second record with this key in the same shard", key)
        self.seen.add(key)
        entry = self.by_key.get(key)
        local = []
        if entry is None:
            local.append("sample is in the shard but not in the sample index")
        encoded = spans.get(FEATURE_ENCODED, (None, []))
        labels = features.get(FEATURE_LABEL)
        if encoded[0] != "bytes" or len(encoded[1]) != 1:
            local.append(f"{where}: no single {FEATURE_ENCODED} bytes value")
            payload = None
        else:
            start, stop = encoded[1][0]
            payload = data[start:stop]
            payload_offset = offset + HEADER_SIZE + start
            if entry is not None and offset == entry.record_offset and (payload_offset, len(payload)) != (entry.payload_offset, entry.payload_size):
                local.append(f"payload at byte {payload_offset:,} ({len(payload):,} bytes), the index says {entry.payload_offset:,} ({entry.payload_size:,} bytes)")
        if entry is not None and (offset, record_size) != (entry.record_offset, entry.record_size):
            local.append(f"{where}: {record_size:,} bytes, the index says byte {entry.record_offset:,} ({entry.record_size:,} bytes)")
        if not labels or not isinstance(labels[0], int):
            local.append(f"{where}: no integer {FEATURE_LABEL}")
        else:
            label, field_problems = sample_field_problems(str(labels[0] - self.label_offset).encode(), None, task.classes, entry)
            local += [f"{p} (stored {FEATURE_LABEL} {labels[0]}, label offset {self.label_offset})" for p in field_problems]
            synset = features.get(FEATURE_SYNSET)
            if synset and label is not None and 0 <= label < len(task.classes):
                text = bytes(synset[0]).decode("utf-8", "replace")
                if text != task.classes[label]:
                    local.append(f"label {label} is class {task.classes[label]!r} in the class table, but the record's {FEATURE_SYNSET} is {text!r}")
        if payload is not None and self.strict:
            if entry is not None:
                self.payloads_hashed += 1
                why = payload_problem(entry, payload)
                if why:
                    local.append(f"{why}: the payload is corrupt")
            if task.deep:
                self.payloads_decoded += 1
                why = decode_problem(task.payload_ext, payload, task.tensor_layout)
                if why:
                    local.append(why)
        for text in local:
            self.problem(text, key)
