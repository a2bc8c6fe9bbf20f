"""A sample's pixels: decode (the region JPEG decoder, jpeg_crop), crop, resize, flip (pipeline) and the
user's torchvision v2 transforms (user_transforms), in the workers.
"""

from imagenet_shards.loader.faces import lazy_exports

_EXPORTS = {
    **{name: "pipeline" for name in ("ImagePipeline", "PipelineError")},
    **{name: "user_transforms" for name in ("build_pipeline", "mixup_cutmix", "strong_augmentation")},
    # which JPEG decode runs: the region decoder (CROP) or PIL's whole image (PIL_FULL), and why not CROP
    **{name: "jpeg_crop" for name in ("CROP", "PIL_FULL", "UNAVAILABLE_REASON")},
    "jpeg_decode_path": "jpeg_crop:decode_path",
    "crop_decode_available": "jpeg_crop:available",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
