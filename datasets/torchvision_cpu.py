"""The one place that imports torchvision.

The registry's torchvision 0.28.0 wheel is a CUDA build. On a CPU-only torch its
import fails with "operator torchvision::nms does not exist", because its Python
code registers fake kernels for C++ operators that the CPU torch never loaded.
Defining the two missing operator schemas first lets the import finish; every
transform and `datasets.ImageFolder` then work. The C++ image ops
(`torchvision.io.decode_jpeg`, `nms` itself) stay unavailable, which is why this
project decodes with PIL (pillow-simd).

Everything in the project gets torchvision from here:
    from datasets.torchvision_cpu import torchvision, transforms, transforms_v2
"""

import importlib
import sys

import torch

_MISSING_OP = "operator torchvision::nms does not exist"
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
# Kept alive for the life of the process: a torch.library.Library unregisters its
# definitions when it is garbage-collected.
_schema_library = None
schemas_defined = False


def _define_missing_schemas():
    global _schema_library, schemas_defined
    _schema_library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS.values():
        _schema_library.define(schema)
    schemas_defined = True


def _import_torchvision():
    try:
        return importlib.import_module("torchvision")
    except RuntimeError as error:
        if _MISSING_OP not in str(error):
            raise
    # Only for that one failure: drop the half-imported modules and try again.
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]
    _define_missing_schemas()
    return importlib.import_module("torchvision")


torchvision = _import_torchvision()
from torchvision import transforms  # noqa: E402
from torchvision.transforms import v2 as transforms_v2  # noqa: E402

__all__ = ["torchvision", "transforms", "transforms_v2", "schemas_defined"]
