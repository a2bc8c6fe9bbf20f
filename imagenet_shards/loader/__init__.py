"""The loader training code imports: `from imagenet_shards.loader import get_data`.

Everything a training script needs from the loader is here, imported lazily so that the light modules
of this package (share_plan, shard_reader) load without torch; `dir()` and tab completion list it all.
What a script needs beside the loader (the launcher, exit codes, CPU accounting, torchvision with the
CPU fix) is in `imagenet_shards.training`.

The loader works in stages, each a subpackage with a small public face (its __init__): plan/ (who reads
which samples in which order, resume), read/ (shards to checked raw samples), transform/ (a sample's
pixels), device/ (JPEG decode on the accelerator), output/ (batches in shared memory, reports). Outside
loader/, the library imports a stage's face, never its modules (tools/layout.py checks). The modules'
names before the stages (issue 46: `imagenet_shards.loader.resume`, `...pipeline`) still import for one
release, with a DeprecationWarning, as the module itself (MOVED below).
"""

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import sys as _sys
import warnings as _warnings

# {exported name: module under imagenet_shards.loader (or the package) that defines it}
_EXPORTS = {
    "get_data": "loader.image_loader",
    "Mix": "loader.mix",
    "GlobalOrder": "loader.plan.global_order",
    **{name: "loader.options" for name in ("Cache", "DataSource", "Normalization", "Order", "TrainCrop",
                                            "UserTransform", "ValidationCrop")},
    "SourceError": "loader.source_kinds",
    "SampleError": "loader.read.read_loop",
    "ResumeError": "loader.plan.resume",
    "is_worker_death": "loader.read.worker_shards",
    "NormalizeOnDevice": "normalization",
    "mixup_cutmix": "loader.transform.user_transforms",
    "strong_augmentation": "loader.transform.user_transforms",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_importlib.import_module(f"{__name__.rsplit('.', 1)[0]}.{module}"), name)


# {a module's name before the stages (issue 46): where it is now}; goes in the release after 0.2.0
MOVED = {
    **{name: f"plan.{name}" for name in ("share_plan", "global_order", "global_mix", "epoch_planner", "resume")},
    **{name: f"read.{name}" for name in ("read_loop", "shard_reader", "epoch_runs", "index_trust", "worker_shards")},
    **{name: f"transform.{name}" for name in ("pipeline", "jpeg_crop", "user_transforms")},
    **{name: f"device.{name}" for name in ("jpeg_header", "device_batches", "device_decode", "device_resample")},
    **{name: f"output.{name}" for name in ("batch_ring", "reports")},
}


class _MovedModule(_importlib_abc.MetaPathFinder, _importlib_abc.Loader):
    """`imagenet_shards.loader.resume` is `imagenet_shards.loader.plan.resume`: the same module object under its
    old name too (classes, pickles and isinstance checks are the real module's), with a DeprecationWarning.
    resume.py's shuffle-buffer, planning and ledger helpers moved to their own modules and are not under
    the old name."""

    def find_spec(self, name, path=None, target=None):
        if name.rpartition(".")[0] != __name__ or name.rpartition(".")[2] not in MOVED:
            return None
        return _importlib_util.spec_from_loader(name, self)

    def _real(self, name):
        return f"{__name__}.{MOVED[name.rpartition('.')[2]]}"

    def create_module(self, spec):
        _warnings.warn(f"{spec.name} is now {self._real(spec.name)} (issue 46: the loader by stage); the old name "
                       f"goes in the next release", DeprecationWarning, stacklevel=2)
        module = _importlib.import_module(self._real(spec.name))
        spec.loader_state = module.__spec__  # importlib sets the alias's spec on it next: exec_module restores
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state  # its own spec again (pickle, reload and -m read it)

    def get_code(self, name):  # `python -m imagenet_shards.loader.<old name>` runs the module's code
        spec = _importlib_util.find_spec(self._real(name))
        return spec.loader.get_code(spec.name)


if not any(isinstance(finder, _MovedModule) for finder in _sys.meta_path):
    _sys.meta_path.insert(0, _MovedModule())


def __dir__():
    return sorted(set(_EXPORTS) | {name for name in globals() if not name.startswith("_")})
