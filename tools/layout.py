"""The package's shape in one screen: module sizes, long functions, import cycles, upward imports.

    python tools/layout.py [--root datasets] [--json FILE]

Goals (issue #20): no module over 600 lines, no function over 80, no import cycle, no import that
runs against the layering below. Exit 0 when all four are met, 1 otherwise; it prints each
offender so a maintainer knows where to cut.

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

# Bottom to top. Units in one tuple are peers and must not import each other.
LAYERS = [
    ("fileio", "layout", "torchvision_cpu", "normalization", "launcher", "metadata_digest"),  # foundations, no data model
    ("storage",),  # transport: bytes from paths and URLs, its own errors only
    ("index", "preprocess", "steps", "balance"),  # the data model: sample index, steps, share policies
    ("sample_columns",),
    ("formats", "cifar10"),  # one module per on-disk format, one registry; CIFAR-10's python batches
    ("reference",),  # Graphcore's reference harness: metadata, checksum, .pth, layout + adopt, remainders
    ("repartition",),  # a package: plan (pure) < source < request < write < run, report
    ("validate",),
    ("convert",),
    ("shard_cache",),
    ("loader",),
    ("sample", "upload", "inspect", "tar_tools", "ledger", "same_as"),  # tools over the library
    ("hostbench", "demo", "cli_args", "testing"),  # applications; testing: real servers for tests and soaks
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


def survey(root: Path) -> dict:
    mods = module_files(root)
    graph = {m: imports_of(m, p, mods) for m, p in mods.items()}
    big_modules, long_functions = [], []
    for module, path in sorted(mods.items()):
        source = path.read_text()
        lines = source.count("\n")
        if lines > MODULE_LINES:
            big_modules.append({"module": str(path.relative_to(root.parent)), "lines": lines})
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES:
                    long_functions.append({"function": f"{path.relative_to(root.parent)}:{node.lineno} {node.name}",
                                       "lines": length})
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
            "cycles": cycles(graph), "upward_imports": upward, "unplaced_units": sorted(unplaced)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "datasets"))
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
    ]
    print(f"{result['modules']} modules under {root.name}/")
    for title, rows in checks:
        print(f"{title}: {len(rows)}" + ("" if rows else "  [goal met]"))
        for row in rows:
            print(f"    {row}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not any(rows for _, rows in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
