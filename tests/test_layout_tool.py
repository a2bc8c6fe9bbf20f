"""tools/layout.py finds what it promises in a package made for the purpose, and nothing in a clean one."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import layout  # noqa: E402


def _package(tmp_path, files):
    root = tmp_path / "imagenet_shards"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_clean_package_meets_every_goal(tmp_path):
    root = _package(tmp_path, {"fileio.py": "", "index.py": "from imagenet_shards import fileio\n"})
    result = layout.survey(root)
    assert (result["cycles"], result["upward_imports"], result["big_modules"], result["long_functions"]) == ([], [], [], [])
    assert layout.main(["--root", str(root)]) == 0


def test_cycles_upward_imports_and_sizes_are_each_reported(tmp_path):
    long_function = "def f():\n" + "    x = 1\n" * 85
    root = _package(tmp_path, {
        "fileio.py": "def g():\n    from imagenet_shards.loader import reader\n",  # a lazy import counts
        "loader/__init__.py": "",
        "loader/reader.py": "from imagenet_shards import fileio\n" + long_function + "#\n" * 600,
        "index.py": "from imagenet_shards import formats\n",
        "formats/__init__.py": "from imagenet_shards.index import x\n",
        "mystery.py": "",
    })
    result = layout.survey(root)
    assert any("imagenet_shards.fileio" in c and "imagenet_shards.loader.reader" in c for c in result["cycles"])
    assert "imagenet_shards.fileio -> imagenet_shards.loader.reader" in result["upward_imports"]
    assert "imagenet_shards.index -> imagenet_shards.formats" in result["upward_imports"]
    assert [m["module"] for m in result["big_modules"]] == ["imagenet_shards/loader/reader.py"]
    assert result["long_functions"][0]["function"].endswith(" f")
    assert result["unplaced_units"] == ["mystery"]
    assert layout.main(["--root", str(root)]) == 1


def test_source_kind_names_compared_outside_the_registry_are_reported(tmp_path):
    root = _package(tmp_path, {
        "loader/__init__.py": "",
        "loader/source_kinds/__init__.py": "",
        "loader/source_kinds/shards.py": 'SHARDS = SourceKind("shards", f, former_names=("webdataset",))\n'
                                         'def f(source):\n    return source.kind == "shards"\n',  # its own home: fine
        "loader/resume.py": 'def f(source):\n    return source.kind == "webdataset"\n',
        "same_as.py": 'def f(source, layout):\n    return source.kind in ("shards", "x") or layout == "shards"\n',
    })
    result = layout.survey(root)
    assert result["kind_name_comparisons"] == ["imagenet_shards/loader/resume.py:2 'webdataset'",
                                               "imagenet_shards/same_as.py:2 'shards'"]
    assert layout.main(["--root", str(root)]) == 1


def test_private_attributes_of_other_objects_are_reported_with_the_exemptions(tmp_path):
    root = _package(tmp_path, {"fileio.py": (
        "import os\nimport torch\nfrom imagenet_shards import index\n"
        "class A:\n"
        "    def f(self, other, row):\n"
        "        self._mine = other._theirs\n"  # reported
        "        super()._g()\n"
        "        os._exit(torch._C._foo(row._replace(x=1)._asdict()))\n"  # a module's private API, namedtuple's
        "        return index._hidden\n"  # the package's own module: reported
    )})
    result = layout.survey(root)
    assert result["private_accesses"] == ["imagenet_shards/fileio.py: index._hidden", "imagenet_shards/fileio.py: other._theirs"]
    assert layout.main(["--root", str(root)]) == 1


def test_a_module_file_name_used_twice_is_reported_with_the_exemptions(tmp_path):
    root = _package(tmp_path, {
        "tar_tools.py": "", "cli/__init__.py": "", "cli/validate_dataset.py": "",  # a script's own command: fine
        "hostbench/sources.py": "", "loader/sources.py": "",
        "cifar10.py": "", "loader/source_kinds/cifar10.py": "",  # a registry entry named after its kind: fine
        "repartition/plan.py": "", "sample/plan.py": "", "sample/__main__.py": "",  # role names: fine
    })
    (tmp_path / "tar_tools.py").write_text("")
    (tmp_path / "validate_dataset.py").write_text("")
    assert layout.same_names(root) == ["sources.py: imagenet_shards/hostbench/sources.py, imagenet_shards/loader/sources.py",
                                       "tar_tools.py: imagenet_shards/tar_tools.py, tar_tools.py"]
    assert layout.main(["--root", str(root)]) == 1


def test_long_functions_in_the_scripts_and_examples_and_a_long_doc_are_reported(tmp_path):
    root = _package(tmp_path, {})
    long_function = "def main():\n" + "    x = 1\n" * 85
    (tmp_path / "create_webdataset.py").write_text(long_function)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "train.py").write_text("def short():\n    return 1\n\n\n" + long_function)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "crop-decode.md").write_text("a line\n" * 151)
    result = layout.survey(root)
    assert [f["function"] for f in result["script_long_functions"]] == ["create_webdataset.py:1 main",
                                                                        "examples/train.py:5 main"]
    assert result["long_docs"] == ["docs/crop-decode.md: 151 lines (goal 150)"]
    assert layout.main(["--root", str(root)]) == 1
    (tmp_path / "docs" / "crop-decode.md").write_text("a line\n" * 150)
    (tmp_path / "create_webdataset.py").write_text("def main():\n    return 0\n")
    (tmp_path / "examples" / "train.py").write_text("")
    assert layout.main(["--root", str(root)]) == 0


def test_get_data_over_its_parameter_goal_and_a_wide_class_init_are_reported(tmp_path):
    wide = ", ".join(f"p{i}" for i in range(19))
    root = _package(tmp_path, {
        "loader/__init__.py": "",
        "loader/image_loader.py": f"def get_data(source, {wide}, **earlier):\n    pass\n"
                                  "class Small:\n    def __init__(self, " + ", ".join(f"a{i}" for i in range(12)) +
                                  "):\n        pass\n",
        "loader/read_loop.py": "class ReadLoop:\n    def __init__(self, a, b, *, " +
                               ", ".join(f"k{i}" for i in range(10)) + ", **rest):\n        pass\n",
    })
    result = layout.survey(root)
    assert result["wide_signatures"] == ["loader/image_loader.py: get_data: 21 parameters (goal 20)",
                                         "loader/read_loop.py: ReadLoop.__init__: 13 parameters (goal 12)"]
    assert layout.main(["--root", str(root)]) == 1
    (root / "loader/image_loader.py").write_text("def load(source):\n    pass\n")  # the goal's function gone
    (root / "loader/read_loop.py").write_text("")
    assert layout.survey(root)["wide_signatures"] == [
        "loader/image_loader.py: get_data: not found (PARAMETER_GOALS names it)"]


def test_a_kind_name_compared_with_anything_but_a_shared_word_is_reported(tmp_path):
    root = _package(tmp_path, {
        "loader/__init__.py": "",
        "loader/source_kinds/__init__.py": "",
        "loader/source_kinds/cifar10.py": 'CIFAR10 = SourceKind("cifar10", f)\n',
        "loader/source_kinds/folder.py": 'FOLDER = SourceKind("folder", f)\n',
        "hostbench.py": 'def f(data, row):\n    return data == "cifar10" or row.format != "folder"\n',
    })
    assert layout.survey(root)["kind_name_comparisons"] == ["imagenet_shards/hostbench.py:2 'cifar10'"]


def test_a_source_field_only_one_kind_reads_is_reported(tmp_path):
    source = ("@dataclass\nclass Source:\n    kind: str\n    groups: list\n    shape: tuple = ()\n"
              "    settings: object = None\n")
    root = _package(tmp_path, {
        "loader/__init__.py": "",
        "loader/read.py": "def f(source):\n    return source.groups\n",  # read outside the kinds: shared
        "loader/source_kinds/__init__.py": "",
        "loader/source_kinds/source.py": source,
        "loader/source_kinds/synthetic.py": 'def f(c):\n    return c.source.shape, c.source.settings\n'
                                            'SYNTHETIC = SourceKind("synthetic", f)\n',
        "loader/source_kinds/cifar10.py": 'def f(c):\n    return c.source.settings\nCIFAR10 = SourceKind("cifar10", f)\n',
    })
    assert layout.survey(root)["one_kind_fields"] == [
        "Source.shape: only the synthetic kind reads it (move it into its settings)"]
    assert layout.main(["--root", str(root)]) == 1


def test_a_test_rig_in_the_wheel_or_imported_by_the_library_is_reported(tmp_path):
    root = _package(tmp_path, {"testing/__init__.py": "", "fileio.py": "from testing_rigs import s3_server\n"})
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["imagenet_shards*"]\n')
    (tmp_path / "testing_rigs").mkdir()
    (tmp_path / "testing_rigs" / "__init__.py").write_text("")
    assert layout.survey(root)["test_rigs_in_wheel"] == ["imagenet_shards.testing",
                                                         "imagenet_shards/fileio.py:1 imports testing_rigs"]
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["*"]\n')
    assert "testing_rigs" in layout.survey(root)["test_rigs_in_wheel"]


def test_the_checkout_ships_no_test_rig():
    """Issue 46: the wheel's packages (pyproject's packages.find, as setuptools finds them) hold no test rig."""
    assert layout.wheel_test_rigs(REPO) == []
    assert not list((REPO / "imagenet_shards" / "testing").glob("*.py"))  # a __pycache__ left by the move is not one
    assert (REPO / "testing_rigs" / "s3_server.py").is_file()
