"""Where uint8 pixels become normalised floats: on the host, or on the accelerator.

    host    the loader's workers turn each uint8 batch into (x / 255 - mean) / std, float32 or
            float16, before it leaves the worker. Four (or two) bytes per pixel cross to the
            accelerator, and the workers spend CPU on it.
    device  the batches stay uint8 NCHW (one byte per pixel: 4x less host->device traffic, no
            host CPU); wrap the model in `NormalizeOnDevice`, which normalises on the
            accelerator. `ipu` is accepted as an alias.

Both use the same arithmetic, x * (1 / (255 * std)) + (-mean / std), in the same order, so in
float32 they agree to the last bit on the same hardware (and within 1e-6 anywhere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LOCATIONS = {"host": "host", "device": "device", "ipu": "device"}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "half": torch.float16, "float": torch.float32}


def normalization_location(name: str) -> str:
    try:
        return LOCATIONS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown normalization location {name!r}; expected host, device or ipu") from None


def float_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.float32, torch.float16):
            raise ValueError(f"normalised batches are float32 or float16, not {dtype}")
        return dtype
    try:
        return DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"unknown float type {dtype!r}; expected float32 or float16") from None


@dataclass(frozen=True)
class Normalization:
    """get_data's `normalization`: where it happens and what comes out. The strings "host", "device"
    and "ipu" stand for `Normalization(that)` with the other fields at their defaults.

    location       "host" (float batches from the workers) or "device"/"ipu" (uint8 NCHW batches for
                   `NormalizeOnDevice`), see the module docstring.
    dtype          host batches: "float32" or "float16" (a torch.dtype too).
    mean, std      per channel, on the 0..1 scale (ImageNet's by default).
    channels_last  the batch's memory is NHWC (torch.channels_last strides), its shape still NCHW.
    """

    location: str = "host"
    dtype: object = "float32"
    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    channels_last: bool = False

    def __post_init__(self):
        normalization_location(self.location)  # one clear error now, not in a worker
        float_dtype(self.dtype)

    @classmethod
    def of(cls, value) -> "Normalization":
        """A Normalization from get_data's argument: one, or a location's name."""
        return value if isinstance(value, cls) else cls(value)

    @property
    def on_host(self) -> bool:
        return normalization_location(self.location) == "host"

    @property
    def torch_dtype(self) -> torch.dtype:
        return float_dtype(self.dtype)


def scale_and_bias(mean=IMAGENET_MEAN, std=IMAGENET_STD):
    """(scale, bias), float32 of shape (1, C, 1, 1), with normalised = uint8 * scale + bias."""
    mean = torch.tensor(mean, dtype=torch.float64).view(1, -1, 1, 1)
    std = torch.tensor(std, dtype=torch.float64).view(1, -1, 1, 1)
    return (1.0 / (255.0 * std)).float(), (-mean / std).float()


def normalize(images: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, dtype=torch.float32,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 NCHW -> normalised float NCHW (computed in float32; float16 is rounded from it)."""
    work = images.to(torch.float32) if out is None or out.dtype != torch.float32 else out.copy_(images)
    work.mul_(scale).add_(bias)
    if dtype == torch.float32:
        return work
    if out is not None and out.dtype == dtype:
        return out.copy_(work)
    return work.to(dtype)


class NormalizeOnDevice(torch.nn.Module):
    """Wrap a model so that it takes uint8 NCHW batches and normalises them where it runs.

        model = NormalizeOnDevice(resnet50(), dtype=torch.float16).to(device)
        logits = model(images.to(device))        # images: uint8 from get_data(normalization="device")

    Float inputs pass through unchanged, so the wrapper can stay in place for host-normalised data.
    """

    def __init__(self, model: torch.nn.Module, mean=IMAGENET_MEAN, std=IMAGENET_STD, dtype=torch.float32):
        super().__init__()
        self.model = model
        self.output_dtype = float_dtype(dtype)
        scale, bias = scale_and_bias(mean, std)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("bias", bias, persistent=False)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        if images.dtype != torch.uint8:
            return images
        work = images.to(torch.float32).mul(self.scale.to(torch.float32)).add(self.bias.to(torch.float32))
        return work if self.output_dtype == torch.float32 else work.to(self.output_dtype)

    def forward(self, images, *args, **kwargs):
        return self.model(self.normalize(images), *args, **kwargs)
