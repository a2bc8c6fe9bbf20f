"""JPEG decode on the accelerator (jpeg_decode="device"): which JPEGs the device takes (jpeg_header), the
worker's packed bytes and boxes (device_batches), nvJPEG and the batch's assembly (device_decode), the
batched crop-resize (device_resample).
"""

from imagenet_shards.loader.faces import lazy_exports

_EXPORTS = {
    **{name: "device_decode" for name in ("DeviceBatches", "decode_device")},
    **{name: "device_batches" for name in ("JpegPacker", "check_device_pipeline", "DEVICE_DECODE")},
    **{name: "jpeg_header" for name in ("read_header", "device_refusal")},
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
