"""The planning rules of imagenet_shards/loader/plan/share_plan.py, on plain integers."""

from collections import Counter

import pytest

from imagenet_shards.loader.plan.share_plan import (
    PlanError,
    balance,
    batches_in,
    epoch_permutation,
    epoch_sequence,
    plan_instance,
    plan_own_share,
    worker_ranges,
)

SIZES = [1, 2, 5, 7, 12, 36, 37, 100, 1001]
COUNTS = [1, 2, 3, 4, 7, 8]


def test_epoch_permutation_is_seeded_and_changes_with_epoch():
    first = epoch_permutation(50, seed=3, epoch=0)
    assert sorted(first) == list(range(50))
    assert first == epoch_permutation(50, seed=3, epoch=0)
    assert first != epoch_permutation(50, seed=3, epoch=1)
    assert first != epoch_permutation(50, seed=4, epoch=0)
    assert epoch_permutation(1, 0, 0) == [0] and epoch_permutation(0, 0, 0) == []


def test_epoch_sequence_keeps_order_inside_groups():
    groups = [[f"s{g}-{i}" for i in range(g + 1)] for g in range(6)]
    sequence = epoch_sequence(groups, seed=0, epoch=2)
    assert sorted(sequence) == sorted(x for g in groups for x in g)
    # each group appears as one contiguous, ordered run
    for group in groups:
        start = sequence.index(group[0])
        assert sequence[start:start + len(group)] == group
    assert epoch_sequence(groups, 0, 2, shuffle=False) == [x for g in groups for x in g]


@pytest.mark.parametrize("total", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_spread_sees_every_sample_once(total, count):
    dealt = balance(total, count, "spread")
    seen = [p for i in range(count) for p in dealt.positions(i)]
    assert sorted(seen) == list(range(total))
    assert max(dealt.counts()) - min(dealt.counts()) <= 1
    assert not dealt.dropped and not dealt.padded


@pytest.mark.parametrize("total", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_drop_gives_equal_counts_and_names_what_it_drops(total, count):
    if total < count:
        with pytest.raises(PlanError, match="no sample"):
            balance(total, count, "drop")
        return
    dealt = balance(total, count, "drop")
    assert set(dealt.counts()) == {total // count}
    seen = [p for i in range(count) for p in dealt.positions(i)]
    assert len(seen) == len(set(seen))
    assert sorted(seen + list(dealt.dropped)) == list(range(total))
    assert len(dealt.dropped) == total % count


@pytest.mark.parametrize("total", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_pad_gives_equal_counts_and_names_its_repeats(total, count):
    dealt = balance(total, count, "pad")
    each = -(-total // count)
    assert set(dealt.counts()) == {each}
    seen = Counter(p for i in range(count) for p in dealt.positions(i))
    assert set(seen) == set(range(total))  # nothing lost
    repeats = Counter(p % total for p in dealt.padded)
    assert seen - Counter(range(total)) == repeats  # the extra copies are exactly the named pads
    assert len(dealt.padded) == each * count - total


@pytest.mark.parametrize("total", SIZES)
@pytest.mark.parametrize("count", COUNTS)
def test_the_loader_deals_the_counts_a_repartition_writes(total, count):
    """One policy module: at run time each instance gets what a repartition for N would give it."""
    from imagenet_shards.balance import POLICIES
    from imagenet_shards.repartition.plan import instance_targets

    for policy in POLICIES:
        if policy == "drop" and total < count:
            continue
        assert balance(total, count, policy).counts() == instance_targets(total, count, policy), policy


def test_unknown_policy_and_bad_counts_are_errors():
    with pytest.raises(PlanError, match="unknown policy 'even'"):
        balance(10, 2, "even")
    with pytest.raises(PlanError, match="at least 1"):
        balance(10, 0, "spread")
    with pytest.raises(PlanError, match="no samples"):
        balance(0, 2, "spread")


@pytest.mark.parametrize("samples", [0, 1, 5, 8, 9, 17, 100])
@pytest.mark.parametrize("batch_size", [1, 4, 8])
@pytest.mark.parametrize("workers", [0, 1, 2, 3, 16])
@pytest.mark.parametrize("drop_last", [True, False])
def test_worker_ranges_are_contiguous_whole_batches(samples, batch_size, workers, drop_last):
    ranges = worker_ranges(samples, batch_size, workers, drop_last)
    assert len(ranges) == max(workers, 1)
    batches = 0
    position = 0
    for start, stop in ranges:
        assert start == position  # contiguous, in order
        position = stop
        if stop > start:
            full, partial = divmod(stop - start, batch_size)
            batches += full + (1 if partial else 0)
            # only the worker holding the instance's last sample can have a partial batch
            assert partial == 0 or stop == samples
    covered = batches_in(samples, batch_size, drop_last) * batch_size
    assert position == min(covered, samples)
    assert batches == batches_in(samples, batch_size, drop_last)


@pytest.mark.parametrize("total", [7, 12, 37])
@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_plan_instance_train_drop_reports_every_missing_key(total, count, workers):
    keys = [f"k{i:03d}" for i in range(total)]
    sequence = epoch_sequence([keys[i:i + 4] for i in range(0, total, 4)], seed=1, epoch=5)
    batch_size = 2
    plans = [plan_instance(sequence, i, count, "drop", batch_size, drop_last=True) for i in range(count)]
    assert len({p.batches for p in plans}) == 1
    read = [k for i, p in enumerate(plans) for w in range(max(workers, 1)) for k in p.worker_items(w, workers)]
    assert len(read) == len(set(read)) == plans[0].batches * batch_size * count
    missing = set(plans[0].policy_dropped) | {k for p in plans for k in p.last_batch_dropped}
    assert set(read) | missing == set(keys) and not set(read) & missing


@pytest.mark.parametrize("count", [2, 3, 5])
def test_plan_instance_pad_repeats_exactly_the_named_pads(count):
    keys = [f"k{i}" for i in range(11)]
    plans = [plan_instance(keys, i, count, "pad", 3, drop_last=False) for i in range(count)]
    assert len({len(p.items) for p in plans}) == 1
    read = Counter(k for p in plans for k in p.items)
    assert set(read) == set(keys)
    assert read - Counter(keys) == Counter(k for p in plans for k in p.padded)


def test_plan_own_share_keeps_the_given_items():
    plan = plan_own_share(["a", "b", "c", "d", "e"], [5, 5], batch_size=2, drop_last=True, policy="drop")
    assert plan.batches == 2 and plan.last_batch_dropped == ["e"]
    assert plan.worker_items(0, 2) == ["a", "b"] and plan.worker_items(1, 2) == ["c", "d"]


def test_more_workers_than_batches_leaves_idle_workers():
    plan = plan_instance(list(range(3)), 0, 1, "spread", batch_size=2, drop_last=False)
    assert [plan.worker_items(w, 4) for w in range(4)] == [[], [0, 1], [], [2]]
