"""Lets `import torchvision` be a script's first line in .venv: the schema fix of torchvision_cpu.py, applied lazily.

.venv pairs a CPU torch with the registry's CUDA torchvision 0.28 wheel, whose import stops with
"operator torchvision::nms does not exist" (imagenet_shards/torchvision_cpu.py says why). The project's own
code imports torchvision through torchvision_cpu.py, which defines the two missing schemas and
retries; a user's script that begins `import torchvision` never reaches it. So scripts/setup_venv.sh
copies this file into .venv's site-packages as `_torchvision_schema_hook.py` with a one-line .pth
that calls `register()`:

  * at interpreter start it only puts a finder first on sys.meta_path: no torch import, nothing else
    (importing torch at every start would add about a second to every pip and test process);
  * when torchvision is first imported, the finder wraps its loader: the real import runs, and only
    if it fails with exactly that error are the half-imported torchvision modules dropped, the
    schemas defined and the import run again. A matching torch/torchvision pair imports at the first
    try, so nothing is defined there.

Only the standard library is imported here, and nothing from the library: the copy in site-packages
runs where this checkout is not on sys.path.

    python imagenet_shards/torchvision_hook.py SITE_PACKAGES     install the copy and the .pth line there
"""

import sys

MODULE = "_torchvision_schema_hook"  # the name of the copy in site-packages
MISSING_OP = "operator torchvision::nms does not exist"
SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
# Kept alive for the life of the process: a torch.library.Library unregisters its definitions when it is
# garbage-collected.
_schema_library = None
schemas_defined = False


def define_missing_schemas() -> None:
    """Define torchvision::nms and ::qnms, the operators the CUDA wheel's Python code registers fakes for."""
    global _schema_library, schemas_defined
    import torch

    _schema_library = torch.library.Library("torchvision", "DEF")
    for schema in SCHEMAS.values():
        _schema_library.define(schema)
    schemas_defined = True


def drop_torchvision_modules(keep=None) -> None:
    """Remove torchvision and its submodules from sys.modules (a failed import leaves some), except `keep`."""
    for name in [n for n in sys.modules if (n == "torchvision" or n.startswith("torchvision.")) and n != keep]:
        del sys.modules[name]


class _RetryingLoader:
    """Runs the real loader; on the missing-operator error only, defines the schemas and runs it again."""

    def __init__(self, spec):
        self.spec, self.loader = spec, spec.loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.spec.loader = self.loader  # from here on the module looks as if imported plainly
        try:
            self.loader.exec_module(module)
        except RuntimeError as error:
            if MISSING_OP not in str(error):
                raise
            drop_torchvision_modules(keep="torchvision")
            define_missing_schemas()
            self.loader.exec_module(module)


class TorchvisionFinder:
    """A sys.meta_path finder that answers only for the first `import torchvision`, then removes itself."""

    def __init__(self):
        self.searching = False

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision" or self.searching:
            return None
        import importlib.util

        self.searching = True  # the search below must not come back here
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.searching = False
        if spec is None or spec.loader is None:
            return None
        self.remove()
        spec.loader = _RetryingLoader(spec)
        return spec

    def remove(self):
        # Not from inside the import system's loop over sys.meta_path when it returns None: that would skip a finder.
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def register() -> None:
    """Put the finder first on sys.meta_path (the .pth line calls this at interpreter start); once only."""
    if "torchvision" not in sys.modules and not any(isinstance(f, TorchvisionFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionFinder())


def install(site_packages) -> list:
    """Copy this file into `site_packages` as _torchvision_schema_hook.py, with the .pth line that registers it.
    -> the two paths written."""
    import os
    import shutil

    module_path = os.path.join(site_packages, MODULE + ".py")
    pth_path = os.path.join(site_packages, MODULE + ".pth")
    shutil.copyfile(__file__, module_path)
    with open(pth_path, "w") as handle:
        # A .pth line that starts with "import" is executed at start-up; the rest of the file is ignored.
        handle.write(f"import {MODULE}; {MODULE}.register()\n")
    return [module_path, pth_path]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python imagenet_shards/torchvision_hook.py SITE_PACKAGES")
    for written in install(sys.argv[1]):
        print(f"wrote {written}")
