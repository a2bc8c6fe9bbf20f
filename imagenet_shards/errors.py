"""The package's exceptions have one root, `Error`, so a script maps them to exit codes in one place.

    Error            the root: every exception the package raises on purpose derives from it
      DatasetError   a dataset, shard or file that cannot be used: the message names it and the problem
      UsageError     a request that cannot be carried out as asked: bad options, a refused command (exit 2)

Each class keeps the base it had before (ValueError, OSError, RuntimeError, ...), so a caller's
`except ValueError` still catches what it caught. The root is not DatasetError itself: code that
catches DatasetError around a metadata or index read (to fall back, or to name the file) must not
start catching a storage outage or a bad option there. `exit_code` is the one mapping the scripts use.
"""

from __future__ import annotations

EXIT_OK, EXIT_DATA, EXIT_USAGE = 0, 1, 2


class Error(Exception):
    """The root of the package's exceptions."""


class DatasetError(Error):
    """A dataset, shard or file that cannot be used: names the file and the problem."""


class UsageError(Error):
    """A request that cannot be carried out as asked (bad options, a refused command)."""


def exit_code(error: BaseException) -> int:
    """The exit status a script ends with for `error`: EXIT_USAGE for a UsageError, else EXIT_DATA."""
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_DATA
