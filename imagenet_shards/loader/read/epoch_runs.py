"""One DataLoader iteration across epochs: the workers run on into the next epoch while the main
process finishes this one (`EpochRuns`, used by imagenet_shards/loader/image_loader.py).

Why: a DataLoader iteration per epoch costs a reset handshake with every worker, a fresh dataset
iterator in each and an end-of-iteration message from each (~3 ms of CPU an epoch here, 28 us an
image on a 106-image validation split), and the workers sit idle from the end of one epoch until
the training loop asks for the next: on an H200, 3 epoch starts were 26 of 31 points of data wait.

The contract between the two sides (the workers: `worker_messages`, ImageStream.__iter__, each
epoch's batches from imagenet_shards/loader/read/read_loop.py):
  * `RunFlags` (shared memory) hold a generation and the epoch it starts at. A worker reads them
    when it starts and after each epoch it finished; while the generation is unchanged it goes on
    with the next epoch (epoch + 1, what `for` without set_epoch asks for next, too).
  * Every message (batch or report) carries (generation, epoch). A worker checks the generation
    after each message it sent and abandons an epoch the main process no longer wants.
  * The main process asks for epoch E: if the workers' generation runs into E (the previous epoch
    was read to its end and E follows it), it goes on; otherwise it starts a new generation at E
    and throws away what was sent for the old one (their ring buffers go back to the workers).
  * An epoch's messages are handed out in the order one DataLoader iteration of that epoch would
    give: worker 0, 1, ... in turn, a worker that sent its report leaving the turn; the epoch ends
    with the last report. What a worker sent ahead of its turn waits in its queue.
  * Every worker sends the same number of messages an epoch (the most batches any worker has, + its
    report), adding `Filler`s after its report: DataLoader asks worker k mod W for task k, so a
    worker with one batch fewer would otherwise run one message further ahead every epoch, its
    batches piling up in the main process (and its ring running out of buffers).
"""

from __future__ import annotations

import os
import traceback
from collections import deque
from typing import NamedTuple

import torch
from torch.utils.data import get_worker_info

from imagenet_shards.loader.output.batch_ring import RingMessage, SharedFlags
from imagenet_shards.loader.read import worker_shards
from imagenet_shards.loader.output.reports import WorkerReport

EPOCH_BITS = 32  # generation and epoch share one int64, so a worker never reads one without the other


class Filler(NamedTuple):
    """A worker's message after its report that only keeps the workers' turns aligned (dropped)."""

    sender: int
    run: tuple


class RunFlags:
    """(generation, first epoch) in shared memory, written by the main process, read by workers."""

    def __init__(self, epoch: int = 0):
        self._flags = SharedFlags(1, 0)
        self.set(0, epoch)

    def set(self, generation: int, epoch: int) -> None:
        if not 0 <= epoch < 1 << EPOCH_BITS - 1:
            raise ValueError(f"epoch must be between 0 and {(1 << EPOCH_BITS - 1) - 1}, got {epoch}")
        self._flags.values[0] = generation << EPOCH_BITS | epoch

    def read(self) -> tuple:
        value = int(self._flags.values[0])
        return value >> EPOCH_BITS, value & ((1 << EPOCH_BITS) - 1)

    def generation(self) -> int:
        return int(self._flags.values[0]) >> EPOCH_BITS


class EpochRuns:
    """The main process's side: `messages(epoch)` yields one epoch's messages from a DataLoader
    iterator that is kept across epochs (see the module docstring)."""

    def __init__(self, dataloader, flags: RunFlags, workers: int, discard, read_ahead: bool = True):
        self.dataloader, self.flags, self.workers = dataloader, flags, max(workers, 1)
        # False: every epoch is a generation and a DataLoader iteration of its own, and the workers
        # stop at its end (ImageStream.spans_epochs False): nothing is read before it is asked for.
        self.read_ahead = read_ahead
        self.discard = discard  # called with each message thrown away (the ring takes its buffer back)
        self.iterator = None
        self.generation = flags.generation()
        self.next_epoch = None  # the epoch the current generation goes on with, when the last one ended whole
        self.queues = [deque() for _ in range(self.workers)]

    def messages(self, epoch: int):
        if self.iterator is None or self.next_epoch != epoch or not self.read_ahead:
            self._start(epoch)
        self.next_epoch = None  # until this epoch is read to its end
        turns, finished, worker = self.workers, [False] * self.workers, 0
        try:
            while turns:
                while finished[worker]:
                    worker = (worker + 1) % self.workers
                message = self._take(worker, epoch)
                if isinstance(message, WorkerReport):  # this worker's epoch is done
                    finished[worker], turns = True, turns - 1
                yield message
                worker = (worker + 1) % self.workers
        except GeneratorExit:  # the caller stopped mid-epoch: the next epoch starts a new generation
            raise
        except BaseException as error:  # a worker failed (or timed out): iterate the DataLoader afresh next time
            self._close()
            # DataLoader re-raises a worker's error from a frame that holds it: error -> traceback ->
            # frame -> error, a cycle that keeps the DataLoader iterator for the garbage collector,
            # which closes its queues before the iterator's shutdown can use them (5 s per worker).
            # The finished frames' locals go; the traceback keeps its files and lines.
            traceback.clear_frames(error.__traceback__)
            raise
        self.next_epoch = epoch + 1

    def _close(self) -> None:
        """Stop the iterator's workers now. A persistent DataLoader keeps its iterator, and torch's SIGCHLD handler
        the iterator's worker pids: a dead worker would be raised again, from wherever the main process is, at
        the next exit of any child process (pytest's INTERNALERROR after test_file_kind_fuzz's worker death)."""
        iterator, self.iterator = self.iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        if getattr(self.dataloader, "_iterator", None) is iterator:
            self.dataloader._iterator = None

    def _start(self, epoch: int) -> None:
        self.generation += 1
        self.flags.set(self.generation, epoch)
        for queue in self.queues:
            while queue:
                self.discard(queue.popleft())
        if self.iterator is None or not self.read_ahead:
            self.iterator = iter(self.dataloader)  # a persistent DataLoader's iter() restarts its workers

    def _take(self, worker: int, epoch: int):
        """The next message of DataLoader worker `worker` in this generation; others' are queued."""
        queue = self.queues[worker]
        while not queue:
            try:
                message = next(self.iterator)
            except StopIteration:
                raise RuntimeError("the DataLoader's workers stopped before the epoch's end") from None
            generation, _ = message.run
            if generation != self.generation:
                self.discard(message)
            elif not isinstance(message, Filler):
                self.queues[sender(message)].append(message)
        message = queue.popleft()
        if message.run[1] != epoch:  # a worker's epochs follow each other within a generation
            raise RuntimeError(f"DataLoader worker {worker} sent epoch {message.run[1]} where {epoch} was due")
        return message


def sender(message) -> int:
    """The DataLoader worker that sent a message (a RingMessage's `worker`, a WorkerReport's `sender`)."""
    return message.worker if isinstance(message, RingMessage) else message.sender

# ------------------------------------------------------------------ the workers' side


def worker_messages(stream):
    """ImageStream.__iter__ in a worker: the messages of the epoch `run_flags` name and, with
    `spans_epochs`, epoch after epoch from there, starting again where a new generation says."""
    info = get_worker_info()
    workers = (info.id, info.num_workers) if info is not None else (0, 1)
    if info is not None:
        worker_shards.enter_worker(stream.worker_table, info.id, os.getpid())
    generation = None
    while True:
        if stream.run_flags.generation() != generation:
            generation, epoch = stream.run_flags.read()
        finished = yield from _epoch_messages(stream, epoch, generation, workers, info is not None)
        if not stream.spans_epochs:
            return
        if finished:
            epoch += 1


def _epoch_messages(stream, epoch, generation, workers, shared):
    """Yield this worker's batches of `epoch`, its report, then Fillers; False if abandoned midway
    because the run flags moved past `generation` (checked after each message sent)."""
    worker, count = workers
    planner = stream.planner
    plan = planner.plan(epoch)
    resume = planner.resume_for(epoch)
    # Resumed: DataLoader worker d plays planned worker (d + next) % W, from where it stopped.
    rotation, done = resume.start(planner.instance.index, count) if resume is not None else (0, None)
    logical = (worker + rotation) % count
    items = plan.worker_items(logical, count)
    report = WorkerReport(logical, sender=worker, run=(generation, epoch))
    sent = 0
    if len(items):
        torch.set_num_threads(1)
        batches = stream.read_loop.batches(items, plan, epoch, (logical, worker), resume.number if resume else 0,
                                           done[logical] if done else (0, 0), report, shared, stream.ring,
                                           stream.byte_ring, plan.worker_sample_ids(logical, count))
        for message in batches:
            yield message._replace(run=report.run)
            sent += 1
            if stream.run_flags.generation() != generation:
                batches.close()
                return False
    report.cache = stream.read_loop.take_cache_events()
    yield report
    if stream.spans_epochs:
        for _ in range(messages_per_worker(plan, count, done) - 1 - sent):
            yield Filler(worker, report.run)
    return True


def messages_per_worker(plan, workers: int, done) -> int:
    """What each worker sends in an epoch: the most batches any (planned) worker has left, + its report."""
    return 1 + max(batches - (int(done[w][0]) if done else 0) for w, batches in enumerate(plan.worker_batches(workers)))


def discard(ring, message) -> None:
    """A message of an epoch no longer wanted: its ring buffer goes back to its worker."""
    if isinstance(message, RingMessage):
        ring.receive(message)
        ring.release_returned()
