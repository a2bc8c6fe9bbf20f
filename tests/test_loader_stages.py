"""The loader by stage (issue 46): each stage's public face resolves every name it lists, a light stage
module imports without torch, and the modules' names before the stages still import, as the module itself,
with a DeprecationWarning."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imagenet_shards import loader

REPO = Path(__file__).resolve().parents[1]
STAGES = ("plan", "read", "transform", "device", "output")


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_face_resolves_every_name_it_exports(stage):
    import importlib

    face = importlib.import_module(f"imagenet_shards.loader.{stage}")
    assert face.__all__ and dir(face) == sorted(face.__all__)
    for name in face.__all__:
        assert getattr(face, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        face.nothing_here


def test_the_read_face_and_its_shard_reader_import_without_torch():
    result = run("import sys; from imagenet_shards.loader.read import Run, iter_run, scan_shard; "
                 "import imagenet_shards.loader.plan.share_plan; print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]


def test_a_module_name_before_the_stages_is_the_module_itself_with_a_deprecation_warning():
    code = ("import warnings, pickle; warnings.simplefilter('always'); "
            "import imagenet_shards.loader.resume as old, imagenet_shards.loader.plan.resume as new; "
            "from imagenet_shards.loader.pipeline import ImagePipeline; "
            "from imagenet_shards.loader.transform import ImagePipeline as face_pipeline; "
            "segment = pickle.loads(pickle.dumps(old.Segment(1, 1, 1, 0))); "
            "print(old is new, old.__spec__.name, ImagePipeline is face_pipeline, type(segment).__module__)")
    result = run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "imagenet_shards.loader.plan.resume", "True",
                                     "imagenet_shards.loader.plan.resume"]
    assert result.stderr.count("DeprecationWarning") == 2
    assert "imagenet_shards.loader.pipeline is now imagenet_shards.loader.transform.pipeline" in result.stderr


def test_every_moved_name_points_at_a_module():
    import importlib.util

    for old, new in loader.MOVED.items():
        assert importlib.util.find_spec(f"imagenet_shards.loader.{new}") is not None, (old, new)
        assert new.split(".")[0] in STAGES


def test_the_path_of_a_sample_is_the_one_the_docs_name(converted):
    """tools/sample_path.py on a local img dataset with 2 workers: the files on its three stacks (the Source,
    the share, a worker's first payload bytes) are the ones docs/loader-stages.md names, in that order."""
    result = subprocess.run([sys.executable, str(REPO / "tools" / "sample_path.py"), str(converted("img"))],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    measured = result.stderr.split("the path of a sample: ")[1].splitlines()[0]
    count, _, files = measured.partition(" files: ")
    section = (REPO / "docs" / "loader-stages.md").read_text().split("## The path of a sample")[1]
    named = re.findall(r"^\d+\. `([^`]+)`", section, flags=re.M)
    assert files.split(", ") == [f"{name}" for name in named] and int(count) == len(named)


def test_loader_sources_re_exports_the_registry_s_resolve_source():
    """resolve_source moved into the source kinds' registry (issue 46); loader.sources keeps its names, the same objects."""
    from imagenet_shards.loader import source_kinds, sources

    for name in ("resolve_source", "Source", "SourceError", "load_own_share", "SYNTHETIC_NAMES"):
        assert getattr(sources, name) is getattr(source_kinds, name), name
    assert loader.SourceError is source_kinds.SourceError
