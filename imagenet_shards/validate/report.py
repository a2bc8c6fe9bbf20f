"""The validator's result: a `Report` of verdicts, problems, notes and stats, and its exit code.

Contract: every check in imagenet_shards.validate returns its findings as `Problem` records
(imagenet_shards.formats.shard_check) collected in a `Report`; nothing prints. `Report.exit_code` is 0
when no problem is an error (warnings allowed) and 1 otherwise; `ValidationUsageError` is a path
that cannot be validated at all (exit code 2). `verdict_lines` are the reference harness's lines
(`Dataset OK.` / `Dataset is corrupted.`); `to_json` is what `validate_dataset.py --json` writes;
`sorted_problems` is the one order a report lists its problems in. validate_dataset.py renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from imagenet_shards.formats.shard_check import ERROR, WARNING
from imagenet_shards.errors import UsageError


class ValidationUsageError(UsageError):
    """The path cannot be validated at all (missing, unreadable, not a dataset): exit code 2."""


@dataclass
class Report:
    path: str
    mode: str  # "converted" or "raw"
    verdicts: dict = field(default_factory=dict)  # label ("Dataset", "Train data", ...) -> ok
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # informational lines, no effect on the verdict
    stats: dict = field(default_factory=dict)
    upgrade: str = ""  # the command a dataset of an earlier layout needs first (then: no verdict line)

    @property
    def errors(self):
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self):
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def verdict_lines(self):
        """The reference harness's lines: `Dataset OK.` / `Dataset is corrupted.`, `Train data OK.` ..."""
        return [f"{label} OK." if ok else f"{label} is corrupted." for label, ok in self.verdicts.items()]

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "mode": self.mode,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "verdicts": self.verdict_lines(),
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
            "stats": dict(self.stats),
            **({"upgrade": self.upgrade} if self.upgrade else {}),
        }


def sorted_problems(problems):
    # Errors first, grouped by file; within a file the order they were found in (a shard's own
    # problems, then its samples in shard order), which sorted() keeps as it is stable.
    return sorted(problems, key=lambda p: (p.severity != ERROR, p.file))

