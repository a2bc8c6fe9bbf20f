"""Weighted mixing (imagenet_shards/loader/mix.py): a Mix of two converted datasets in two formats with
different class tables (the sample dataset as img: 36 train samples, 4 classes; a second one as
tfrecord: 35 samples, 5 classes, 3 of them shared) gives exact per-epoch counts, one label space,
resumes and verifies in the ledger."""

import json
from collections import Counter

import numpy as np
import pytest

from conftest import run_script
from imagenet_shards.ledger import main as ledger_main
from imagenet_shards.loader import GlobalOrder, Mix, get_data
from imagenet_shards.loader.mix import MixError, decode_items, largest_remainder, mix_groups
from imagenet_shards.loader.sources import SourceError


def test_largest_remainder_is_exact_and_stated():
    assert largest_remainder([0.7, 0.3], 71) == [50, 21]  # 49.7, 21.3: the one left goes to 0.7
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]  # ties: the earlier source
    assert largest_remainder([0.5, 0.5, 0], 7) == [4, 3, 0]
    for length in range(1, 50):
        assert sum(largest_remainder([0.2, 0.3, 0.5], length)) == length


def test_mix_groups_take_exact_counts_repeating_or_subsampling_by_shard_runs():
    ranges = [(np.array([0, 4, 8]), np.array([4, 4, 2])), (np.array([0, 5]), np.array([5, 5]))]
    offsets = [0, 10, 20]
    for epoch in (0, 1):
        starts, sizes, order = mix_groups(ranges, [23, 4], seed=3, epoch=epoch)
        items = np.concatenate([np.arange(s, s + n) for s, n in zip(starts[order], sizes[order])])
        passes, sources, rows = decode_items(items, offsets)
        assert Counter(sources.tolist()) == {0: 23, 1: 4}
        assert len(set(items.tolist())) == 27  # a repeat is another item (its pass)
        assert sorted(rows[(sources == 0) & (passes == 0)].tolist()) == list(range(10))  # whole passes first
        assert passes.max() == 2 and (passes[sources == 1] == 0).all()
    from imagenet_shards.loader.share_plan import GroupedOrder

    big = mix_groups([(np.array([0]), np.array([3])), (np.array([0]), np.array([10**9]))], [12, 1], 0, 0)
    items = GroupedOrder(*big).take(np.arange(13))  # the small source's 4th pass is past 2**31
    assert items.max() > 2**31 and decode_items(items, [0, 3, 10**9 + 3])[1].tolist().count(0) == 12
    with pytest.raises(MixError, match="weight >= 0"):
        Mix({"a": -1})


@pytest.fixture(scope="module")
def two_datasets(converted, tmp_path_factory):
    from imagenet_shards.sample import build_sample_dataset

    root = tmp_path_factory.mktemp("mix-other")
    build_sample_dataset(root / "source", seed=1, classes=5, train_per_class=7, val_per_class=5)
    result = run_script("create_webdataset.py", "--source", root / "source", "--target", root / "tfrecord",
                        "--format", "tfrecord", "--samples-per-shard", 8, "--seed", 0)
    assert result.returncode == 0, result.stdout + result.stderr
    return converted("img"), root / "tfrecord"


def make(mix, instance=(0, 1), epoch=2, workers=0, **options):
    return get_data(mix, "train", 3, workers, normalization="device", with_keys=True, seed=5, epoch=epoch,
                    instance=instance, **options)


@pytest.mark.parametrize("order", [None, GlobalOrder(partitions=2)])
def test_a_70_30_mix_gives_exact_counts_one_label_space_and_verifies(two_datasets, tmp_path, order, capsys):
    img, tfrecord = two_datasets
    mix = Mix([(img, 0.7), (tfrecord, 0.3)])
    for epoch in (2, 3):
        loader = make(mix, epoch=epoch, workers=2, order=order)
        delivered = [(k, int(label)) for _, labels, keys in loader for k, label in zip(keys, labels)]
        report = loader.report
        epoch_keys = [k for k, _ in delivered] + report.policy_dropped + report.last_batch_dropped
        assert len(epoch_keys) == len(set(epoch_keys)) == 71
        assert Counter(k.split("/")[0] for k in epoch_keys) == {"0": 50, "1": 21}  # 0.7 x 71 = 49.7 -> 50
        assert any("#1" in k for k in epoch_keys)  # the img dataset (36) is repeated to 50
        loader.write_ledger(tmp_path / f"ledger-{epoch}.json")
        assert ledger_main(["verify", str(tmp_path / f"ledger-{epoch}.json")]) == 0, capsys.readouterr().out
    classes = loader.classes
    assert classes[:4] == json.loads((img / "metadata.json").read_text())["classes"] and len(classes) == 5
    theirs = json.loads((tfrecord / "metadata.json").read_text())["classes"]
    for key, label in delivered:  # every label in the one space: a source's class name keeps its meaning
        name = key.split("/")[1].split("_")[0]
        assert classes[label] == name, (key, label)
        assert key.startswith("0/") or name in theirs


def test_a_mix_resumes_onto_another_instance_count(two_datasets, tmp_path, capsys):
    img, tfrecord = two_datasets
    mix = Mix([(img, 0.7), (tfrecord, 0.3)], length=60)
    reference = make(mix)
    uninterrupted = [k for _, _, keys in reference for k in keys]
    epoch_keys = set(uninterrupted + reference.report.policy_dropped + reference.report.last_batch_dropped)
    loader = make(mix)
    iterator = iter(loader)
    before = [k for _ in range(4) for k in next(iterator)[2]]
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    after = []
    for index in range(2):
        resumed = make(mix, instance=(index, 2), epoch=0)
        resumed.load_state_dict([state])
        after += [k for _, _, keys in resumed for k in keys]
        resumed.write_ledger(tmp_path / f"ledger-{index}.json")
    assert before == uninterrupted[:12] and not set(before) & set(after)
    assert set(before + after) <= epoch_keys and len(epoch_keys) == 60
    assert ledger_main(["verify", *(str(tmp_path / f"ledger-{i}.json") for i in range(2))]) == 0
    assert "OK: every sample" in capsys.readouterr().out


def test_a_mix_of_other_sources_is_refused_with_one_line(two_datasets):
    with pytest.raises(SourceError, match="a Mix mixes converted datasets"):
        make(Mix([(two_datasets[0], 1), ("synthetic", 1)]))
    with pytest.raises(MixError, match="positive weight"):
        Mix([(two_datasets[0], 0)])


def test_a_70_30_mix_under_the_global_order_exact_counts_and_each_global_batch_within_one_sample(
        two_datasets, tmp_path, capsys):
    """GlobalOrder(global_batch_size=8) on 2 ranks (batch 4 each): 71 samples an epoch (50 + 21), 8 global
    batches of 8, 7 left out; every global batch takes 8 x 50/71 = 5.63 of source 0 to within one sample."""
    img, tfrecord = two_datasets
    mix = Mix([(img, 0.7), (tfrecord, 0.3)])
    order = GlobalOrder(global_batch_size=8)
    ranks = [get_data(mix, "train", None, 0, normalization="device", with_keys=True, seed=5, epoch=2,
                      instance=(i, 2), order=order) for i in range(2)]
    per_rank = [[list(keys) for _, _, keys in loader] for loader in ranks]
    steps = [a + b for a, b in zip(*per_rank)]
    assert len(steps) == 8 and all(len(step) == 8 for step in steps)
    for step in steps:
        share = sum(key.startswith("0/") for key in step)
        assert abs(share - 8 * 50 / 71) < 1 and abs((8 - share) - 8 * 21 / 71) < 1, step
    delivered = [key for step in steps for key in step]
    dropped = ranks[0].report.policy_dropped
    assert sorted(dropped) == sorted(ranks[1].report.policy_dropped)
    epoch_keys = delivered + dropped
    assert len(epoch_keys) == len(set(epoch_keys)) == 71
    assert Counter(k.split("/")[0] for k in epoch_keys) == {"0": 50, "1": 21}  # exact per-epoch counts
    for i, loader in enumerate(ranks):
        loader.write_ledger(tmp_path / f"ledger-{i}.json")
    assert ledger_main(["verify", *(str(tmp_path / f"ledger-{i}.json") for i in range(2))]) == 0
    assert "OK: every sample" in capsys.readouterr().out


def test_the_shard_cache_serves_each_source_of_a_mix(two_datasets, tmp_path):
    """Each source's shards are cached under the one directory, each keyed by its dataset; a second epoch
    reads them from there (the same keys as without the cache)."""
    img, tfrecord = two_datasets
    mix = Mix([(img, 0.7), (tfrecord, 0.3)])
    plain = [k for _, _, keys in make(mix, order=GlobalOrder(global_batch_size=3)) for k in keys]
    loader = make(mix, order=GlobalOrder(global_batch_size=3), cache=str(tmp_path / "cache"))
    assert [k for _, _, keys in loader for k in keys] == plain
    assert len([d for d in (tmp_path / "cache").iterdir() if d.is_dir()]) == 2  # one entry folder per source
    cached = [p for p in (tmp_path / "cache").rglob("*") if p.suffix in (".tar", ".tfrecord")]
    assert len(cached) == len(list(img.glob("train/*.tar"))) + len(list(tfrecord.glob("train/*.tfrecord")))


def test_a_mix_under_the_global_order_resumed_from_2_onto_4_ranks_keeps_the_global_batches(two_datasets, tmp_path,
                                                                                            capsys):
    img, tfrecord = two_datasets
    mix = Mix([(img, 0.7), (tfrecord, 0.3)])

    def ranks(count, epoch=2):
        return [get_data(mix, "train", None, 0, normalization="device", with_keys=True, seed=5, epoch=epoch,
                         instance=(i, count), order=GlobalOrder(global_batch_size=8)) for i in range(count)]

    def steps(per_rank):
        return [set().union(*batches) for batches in zip(*per_rank)]

    reference = steps([[list(keys) for _, _, keys in loader] for loader in ranks(1)])
    first = ranks(2)
    iterators = [iter(loader) for loader in first]
    before = steps([[list(next(it)[2]) for _ in range(3)] for it in iterators])
    states = json.loads(json.dumps([loader.state_dict() for loader in first]))
    for it in iterators:
        it.close()
    later = ranks(4, epoch=0)
    for loader in later:
        loader.load_state_dict(states)
    after = steps([[list(keys) for _, _, keys in loader] for loader in later])
    assert before + after == reference and len(reference) == 8
    for i, loader in enumerate(later):
        loader.write_ledger(tmp_path / f"ledger-{i}.json")
    assert ledger_main(["verify", *(str(tmp_path / f"ledger-{i}.json") for i in range(4))]) == 0
    assert "OK: every sample" in capsys.readouterr().out
