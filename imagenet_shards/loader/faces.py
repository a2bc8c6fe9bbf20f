"""A stage package's public face: the names other stages and the rest of the library use, imported lazily.

Each stage (plan/, read/, transform/, device/, output/) lists its exports in one table; a name is
imported from its module on first use, so that importing a light module of a stage (read/shard_reader.py:
numpy only) does not pull in the stage's torch-heavy ones, and two stages may name each other without
an import cycle at package import time.
"""

import importlib


def lazy_exports(package: str, exports: dict):
    """(__getattr__, __dir__) for `package`. exports: {name: "module"} or {name: "module:attribute"} (an
    attribute exported under a clearer name than its module gives it)."""

    def __getattr__(name):
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attribute = target.partition(":")
        return getattr(importlib.import_module(f"{package}.{module}"), attribute or name)

    def __dir__():
        return sorted(exports)

    return __getattr__, __dir__
