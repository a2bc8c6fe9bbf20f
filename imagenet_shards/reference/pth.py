"""`.pth` payloads of the reference harness's `tensor` datasets: torch.save of a CHW uint8 image tensor.

Read only through `torch.load(weights_only=True)`: torch's restricted unpickler, which builds
tensors and plain containers and refuses any other global, so a crafted pickle is an error
here, never code that runs. Anything but a plain uint8 3xHxW tensor is a `PthFormatError`
naming what was found.
"""

import io

import numpy as np

from imagenet_shards.errors import Error


class PthFormatError(Error, ValueError):
    pass


def decode_pth(payload) -> np.ndarray:
    """The image of a `.pth` payload as an HWC uint8 array (a view of the loaded tensor)."""
    import pickle
    import warnings

    import torch

    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols it is not sure of
            warnings.simplefilter("ignore")
            value = torch.load(io.BytesIO(bytes(payload)), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise PthFormatError(f".pth payload refused, not unpickled: {_reason(error)}") from None
    except Exception as error:  # truncated zip, bad magic, ...: torch raises many types
        raise PthFormatError(f".pth payload does not load: {type(error).__name__}: {error}") from None
    if not isinstance(value, torch.Tensor) or type(value) is not torch.Tensor:
        raise PthFormatError(f".pth payload holds a {type(value).__name__}, expected a uint8 3xHxW tensor")
    if value.dtype != torch.uint8:
        raise PthFormatError(f".pth tensor has dtype {str(value.dtype).removeprefix('torch.')}, expected uint8")
    if value.dim() != 3 or value.shape[0] != 3:
        raise PthFormatError(f".pth tensor has shape {tuple(value.shape)}, expected 3xHxW (CHW, 3 channels)")
    if value.layout != torch.strided or value.is_quantized:
        raise PthFormatError(f".pth tensor is not a plain dense tensor ({value.layout})")
    return value.numpy().transpose(1, 2, 0)


def pth_problem(payload):
    """Why a `.pth` payload does not decode, or None (imagenet_shards.formats.shard_check's check for "pth")."""
    try:
        decode_pth(payload)
    except PthFormatError as error:
        return str(error)
    return None


def _reason(error) -> str:
    """The informative line of torch's weights-only refusal (its message is mostly advice)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "Unsupported" in line or "GLOBAL" in line or "Unpickling" in line:
            return line.removeprefix("WeightsUnpickler error: ").split(" Please use")[0]
    return lines[-1] if lines else "refused by torch's weights-only loader"
