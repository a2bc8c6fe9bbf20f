"""tools/layout.py finds what it promises in a package made for the purpose, and nothing in a clean one."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import layout  # noqa: E402


def _package(tmp_path, files):
    root = tmp_path / "datasets"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_clean_package_meets_every_goal(tmp_path):
    root = _package(tmp_path, {"fileio.py": "", "index.py": "from datasets import fileio\n"})
    result = layout.survey(root)
    assert (result["cycles"], result["upward_imports"], result["big_modules"], result["long_functions"]) == ([], [], [], [])
    assert layout.main(["--root", str(root)]) == 0


def test_cycles_upward_imports_and_sizes_are_each_reported(tmp_path):
    long_function = "def f():\n" + "    x = 1\n" * 85
    root = _package(tmp_path, {
        "fileio.py": "def g():\n    from datasets.loader import reader\n",  # a lazy import counts
        "loader/__init__.py": "",
        "loader/reader.py": "from datasets import fileio\n" + long_function + "#\n" * 600,
        "index.py": "from datasets import formats\n",
        "formats/__init__.py": "from datasets.index import x\n",
        "mystery.py": "",
    })
    result = layout.survey(root)
    assert any("datasets.fileio" in c and "datasets.loader.reader" in c for c in result["cycles"])
    assert "datasets.fileio -> datasets.loader.reader" in result["upward_imports"]
    assert "datasets.index -> datasets.formats" in result["upward_imports"]
    assert [m["module"] for m in result["big_modules"]] == ["datasets/loader/reader.py"]
    assert result["long_functions"][0]["function"].endswith(" f")
    assert result["unplaced_units"] == ["mystery"]
    assert layout.main(["--root", str(root)]) == 1
