"""metadata.json protects itself (imagenet_shards.metadata_digest), and a seeded fuzz of a converted dataset.

The fuzz applies tens of seeded mutations (shards, sample indexes, metadata.json) to copies of the
converted sample dataset and validates each in-process: none may validate clean, raise anything but
the validator's usage error, or run past a generous alarm.
"""

import json
import random
import shutil
import signal
import warnings

import pytest

from conftest import run_script
from imagenet_shards.index import parse_metadata
from imagenet_shards.metadata_digest import ABSENT, DIGEST_KEY, EDITED, MALFORMED, OK, canonical_bytes, digest_status, sealed
from imagenet_shards.validate.report import ValidationUsageError
from imagenet_shards.validate.validator import validate


def load(ds):
    return json.loads((ds / "metadata.json").read_text())


def save(ds, meta):
    (ds / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")


@pytest.fixture
def dataset(converted, tmp_path):
    copy = tmp_path / "dataset"
    shutil.copytree(converted("img"), copy)
    return copy


# ------------------------------------------------------------------------------------------ the digest


def test_the_digest_covers_every_key_but_itself_and_not_the_indentation():
    meta = sealed({"b": [1, 2.5, None], "a": {"x": "é"}})
    assert digest_status(meta) == (OK, "")
    assert digest_status(json.loads(json.dumps(meta, indent=4))) == (OK, "")
    assert canonical_bytes(meta) == '{"a":{"x":"é"},"b":[1,2.5,null]}'.encode()
    for edited in ({**meta, "b": [1, 2.5]}, {**meta, "c": 0}, {k: v for k, v in meta.items() if k != "a"},
                   {**meta, "a": {"x": "e"}}):
        assert digest_status(edited)[0] == EDITED
    assert digest_status({"a": 1})[0] == ABSENT
    for bad in ("sha256:xyz", 5, None, "md5:" + "0" * 64):
        assert digest_status({"a": 1, DIGEST_KEY: bad})[0] == MALFORMED


def test_every_converted_format_writes_a_digest_that_verifies(converted):
    for fmt in ("img", "tensor", "tfrecord", "lmdb"):
        assert digest_status(load(converted(fmt)))[0] == OK, fmt


@pytest.mark.parametrize("edit", [
    lambda m: m.pop("format_version"),
    lambda m: m.__setitem__("exif_orientation", -1),
    lambda m: m["splits"]["train"]["transform_pipeline"].append("Resize(64)"),
    lambda m: m.pop("splits"),  # would otherwise look like a reference harness dataset
])
def test_an_edited_metadata_json_is_named_exit_1(dataset, edit):
    meta = load(dataset)
    edit(meta)
    save(dataset, meta)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Dataset is corrupted." in result.stdout
    assert "metadata.json" in result.stdout and "edited since it was written" in result.stdout


def test_a_dataset_written_before_the_digest_validates_with_a_note(dataset):
    meta = load(dataset)
    del meta[DIGEST_KEY]
    save(dataset, meta)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Dataset OK." in result.stdout and f"note: metadata.json has no {DIGEST_KEY}" in result.stdout


def test_the_loader_warns_once_about_an_edited_metadata_json(dataset):
    from imagenet_shards.loader import get_data

    meta = load(dataset)
    meta["exif_orientation"] = -1
    save(dataset, meta)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for split in ("train", "validation", "train"):
            loader = get_data(str(dataset), split, batch_size=4, workers=0)
            next(iter(loader))
    edited = [w for w in caught if "edited since it was written" in str(w.message)]
    assert len(edited) == 1, [str(w.message) for w in caught]
    assert str(dataset / "metadata.json") in str(edited[0].message)


def test_repartitioning_refuses_an_edited_metadata_json(dataset):
    meta = load(dataset)
    meta["seed"] = 1
    save(dataset, meta)
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2)
    assert result.returncode == 1 and "edited since it was written" in result.stderr, result.stdout + result.stderr
    assert not (dataset / "distributed").exists()


def test_a_repartition_manifest_carries_a_digest_and_an_edit_is_named(dataset):
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    path = dataset / "distributed/2-instances/manifest.json"
    manifest = json.loads(path.read_text())
    assert digest_status(manifest)[0] == OK
    assert validate(dataset).ok
    manifest["splits"]["train"]["policy"] = "pad"
    path.write_text(json.dumps(manifest))
    report = validate(dataset)
    assert any(p.file == "distributed/2-instances/manifest.json" and "edited since it was written" in p.problem
               for p in report.errors), [p.line() for p in report.problems]


def test_adopting_a_reference_dataset_writes_a_digest(tmp_path, sample_source):
    from reference_layout import write_reference_dataset

    target = tmp_path / "reference"
    write_reference_dataset(sample_source, target, "img")
    result = run_script("validate_dataset.py", target, "--adopt")
    assert result.returncode == 0, result.stdout + result.stderr
    meta = load(target)
    assert digest_status(meta)[0] == OK
    parse_metadata((target / "metadata.json").read_bytes())  # ours now, not the reference's


# ------------------------------------------------------------------------------------------ the fuzz

TRIALS = 36


def _leaf_paths(value, path=()):
    """Every (path) into a JSON value: dict keys and list positions, containers and leaves."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaf_paths(item, path + (key,))
    elif isinstance(value, list):
        for number, item in enumerate(value[:4]):
            yield from _leaf_paths(item, path + (number,))


def _mutate_metadata(ds, rng):
    meta = load(ds)
    before = canonical_bytes(meta)
    paths = [p for p in _leaf_paths(meta) if p and p[0] != DIGEST_KEY]
    while canonical_bytes(meta) == before:
        path = rng.choice(paths)
        parent = meta
        for step in path[:-1]:
            parent = parent[step]
        old = parent[path[-1]]
        replacement = rng.choice([
            -1, 0, None, "x", [], {}, True, 1e300,
            (old * 2 + 1) if isinstance(old, int) and not isinstance(old, bool) else 7,
            (old[:-1] + ("0" if old[-1:] != "0" else "1")) if isinstance(old, str) and old else "y",
            "delete",
        ])
        if replacement == "delete":
            if isinstance(parent, list):
                parent.pop(path[-1])
            else:
                del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    save(ds, meta)
    return f"metadata {'/'.join(map(str, path))} -> {replacement!r}"


def _mutate_shard(ds, rng):
    shards = sorted(p for p in ds.iterdir() if p.name.endswith(".tar"))
    shard = rng.choice(shards)
    data = bytearray(shard.read_bytes())
    kind = rng.choice(["flip", "truncate", "append", "zero-block", "delete", "swap"])
    if kind == "flip":
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        data = data[:rng.randrange(len(data))]
    elif kind == "append":
        data += bytes(rng.choice([1, 512, 1024]))
    elif kind == "zero-block":
        start = rng.randrange(0, len(data) // 512) * 512
        data[start:start + 512] = bytes(512)
    if kind == "delete":
        shard.unlink()
    elif kind == "swap":
        other = rng.choice([s for s in shards if s != shard])
        tmp = shard.with_suffix(".swap")
        shard.rename(tmp)
        other.rename(shard)
        tmp.rename(other)
    else:
        shard.write_bytes(bytes(data))
    return f"shard {shard.name} {kind}"


def _mutate_index(ds, rng):
    index = rng.choice(sorted(ds.glob("samples-*.index.tsv")))
    lines = index.read_bytes().split(b"\n")
    kind = rng.choice(["flip", "drop-line", "swap-labels", "duplicate-line", "empty"])
    if kind == "flip":
        data = bytearray(b"\n".join(lines))
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(7)
        index.write_bytes(bytes(data))
        return f"index {index.name} flip"
    body = [n for n in range(1, len(lines)) if lines[n]]
    if kind == "drop-line":
        del lines[rng.choice(body)]
    elif kind == "duplicate-line":
        lines.insert(1, lines[rng.choice(body)])
    elif kind == "swap-labels":
        a, b = rng.sample(body, 2)
        fa, fb = lines[a].split(b"\t"), lines[b].split(b"\t")
        if fa[2] == fb[2]:
            fa[2] = str(int(fa[2]) + 1).encode()
        else:
            fa[2], fb[2] = fb[2], fa[2]
        lines[a], lines[b] = b"\t".join(fa), b"\t".join(fb)
    else:
        lines = []
    index.write_bytes(b"\n".join(lines))
    return f"index {index.name} {kind}"


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _validate_trials(source, tmp_path, mutate, trials, seed):
    """[(what was mutated, the first error or usage error, report ok)] of `trials` mutated copies of
    `source`; fails the test on a crash (any exception but the usage error) or a hang."""
    rng = random.Random(seed)
    outcomes = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for trial in range(trials):
            ds = tmp_path / f"trial-{trial}"
            shutil.copytree(source, ds)
            what = mutate(trial, ds, rng)
            signal.alarm(60)  # a hang, not a timing: a validation of this dataset takes well under 1 s
            try:
                report = validate(ds)
            except ValidationUsageError as exc:  # exit 2, one line: not clean, not a crash
                outcomes.append((what, f"usage error: {exc}", False))
                continue
            except _Hang:
                pytest.fail(f"trial {trial}: {what}: validation hung")
            except Exception as exc:  # noqa: BLE001 - any other exception is a traceback for the user
                pytest.fail(f"trial {trial}: {what}: validation crashed with {type(exc).__name__}: {exc}")
            finally:
                signal.alarm(0)
            outcomes.append((what, report.errors[0].problem if report.errors else "", report.ok))
            shutil.rmtree(ds)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert len(outcomes) == trials
    return outcomes


def test_seeded_mutations_never_validate_clean_crash_or_hang(converted, tmp_path):
    mutations = [_mutate_metadata, _mutate_shard, _mutate_index]
    outcomes = _validate_trials(converted("img"), tmp_path, lambda n, ds, rng: mutations[n % 3](ds, rng), TRIALS, 25)
    clean = [what for what, _, ok in outcomes if ok]
    assert not clean, f"validated clean: {clean}"
    assert {what.split()[0] for what, _, _ in outcomes} == {"metadata", "shard", "index"}


def test_resealed_metadata_mutations_never_crash_or_hang(converted, tmp_path):
    """A metadata.json rewritten with a matching digest (a careful tamperer, a buggy writer): the digest
    cannot tell, so validating may pass (e.g. another `seed`), but never with a traceback or a hang."""
    def mutate(trial, ds, rng):
        what = _mutate_metadata(ds, rng)
        save(ds, sealed(load(ds)))
        return what

    outcomes = _validate_trials(converted("img"), tmp_path, mutate, TRIALS, 7)
    assert any(not ok for _, _, ok in outcomes)  # most such edits are still found by the checks below the digest
