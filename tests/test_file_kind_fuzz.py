"""A seeded fuzz of every other kind of file the formats write or read (issue 35, build item 4); the
shards, sample indexes, .tfindex and metadata.json of a split are test_loader_fuzz.py's.

Here, for every format: a repartition's files (manifest, instance shard lists and indexes, remainder
shards), the shard cache's entries and their .meta, a stray LMDB lock file, the loader's resume state
(state_dict as JSON) and its ledgers; and the validator (its exit code) over the split's own files.
Each trial damages one file at a seeded byte position (a flipped bit, a truncation, a zeroed block,
bytes appended, the file deleted), then reads with the real stack.

The oracle: the loader's output (key, label and a digest of the pixels of every sample) against the
undamaged one; for validate_dataset.py and `python -m imagenet_shards.ledger verify`, the exit code. A trial
passes when the damage is named (exit 1, or an error / report / warning naming the file) or the output
is unchanged. It fails on a traceback (an exception that is not the project's one-line Error, or one
that does not name the file), a hang, or a changed output with no word.
"""

import hashlib
import json
import random
import shutil
import signal
import warnings
from pathlib import Path

import pytest
from conftest import damage, flip_byte

from imagenet_shards.errors import Error
from imagenet_shards.launcher import Instance
from imagenet_shards.loader import Cache, TrainCrop, ValidationCrop

FORMATS = ("img", "tensor", "tfrecord", "lmdb")
INSTANCES = 3  # the repartition fuzzed: 12 validation samples in shards of 8 and 4, dealt to 3


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _digest(image) -> str:
    return hashlib.sha256(image.contiguous().numpy().tobytes()).hexdigest()


def read_split(dataset, split="validation", instance=(0, 1), workers=0, state=None, **options):
    """([(key, label, pixel digest)], [texts that may name a file: skips, cache events, warnings]) of one
    epoch of `split` read by `instance` (its state loaded first, when given)."""
    from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        crop = TrainCrop(image_size=32) if split == "train" else ValidationCrop(image_size=32)
        loader = get_data(str(dataset), split, 4, workers, normalization="device", transform=crop, with_keys=True,
                          instance=Instance(*instance, "fuzz"), **options)
        if state is not None:
            loader.load_state_dict(state)
        samples = [(key, label, _digest(image)) for images, labels, keys in loader
                   for image, label, key in zip(images, labels.tolist(), keys)]
    said = [f"{s.shard}: {s.reason}" for s in loader.report.skipped] + [str(w.message) for w in caught]
    said += [json.dumps(loader.report.cache, default=str)] if getattr(loader.report, "cache", None) else []
    return samples, said


def trials(name, files, count, trial, seed):
    """Run `count` seeded trials: trial(number, file name, rng) -> None (passed) or a failure text. Every
    file is damaged once before any is drawn again. -> the failures, each naming the trial."""
    rng = random.Random(f"{seed}-{name}")
    failures = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for number in range(count):
            chosen = files[number % len(files)] if number < len(files) else rng.choice(files)
            signal.alarm(60)  # a hang, not a timing: a trial takes well under a second
            try:
                failure = trial(number, chosen, rng)
            except _Hang:
                failure = f"{chosen}: hung"
            finally:
                signal.alarm(0)
            if failure:
                failures.append(f"{name} trial {number} (seed {seed!r}): {failure}")
    finally:
        signal.signal(signal.SIGALRM, previous)
    return failures


def judged(what, name, read, reference, said_before=()):
    """The oracle over one read: None (passed) or why it failed. `said_before`: what the undamaged read
    said too (a warning about the options), which names nothing damaged."""
    try:
        samples, said = read()
    except Error as error:  # the project's one-line errors: they must name the damaged file
        return None if name in str(error) else f"{what}: {type(error).__name__} not naming {name}: {error}"
    except Exception as error:  # noqa: BLE001 - anything else reaches the user as a traceback
        return f"{what}: traceback: {type(error).__name__}: {error}"
    said = [text for text in said if text not in said_before]
    if samples != reference and not any(name in text for text in said):
        return (f"{what}: the output changed with no word ({len(samples)} samples, "
                f"{sum(a != b for a, b in zip(samples, reference))} differ; said {said})")
    return None


# ------------------------------------------------------------------------------------- repartitions

@pytest.fixture(scope="module")
def repartitioned(converted, tmp_path_factory):
    """repartitioned(fmt) -> a copy of the converted dataset with a repartition for INSTANCES instances."""
    from imagenet_shards.repartition.run import repartition

    made = {}

    def make(fmt):
        if fmt not in made:
            target = tmp_path_factory.mktemp(f"repartitioned-{fmt}") / fmt
            shutil.copytree(converted(fmt), target)
            repartition(target, INSTANCES, splits=["validation"])
            made[fmt] = target
        return made[fmt]

    return make


def _every_instance(dataset):
    samples, said = [], []
    for index in range(INSTANCES):
        got, words = read_split(dataset, instance=(index, INSTANCES))
        samples += got
        said += words
    return samples, said


REPARTITION_TRIALS = 12  # per format: the manifest, then every other file once, then drawn


@pytest.mark.parametrize("fmt", FORMATS)
def test_damage_to_a_repartition_is_named_or_changes_nothing(repartitioned, converted, tmp_path, fmt):
    source = repartitioned(fmt)
    folder = Path("distributed") / f"{INSTANCES}-instances"
    reference, said = _every_instance(source)
    assert len(reference) == 12 and not [text for text in said if "samples skipped" in text]
    files = ["manifest.json"] + sorted(p.name for p in (source / folder).iterdir() if p.name != "manifest.json")

    def trial(number, name, rng):
        dataset = tmp_path / f"trial-{number}"
        shutil.copytree(source, dataset)
        what = damage(dataset / folder / name, rng)
        expected = reference
        if not (dataset / folder / "manifest.json").exists():  # no manifest, no repartition: by its contract,
            expected = _every_instance(converted(fmt))[0]     # samples are dealt at run time, as without one
        failure = judged(what, name, lambda: _every_instance(dataset), expected, said)
        shutil.rmtree(dataset)
        return failure

    failures = trials(f"repartition-{fmt}", files, REPARTITION_TRIALS, trial, "fuzz")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("damaged", ["flip", "delete"])
def test_a_damaged_or_missing_instance_index_is_named(repartitioned, tmp_path, damaged):
    """Found by the repartition fuzz (seed 'fuzz'): a flipped byte in an instance's sample index (img,
    trial 4) skipped a sample with a word naming the shard, not the index; a deleted one (tfrecord,
    trial 1) was a FileNotFoundError traceback. The manifest now records each instance index's size and
    sha256, and the loader holds the index against them."""
    from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data
    from imagenet_shards.loader.sources import SourceError

    dataset = tmp_path / "img"
    shutil.copytree(repartitioned("img"), dataset)
    index = dataset / "distributed" / f"{INSTANCES}-instances" / "validation-instance-0000.index.tsv"
    if damaged == "flip":
        flip_byte(index, index.stat().st_size - 40, 0x01)
    else:
        index.unlink()
    with pytest.raises(SourceError, match=index.name):
        list(get_data(str(dataset), "validation", 4, 0, normalization="device", transform=ValidationCrop(image_size=32),
                      instance=Instance(0, INSTANCES, "fuzz")))


# ------------------------------------------------------------------------------ the shard cache

HOSTILE_MANIFEST = [  # (case, instance, file, field or the name replaced, a name leaving the dataset) (issue 45)
    ("index named ../x", 0, "manifest", "index", "../../../escaped.index.tsv"),
    ("index named by an absolute path", 0, "manifest", "index", "/etc/hostname"),
    ("index named by a URL", 0, "manifest", "index", "http://127.0.0.1:9/escaped.index.tsv"),
    ("remainder named ../x", 1, "manifest", "remainder", "distributed/../../escaped.tar"),
    ("remainder named by an absolute path", 1, "manifest", "remainder", "/etc/hostname"),
    ("shard list named by a URL", 0, "manifest", "shard_list", "http://127.0.0.1:9/escaped.txt"),
    ("instance index row naming ../x", 1, "index", "distributed/", "distributed/../../"),
    ("instance index row naming an absolute path", 1, "index", "distributed/", "/etc/"),
    ("instance index row naming a URL", 1, "index", "distributed/", "http://127.0.0.1:9/"),
]


def _hostile_manifest(dataset, instance, kind, field, name):
    """The repartition of `dataset` with `name` put in its manifest's `field` for `instance`, or replacing `field`
    in the rows of that instance's index (its size and sha256 in the manifest updated)."""
    manifest = dataset / "distributed" / f"{INSTANCES}-instances" / "manifest.json"
    data = json.loads(manifest.read_text())
    entry = data["splits"]["validation"]["instances"][instance]
    if kind == "index":
        index = dataset / entry["index"]
        text = "\n".join(line.replace(field, name, 1) if n else line
                         for n, line in enumerate(index.read_text().split("\n")))
        index.write_text(text)
        entry["index_record"] = {"bytes": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    else:
        entry[field] = name
        if field == "remainder" and entry.get("remainder_record"):
            entry["remainder_record"]["name"] = name
    manifest.write_text(json.dumps(data))


@pytest.mark.parametrize("case,instance,kind,field,name", HOSTILE_MANIFEST, ids=[c[0] for c in HOSTILE_MANIFEST])
def test_a_hostile_repartition_is_refused_in_one_line_or_changes_nothing_and_writes_nothing(
        repartitioned, tmp_path, case, instance, kind, field, name):
    # Deep enough that every `..` of the cases stays inside tmp_path, whose tree outside the dataset is compared
    # (pytest's other folders beside it hold servers that write while this test runs: SeaweedFS's data)
    dataset = tmp_path / "a" / "b" / "c" / "img"
    shutil.copytree(repartitioned("img"), dataset)
    reference, _ = read_split(dataset, instance=(instance, INSTANCES))
    _hostile_manifest(dataset, instance, kind, field, name)
    outside = lambda: sorted(p for p in tmp_path.rglob("*") if dataset not in p.parents)  # noqa: E731
    before = outside()
    samples = None
    try:
        samples, said = read_split(dataset, instance=(instance, INSTANCES))
    except Error as error:
        said = [str(error)]
    assert outside() == before, case
    assert all(len(line.splitlines()) == 1 for line in said), said
    named = any("unsafe" in line for line in said)
    assert named or samples == reference, f"{case}: neither refused nor unchanged: {said}"


CACHE_TRIALS = 8  # per format: each validation entry and its .meta, then drawn


@pytest.mark.parametrize("fmt", ["img", "tensor", "tfrecord"])  # LMDB shards are read from local files only
def test_damage_to_a_cache_entry_or_its_meta_is_named_or_changes_nothing(converted, tmp_path, fmt):
    source = converted(fmt)
    cache = tmp_path / "cache"
    reference, said = read_split(source, cache=Cache(cache, remote_paths=True))
    files = sorted(str(p.relative_to(cache)) for p in cache.glob("*/*") if p.suffix not in (".lock", ".pin"))
    assert len(files) == 4, files

    def trial(number, name, rng):
        copy = tmp_path / f"cache-{number}"
        shutil.copytree(cache, copy)
        what = damage(copy / name, rng)
        shard = Path(name).name.removesuffix(".meta")
        failure = judged(what, shard, lambda: read_split(source, cache=Cache(copy, remote_paths=True)),
                         reference, said)
        shutil.rmtree(copy)
        return failure

    failures = trials(f"cache-{fmt}", files, CACHE_TRIALS, trial, "fuzz")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ resume state and ledgers

STATE_TRIALS = 12  # per format
LEDGER_TRIALS = 8  # per format


@pytest.mark.parametrize("fmt", FORMATS)
def test_damage_to_a_saved_resume_state_is_named_or_changes_nothing(converted, tmp_path, fmt):
    """The state a user saves with the model (state_dict() as JSON), damaged, then loaded: a ResumeError
    (the project's one line) or the same batches as the undamaged state."""
    from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data

    source = converted(fmt)
    loader = get_data(str(source), "train", 4, 0, normalization="device", transform=TrainCrop(image_size=32), with_keys=True,
                      instance=Instance(0, 1, "fuzz"), seed=3)
    batches = iter(loader)
    next(batches)
    saved = tmp_path / "state.json"
    saved.write_text(json.dumps(loader.state_dict()))
    del batches
    reference, said = read_split(source, "train", state=json.loads(saved.read_text()), seed=3)
    assert len(reference) == 32

    def trial(number, name, rng):
        copy = tmp_path / f"state-{number}.json"
        shutil.copy(saved, copy)
        what = damage(copy, rng)
        try:
            state = json.loads(copy.read_bytes())
        except (OSError, ValueError):
            return None  # the user's own json.load names their file; the loader never sees it
        failure = judged(what, "", lambda: read_split(source, "train", state=state, seed=3), reference, said)
        copy.unlink(missing_ok=True)
        return failure

    failures = trials(f"state-{fmt}", [saved.name], STATE_TRIALS, trial, "fuzz")
    assert not failures, "\n".join(failures)


def _changed_fields(ledger, original) -> list:
    """Where a ledger differs from the original in what its verdict stands on: what was delivered (keys,
    labels, padded, dropped, batches, per segment and instance), the epoch's header and the dataset's
    fingerprint. A changed description, `source` or unknown name leaves the verdict true."""
    from imagenet_shards.ledger import ENTRY, HEADER

    changed = [name for name in HEADER if name != "dataset" and ledger.get(name) != original.get(name)]
    dataset, had_dataset = ledger.get("dataset"), original["dataset"]
    changed += [f"dataset.{name}" for name in ("samples", "sha256")
                if not isinstance(dataset, dict) or dataset.get(name) != had_dataset[name]]
    for got, had in zip(ledger.get("entries", []), original["entries"]):
        changed += [f"entries[].{name}" for name in ENTRY if got.get(name) != had.get(name)]
    return changed


@pytest.mark.parametrize("fmt", FORMATS)
def test_damage_to_a_ledger_is_named_exit_1_or_verifies_the_same(converted, tmp_path, fmt, capsys):
    from imagenet_shards.ledger import main as ledger_main
    from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data

    source = converted(fmt)
    loader = get_data(str(source), "validation", 4, 0, normalization="device", transform=ValidationCrop(image_size=32),
                      instance=Instance(0, 1, "fuzz"))
    for _ in loader:
        pass
    ledger = tmp_path / "ledger.json"
    original = loader.write_ledger(ledger)
    assert ledger_main(["verify", str(ledger), "--source", str(source)]) == 0
    original = json.loads(ledger.read_text())

    def trial(number, name, rng):
        copy = tmp_path / f"ledger-{number}.json"
        shutil.copy(ledger, copy)
        what = damage(copy, rng)
        capsys.readouterr()
        try:
            code = ledger_main(["verify", str(copy), "--source", str(source)])
        except SystemExit as exit_:
            code = exit_.code
        except Exception as error:  # noqa: BLE001 - a traceback for the user
            return f"{what}: traceback: {type(error).__name__}: {error}"
        out = capsys.readouterr()
        if code == 0:
            try:
                changed = _changed_fields(json.loads(copy.read_bytes()), original)
            except ValueError:
                changed = ["not JSON"]
            return f"{what}: verified clean (exit 0) though the ledger changed: {changed}" if changed else None
        # exit 1 names the damage: the ledger's file, or the keys it no longer lists as delivered
        return None if code == 1 else f"{what}: exit {code}: {out.out[-300:]} {out.err[-300:]}"

    failures = trials(f"ledger-{fmt}", [ledger.name], LEDGER_TRIALS, trial, "fuzz")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("edit", ["rename-key", "next-batch"])
def test_a_damaged_saved_state_is_a_resume_error(converted, edit):
    """Found by the resume-state fuzz (seed 'fuzz', tensor, trial 3): a flipped byte in the key "sha256"
    of a saved state was a KeyError traceback in load_state_dict. And a digit changed in "next" resumed
    at another batch with no word: a state now carries a digest of its content."""
    from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data
    from imagenet_shards.loader.plan.resume import ResumeError

    def loader():
        return get_data(str(converted("img")), "train", 4, 0, normalization="device", transform=TrainCrop(image_size=32),
                        instance=Instance(0, 1, "fuzz"), seed=3)

    first = loader()
    batches = iter(first)
    next(batches)
    text = json.dumps(first.state_dict())
    if edit == "rename-key":
        text = text.replace('"sha256"', '"sha257"', 1)
    else:
        assert '"next": 0' in text
        text = text.replace('"next": 0', '"next": 2', 1)
    with pytest.raises(ResumeError):
        loader().load_state_dict(json.loads(text))


# ------------------------------------------------------------------------------- the validator

VALIDATOR_TRIALS = 10  # per format: shards, .tfindex, LMDB files, the sample index, then drawn


@pytest.mark.parametrize("fmt", FORMATS)
def test_validate_dataset_exits_1_on_damage_to_any_file_of_a_split(converted, tmp_path, fmt, capsys):
    """validate_dataset.py's exit code over every kind of file of a split (metadata.json's own fuzz is in
    test_metadata_digest.py): every damage is exit 1 (metadata.json records each file's size and sha256),
    never a traceback, a hang or exit 0."""
    from imagenet_shards.cli.validate_dataset import main as validate_main

    source = converted(fmt)
    files = sorted(p.name for p in source.iterdir() if p.name.startswith(("validation", "samples-validation")))

    def trial(number, name, rng):
        dataset = tmp_path / f"trial-{number}"
        shutil.copytree(source, dataset)
        what = damage(dataset / name, rng)
        capsys.readouterr()
        try:
            code = validate_main([str(dataset), "--no-progress", "--workers", "1"])
        except SystemExit as exit_:
            code = exit_.code
        except Exception as error:  # noqa: BLE001 - a traceback for the user
            return f"{what}: traceback: {type(error).__name__}: {error}"
        out = capsys.readouterr()
        shutil.rmtree(dataset)
        if code != 1 or name not in out.out:
            return f"{what}: exit {code}, expected 1 naming {name}: {out.out[-400:]} {out.err[-400:]}"
        return None

    failures = trials(f"validate-{fmt}", files, VALIDATOR_TRIALS, trial, "fuzz")
    assert not failures, "\n".join(failures)


def test_a_stray_lmdb_lock_file_changes_nothing(converted, tmp_path):
    """LMDB shards are single files read without a lock (lock=False): a `-lock` file beside one, as the
    lmdb package would leave with its defaults, full of seeded garbage, is never read."""
    source = tmp_path / "lmdb"
    shutil.copytree(converted("lmdb"), source)
    reference, said = read_split(source)
    rng = random.Random("fuzz-lmdb-lock")
    for shard in sorted(source.glob("validation-*.lmdb")):
        Path(f"{shard}-lock").write_bytes(rng.randbytes(8192))
    assert read_split(source) == (reference, said)


def test_a_worker_that_dies_mid_epoch_ends_it_with_an_error_naming_its_shard(converted):
    """A corrupt LMDB file can crash the process that maps it (LMDB trusts its pages): SIGSEGV sent to a
    worker stands in for that crash, deterministically. Before, the epoch ended with DataLoader's
    RuntimeError "worker (pid(s) N) exited unexpectedly", naming no file."""
    import os
    import signal as signals

    from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data
    from imagenet_shards.loader.read.worker_shards import WorkerDiedError

    source = converted("lmdb")
    loader = get_data(str(source), "train", 4, 2, normalization="device", transform=TrainCrop(image_size=32),
                      instance=Instance(0, 1, "fuzz"))
    batches = iter(loader)
    next(batches)
    import time

    for _ in range(200):  # worker 1 may not have started its first shard when worker 0's batch comes
        pid, shard = (int(value) for value in loader.dataset.worker_table[1])
        if pid and shard:
            break
        time.sleep(0.05)
    assert pid > 0 and shard > 0
    os.kill(pid, signals.SIGSEGV)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)  # a hang, not a timing
    try:
        with pytest.raises(WorkerDiedError, match=r"worker 1 \(pid \d+\) died while reading train-\d{6}\.lmdb"):
            for _ in batches:
                pass
    finally:
        signal.alarm(0)


def test_a_worker_death_is_told_apart_wherever_torch_raises_it():
    # torch raises it from its SIGCHLD handler wherever the main process is (the soak, seed 5: in a training
    # step's backward); examples/train_imagenet.py turns it into one line with is_worker_death
    from imagenet_shards.loader.read.worker_shards import is_worker_death

    assert is_worker_death(RuntimeError("DataLoader worker (pid 8044) is killed by signal: Bus error. It is possible"))
    assert is_worker_death(RuntimeError("DataLoader worker (pid(s) 12, 13) exited unexpectedly"))
    assert not is_worker_death(RuntimeError("CUDA out of memory"))
    assert not is_worker_death(ValueError("DataLoader worker (pid 1) exited unexpectedly"))
