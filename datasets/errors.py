"""The package's exceptions have one root, so a script maps them to exit codes in one place.

    DatasetError     bad data or an unusable dataset: the message names the file and the problem (exit 1)
    UsageError       a request that cannot be carried out as asked: bad options, a refused command (exit 2)

Every error the package raises on purpose derives from one of these, and keeps the base it had before
(ValueError, OSError, ...), so that a caller's `except ValueError` still catches what it caught.
`exit_code` is the one mapping the scripts use.
"""

from __future__ import annotations

EXIT_OK, EXIT_DATA, EXIT_USAGE = 0, 1, 2


class DatasetError(Exception):
    """A dataset, shard or file that cannot be used: names the file and the problem."""


class UsageError(DatasetError, ValueError):
    """A request that cannot be carried out as asked (bad options, a refused command)."""


def exit_code(error: BaseException) -> int:
    """The exit status a script ends with for `error`: EXIT_USAGE for a UsageError, else EXIT_DATA."""
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_DATA
