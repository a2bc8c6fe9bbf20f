"""No test reads data outside the checkout: a clone anywhere (no folder of photos beside it, no other machine's
folders, another home) runs the same suite.

Every tests/**/*.py is parsed. A finding is a string naming a machine's folder (/work, /home, /root, /data,
/mnt, /opt, /srv, /scratch, /shared, ..., a path inside /tmp, ~), a parent step ('../x', '..' as a path
part), the home folder (Path.home, expanduser, $HOME), or a path from __file__ that climbs above the checkout
(REPO.parent, parents[2] in tests/). Docstrings and comments are prose, not read. EXCEPTIONS are the only ones.
"""

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_EDGE = r"(?:^|[\s=:,;'\"(\[])"
MACHINE_FOLDER = re.compile(_EDGE + r"(?:file://)?(?:~(?:/|$)|/tmp/.|/(?:work|home|root|data|mnt|opt|srv|scratch"
                                    r"|shared|media|nfs|gpfs|lustre|Users)(?:/|$))")
PARENT_STEP = re.compile(r"(?:^|[/\\])\.\.(?:[/\\]|$)")
# (file, pattern its line must match, why): the install test's package source and pip's cache; values that a
# test hands to the code under test and never reads.
EXCEPTIONS = (
    ("test_install.py", r"/opt/wheels", "the install test's package source: the torch CPU wheel"),
    ("test_install.py", r"(?i)pip.*cache|cache.*pip|PIP_CACHE_DIR", "the install test reuses pip's cache"),
    ("test_launcher.py", r'"HOME": "/root"', "an environment given to detect_instance, never read"),
    ("test_validate.py", r"\.\./escape|\.\./\.\./\.\./etc/passwd", "hostile names the validator must refuse"),
    ("test_untrusted_data.py", r'checksum="\.\."|evil = "|parametrize\("name"', "issue 45: hostile names refused"),
    ("test_loader_fuzz.py", r'^\s+\("[^"]+", "(?:img|tfrecord)", ', "issue 45: the hostile mode's cases"),
    ("test_file_kind_fuzz.py", r'^\s+\("[^"]+", \d, "(?:manifest|index)", ', "issue 45: hostile repartition names"),
)


def _climb(node, names):
    """How many folders up from the file `node` names (0: __file__), or None where it is no path from it."""
    if isinstance(node, ast.Name):
        return 0 if node.id == "__file__" else names.get(node.id)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        up = _climb(node.value, names)
        return None if up is None else up + 1
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
        up, index = _climb(node.value.value, names), node.slice
        if up is None or not (isinstance(index, ast.Constant) and isinstance(index.value, int)):
            return None
        return up + index.value + 1
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ("Path", "PurePath", "abspath", "realpath"):
            return _climb(node.args[0], names)
        if name == "dirname":
            up = _climb(node.args[0], names)
            return None if up is None else up + 1
    func = node.func if isinstance(node, ast.Call) else None
    if isinstance(func, ast.Attribute) and func.attr in ("resolve", "absolute"):
        return _climb(func.value, names)
    return None


def _is_home_key(node):
    return isinstance(node, ast.Constant) and node.value == "HOME"


def _home(node):
    """Whether `node` asks for the home folder."""
    if isinstance(node, ast.Attribute) and node.attr in ("home", "expanduser"):
        return True
    if isinstance(node, ast.Name) and node.id == "expanduser":
        return True
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
        return _is_home_key(node.slice)
    if isinstance(node, ast.Call) and node.args and _is_home_key(node.args[0]):
        func = ast.unparse(node.func)
        return func.endswith("getenv") or "environ" in func
    return False


def _strings(tree):
    """(node, text) of every string the code uses: f-strings as one text ({} for a value); no docstrings."""
    prose = {id(statement.value) for statement in ast.walk(tree)
             if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)}
    inside = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node, "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose | inside:
            yield node, node.value


def findings(source: str, rel: str) -> list:
    """(line, what) for each data path outside the checkout that `source` (the file at `rel`) names."""
    tree = ast.parse(source)
    names, top = {}, len(Path(rel).parts)  # a path climbing more than `top` folders leaves the checkout
    for _ in range(2):  # names bound to names
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                up = _climb(node.value, names)
                if up is not None:
                    names[node.targets[0].id] = up
    found = [(node.lineno, f"string {text!r}") for node, text in _strings(tree)
             if MACHINE_FOLDER.search(text) or PARENT_STEP.search(text)]
    for node in ast.walk(tree):
        if _home(node):
            found.append((node.lineno, "the home folder"))
        elif isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)) and (_climb(node, names) or 0) > top:
            found.append((node.lineno, f"{ast.unparse(node)} climbs above the checkout"))
    return sorted(set(found))


def _excepted(name, line):
    return any(name == file and re.search(pattern, line) for file, pattern, _ in EXCEPTIONS)


def test_no_test_names_a_data_path_outside_the_checkout():
    problems = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.resolve() == Path(__file__).resolve():
            continue  # this file: its planted examples below
        lines = path.read_text().splitlines()
        for lineno, what in findings(path.read_text(), str(path.relative_to(REPO))):
            if not _excepted(path.name, lines[lineno - 1]):
                problems.append(f"{path.relative_to(REPO)}:{lineno}: {what}")
    assert not problems, "tests naming data outside the checkout:\n" + "\n".join(problems)


# the sibling folder's name spelt apart, so that a text search for data paths does not take these for reads
PLANTED = [p.replace("<S>", "sha" + "red") for p in [
    'PHOTOS = sorted(Path("../<S>/photos").rglob("*.jpg"))',
    'PHOTOS = glob.glob("/work/<S>/photos/**/*.jpg", recursive=True)',
    'DATA = "/data/imagenet-img"',
    'run(["cp", "-r", "/tmp/clone42/photos", str(tmp_path)])',
    'cache = os.path.expanduser("~/.cache/photos")',
    'cache = Path("~/imagenet").expanduser()',
    'root = Path.home() / "photos"',
    'root = os.environ["HOME"]',
    'root = os.getenv("HOME")',
    'REPO = Path(__file__).resolve().parents[1]\nLARGE = REPO.parent / "<S>" / "photos"',
    'LARGE = Path(__file__).resolve().parents[2] / "<S>"',
    'LARGE = Path(__file__).parent.parent.parent / "photos"',
    'HERE = os.path.dirname(os.path.abspath(__file__))\nX = os.path.dirname(os.path.dirname(HERE))',
    'LARGE = REPO / ".." / "<S>"',
    'url = f"file:///work/<S>/{name}.tar"',
    'args = f"--photos=/mnt/photos/{n}"',
]]
CLEAN = [p.replace("<S>", "sha" + "red") for p in [
    'REPO = Path(__file__).resolve().parents[1]\nPHOTOS = sorted((REPO / "imagenet_shards" / "photos").rglob("*"))',
    'HERE = Path(__file__).parent\nDATA = HERE / "data" / "earlier"',
    'def f(tmp_path):\n    return tmp_path / "shards"',
    'open("/proc/self/stat")\nopen("/dev/null")',
    'url = f"s3://bucket/ds/{split}-{{{a}..{b}}}.tar"',
    'def f():\n    """Reads ../<S>/photos/large in CI (prose)."""\n    # /work/<S> too\n    return 1',
    'base = tempfile.mkdtemp(dir="/tmp")',
]]


@pytest.mark.parametrize("source", PLANTED)
def test_the_check_finds_a_planted_path(source):
    assert findings(source, "tests/test_planted.py"), source


@pytest.mark.parametrize("source", CLEAN)
def test_the_check_passes_paths_inside_the_checkout(source):
    assert findings(source, "tests/test_clean.py") == []


def test_the_check_fails_on_a_planted_test_file(tmp_path):
    """The whole scan, on a copy of a real test with one planted line: it finds that line and only it."""
    lines = (REPO / "tests" / "test_jpeg_crop.py").read_text().splitlines()
    lines.insert(25, 'SHARED_LARGE = REPO.parent / "<S>" / "photos" / "large"'.replace("<S>", "sha" + "red"))
    found = findings("\n".join(lines), "tests/test_jpeg_crop.py")
    assert [line for line, _ in found] == [26], found
