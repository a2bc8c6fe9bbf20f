"""The one place that imports torchvision.

The registry's torchvision 0.28.0 wheel is a CUDA build. On a CPU-only torch its
import fails with "operator torchvision::nms does not exist", because its Python
code registers fake kernels for C++ operators that the CPU torch never loaded.
Defining the two missing operator schemas first lets the import finish; every
transform and `datasets.ImageFolder` then work. The C++ image ops
(`torchvision.io.decode_jpeg`, `nms` itself) stay unavailable, which is why this
project decodes with PIL (pillow-simd).

In .venv, scripts/setup_venv.sh also installs that fix as a lazy import hook (imagenet_shards/torchvision_hook.py),
so a script whose first line is `import torchvision` works there too.

Everything in the project gets torchvision from here:
    from imagenet_shards.torchvision_cpu import torchvision, transforms, transforms_v2
"""

import importlib
import sys

import torch  # noqa: F401 (torchvision needs it first; the schemas are defined in it)

from imagenet_shards import torchvision_hook


def _import_torchvision():
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as error:
        if torchvision_hook.MISSING_OP not in str(error):
            raise
    # Only for that one failure: drop the half-imported modules and try again.
    torchvision_hook.drop_torchvision_modules()
    torchvision_hook.define_missing_schemas()
    return importlib.import_module("torchvision")


torchvision = _import_torchvision()
# Whether the fix was needed: defined just now, or before by .venv's import hook (imagenet_shards/torchvision_hook.py,
# installed by scripts/setup_venv.sh as _torchvision_schema_hook) when a script imported torchvision first.
schemas_defined = torchvision_hook.schemas_defined or getattr(sys.modules.get(torchvision_hook.MODULE),
                                                              "schemas_defined", False)
from torchvision import transforms  # noqa: E402
from torchvision.transforms import v2 as transforms_v2  # noqa: E402

__all__ = ["torchvision", "transforms", "transforms_v2", "schemas_defined"]
