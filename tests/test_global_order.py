"""The global train order (get_data's order="global"; imagenet_shards/loader/global_order.py).

Pure planner checks on integers, then the loader on the converted sample dataset (36 train samples,
shards of 8): the same flat key sequence for (instances, workers) = (1, 0), (2, 2) and (4, 1),
instances simulated in-process with `instance=(i, N)` and, for (2, 2), under torchrun with gloo
gathering the keys; a torchrun job of 2 ranks killed mid-epoch (SIGKILL) and resumed on 3
continues the flat sequence; the ledger verifies both.
"""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import PYTHON, REPO
from imagenet_shards.balance import instance_counts
from imagenet_shards.ledger import main as ledger_main
from imagenet_shards.loader import DataSource, GlobalOrder, TrainCrop, get_data
from imagenet_shards.loader.global_order import FlatLayout, check_layout, deal_batches, flat_sequence, plan_flat
from imagenet_shards.loader.share_plan import PlanError

SEED, BATCH, PARTITIONS = 7, 3, 12  # 12: 2, 3 and 4 instances divide it


def steps(per_rank):
    """Every step's global batch (rank 0's batch k, rank 1's, ...), concatenated."""
    out = []
    for step in range(max(len(batches) for batches in per_rank)):
        for batches in per_rank:
            if step < len(batches):
                out.extend(batches[step])
    return out


# ------------------------------------------------------------------------------------------ pure


@pytest.mark.parametrize("total,policy", [(1000, "drop"), (1003, "drop"), (1003, "pad"), (64 * 7 + 5, "pad")])
def test_flat_sequence_holds_each_kept_sample_once_and_names_the_tail(total, policy):
    layout = FlatLayout(total, 8, 5, policy)
    flat = flat_sequence(layout, seed=3, epoch=1, block=16)
    assert len(flat) == len(layout) and len(layout) % (8 * 5) == 0
    mask = layout.padded_mask()
    kept = flat.positions[~mask]
    assert len(set(kept.tolist())) == len(kept)  # no sample twice but the padded slots
    assert sorted(kept.tolist() + flat.dropped.tolist()) == list(range(total))
    if policy == "drop":
        assert not mask.any() and len(flat.dropped) == total - len(flat)
    else:
        assert not len(flat.dropped) and set(flat.positions[mask].tolist()) <= set(kept.tolist())


def test_flat_sequence_depends_on_seed_and_epoch_only():
    layout = FlatLayout(500, 4, 8, "drop")
    first = flat_sequence(layout, 1, 2).positions
    assert (first == flat_sequence(layout, 1, 2).positions).all()
    assert not (first == flat_sequence(layout, 1, 3).positions).all()
    assert not (first == flat_sequence(layout, 2, 2).positions).all()


@pytest.mark.parametrize("instances", [1, 2, 4, 8])
def test_every_instance_count_dividing_p_reads_the_flat_sequence_and_only_its_partitions(instances):
    layout = FlatLayout(1000, 8, 5, "drop")
    flat = flat_sequence(layout, seed=0, epoch=4)
    bounds = np.cumsum([0] + instance_counts(1000, 8, "spread"))
    plans = [plan_flat(np.arange(len(flat)), layout, i, instances) for i in range(instances)]
    per_rank = [[p.items[k * 5:(k + 1) * 5].tolist() for k in range(p.batches)] for p in plans]
    assert steps(per_rank) == list(range(len(flat)))  # the deal, in flat positions
    for i, plan in enumerate(plans):  # bytes 1x: instance i reads partitions i, i + N, ... only
        partitions = set(np.searchsorted(bounds, flat.positions[plan.items], side="right") - 1)
        assert partitions == set(range(i, 8, instances))


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_strided_workers_hand_out_the_plan_in_order_round_robin(workers):
    plan = plan_flat(np.arange(60), FlatLayout(60, 4, 3, "drop"), 0, 1)
    per_worker = [plan.worker_items(w, workers).tolist() for w in range(workers)]
    assert [sum(1 for _ in range(0, len(w), 3)) for w in per_worker] == plan.worker_batches(workers)
    batches = [[w[k:k + 3] for k in range(0, len(w), 3)] for w in per_worker]
    assert steps(batches) == plan.items.tolist()


def test_a_segment_tail_is_dropped_or_padded_and_named():
    indices, padded, dropped = deal_batches(24, 1, 3, 3, "drop")  # 8 batches over 3: 2 each, 2 dropped
    assert indices.tolist() == [3, 4, 5, 12, 13, 14] and dropped.tolist() == list(range(18, 24))
    indices, padded, dropped = deal_batches(24, 2, 3, 3, "pad")  # 3 each: batch 8 wraps to batch 0
    assert indices.tolist() == [6, 7, 8, 15, 16, 17, 0, 1, 2] and padded.tolist() == [0, 1, 2]


def test_instance_counts_that_do_not_divide_p_or_too_few_samples_are_refused():
    with pytest.raises(PlanError, match="divides it, got 3"):
        check_layout(FlatLayout(1000, 64, 8, "drop"), 3)
    with pytest.raises(PlanError, match="no whole batch"):
        check_layout(FlatLayout(100, 64, 8, "drop"), 1)
    with pytest.raises(PlanError, match="cannot fill 64 partitions"):
        check_layout(FlatLayout(40, 64, 8, "pad"), 1)
    with pytest.raises(PlanError, match="unknown order"):
        get_data(DataSource("synthetic", synthetic_length=64), "train", 3, 0, order="random",
                 transform=TrainCrop(image_size=8))


# ------------------------------------------------------------------------------------------ the loader


def make(source, instance, workers, epoch=3, **options):
    return get_data(source, "train", BATCH, workers, normalization="device", with_keys=True, seed=SEED, epoch=epoch,
                    instance=instance, order=GlobalOrder(partitions=PARTITIONS), **options)


def flat_keys(source, instances, workers, **options):
    per_rank = [[list(keys) for _, _, keys in make(source, (i, instances), workers, **options)]
                for i in range(instances)]
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps
    return steps(per_rank)


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


def test_one_flat_sequence_for_1x0_2x2_4x1_and_validation_keeps_its_order(img):
    reference = flat_keys(img, 1, 0)
    assert len(reference) == 36 and len(set(reference)) == 36
    assert flat_keys(img, 2, 2) == reference
    assert flat_keys(img, 4, 1) == reference
    today = [k for _, _, keys in get_data(img, "train", BATCH, 0, normalization="device", with_keys=True, seed=SEED,
                                          epoch=3) for k in keys]
    assert sorted(today) != today and today != reference  # another order, the same samples
    validation = [[k for _, _, keys in get_data(img, "validation", BATCH, 0, normalization="device", with_keys=True,
                                                instance=(0, 2), order=order) for k in keys]
                  for order in (None, "global")]
    assert validation[0] == validation[1]


def test_a_flat_batch_is_augmented_alike_at_any_scale(img):
    """Train crops and flips are drawn per flat batch: the same pixels for (1, 0), (2, 2) and (4, 1)."""
    import torch

    def flat_images(instances, workers):
        per_rank = [[(list(keys), images.clone()) for images, _, keys in make(img, (i, instances), workers,
                                                                             transform=TrainCrop(image_size=32))]
                    for i in range(instances)]
        return [per_rank[rank][step] for step in range(len(per_rank[0])) for rank in range(instances)]

    reference = flat_images(1, 0)
    for instances, workers in ((2, 2), (4, 1)):
        other = flat_images(instances, workers)
        assert [keys for keys, _ in other] == [keys for keys, _ in reference]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(other, reference))


RANKS = """
import json, os, signal, sys
import torch.distributed as dist
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import GlobalOrder, get_data
phase, source, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo")
instance = detect_instance()
def loader(epoch=3):
    return get_data(source, "train", 3, workers, normalization="device", with_keys=True, seed=7, epoch=epoch,
                    instance=instance, order=GlobalOrder(partitions=12))
def gather(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values
if phase == "full":
    json.dump(gather([list(keys) for _, _, keys in loader()]), open(f"{out}/full.json", "w"))
    train = loader()
    iterator = iter(train)
    batches = [list(next(iterator)[2]) for _ in range(2)]
    states = gather(train.state_dict())
    if instance.index == 0:
        json.dump({"states": states, "batches": gather(batches)}, open(f"{out}/killed.json", "w"))
    else:
        gather(batches)
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, its DataLoader workers running
else:
    train = loader(epoch=0)
    train.load_state_dict(json.load(open(f"{out}/killed.json"))["states"])
    batches = [list(keys) for _, _, keys in train]
    train.write_ledger(f"{out}/ledger-{instance.index}.json")
    dropped = train.report.policy_dropped
    json.dump(gather({"batches": batches, "dropped": dropped}), open(f"{out}/resumed.json", "w"))
"""


def torchrun(processes, *args):
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes), *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_torchrun_2x2_reads_the_flat_sequence_and_a_kill_resumed_on_3_continues_it(img, tmp_path, capsys):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    killed = torchrun(2, script, "full", img, tmp_path, 2)
    assert (tmp_path / "killed.json").exists(), killed.stdout[-3000:] + killed.stderr[-3000:]
    assert killed.returncode != 0  # the ranks killed themselves
    reference = flat_keys(img, 1, 0)
    assert steps(json.loads((tmp_path / "full.json").read_text())) == reference
    resumed = torchrun(3, script, "resume", img, tmp_path, 1)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    before = steps(json.loads((tmp_path / "killed.json").read_text())["batches"])
    ranks = json.loads((tmp_path / "resumed.json").read_text())
    after = steps([rank["batches"] for rank in ranks])
    # 12 flat batches, 4 delivered on 2 ranks; 8 left over 3 ranks: 2 each, the last 2 batches dropped
    assert len(before) == 12 and len(after) == 18
    assert before + after == reference[:30]
    assert all(sorted(rank["dropped"]) == sorted(reference[30:]) for rank in ranks)
    ledgers = [str(tmp_path / f"ledger-{i}.json") for i in range(3)]
    assert ledger_main(["verify", *ledgers]) == 0, capsys.readouterr().out
    assert "OK: every sample of the epoch delivered" in capsys.readouterr().out


def test_scattered_rows_read_shard_by_shard_give_what_the_runs_give(img, monkeypatch):
    """The block-shuffled order's reads (source_kinds/shards.py: a chunk read one shard at a time, then
    handed out in item order) yield the same tuples as reading run by run, a damaged payload included."""
    from imagenet_shards.loader.source_kinds import ReadContext, shards
    from imagenet_shards.loader.sources import resolve_source

    source = resolve_source(str(img), "train")
    context = ReadContext(source, source.columns, True, False, 0)
    rows = np.random.default_rng(1).permutation(len(source.columns))
    assert shards._scattered(source.columns, rows) and not shards._scattered(source.columns, np.sort(rows))
    monkeypatch.setattr(shards, "SCATTER_CHUNK", 5)  # chunk boundaries inside the 36 rows

    def read(samples):
        return [(row, shard, label, bytes(payload) if payload is not None else None, kind, error)
                for row, shard, label, payload, kind, error in samples]

    expected = read(shards._sequential_samples(context, rows))
    assert read(shards._scattered_samples(context, rows)) == expected
    assert [sample[0] for sample in expected] == rows.tolist()
    checksums = source.columns.checksums.copy()  # a payload whose recorded CRC32C no longer matches
    source.columns.checksums[rows[7]] ^= 1
    try:
        damaged = read(shards.SHARDS.raw_samples(context, rows))
    finally:
        source.columns.checksums[:] = checksums
    assert [sample[5] is not None for sample in damaged] == [n == 7 for n in range(len(rows))]
