"""Mid-epoch resume (ImageLoader.state_dict / load_state_dict) and the order ledger (imagenet_shards.ledger).

On the converted sample dataset (36 train / 12 validation samples, shards of 8). In-process tests
simulate instances with `instance=(i, N)`; the torchrun test kills a real 2-process job with
SIGKILL mid-epoch and resumes it with 2 and with 3 processes.
"""

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import PYTHON, REPO, run_script
from imagenet_shards.ledger import main as ledger_main
from imagenet_shards.loader import DataSource, Order, TrainCrop, get_data
from imagenet_shards.loader.plan.resume import EpochProgress, ResumeError
from imagenet_shards.loader.plan.shuffle_buffer import buffer_order, shuffled

SEED = 7


def make(source, split, batch, workers, instance=(0, 1), epoch=3, policy=None, **options):
    return get_data(source, split, batch, workers, normalization="device", with_keys=True, seed=SEED, epoch=epoch,
                    instance=instance, order=Order(policy=policy, shuffle_buffer=5), **options)


def batches(loader):
    return [(list(keys), images.clone()) for images, _, keys in loader]


def stop_after(loader, count):
    """Iterate `count` batches and return (their keys, the state saved after the last), JSON round-tripped."""
    iterator, keys = iter(loader), []
    for _ in range(count):
        keys += next(iterator)[2]
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    return keys, state


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


def test_epoch_progress_starts_at_a_loaded_state_or_at_the_beginning_and_follows_each_batch():
    fresh = EpochProgress.starting(3, None, 0, 2)
    assert (fresh.epoch, fresh.resume, fresh.complete) == (3, None, False)
    assert fresh.progress() == {"next": 0, "done": [[0, 0], [0, 0]]}
    fresh.handed_over(0, 1, 4, 2)
    fresh.handed_over(1, 1, 5, 2)
    fresh.handed_over(0, 2, 8, 2)
    assert fresh.progress() == {"next": 1, "done": [[2, 8], [1, 5]]}

    class Loaded:  # a Resume's start: where this instance's saved progress puts it
        def start(self, instance, workers):
            return 1, [[2, 8], [1, 5]]

    loaded = Loaded()
    resumed = EpochProgress.starting(3, loaded, 0, 2)
    assert resumed.resume is loaded and resumed.progress() == {"next": 1, "done": [[2, 8], [1, 5]]}


def test_buffer_order_is_a_permutation_that_depends_on_the_generator():
    import random

    order = buffer_order(50, 8, random.Random(1))
    assert sorted(order.tolist()) == list(range(50)) and order.tolist() != list(range(50))
    assert order.tolist() == buffer_order(50, 8, random.Random(1)).tolist()
    assert buffer_order(50, 1, random.Random(1)).tolist() == list(range(50))
    assert list(shuffled(range(50), 8, random.Random(1))) == order.tolist()  # the streaming form: same order


@pytest.mark.parametrize("split,batch", [("train", 3), ("validation", 2)])
@pytest.mark.parametrize("workers", [0, 2])
def test_same_count_resume_gives_exactly_the_following_batches(img, split, batch, workers):
    reference = batches(make(img, split, batch, workers))
    next_epoch = [keys for keys, _ in batches(make(img, split, batch, workers, epoch=4))]
    for stop in (1, 3, len(reference) - 1):
        before, state = stop_after(make(img, split, batch, workers), stop)
        assert before == [k for keys, _ in reference[:stop] for k in keys]
        resumed = make(img, split, batch, workers, epoch=0)
        resumed.load_state_dict(state)
        assert resumed.epoch == 3
        rest = batches(resumed)
        assert [keys for keys, _ in rest] == [keys for keys, _ in reference[stop:]], (split, workers, stop)
        # the same augmentations too: each batch has its own generator
        assert all(a.equal(b) for (_, a), (_, b) in zip(rest, reference[stop:]))
        assert [keys for keys, _ in batches(resumed)] == next_epoch  # the next epoch as if nothing happened


def simulate(source, split, batch, count, stops, workers=0, **options):
    """`count` instances each stop after stops[i] batches: (keys delivered, every state)."""
    delivered, states = [], []
    for index in range(count):
        keys, state = stop_after(make(source, split, batch, workers, (index, count), **options), stops[index])
        delivered += keys
        states.append(state)
    return delivered, states


def finish(source, split, batch, count, states, ledgers, workers=0, **options):
    """Resume on `count` instances from every state: (keys delivered, keys named dropped, padded)."""
    delivered, dropped, padded = [], set(), Counter()
    for index in range(count):
        loader = make(source, split, batch, workers, (index, count), **options)
        loader.load_state_dict(states)
        delivered += [k for keys, _ in batches(loader) for k in keys]
        dropped.update(loader.report.policy_dropped + loader.report.last_batch_dropped)
        padded.update(loader.report.padded)
        loader.write_ledger(ledgers / f"ledger-{index}.json")
    return delivered, dropped, padded


@pytest.mark.parametrize("split,batch,policy", [("validation", 2, "spread"), ("train", 3, "drop"), ("train", 3, "pad")])
def test_two_to_three_instances_delivers_what_is_left_once(img, tmp_path, split, batch, policy, capsys):
    total = 36 if split == "train" else 12
    before, states = simulate(img, split, batch, 2, (1, 2), policy=policy)
    with pytest.raises(ResumeError, match=r"missing instance\(s\) \[1\]"):
        make(img, split, batch, 0, (0, 3), policy=policy).load_state_dict(states[0])
    with pytest.raises(ResumeError, match="instance 1 needs its own"):
        make(img, split, batch, 0, (1, 2), policy=policy).load_state_dict(states[0])
    after, dropped, padded = finish(img, split, batch, 3, states, tmp_path, policy=policy)
    read = Counter(before + after)
    if split == "validation":
        assert read == Counter({k: 1 for k in read}) and len(read) == total and not dropped
    else:
        assert all(n <= 1 + padded[k] for k, n in read.items())
        assert len(set(read) | dropped) == total
        assert not set(read) & dropped
    ledgers = sorted(str(p) for p in tmp_path.glob("ledger-*.json"))
    assert ledger_main(["verify", *ledgers]) == 0
    out = capsys.readouterr().out
    assert "OK: every sample" in out and "a perfect shuffle" in out
    entries = {(e["segment"], e["instance"]): e for p in ledgers for e in json.loads(open(p).read())["entries"]}
    assert sorted(entries) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert [k for s in (0, 1) for i in range(3) for k in entries.get((s, i), {"keys": []})["keys"]] == before + after


def test_ledger_is_red_when_a_sample_is_missing_or_repeated(img, tmp_path, capsys):
    before, states = simulate(img, "validation", 2, 2, (1, 1))
    finish(img, "validation", 2, 3, states, tmp_path)
    ledgers = sorted(str(p) for p in tmp_path.glob("ledger-*.json"))
    assert ledger_main(["verify", *ledgers]) == 0
    ledger = json.loads(open(ledgers[2]).read())
    entry = ledger["entries"][-1]
    lost = entry["keys"].pop(0)
    entry["labels"].pop(0)
    entry["batches"][0] -= 1
    open(ledgers[2], "w").write(json.dumps(ledger))
    capsys.readouterr()
    assert ledger_main(["verify", *ledgers]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and lost in out and "not delivered" in out
    entry["keys"].insert(0, before[0])  # delivered before the restart, and again after it
    entry["labels"].insert(0, 0)
    entry["batches"][0] += 1
    open(ledgers[2], "w").write(json.dumps(ledger))
    assert ledger_main(["verify", *ledgers]) == 1
    out = capsys.readouterr().out
    assert f"{before[0]} x2" in out and lost in out
    assert ledger_main(["verify", *ledgers[:2]]) == 1  # instance 2's ledger missing
    assert "no ledger holds instance(s) [2]" in capsys.readouterr().out
    del entry["labels"]
    open(ledgers[2], "w").write(json.dumps(ledger))
    assert ledger_main(["verify", *ledgers]) == 1
    assert f"{ledgers[2]}: malformed ledger, missing entries[].labels" in capsys.readouterr().err


def test_a_state_of_another_dataset_or_seed_is_refused(img, converted):
    _, state = stop_after(make(img, "train", 3, 0), 2)
    with pytest.raises(ResumeError, match="seed 7, this loader seed 8"):
        get_data(img, "train", 3, 0, seed=8, instance=(0, 1)).load_state_dict(state)
    with pytest.raises(ResumeError, match="another dataset"):
        make(DataSource("synthetic", synthetic_length=36), "train", 3, 0).load_state_dict(state)
    with pytest.raises(ResumeError, match="policy 'drop', this loader policy 'pad'"):
        make(img, "train", 3, 0, policy="pad").load_state_dict(state)
    with pytest.raises(ResumeError, match="version"):
        make(img, "train", 3, 0).load_state_dict({**state, "version": 99})


def test_state_is_small_and_json():
    loader = make(DataSource("synthetic", synthetic_length=1_331_167), "train", 256, 0,
                  transform=TrainCrop(image_size=8))
    _, state = stop_after(loader, 2)
    text = json.dumps(state)
    assert len(text) < 2048 and state["version"] == 1 and state["progress"]["done"] == [[2, 512]]


KILLED = """
import json, os, sys, time
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import Order, get_data
source, out = sys.argv[1], sys.argv[2]
instance = detect_instance()
held = []
def save(name, value):
    with open(f"{out}/{name}.tmp", "w") as handle:
        json.dump(value, handle)
    os.replace(f"{out}/{name}.tmp", f"{out}/{name}")
for split, batch, stop in (("validation", 2, 1 + instance.index), ("train", 3, 2 + instance.index)):
    loader = get_data(source, split, batch, 1, normalization="device", with_keys=True, seed=7, epoch=3,
                      instance=instance, order=Order(shuffle_buffer=5))
    iterator, keys = iter(loader), []
    for _ in range(stop):
        keys += next(iterator)[2]
        save(f"state-{split}-{instance.index}.json", loader.state_dict())  # as a checkpoint would
        save(f"keys-{split}-{instance.index}.json", keys)
    held.append(iterator)
open(f"{out}/ready-{instance.index}", "w").close()
time.sleep(600)
"""

RESUMED = """
import glob, json, sys
from imagenet_shards.launcher import detect_instance
from imagenet_shards.loader import Order, get_data
source, states, out, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
instance = detect_instance()
result = {}
for split, batch in (("validation", 2), ("train", 3)):
    loader = get_data(source, split, batch, workers, normalization="device", with_keys=True, seed=7,
                      instance=instance, order=Order(shuffle_buffer=5))
    loader.load_state_dict([json.load(open(p)) for p in sorted(glob.glob(f"{states}/state-{split}-*.json"))])
    keys = [k for _, _, batch_keys in loader for k in batch_keys]
    report = loader.report
    loader.write_ledger(f"{out}/ledger-{split}-{instance.index}.json")
    following = [k for _, _, batch_keys in loader for k in batch_keys]
    result[split] = {"keys": keys, "epoch": report.epoch, "next": following,
                     "dropped": report.policy_dropped + report.last_batch_dropped}
json.dump(result, open(f"{out}/rank{instance.index}.json", "w"))
"""


def torchrun(script, processes, *args, **popen):
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               str(script), *map(str, args)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **popen)


def _kill_every_process_running(script):
    """SIGKILL every process whose command line names `script` (the ranks and their forked workers)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(script).encode() in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass  # gone already


def test_torchrun_kill_9_mid_epoch_then_resume_on_2_and_3(img, tmp_path, capsys):
    (tmp_path / "killed.py").write_text(KILLED)
    (tmp_path / "resumed.py").write_text(RESUMED)
    states = tmp_path / "states"
    states.mkdir()
    job = torchrun(tmp_path / "killed.py", 2, img, states, start_new_session=True)
    deadline = time.time() + 240
    while not all((states / f"ready-{i}").exists() for i in range(2)):
        assert job.poll() is None and time.time() < deadline, job.communicate()[0][-3000:]
        time.sleep(0.5)
    os.killpg(job.pid, signal.SIGKILL)  # kill -9 the whole job: launcher, ranks and their workers
    _kill_every_process_running(tmp_path / "killed.py")  # torchrun starts each rank in a session of its own
    job.wait()
    before = {(split, i): json.loads((states / f"keys-{split}-{i}.json").read_text())
              for split in ("validation", "train") for i in range(2)}
    jobs = {}  # both resumed jobs side by side: they only read the states; each writes its own folder
    for count, workers in ((2, 1), (3, 0)):
        (tmp_path / f"resumed-{count}").mkdir()
        jobs[count] = torchrun(tmp_path / "resumed.py", count, img, states, tmp_path / f"resumed-{count}", workers)
    # 0 and 1 workers read in the same order: the references run in this process
    reference = {(split, i): [k for _, _, keys in make(img, split, batch, 0, (i, 2)) for k in keys]
                 for split, batch in (("validation", 2), ("train", 3)) for i in range(2)}
    for count, job in jobs.items():
        out = tmp_path / f"resumed-{count}"
        log = job.communicate(timeout=300)[0]
        assert job.returncode == 0, log[-3000:]
        ranks = [json.loads((out / f"rank{i}.json").read_text()) for i in range(count)]
        for split in ("validation", "train"):
            where = f"{split}, resumed on {count}"
            after = [k for rank in ranks for k in rank[split]["keys"]]
            assert all(rank[split]["epoch"] == 3 for rank in ranks), where
            if count == 2:  # each rank: exactly the rest of its uninterrupted run, in order
                for i in range(2):
                    assert before[split, i] + ranks[i][split]["keys"] == reference[split, i], where
            read = Counter(after + before[split, 0] + before[split, 1])
            everything = set(reference[split, 0] + reference[split, 1])
            if split == "validation":
                assert read == Counter(everything), where
            else:
                dropped = {k for rank in ranks for k in rank[split]["dropped"]}
                assert max(read.values()) == 1 and set(read) | dropped >= everything and not set(read) & dropped, where
            ledgers = [str(out / f"ledger-{split}-{i}.json") for i in range(count)]
            assert ledger_main(["verify", *ledgers]) == 0, where + capsys.readouterr().out
            assert "OK: every sample of the epoch delivered" in capsys.readouterr().out, where
        for i in range(count):  # the next epoch as if nothing had happened
            expected = [k for _, _, keys in make(img, "train", 3, 0, (i, count), epoch=4) for k in keys]
            assert ranks[i]["train"]["next"] == expected
    # a sample dropped on purpose: the verdict turns red and names it
    ledger_file = out / "ledger-validation-1.json"
    ledger = json.loads(ledger_file.read_text())
    lost = ledger["entries"][-1]["keys"].pop()
    ledger["entries"][-1]["labels"].pop()
    ledger["entries"][-1]["batches"][-1] -= 1
    ledger_file.write_text(json.dumps(ledger))
    verdict = run_script("-m", "imagenet_shards.ledger", "verify", *(out / f"ledger-validation-{i}.json" for i in range(3)))
    assert verdict.returncode == 1 and lost in verdict.stdout and "FAILED" in verdict.stdout


def test_a_state_of_the_shard_kind_under_its_old_name_still_loads(img):
    """The shard kind was named "webdataset" until 2026-11-28, and states written then carry a
    fingerprint hashed over that name: the state below, built as that code built it, resumes."""
    import dataclasses
    import hashlib

    import numpy as np

    from imagenet_shards.loader.source_kinds import SHARDS, get_source_kind
    from imagenet_shards.loader.sources import resolve_source

    source = resolve_source(img, "train")
    assert source.kind == "shards" and get_source_kind("webdataset") is SHARDS
    columns = source.columns
    digest = hashlib.sha256(f"webdataset\n{len(columns)}\n".encode())  # resume.fingerprint before the rename
    digest.update(np.ascontiguousarray(columns.key_offsets, dtype=np.int64).tobytes())
    digest.update(columns.keys.tobytes())
    loader = make(img, "train", 3, 0)
    expected = batches(loader)
    _, state = stop_after(make(img, "train", 3, 0), 2)
    old = json.loads(json.dumps({**state, "dataset": {**state["dataset"], "sha256": digest.hexdigest()[:32]}}))
    assert old == state  # the fingerprint did not change with the name
    resumed = make(img, "train", 3, 0)
    resumed.load_state_dict(old)
    assert [keys for keys, _ in batches(resumed)] == [keys for keys, _ in expected[2:]]
    # A Source made by code of that time (kind "webdataset") still reads, through the shard kind.
    legacy = make(dataclasses.replace(source, kind="webdataset"), "train", 3, 0)
    assert [keys for keys, _ in batches(legacy)] == [keys for keys, _ in expected]
