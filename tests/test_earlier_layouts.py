"""Datasets as earlier commits wrote them (tests/data/earlier-layouts/, one per on-disk layout since 3a4a4fc;
its README names the commit and the command that wrote each): each validates and loads as it did, or
gets one line naming the re-index command, exit 1, and nothing about its intact shards; after the
re-index it validates and loads every sample. The layouts: docs/on-disk-format.md.
"""

import csv
import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_main, run_script
from imagenet_shards.cli.tar_tools import main as tar_tools_main
from imagenet_shards.cli.validate_dataset import main as validate_main
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import earlier
from imagenet_shards.loader import get_data

DATA = Path(__file__).resolve().parent / "data" / "earlier-layouts"
EARLIEST = ("train.index.tsv", "validation.index.tsv")
RENAMED = ("samples-train.index.tsv", "samples-validation.index.tsv")
# <format>-<the commit that wrote it> -> (its index file names, whether this version needs it re-indexed)
LAYOUTS = {
    "img-3a4a4fc": (EARLIEST, True),  # <split>.index.tsv, payload sha256
    "tensor-3a4a4fc": (EARLIEST, True),
    "tfrecord-3a4a4fc": (EARLIEST, True),
    "img-22d84c3": (RENAMED, True),  # samples-<split>.index.tsv, payload sha256
    "img-efb8731": (RENAMED, False),  # payload CRC32C
    "img-b0a591e": (RENAMED, False),  # + the bbox column
    "img-77eab42": (RENAMED, False),  # + metadata_digest
}
# tensor and tfrecord store 16 px images (to stay a few KB): the loader's note that it upsamples them is expected
pytestmark = pytest.mark.filterwarnings("ignore:.*have a short side of 16 px:UserWarning")
NEEDS_REINDEX = [layout for layout, (_, needs) in LAYOUTS.items() if needs]


@pytest.fixture
def copy(tmp_path):
    """A fresh copy of the dataset of `layout` (the tests change some)."""
    def make(layout):
        target = tmp_path / layout
        shutil.copytree(DATA / layout, target)
        return target

    return make


def _index_rows(target, name):
    """(key, label) of every line of an index as written, read as text (whatever its version)."""
    with open(target / name, newline="") as handle:
        return sorted((row["key"], int(row["label"])) for row in csv.DictReader(handle, delimiter="\t"))


def _loaded(target, split, instances=1):
    """(key, label) of every sample the loader gives `instances` instances (a repartition when 2), together."""
    rows = []
    for instance in range(instances):
        loader = get_data(str(target), split, 1, 0, instance=(instance, instances), on_error="fail",
                          normalization="device", with_keys=True)
        rows += [(key, int(label)) for batch in loader for key, label in zip(batch.keys, batch[1].tolist())]
    return sorted(rows)


def _reindex_line(target, names):
    return (f"error: {', '.join(names)}: sample indexes of the earlier version (payload sha256, no CRC32C), not "
            f"damage: run `python tar_tools.py reindex {target}` (it checks every payload against its sha256), "
            f"then validate again")


def test_every_layout_is_kept_with_the_commit_that_wrote_it():
    readme = (DATA / "README.md").read_text()
    assert sorted(p.name for p in DATA.iterdir() if p.is_dir()) == sorted(LAYOUTS)
    assert all(f"`{layout}`" in readme for layout in LAYOUTS)
    for layout, (names, _) in LAYOUTS.items():
        assert all((DATA / layout / name).is_file() for name in names), layout
        assert (DATA / layout / "distributed" / "2-instances" / "manifest.json").is_file(), layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_validate_says_ok_or_names_the_reindex_command_in_one_line(copy, layout):
    target = copy(layout)
    names, needs = LAYOUTS[layout]
    result = run_main(validate_main, target, "--workers", 1)
    if needs:
        assert result.returncode == 1 and result.stderr == "", result.stdout + result.stderr
        assert result.stdout.splitlines() == [_reindex_line(target, names)]
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[0] == "Dataset OK." and "error:" not in result.stdout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_loader_reads_every_sample_or_refuses_in_one_line(copy, layout):
    target = copy(layout)
    names, needs = LAYOUTS[layout]
    for split, name in zip(("train", "validation"), names):
        if needs:
            with pytest.raises(DatasetError) as raised:
                _loaded(target, split)
            assert str(raised.value) == (f"{target / name}: a sample index of the earlier version (payload sha256, "
                                         f"no CRC32C); re-create it with `python tar_tools.py reindex DATASET_DIR`")
        else:  # the whole split, and the two instances of its repartition (4 and 2 samples: none dropped)
            assert _loaded(target, split) == _loaded(target, split, 2) == _index_rows(target, name)


@pytest.mark.parametrize("layout", NEEDS_REINDEX)
def test_reindex_then_validate_and_load(copy, layout):
    target = copy(layout)
    names, _ = LAYOUTS[layout]
    before = {name: _index_rows(target, name) for name in names}
    result = run_main(tar_tools_main, "reindex", target)
    assert result.returncode == 0, result
    assert result.stdout == "reindex: train 4 samples, validation 2 samples; distributed/2-instances written again\n"
    for extra in ((), ("--deep",)):
        result = run_main(validate_main, target, "--workers", 1, *extra)
        assert result.returncode == 0 and result.stdout.startswith("Dataset OK.\n"), result.stdout + result.stderr
    for split, name in zip(("train", "validation"), names):
        assert _loaded(target, split) == _loaded(target, split, 2) == _index_rows(target, name) == before[name]
    result = run_main(tar_tools_main, "reindex", target)  # again: nothing to do
    assert result.returncode == 0 and result.stdout == f"reindex: every index of {target} is current\n", result


def test_the_validator_as_a_command_one_line_and_a_damaged_shard_named(copy):
    """The checkout's script in a process of its own (its sys.argv[0]: validate_dataset.py): the one line,
    exit 1, no traceback; a byte changed in one shard adds that shard's line, and only its."""
    target = copy("img-3a4a4fc")
    result = run_script("validate_dataset.py", target, "--workers", 2)
    assert result.returncode == 1 and result.stderr == "", result.stdout + result.stderr
    assert result.stdout.splitlines() == [_reindex_line(target, LAYOUTS["img-3a4a4fc"][0])]
    with open(target / "train.index.tsv", newline="") as handle:
        row = next(r for r in csv.DictReader(handle, delimiter="\t") if r["shard"] == "train-000001.tar")
    with open(target / "train-000001.tar", "r+b") as handle:  # a payload's last byte
        handle.seek(int(row["payload_offset"]) + int(row["payload_size"]) - 1)
        byte = handle.read(1)[0]
        handle.seek(-1, 1)
        handle.write(bytes([byte ^ 1]))
    result = run_main(validate_main, target, "--workers", 1)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == _reindex_line(target, LAYOUTS["img-3a4a4fc"][0]), lines
    assert lines[1].startswith("error: train-000001.tar: sha256 ") and "changed since conversion" in lines[1]
    result = run_main(tar_tools_main, "reindex", target)  # damage is named, never blessed
    assert result.returncode == 1 and result.stderr.startswith("train-000001.tar: the payload at line "), result


def test_the_reindex_command_is_named_as_the_user_has_it(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", [str(Path(earlier.PACKAGE).parent / "validate_dataset.py")])
    assert earlier.reindex_command() == "python tar_tools.py reindex DATASET_DIR"  # the checkout's script
    assert earlier.reindex_command(tmp_path / "my set") == f"python tar_tools.py reindex '{tmp_path}/my set'"
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "bin" / "validate-dataset")])
    monkeypatch.setattr(earlier.distributions, "entry_points", lambda group, name: [
        type("Entry", (), {"value": f"{earlier.PACKAGE.name}.cli.validate_dataset:main"})()])
    assert earlier.reindex_command() == "tar-tools reindex DATASET_DIR"  # a console script of an install
    monkeypatch.setattr(earlier.distributions, "entry_points", lambda group, name: [])
    assert earlier.reindex_command() == "python tar_tools.py reindex DATASET_DIR"  # not ours: the checkout's
    monkeypatch.setattr(earlier, "PACKAGE", tmp_path / "site-packages" / "imagenet_shards")
    assert earlier.reindex_command() == "tar-tools reindex DATASET_DIR"  # installed: no tar_tools.py beside it
