"""Deprecated: this checkout's library is `imagenet_shards` now; `datasets` stays as an alias for one release.

`import datasets.loader` (and `from datasets.X import Y`, `python -m datasets.X`) gives the module
`imagenet_shards.loader` itself, not a copy: classes, pickles and isinstance checks are the library's.
The alias lives in the checkout only; the installed distribution has `imagenet_shards` alone, so it
never replaces Hugging Face's `datasets` (docs/commands.md, "The import name").
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

NEW = "imagenet_shards"
warnings.warn("`datasets` is now `imagenet_shards` (the old name is Hugging Face's); import imagenet_shards: "
              "this alias goes in the next release", DeprecationWarning, stacklevel=2)


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`datasets.X` is `imagenet_shards.X`: the same module object under a second name in sys.modules."""

    def find_spec(self, name, path=None, target=None):
        if not name.startswith(__name__ + "."):
            return None
        real = NEW + name[len(__name__):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=self.is_package(name))

    def _real(self, name):
        return NEW + name[len(__name__):]

    def create_module(self, spec):
        module = importlib.import_module(self._real(spec.name))
        spec.loader_state = module.__spec__  # importlib sets the alias's spec on it next: exec_module restores
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # its own spec again (pickle, reload and -m read it)

    def is_package(self, name):
        return importlib.util.find_spec(self._real(name)).submodule_search_locations is not None

    def get_code(self, name):  # `python -m datasets.X` runs imagenet_shards.X's code
        spec = importlib.util.find_spec(self._real(name))
        return spec.loader.get_code(spec.name)


if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Alias())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}: this `datasets` is the ImageNet-shards "
                             f"library's old name ({__file__}), not Hugging Face's `datasets`; run that code where "
                             f"this checkout is not on sys.path") from None
