"""Builds `_jpeg_crop`, the region JPEG decoder, against the system libjpeg-turbo (libjpeg62-turbo-dev).

Installed by scripts/setup_venv.sh after pillow-simd; datasets/loader/jpeg_crop.py uses it when importable.
"""
from setuptools import Extension, setup

setup(
    name="jpeg-crop",
    version="0.1.0",
    ext_modules=[Extension("_jpeg_crop", ["_jpeg_crop.c", "resample.c"], depends=["resample.h"],
                           libraries=["jpeg"], extra_compile_args=["-O2"])],
)
