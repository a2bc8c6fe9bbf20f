"""The package's shape in one screen: module sizes, long functions, import cycles, upward imports,
comparisons of a source kind's name, access to another object's private attributes.

    python tools/layout.py [--root imagenet_shards] [--json FILE]

Goals (issue #20): no module over 600 lines, no function over 80, no import cycle, no import that
runs against the layering below. Issue #34: no comparison of a source kind's name (`x.kind ==
"synthetic"`) outside loader/source_kinds/ (ask the kind instead), and no `obj._name` where obj is
not self/cls (namedtuple's `_replace`/`_asdict`/`_fields`/`_make` and private names of modules that
are not the package's, `os._exit`, `torch._C`, are exempt; PRIVATE_ALLOWED lists the known rest).
No module file name twice in the package and the repository root's scripts (role names, registry entries
and a script's own command in cli/ aside); no function over 80 lines in the root's scripts and examples/;
docs/crop-decode.md within 150 lines (DOC_LINES); get_data within 20 parameters (PARAMETER_GOALS) and no
class `__init__` over 12 (INIT_PARAMETERS): settings that belong together travel as one object. Issue 46: no
branch on a kind name outside the registry (`data == "cifar10"` too, SHARED_WORDS aside), no field of the loader's
`Source` that only one kind reads (it belongs in that kind's settings object), and no test rig (TEST_RIGS, a
`testing` package) in the wheel pyproject.toml's packages.find makes, nor imported by the library; no module
outside loader/ imports a loader stage's internals (STAGED: a module inside one of loader/'s subpackages other
than its __init__, the stage's public face; tests and benchmarks may). Exit 0 when all are met, 1 otherwise;
it prints each offender so a maintainer knows where to cut.

LAYERS orders the package's top-level modules and subpackages from the bottom up: a module may
import from its own layer's unit (itself or its subpackage) and from units in lower layers. A
unit missing from LAYERS is reported, so a new module gets placed deliberately. Imports inside
functions count: a lazy import is still a dependency.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

MODULE_LINES = 600
FUNCTION_LINES = 80
SOURCE_KINDS_DIR = ("loader", "source_kinds")  # the one place that names source kinds
# Kind names that are also words of other vocabularies (order="shards", the format comparison's "folder" row, the
# sample's layouts): compared with a `.kind` they are reported, compared with anything else they are not.
SHARED_WORDS = {"shards", "folder"}
KIND_COMMON_MODULES = {"__init__", "base", "source"}  # source_kinds/ modules of every kind (registry, contract, Source)
# Folders of the checkout that hold test rigs, tests and benchmarks: never in the wheel, never imported by the library.
TEST_RIGS = ("testing_rigs", "tests", "benchmarks")
# Module names that say a module's role in its package, so several packages have one (issue 34).
ROLE_NAMES = {"__init__", "__main__", "plan", "cli", "report", "run", "base"}
# Docs with a size goal: {path under the repository: most lines} (issue 34: a method, not a lab log).
DOC_LINES = {"docs/crop-decode.md": 150}
# Functions with a parameter goal: {"path under the package: function": most parameters} (issue 34: get_data
# takes groups, imagenet_shards/loader/options.py). Every parameter counts, *args and **kwargs included.
PARAMETER_GOALS = {"loader/image_loader.py: get_data": 20}
INIT_PARAMETERS = 12  # a class __init__'s parameters besides self (issue 34)
SCRIPT_DIRS = ("examples",)  # besides the repository root's scripts: functions held to FUNCTION_LINES too
STAGED = "loader"  # its subpackages are stages (plan/, read/, ...): outside it, only their __init__ is imported
REGISTRY_DIRS = {("loader", "source_kinds"), ("loader", "payloads")}  # entries named after their kind
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# Private attributes of other objects still read, each with the issue that removes it: "path: obj._name".
PRIVATE_ALLOWED = {
    "imagenet_shards/loader/output/batch_ring.py: self.buffers[key].untyped_storage()._cdata":
        "issue 34: torch has no public storage use count",
    "imagenet_shards/loader/output/batch_ring.py: torch.empty(0, dtype=dtype)._typed_storage":
        "issue 34: torch has no public shared-storage constructor",
    "imagenet_shards/loader/output/batch_ring.py: torch.empty(0, dtype=dtype)._typed_storage()._new_shared":
        "issue 34: torch has no public shared-storage constructor",
    "imagenet_shards/loader/read/epoch_runs.py: iterator._shutdown_workers":
        "torch has no public way to stop a persistent DataLoader's workers (and forget their pids) now",
    "imagenet_shards/loader/read/epoch_runs.py: self.dataloader._iterator":
        "torch has no public way to drop a persistent DataLoader's iterator",
    "imagenet_shards/storage.py: answer['Body']._raw_stream": "issue 34: botocore's StreamingBody hides the urllib3 response",
}

# Bottom to top. Units in one tuple are peers and must not import each other.
LAYERS = [
    ("torchvision_hook",),  # stdlib only: copied into .venv as an import hook
    ("errors",),  # the exception root every module raises from
    ("fileio", "dataset_folder", "torchvision_cpu", "normalization", "launcher", "metadata_digest",
     "safe_names", "pixel_limit"),  # foundations, no data model; the names and pixel rules for untrusted data
    ("storage_hooks",),  # who watches storage's requests (the benchmark's request log)
    ("storage",),  # transport: bytes from paths and URLs, its own errors only
    ("index", "preprocess", "balance"),  # the data model: sample index (records, columns, metadata), steps
    ("formats", "cifar10"),  # one module per on-disk format, one registry; CIFAR-10's python batches
    ("reference",),  # Graphcore's reference harness: metadata, checksum, .pth, layout + adopt, remainders
    ("repartition",),  # a package: plan (pure) < source < request < write < run, report
    ("validate",),
    ("convert",),
    ("shard_cache",),
    ("loader",),
    ("sample", "tools", "inspect", "ledger"),  # tools over the library (tools/: modules behind one script each)
    ("hostbench",),  # applications
    ("cli", "training"),  # the commands (top-level scripts, console entry points); a training script's imports
]


def module_files(root: Path) -> dict:
    """{dotted module name: path} for every .py under root (root's own name first)."""
    mods = {}
    for directory, _, files in os.walk(root):
        for name in sorted(files):
            if name.endswith(".py"):
                path = Path(directory) / name
                dotted = ".".join(path.relative_to(root.parent).with_suffix("").parts)
                mods[dotted.removesuffix(".__init__")] = path
    return mods


def imports_of(module: str, path: Path, known: dict) -> set:
    """The package modules that `module` imports (module-level and in functions alike)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            candidates = [base] + [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != module and not module.startswith(c + "."))
    return found


def cycles(graph: dict) -> list:
    """Each import cycle once, as "a -> b -> a" (depth-first search, back edges)."""
    state, stack, out = {}, [], []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                out.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif not state.get(nxt):
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if not state.get(node):
            visit(node)
    return out


def unit_of(module: str) -> str:
    """The layering unit: the top-level module or subpackage under the package root."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of(unit: str):
    for level, units in enumerate(LAYERS):
        if unit in units:
            return level
    return None


def source_kind_names(root: Path) -> set:
    """The names (and former names) of the source kinds registered under loader/source_kinds/."""
    names = set()
    for path in sorted(root.joinpath(*SOURCE_KINDS_DIR).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "SourceKind":
                if node.args and isinstance(node.args[0], ast.Constant):
                    names.add(node.args[0].value)
                for keyword in node.keywords:
                    if keyword.arg == "former_names" and isinstance(keyword.value, (ast.Tuple, ast.List)):
                        names.update(e.value for e in keyword.value.elts if isinstance(e, ast.Constant))
    return names


def _literals(node) -> set:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def kind_comparisons(tree, names: set) -> list:
    """(line, name) of each branch on a source kind's name: a comparison of something's `.kind` with one, or of
    anything with one that no other vocabulary uses (SHARED_WORDS): `data == "cifar10"` asks the registry too."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            compared = set().union(*map(_literals, operands)) & names
            if not any(isinstance(o, ast.Attribute) and o.attr == "kind" for o in operands):
                compared -= SHARED_WORDS
            found.extend((node.lineno, name) for name in sorted(compared))
    return found


def _attributes_read(tree) -> set:
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def _kinds_defined(tree) -> set:
    return {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "SourceKind" and node.args and isinstance(node.args[0], ast.Constant)}


def one_kind_fields(root: Path, mods: dict) -> list:
    """"Source.field: only the K kind" for each dataclass field of the loader's Source that only one kind's modules
    read (its own settings object's business); a module in source_kinds/ defining no kind belongs to the kinds of
    the modules there that import it (a kind's helper module: its kind's). Reads outside source_kinds/ make it shared."""
    kinds_dir = root.joinpath(*SOURCE_KINDS_DIR)
    trees = {m: ast.parse(p.read_text()) for m, p in mods.items()}
    source_class = next(((m, node) for m, tree in trees.items() for node in tree.body
                         if isinstance(node, ast.ClassDef) and node.name == "Source" and mods[m].parent in
                         (kinds_dir, kinds_dir.parent)), None)
    if source_class is None:
        return []
    home, cls = source_class
    fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    in_kinds = {m: p for m, p in mods.items() if p.parent == kinds_dir and p.stem not in KIND_COMMON_MODULES}
    owners = {m: _kinds_defined(trees[m]) for m in in_kinds}
    for module in in_kinds:
        if not owners[module]:
            owners[module] = set().union(*(owners[m] for m in in_kinds
                                           if module in imports_of(m, mods[m], mods) and _kinds_defined(trees[m])))
    read_outside = set().union(*(_attributes_read(tree) for m, tree in trees.items()
                                 if m not in in_kinds and m != home and mods[m].parent != kinds_dir))
    read_outside |= set().union(*(_attributes_read(trees[m]) for m in mods
                                  if mods[m].parent == kinds_dir and mods[m].stem == "base"))
    found = []
    for name in fields:
        readers = set().union(*(owners[m] for m in in_kinds if name in _attributes_read(trees[m])))
        if len(readers) == 1 and name not in read_outside:
            found.append(f"Source.{name}: only the {readers.pop()} kind reads it (move it into its settings)")
    return found


def wheel_test_rigs(repo: Path) -> list:
    """The packages pyproject.toml's packages.find puts in the wheel that are test rigs (TEST_RIGS, or a `testing`
    package in the library): setuptools' own find_packages over the checkout, no build. [] without a pyproject."""
    path = repo / "pyproject.toml"
    if not path.is_file():
        return []
    import tomllib

    from setuptools import find_packages

    found = tomllib.loads(path.read_text()).get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    packages = find_packages(where=str(repo), include=found.get("include", ("*",)), exclude=found.get("exclude", ()))
    return sorted(p for p in packages if p.split(".")[0] in TEST_RIGS or "testing" in p.split(".")[1:])


def rig_imports(tree) -> list:
    """(line, module) of each import of a test rig (TEST_RIGS) by the library: the wheel does not carry them."""
    found = []
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found.extend((node.lineno, name) for name in names if name.split(".")[0] in TEST_RIGS)
    return found


def _external_modules(tree, package: str) -> set:
    """Names bound by `import x` / `import x as y` / `from x import y` of modules outside `package`."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] != package)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] != package:
            bound.update(a.asname or a.name for a in node.names)
    return bound


def private_accesses(tree, package: str) -> list:
    """(line, "obj._name") of each access to a private attribute of an object other than self/cls."""
    external, found = _external_modules(tree, package), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.endswith("__"):
            continue
        if node.attr in NAMEDTUPLE_API:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "super":
            continue
        if _chain_root(node.value) in external:
            continue  # os._exit, torch._C, torch._C._foo: a module's private API, not an object's
        found.append((node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    return found


def _chain_root(node):
    """The name a bare chain of attributes starts from (torch for torch._C), or None (calls, subscripts)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def parameter_count(node) -> int:
    """A function's parameters, *args and **kwargs included."""
    a = node.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def wide_signatures(tree, relative: str) -> list:
    """"path: function: N parameters (goal G)" of each function over its PARAMETER_GOALS entry and each class
    __init__ over INIT_PARAMETERS (self not counted)."""
    found = []
    for node in tree.body:
        goal = PARAMETER_GOALS.get(f"{relative}: {getattr(node, 'name', '')}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and goal is not None:
            if parameter_count(node) > goal:
                found.append(f"{relative}: {node.name}: {parameter_count(node)} parameters (goal {goal})")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for init in node.body:
                if isinstance(init, ast.FunctionDef) and init.name == "__init__":
                    count = parameter_count(init) - 1
                    if count > INIT_PARAMETERS:
                        found.append(f"{relative}: {node.name}.__init__: {count} parameters (goal {INIT_PARAMETERS})")
    return found


def same_names(root: Path) -> list:
    """"name.py: path, path" for each module file name used twice in the package and the repository root
    (its scripts), except ROLE_NAMES, a registry's entries (named after their kind) and a top-level script's
    command in cli/ (the script is its thin wrapper: one command, two files by design)."""
    repo, places = root.parent, {}
    for path in sorted(root.rglob("*.py")):
        folder = path.relative_to(root).parent.parts
        if path.stem in ROLE_NAMES or folder in REGISTRY_DIRS or (folder == ("cli",) and (repo / path.name).is_file()):
            continue
        places.setdefault(path.name, []).append(str(path.relative_to(repo)))
    for path in sorted(repo.glob("*.py")):
        places.setdefault(path.name, []).append(path.name)
    return [f"{name}: {', '.join(paths)}" for name, paths in sorted(places.items()) if len(paths) > 1]


def long_functions_in(path: Path, relative: str) -> list:
    """{"function", "lines"} of each function in `path` over FUNCTION_LINES."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES:
                found.append({"function": f"{relative}:{node.lineno} {node.name}", "lines": length})
    return found


def script_long_functions(repo: Path) -> list:
    """Long functions in the repository root's scripts and in SCRIPT_DIRS (the examples users copy)."""
    paths = sorted(repo.glob("*.py")) + [p for folder in SCRIPT_DIRS for p in sorted((repo / folder).rglob("*.py"))]
    return [f for path in paths for f in long_functions_in(path, str(path.relative_to(repo)))]


def long_docs(repo: Path) -> list:
    """"path: lines (goal N)" of each doc in DOC_LINES over its goal."""
    found = []
    for name, limit in sorted(DOC_LINES.items()):
        path = repo / name
        lines = path.read_text().count("\n") if path.is_file() else 0
        if lines > limit:
            found.append(f"{name}: {lines} lines (goal {limit})")
    return found


def stage_internals(root: Path, graph: dict) -> list:
    """"importer -> module" for each import, from outside STAGED, of a module inside one of STAGED's subpackages
    (imagenet_shards.loader.read.shard_reader), where the subpackage's face (imagenet_shards.loader.read) is the
    way in: a stage's modules can then move or split without touching the rest of the library."""
    staged = f"{root.name}.{STAGED}"
    found = []
    for module, targets in sorted(graph.items()):
        if module == staged or module.startswith(staged + "."):
            continue
        found.extend(f"{module} -> {target}" for target in sorted(targets)
                     if target.startswith(staged + ".") and target.count(".") >= staged.count(".") + 2)
    return found


def survey(root: Path) -> dict:
    mods = module_files(root)
    graph = {m: imports_of(m, p, mods) for m, p in mods.items()}
    big_modules, long_functions, kind_names, private, wide, rigs, goals_seen = [], [], [], [], [], [], set()
    names = source_kind_names(root)
    for module, path in sorted(mods.items()):
        source = path.read_text()
        lines = source.count("\n")
        relative = str(path.relative_to(root.parent))
        if lines > MODULE_LINES:
            big_modules.append({"module": relative, "lines": lines})
        tree = ast.parse(source)
        if path.parent != root.joinpath(*SOURCE_KINDS_DIR):
            kind_names.extend(f"{relative}:{line} {name!r}" for line, name in kind_comparisons(tree, names))
        private.extend(f"{relative}: {access}" for line, access in private_accesses(tree, root.name))
        rigs.extend(f"{relative}:{line} imports {name}" for line, name in rig_imports(tree))
        long_functions.extend(long_functions_in(path, relative))
        wide.extend(wide_signatures(tree, str(path.relative_to(root))))
        goals_seen.update(f"{path.relative_to(root)}: {node.name}" for node in tree.body
                          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    wide.extend(f"{goal}: not found (PARAMETER_GOALS names it)" for goal in sorted(set(PARAMETER_GOALS) - goals_seen)
                if (root / Path(goal.split(":")[0]).parts[0]).exists())  # a goal in a package that has its folder
    upward, unplaced = [], set()
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        level = layer_of(unit)
        if level is None and module != root.name:
            unplaced.add(unit)
        for target in sorted(targets):
            target_unit = unit_of(target)
            target_level = layer_of(target_unit)
            if target_unit == unit or target == root.name or level is None or target_level is None:
                continue
            if target_level >= level:
                upward.append(f"{module} -> {target}")
    return {"modules": len(mods), "big_modules": big_modules, "long_functions": long_functions,
            "cycles": cycles(graph), "upward_imports": upward, "unplaced_units": sorted(unplaced),
            "kind_name_comparisons": kind_names, "wide_signatures": wide, "one_kind_fields": one_kind_fields(root, mods),
            "test_rigs_in_wheel": wheel_test_rigs(root.parent) + rigs, "stage_internals": stage_internals(root, graph),
            "private_accesses": sorted(set(private) - set(PRIVATE_ALLOWED)), "same_names": same_names(root),
            "script_long_functions": script_long_functions(root.parent), "long_docs": long_docs(root.parent),
            "private_allowed": sorted(set(private) & set(PRIVATE_ALLOWED))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "imagenet_shards"))
    parser.add_argument("--json", help="also write the survey as JSON to this file")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    if not (root / "__init__.py").is_file():
        print(f"error: {root}: not a Python package (no __init__.py)", file=sys.stderr)
        return 2
    result = survey(root)
    checks = [
        (f"modules over {MODULE_LINES} lines", [f"{m['module']}: {m['lines']}" for m in result["big_modules"]]),
        (f"functions over {FUNCTION_LINES} lines", [f"{f['function']}: {f['lines']}" for f in result["long_functions"]]),
        ("import cycles", result["cycles"]),
        ("upward imports (against LAYERS)", result["upward_imports"]),
        ("units not placed in LAYERS", result["unplaced_units"]),
        ("source kind names compared outside loader/source_kinds/", result["kind_name_comparisons"]),
        ("Source fields only one kind reads", result["one_kind_fields"]),
        ("test rigs in the wheel (pyproject's packages.find) or imported by the library", result["test_rigs_in_wheel"]),
        (f"loader stages' internals imported from outside {STAGED}/ (import the stage's __init__)",
         result["stage_internals"]),
        ("private attributes of other objects", result["private_accesses"]),
        ("module file names used twice (imagenet_shards/ and the root's scripts)", result["same_names"]),
        (f"functions over {FUNCTION_LINES} lines in the scripts and {', '.join(SCRIPT_DIRS)}/",
         [f"{f['function']}: {f['lines']}" for f in result["script_long_functions"]]),
        ("docs over their size goal", result["long_docs"]),
        (f"get_data over its parameter goal, class __init__ over {INIT_PARAMETERS} parameters",
         result["wide_signatures"]),
    ]
    print(f"{result['modules']} modules under {root.name}/")
    for title, rows in checks:
        print(f"{title}: {len(rows)}" + ("" if rows else "  [goal met]"))
        for row in rows:
            print(f"    {row}")
    for access in result["private_allowed"]:
        print(f"    known, {PRIVATE_ALLOWED[access]}: {access}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not any(rows for _, rows in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
