"""The validator's check of one tar shard (img and tensor formats).

One sequential pass over the mapped shard: the tar walk feeds the whole-shard sha256 as it
goes, and every sample is compared with the sample index. A shard whose sha256 differs is walked
a second time, strictly, from the pages already mapped, to name each damaged sample.
"""

from __future__ import annotations

from imagenet_shards.index import payload_problem
from imagenet_shards.formats.shard_check import (
    HASH_STEP,
    NOT_IN_INDEX,
    MappedShard,
    SampleIndex,
    SequentialHasher,
    ShardResult,
    ShardTask,
    check_mapped_shard,
    decode_problem,
    error,
    metadata_mismatches,
    sample_field_problems,
    unsafe_member_name,
)
from imagenet_shards.formats.tar import BLOCK, TarFormatError, iter_tar_members, split_key


def check_tar_shard(task: ShardTask) -> ShardResult:
    """Every check of one tar shard. One sequential pass; a shard whose sha256 differs is walked
    a second time, strictly, from the pages already mapped, to name each damaged sample."""
    return check_mapped_shard(task, "samples", _check_tar_contents)


def _check_tar_contents(task: ShardTask, shard: MappedShard, result: ShardResult):
    strict = task.hash_payloads or task.deep or shard.size_differs
    hasher = SequentialHasher(shard.view)
    walk = _TarWalk(task, shard.view, shard.size, strict)
    walk.run(hasher)
    result.sha256 = hasher.finish()
    sha_differs = task.record is not None and result.sha256 != task.record.sha256
    if sha_differs and not strict:
        walk = _TarWalk(task, shard.view, shard.size, strict=True)  # name what is wrong
        walk.run(None)
    unchanged = not walk.sample_problem_keys and not shard.size_differs
    detail = ("; every sample still matches the index, so what changed is in tar headers or padding, "
              "or metadata's record of the shard") if unchanged else ""
    result.problems = (shard.problems + metadata_mismatches(task, result.sha256, len(walk.found), "samples", detail)
                       + walk.problems)
    return walk


class _TarWalk:
    """One walk over a tar shard's members, comparing each sample with the index.

    strict=False (the shard is expected to be intact; its sha256 decides): headers, names,
    completeness, keys, labels and offsets are checked for every sample, each label's class
    name once per shard. strict=True (the shard is known or likely to be damaged, or the user
    asked for everything): every payload is hashed and every json parsed as well, and with
    `deep` every payload is decoded.
    """

    def __init__(self, task, view, size, strict):
        self.task, self.view, self.size, self.strict = task, view, size, strict
        self.name = task.name
        self.index = SampleIndex(task.samples)
        self.problems = []
        self.found = []  # keys in shard order
        self.seen = set()
        self.damaged = set()  # keys already reported as unreadable: no "missing" line for them
        self.sample_problem_keys = set()
        self.checked_labels = set()  # labels whose class name was checked against a sample's json
        self.label_texts = {label: str(label).encode() for label in range(len(task.classes))}
        self.expected_exts = {"cls", "json", task.payload_ext}
        self.payloads_hashed = 0
        self.payloads_decoded = 0

    def problem(self, text, key=None):
        self.problems.append(error(self.name, text, key))
        if key is not None:
            self.sample_problem_keys.add(key)

    def run(self, hasher):
        task, index = self.task, self.index
        offset = 0
        end_of_members = None
        group = None
        # A sample's range starts where the previous one ended (where the walk starts, for the first),
        # as the indexers count it: pax and GNU long-name headers before its first member are its own.
        # (Every member of a reference shard has a pax header, written for its float mtime.)
        sample_start = offset
        next_hash_at = HASH_STEP if hasher is not None else float("inf")
        while True:
            last = None
            try:
                # Header checksums: in the fast walk the shard's sha256 covers every header byte (a
                # bad checksum means a sha256 mismatch, and then the strict walk names it).
                for member in iter_tar_members(task.name, offset=offset, verify_checksums=self.strict,
                                               buffer=self.view):  # the one mapping: pages fault once
                    member_end = member.data_offset + len(member.data)
                    if member_end >= next_hash_at:  # feed the shard hash as the walk advances
                        hasher.advance(member_end)
                        next_hash_at = hasher.done + HASH_STEP
                    member_name = member.name
                    key, ext = split_key(member_name)
                    if member_name[:1] == "/" or ".." in member_name or "\\" in member_name:
                        if unsafe_member_name(member_name):
                            self.problem(f"unsafe member name {member_name!r} (absolute or with '..'): extracting "
                                         f"the shard would write outside its folder", key)
                    # A new sample starts at a new key, or at a member its sample already has: the
                    # same key again (webdataset stops there with "duplicate file name").
                    if group is None or key != group[0] or ext in group[2]:
                        if group is not None:
                            self.finish(*group)
                        group = (key, sample_start, {})
                    group[2][ext] = member
                    sample_start = member_end + (-len(member.data) % BLOCK)
                    last = member
                if last is not None:
                    end_of_members = last.data_offset + len(last.data) + (-len(last.data) % BLOCK)
                if group is not None:
                    self.finish(*group)
                    group = None
                break
            except TarFormatError as exc:
                at = index.at(exc.offset)
                key = at.key if at is not None else (group[0] if group is not None else None)
                if group is not None:
                    self.finish(*group, broken=(group[0] == key))
                    group = None
                if key is not None:
                    self.damaged.add(key)
                self.problem(f"{exc.problem} (at byte {exc.offset:,})", key)
                end_of_members = None
                resume = index.next_start_after(exc.offset)
                if exc.problem.startswith("truncated") or resume is None or resume >= self.size:
                    break
                offset = sample_start = resume  # resynchronise on the next sample the index knows
        if end_of_members is not None:
            self.check_tail(end_of_members)
        for entry in task.samples:
            if entry.key not in self.seen and entry.key not in self.damaged:
                self.problem("listed in the sample index but not in the shard", entry.key)

    def check_tail(self, end_of_members):
        # Only zero blocks may follow the last member: anything else is members hidden behind a
        # zeroed header, or data appended after the archive.
        tail = self.view[end_of_members:]
        if len(tail) < 2 * BLOCK:
            self.problem(f"end-of-archive marker incomplete: {len(tail)} bytes after the last member")
            return
        stray = bytes(tail).lstrip(b"\0")
        if stray:
            at = self.size - len(stray)
            hit = self.index.at(at)
            if hit is not None:
                self.damaged.add(hit.key)
            self.problem(f"non-zero bytes after the end-of-archive marker (at byte {at:,}): the archive ends early "
                         f"or has data appended", hit.key if hit else None)

    def finish(self, key, offset, members, broken=False):
        self.found.append(key)
        if key in self.seen:
            self.problem("duplicated key: a second sample with this key in the same shard", key)
        self.seen.add(key)
        if broken:
            return
        entry = self.index.by_key.get(key)
        if not self.strict and entry is not None and members.keys() == self.expected_exts:
            payload = members[self.task.payload_ext]
            if (offset == entry.record_offset and payload.data_offset == entry.payload_offset
                    and len(payload.data) == entry.payload_size and entry.label in self.checked_labels
                    and bytes(members["cls"].data) == self.label_texts[entry.label]):
                return  # the common case: exactly as the index says, its class already checked in this shard
        self.finish_slowly(key, offset, members, entry)

    def finish_slowly(self, key, offset, members, entry):
        task = self.task
        local = []
        if members.keys() != self.expected_exts:
            missing = sorted(self.expected_exts - set(members))
            if missing:
                local.append("incomplete sample: no " + ", ".join(f".{ext}" for ext in missing) + " member")
            for ext in sorted(set(members) - self.expected_exts):
                local.append(f"unexpected member {key}.{ext} (a sample holds .cls, .json and one .{task.payload_ext})")
        if entry is None:
            local.append(NOT_IN_INDEX)
        label_member = members.get("cls")
        if label_member is not None:
            info = members.get("json")
            label, field_problems = sample_field_problems(bytes(label_member.data), None if info is None else info.data,
                                                          task.classes, entry)
            local += field_problems
            if label is not None and not field_problems:
                self.checked_labels.add(label)
        payload = members.get(task.payload_ext)
        if entry is not None:
            if offset != entry.record_offset:
                local.append(f"sample starts at byte {offset:,}, the index says {entry.record_offset:,}")
            elif payload is not None and (payload.data_offset != entry.payload_offset
                                          or len(payload.data) != entry.payload_size):
                local.append(f"payload at byte {payload.data_offset:,} ({len(payload.data):,} bytes), the index "
                             f"says {entry.payload_offset:,} ({entry.payload_size:,} bytes)")
        if payload is not None and self.strict:
            if entry is not None:
                self.payloads_hashed += 1
                why = payload_problem(entry, payload.data)
                if why:
                    local.append(f"{why}: the payload is corrupt")
            if task.deep:
                self.payloads_decoded += 1
                why = decode_problem(task.payload_ext, payload.data, task.tensor_layout)
                if why:
                    local.append(why)
        for text in local:
            self.problem(text, key)
