"""Builds `imagenet_shards._jpeg_crop`, the region JPEG decoder, against the system libjpeg-turbo (libjpeg62-turbo-dev).

Installed by scripts/setup_venv.sh into .venv (site-packages/imagenet_shards/, the module alone) after
pillow-simd; the checkout's package takes that folder into its path (imagenet_shards/__init__.py), and
imagenet_shards/loader/jpeg_crop.py uses it when importable.
"""
from setuptools import Extension, setup

setup(
    name="jpeg-crop",
    version="0.1.0",
    ext_modules=[Extension("imagenet_shards._jpeg_crop", ["_jpeg_crop.c", "resample.c"], depends=["resample.h"],
                           libraries=["jpeg"], extra_compile_args=["-O2"])],
)
