"""Which shard each DataLoader worker is reading, in shared memory, so that a worker's death is named.

Why: a corrupt LMDB file can crash the process that maps it (LMDB's design: it trusts its pages), and
a worker can be killed (the kernel's OOM killer, a scheduler). DataLoader then raises "DataLoader worker
(pid(s) N) exited unexpectedly", which names no file. Each worker writes its pid and the shard it is
about to read into one row of a small shared table (two integers a run of samples, not a sample); the
main process turns the death into a WorkerDiedError naming the dataset and that shard.
"""

from __future__ import annotations

import os
import re
import time
from typing import Optional

from imagenet_shards.errors import Error

_own = None  # in a worker: (the shared table, this worker's row)


class WorkerDiedError(Error, RuntimeError):
    """A DataLoader worker died mid-epoch: names the shard it was reading."""


def shared_table(workers: int) -> Optional["torch.Tensor"]:
    """The table of `workers` rows (pid, shard id + 1), in shared memory; None without workers."""
    import torch  # here, not at the top: the source kinds import this module, and the commands that only
    # read indexes (inspect_dataset.py, ledger) would pay torch's import (~2.5 s) in every process

    return torch.zeros((workers, 2), dtype=torch.int64).share_memory_() if workers > 0 else None


def enter_worker(table: Optional["torch.Tensor"], worker: int, pid: int) -> None:
    """In a worker, before it reads: its row of `table` is this process's."""
    global _own
    if table is not None:
        table[worker, 0], table[worker, 1] = pid, 0
        _own = (table, worker)


def reading(shard_id: int) -> None:
    """In a worker: it is about to read the shard `shard_id` (of the columns' shard_names)."""
    if _own is not None:
        _own[0][_own[1], 1] = shard_id + 1


def is_worker_death(error: BaseException) -> bool:
    """Whether `error` is DataLoader's news of a worker's death. torch raises it from its SIGCHLD handler
    wherever the main process is at that moment (a training step, not only the loader's iteration)."""
    text = str(error)
    return isinstance(error, RuntimeError) and "DataLoader worker" in text and \
        ("exited unexpectedly" in text or "killed by signal" in text)


PIPE_BROKEN = (EOFError, ConnectionError)  # a worker died while sending a batch: its pipe ends mid-message


def death_of(error: BaseException, table: Optional["torch.Tensor"], shard_names, description: str):
    """The WorkerDiedError for DataLoader's worker-death `error` (or a pipe broken by a worker that has exited),
    or None when it is not one."""
    text = str(error)
    if table is None:
        return None
    if isinstance(error, PIPE_BROKEN):
        pids = exited_workers(table)
        if not pids:
            return None
    elif is_worker_death(error):
        listed = re.search(r"pid(?:\(s\))?\s*([\d,\s]+)", text)  # "(pid 12)", "(pid(s) 12, 13)"
        pids = {int(pid) for pid in re.findall(r"\d+", listed.group(1))} if listed else set()
    else:
        return None
    named = []
    for worker, (pid, shard) in enumerate(table.tolist()):
        if pid in pids:
            where = shard_names[shard - 1] if shard_names is not None and 0 < shard <= len(shard_names) else None
            named.append(f"worker {worker} (pid {pid}) died while reading {where}" if where else
                         f"worker {worker} (pid {pid}) died; no shard recorded (before its first, or a source without shards)")
    what = "; ".join(named) or text
    return WorkerDiedError(f"{description}: {what}: the epoch ends here (a corrupt shard can crash the process "
                           f"that maps it, e.g. an LMDB file: validate_dataset.py names it; or the worker was "
                           f"killed, e.g. for memory)")


def exited_workers(table, wait_s: float = 2.0) -> set:
    """The pids in the worker table whose process has exited (gone, or a zombie not yet reaped), waiting up to
    `wait_s` for the one whose broken pipe the main process saw first."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = {pid for pid, _ in table.tolist() if pid and _exited(pid)}
        if pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:  # no such process (or no /proc: then a broken pipe stays the error it is)
        return os.path.isdir("/proc/self")
