"""The converter's failures, and how a failed write names its file.

Contract: UsageError means exit code 2 (bad arguments, a target that must not be touched),
ConversionError exit code 1 (bad data with --on-error fail, an unreadable source, a full disk);
create_webdataset.py maps them. SampleSkipped is one sample that cannot be converted (skipped, or
a SampleFailure with --on-error fail); FileFailure and its kinds are picklable, so worker
processes raise them to the main process. `writing()` turns an OSError of a failed write into a
WriteFailure "<that file>: cannot write the <what>: <why>" and removes the file's .partial (and
its companions'), so a failed write leaves nothing behind.
"""

import errno
from contextlib import contextmanager

from imagenet_shards.errors import Error, UsageError  # noqa: F401  (UsageError: bad arguments, a target not to touch)
from imagenet_shards.fileio import partial_path


class ConversionError(Error):
    """The conversion failed (bad data with --on-error fail, unreadable source, full disk): exit code 1."""


class SampleSkipped(Error):
    """One sample cannot be converted: `reason` says why."""


class FileFailure(Error):
    """A problem with one file, shown as "<file>: <reason>" (picklable: workers raise these)."""

    def __init__(self, path, reason):
        super().__init__(str(path), reason)
        self.path = str(path)
        self.reason = reason

    def __str__(self):
        return f"{self.path}: {self.reason}"


class SampleFailure(FileFailure):
    """A bad sample with --on-error fail (raised in a worker, re-raised by the main process)."""


class WriteFailure(FileFailure):
    """Writing a file of the target failed (full disk, permissions): names the file being written."""


def write_problem(error: OSError) -> str:
    """What went wrong in a failed write, and for a full disk what to do about it."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"the disk is full ({error.strerror}); nothing incomplete was left under a final name: free "
                f"space, then run again with --resume (verified shards are kept)")
    return error.strerror or str(error)


@contextmanager
def writing(path, what: str, companions=()):
    """Report an OSError raised while writing `path` (a shard, a state record, an index, the
    metadata) as a WriteFailure naming that file: the OSError of a failed write() or fsync()
    carries no file name. The .partial files of `path` and its `companions` are removed: on a
    full disk the writers' own cleanup can stop early (close() retries the failed flush and
    raises again before the partial file is unlinked)."""
    try:
        yield
    except OSError as error:
        for written in (path, *companions):
            try:
                partial_path(written).unlink(missing_ok=True)
            except OSError:
                pass  # reported below with the write's own error
        raise WriteFailure(path, f"cannot write the {what}: {write_problem(error)}") from None
