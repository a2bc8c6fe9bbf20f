"""A worker's reading order: the shuffle buffer, and the seeds of its generators.

Worker order. Worker w of an instance reads its contiguous run of whole batches (share_plan.py)
in the order `buffer_order` gives: the shuffle buffer's output, computed on indices with its own
generator (`order_rng`), so it does not depend on the augmentations' random draws (those come
from `augment_rng`, one per batch). DataLoader hands batches over round-robin over the workers,
starting at worker 0; a resumed worker d plays worker (d + next) % W, so the round-robin resumes
where it stopped.

read/read_loop.py reads in this order; resume.py recomputes it to know what a worker delivered.
"""

from __future__ import annotations

import random

import numpy as np


def _tag(seed, epoch, segment, instance, worker) -> str:
    base = f"{seed}/{epoch}/{instance}/{worker}"
    return base if segment == 0 else f"{base}/s{segment}"


def order_rng(seed, epoch, segment, instance, worker) -> random.Random:
    """The shuffle buffer's generator of one worker (nothing else draws from it)."""
    return random.Random(_tag(seed, epoch, segment, instance, worker) + "/order")


def augment_rng(seed, epoch, segment, instance, worker, batch) -> random.Random:
    """The augmentations' generator for one batch of one worker: a resumed batch is augmented alike."""
    return random.Random(f"{_tag(seed, epoch, segment, instance, worker)}/b{batch}")


def buffer_order(count: int, size: int, rng) -> np.ndarray:
    """The order in which a shuffle buffer of `size` emits `count` inputs (as input indices):
    fill the buffer, then for each further input emit a random slot's and put it there; at the
    end shuffle the buffer and emit it. `size` <= 1: input order."""
    if size <= 1 or count <= 1:
        return np.arange(count, dtype=np.int64)
    buffer, out = [], []
    for index in range(count):
        if len(buffer) < size:
            buffer.append(index)
            continue
        slot = rng.randrange(size)
        out.append(buffer[slot])
        buffer[slot] = index
    rng.shuffle(buffer)
    out.extend(buffer)
    return np.asarray(out, dtype=np.int64)


def shuffled(items, size: int, rng):
    """The streaming twin of `buffer_order`: the same draws, so the same order, without computing
    it first (a fresh epoch's first batch waits for no pass over the worker's items)."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        slot = rng.randrange(size)
        yield buffer[slot]
        buffer[slot] = item
    rng.shuffle(buffer)
    yield from buffer


def in_order(raw, inputs: np.ndarray, order: np.ndarray):
    """`raw` yields the samples of `inputs` (ascending input indices) in that order; yield them in
    `order` (a permutation of `inputs`). Holds at most what a shuffle buffer would."""
    pending, source, arriving = {}, iter(raw), iter(inputs.tolist())
    for wanted in order.tolist():
        while wanted not in pending:
            pending[next(arriving)] = next(source)
        yield pending.pop(wanted)


def pick(items, indices):
    """items[indices] for an int array of rows or a list of items."""
    if isinstance(items, np.ndarray):
        return items[np.asarray(indices, dtype=np.int64)]
    return [items[i] for i in np.asarray(indices).tolist()]
