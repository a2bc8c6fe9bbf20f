"""The global train order (get_data's order="global"; imagenet_shards/loader/plan/global_order.py).

Pure planner checks on integers, then the loader on the converted sample dataset (36 train samples,
shards of 8) with GlobalOrder(global_batch_size=16): the same global batches (sets of keys, step by
step) and pixels for (N, b) = (1, 16), (2, 8), (4, 4) with W in {0, 2}, ranks simulated in-process
with `instance=(i, N)`; under torchrun with gloo, G = 8: 2 ranks killed mid-epoch (SIGKILL) and
resumed on 4 deliver the uninterrupted run's global batches; the ledger verifies them.
"""

import json
import os
import subprocess

import numpy as np
import pytest

from conftest import PYTHON, REPO
from imagenet_shards.ledger import main as ledger_main
from imagenet_shards.loader import DataSource, GlobalOrder, TrainCrop, get_data
from imagenet_shards.loader.plan.global_order import (FlatLayout, check_layout, deal_batches, default_partitions,
                                                 flat_sequence, plan_flat)
from imagenet_shards.loader.plan.resume import ResumeError
from imagenet_shards.loader.plan.share_plan import PlanError

SEED = 7


def steps(per_rank):
    """Every step's global batch (rank 0's batch k, rank 1's, ...), concatenated."""
    out = []
    for step in range(max(len(batches) for batches in per_rank)):
        for batches in per_rank:
            if step < len(batches):
                out.extend(batches[step])
    return out


# ------------------------------------------------------------------------------------------ pure


@pytest.mark.parametrize("total,parts,g,policy", [(1000, 8, 16, "drop"), (1003, 8, 20, "drop"), (1003, 8, 20, "pad"),
                                                  (64 * 7 + 5, 64, 100, "pad"), (36, 16, 16, "drop")])
def test_flat_sequence_holds_each_kept_sample_once_and_names_the_tail(total, parts, g, policy):
    layout = FlatLayout(total, parts, g, policy)
    flat = flat_sequence(layout, seed=3, epoch=1, block=16)
    assert len(flat) == len(layout) == layout.global_batches * g
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


def partition_of(layout, flat, positions):
    bounds = np.cumsum([0] + layout.partition_sizes)
    return np.searchsorted(bounds, flat.positions[positions], side="right") - 1


@pytest.mark.parametrize("g", [64, 40, 12])  # P divides G; the remainder 8 (40 % 16) and G < P rotate
def test_a_global_batch_takes_its_share_of_every_partition_and_each_rank_its_own_partitions(g):
    layout = FlatLayout(1000, 16, g, "drop")
    flat = flat_sequence(layout, seed=0, epoch=4)
    shares = layout.shares()
    assert (shares.sum(axis=1) == g).all() and shares.max() - shares.min() <= 1
    for k in range(layout.global_batches):  # global batch k, partition by partition
        parts = partition_of(layout, flat, np.arange(k * g, (k + 1) * g))
        assert np.bincount(parts, minlength=16).tolist() == shares[k].tolist()
    for instances in (n for n in (1, 2, 4, 8, 16) if g % n == 0):
        plans = [plan_flat(np.arange(len(flat)), layout, i, instances) for i in range(instances)]
        b = g // instances
        per_rank = [[p.items[k * b:(k + 1) * b].tolist() for k in range(p.batches)] for p in plans]
        assert steps(per_rank) == list(range(len(flat)))  # rank r's batch k: flat kG + rB ... kG + (r+1)B - 1
        for i, plan in enumerate(plans):  # bytes 1x: rank i reads its own run of partitions only
            owned = set(range(i * 16 // instances, (i + 1) * 16 // instances))
            assert set(partition_of(layout, flat, plan.items).tolist()) <= owned


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_strided_workers_hand_out_the_plan_in_order_round_robin(workers):
    plan = plan_flat(np.arange(60), FlatLayout(60, 4, 3, "drop"), 0, 1)
    per_worker = [plan.worker_items(w, workers).tolist() for w in range(workers)]
    assert [sum(1 for _ in range(0, len(w), 3)) for w in per_worker] == plan.worker_batches(workers)
    batches = [[w[k:k + 3] for k in range(0, len(w), 3)] for w in per_worker]
    assert steps(batches) == plan.items.tolist()
    assert [plan.worker_sample_ids(w, workers).tolist() for w in range(workers)] == per_worker


def test_a_segment_tail_is_dropped_or_padded_and_named():
    indices, padded, dropped = deal_batches(24, 1, 3, 3, "drop")  # 8 batches over 3: 2 each, 2 dropped
    assert indices.tolist() == [3, 4, 5, 12, 13, 14] and dropped.tolist() == list(range(18, 24))
    indices, padded, dropped = deal_batches(24, 2, 3, 3, "pad")  # 3 each: batch 8 wraps to batch 0
    assert indices.tolist() == [6, 7, 8, 15, 16, 17, 0, 1, 2] and padded.tolist() == [0, 1, 2]


def test_default_partitions_follow_the_split_size_and_g_only():
    assert default_partitions(1_281_167, 1024) == 64  # ImageNet: N = 1, 2, 4, 8, 16 (and 32, 64) divide it
    for n in (1, 2, 4, 8, 16):
        check_layout(FlatLayout(1_281_167, 64, 1024, "drop"), n)
    assert default_partitions(36, 16) == 16 and default_partitions(36, 48) == 32 and default_partitions(5, 3) == 2
    assert default_partitions(10_000, 32) == 32 and default_partitions(10_000, 256) == 64


def test_what_the_global_order_cannot_serve_is_refused_in_one_line():
    with pytest.raises(PlanError, match="divides it, got 3"):
        check_layout(FlatLayout(1000, 64, 96, "drop"), 3)
    with pytest.raises(PlanError, match="cannot be split among 4 instances"):
        check_layout(FlatLayout(1000, 8, 18, "drop"), 4)
    with pytest.raises(PlanError, match="not a power of two"):
        check_layout(FlatLayout(1000, 12, 16, "drop"), 1)
    with pytest.raises(PlanError, match="no whole global batch of 128"):
        check_layout(FlatLayout(100, 64, 128, "drop"), 1)
    with pytest.raises(PlanError, match="cannot fill 64 partitions"):
        check_layout(FlatLayout(40, 64, 64, "pad"), 1)
    with pytest.raises(PlanError, match="unknown order"):
        get_data(DataSource("synthetic", synthetic_length=64), "train", 3, 0, order="random",
                 transform=TrainCrop(image_size=8))
    with pytest.raises(PlanError, match="batch_size 8 is not the global batch 16 / 4 instances = 4"):
        get_data(DataSource("synthetic", synthetic_length=64), "train", 8, 0, instance=(0, 4),
                 order=GlobalOrder(global_batch_size=16), transform=TrainCrop(image_size=8))


# ------------------------------------------------------------------------------------------ the loader

G = 16  # 36 samples: 2 global batches of 16 (default P = 16), 4 left out


def make(source, instance, workers, epoch=3, g=G, **options):
    return get_data(source, "train", None, workers, normalization="device", with_keys=True, seed=SEED, epoch=epoch,
                    instance=instance, order=GlobalOrder(global_batch_size=g), **options)


def global_batches(source, instances, workers, images=False, **options):
    """Step k's global batch as {key: image} (images) or a set of keys, for `instances` ranks in-process."""
    per_rank = [[(list(keys), pixels.clone() if images else None) for pixels, _, keys in
                 make(source, (i, instances), workers, **options)] for i in range(instances)]
    assert len({len(batches) for batches in per_rank}) == 1  # equal steps
    out = []
    for step in range(len(per_rank[0])):
        batch = {}
        for rank in per_rank:
            keys, pixels = rank[step]
            assert len(keys) == options.get("g", G) // instances
            batch.update({key: pixels[n] if images else None for n, key in enumerate(keys)})
        out.append(batch if images else set(batch))
    return out


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


def test_the_same_global_batches_and_pixels_for_n_b_1_16_2_8_4_4_and_w_0_2(img):
    """Keys and train crops (drawn per sample by its flat position): the same global batches at any scale."""
    import torch

    crop = TrainCrop(image_size=32)
    reference = global_batches(img, 1, 0, images=True, transform=crop)
    assert [len(batch) for batch in reference] == [16, 16]
    assert len(set().union(*map(set, reference))) == 32
    for instances, workers in ((1, 2), (2, 0), (2, 2), (4, 0), (4, 2)):
        other = global_batches(img, instances, workers, images=True, transform=crop)
        assert [set(batch) for batch in other] == [set(batch) for batch in reference], (instances, workers)
        assert all(torch.equal(batch[key], ref[key]) for batch, ref in zip(other, reference) for key in ref)
    today = [k for _, _, keys in get_data(img, "train", 16, 0, normalization="device", with_keys=True, seed=SEED,
                                          epoch=3) for k in keys]
    assert set(today[:16]) != reference[0].keys()  # another order
    validation = [[k for _, _, keys in get_data(img, "validation", 4, 0, normalization="device", with_keys=True,
                                                instance=(0, 2), order=order) for k in keys]
                  for order in (None, "global")]
    assert validation[0] == validation[1]


def test_the_default_p_serves_the_sample_dataset_and_is_in_the_state(img):
    loader = make(img, (0, 2), 0, g=8)
    state = loader.state_dict()
    assert state["order"] == {"name": "global", "partitions": 8, "block": 1 << 18, "global_batch_size": 8}
    assert loader.planner.batch_size == 4 and len(loader) == 4
    later = make(img, (0, 2), 0, g=16)
    with pytest.raises(ResumeError, match="saved with global batch size 8, this loader's is 16"):
        later.load_state_dict(state)


def test_a_resume_on_the_same_count_continues_each_worker_where_it_stopped(img):
    """Same N and W: the workers continue their own plans mid-way (no shuffle buffer under the global order)."""
    reference = [list(keys) for _, _, keys in make(img, (1, 2), 2, g=8)]
    loader = make(img, (1, 2), 2, g=8)
    iterator = iter(loader)
    before = [list(next(iterator)[2]) for _ in range(3)]
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    resumed = make(img, (1, 2), 2, epoch=0, g=8)
    resumed.load_state_dict(state)
    assert before + [list(keys) for _, _, keys in resumed] == reference


RANKS = """
import json, os, signal, sys
import torch.distributed as dist
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import GlobalOrder, get_data
phase, source, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo")
instance = detect_instance()
def loader(epoch=3):
    return get_data(source, "train", None, workers, normalization="device", with_keys=True, seed=7, epoch=epoch,
                    instance=instance, order=GlobalOrder(global_batch_size=8))
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


def rank_steps(per_rank):
    """Step k's global batch as a set of keys, from every rank's batches."""
    return [set().union(*(batches[step] for batches in per_rank)) for step in range(len(per_rank[0]))]


def test_torchrun_2_ranks_killed_and_resumed_on_4_with_g_kept_deliver_the_uninterrupted_global_batches(
        img, tmp_path, capsys):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    killed = torchrun(2, script, "full", img, tmp_path, 2)
    assert (tmp_path / "killed.json").exists(), killed.stdout[-3000:] + killed.stderr[-3000:]
    assert killed.returncode != 0  # the ranks killed themselves
    reference = global_batches(img, 1, 0, g=8)  # 4 global batches of 8 (P = 8), 4 samples left out
    assert rank_steps(json.loads((tmp_path / "full.json").read_text())) == reference
    resumed = torchrun(4, script, "resume", img, tmp_path, 1)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    before = rank_steps(json.loads((tmp_path / "killed.json").read_text())["batches"])
    ranks = json.loads((tmp_path / "resumed.json").read_text())
    after = rank_steps([rank["batches"] for rank in ranks])
    assert all(len(rank["batches"][0]) == 2 for rank in ranks)  # G / 4
    assert before + after == reference  # global batches 0, 1 on 2 ranks; 2, 3 on 4
    left_out = {k for _, _, keys in get_data(img, "train", 36, 0, with_keys=True, normalization="device",
                                             train=False) for k in keys} - set().union(*reference)
    assert all(set(rank["dropped"]) == left_out for rank in ranks)
    ledgers = [str(tmp_path / f"ledger-{i}.json") for i in range(4)]
    assert ledger_main(["verify", *ledgers]) == 0, capsys.readouterr().out
    assert "OK: every sample of the epoch delivered" in capsys.readouterr().out


def test_scattered_rows_read_shard_by_shard_give_what_the_runs_give(img, monkeypatch):
    """The block-shuffled order's reads (source_kinds/shards.py, told positions: a chunk read one shard at a
    time by the format's read_positions, then handed out in item order) yield the same tuples as reading run
    by run, a damaged payload included."""
    from imagenet_shards.loader.source_kinds import ReadContext, shards
    from imagenet_shards.loader.sources import resolve_source

    source = resolve_source(str(img), "train")
    runs = ReadContext(source, source.columns, True, False, 0)
    context = ReadContext(source, source.columns, True, False, 0, positions=True)
    rows = np.random.default_rng(1).permutation(len(source.columns))
    monkeypatch.setattr(shards, "POSITIONS_CHUNK", 5)  # chunk boundaries inside the 36 rows

    def read(samples):
        return [(row, shard, label, bytes(payload) if payload is not None else None, kind, error)
                for row, shard, label, payload, kind, error in samples]

    expected = read(shards.SHARDS.raw_samples(runs, rows))
    assert read(shards.SHARDS.raw_samples(context, rows)) == expected
    assert [sample[0] for sample in expected] == rows.tolist()
    checksums = source.columns.checksums.copy()  # a payload whose recorded CRC32C no longer matches
    source.columns.checksums[rows[7]] ^= 1
    try:
        damaged = read(shards.SHARDS.raw_samples(context, rows))
    finally:
        source.columns.checksums[:] = checksums
    assert [sample[5] is not None for sample in damaged] == [n == 7 for n in range(len(rows))]
