"""Conversion-time preprocessing steps: parsing, canonical text, and pixels equal to torchvision's."""

import numpy as np
import pytest
from PIL import Image

from datasets.preprocess import (
    CenterCrop,
    PreprocessError,
    Resize,
    apply_steps,
    canonical,
    output_size,
    parse_step,
    parse_steps,
)


def test_parse_and_canonical_text():
    steps = parse_steps(["Resize(256)", "CenterCrop( 224 )", "Resize(256,320) CenterCrop(224, 200)"])
    assert steps == [Resize(256), CenterCrop(224), Resize((256, 320)), CenterCrop((224, 200))]
    assert canonical(steps) == ["Resize(256)", "CenterCrop(224)", "Resize(256, 320)", "CenterCrop(224, 200)"]
    assert parse_steps(canonical(steps)) == steps  # canonical text round-trips
    assert parse_steps([]) == [] and parse_step("Resize(8)") == Resize(8)
    assert Resize(224) != CenterCrop(224)


@pytest.mark.parametrize("text, message", [
    ("Resize(256", "'Resize(256' does not parse"),
    ("Resize(256) junk", "does not parse (at 'junk')"),
    ("Blur(3)", "unknown preprocessing step 'Blur(3)'"),
    ("RandomResizedCrop(224)", "is random"),
    ("RandomHorizontalFlip()", "is random"),
    ("Resize(0)", "sizes must be at least 1"),
    ("Resize(-4)", "expected one or two positive integer sizes"),
    ("CenterCrop(1, 2, 3)", "expected one or two positive integer sizes"),
    ("", "is empty"),
])
def test_bad_steps_raise_quoting_the_text(text, message):
    with pytest.raises(PreprocessError) as error:
        parse_steps([text])
    assert message in str(error.value)


def test_output_size_is_known_only_when_fixed():
    assert output_size(parse_steps(["Resize(256)", "CenterCrop(224)"])) == (224, 224)
    assert output_size(parse_steps(["Resize(256)"])) is None
    assert output_size(parse_steps(["Resize(100, 50)"])) == (100, 50)
    assert output_size(parse_steps(["CenterCrop(64)", "Resize(32)"])) is None
    assert output_size([]) is None


SIZES = [(400, 300), (300, 400), (256, 256), (255, 300), (500, 333), (224, 224), (100, 50), (7, 5), (5, 7),
         (1000, 257), (257, 1000), (300, 256)]
STEPS = ["Resize(256)", "CenterCrop(224)", "Resize(256) CenterCrop(224)", "Resize(224, 300)", "CenterCrop(8, 3)",
         "CenterCrop(300, 200)", "Resize(256) CenterCrop(256)", "Resize(5)"]


def test_pixels_equal_torchvisions_transforms():
    from datasets.torchvision_cpu import transforms

    rng = np.random.default_rng(0)
    for width, height in SIZES:
        for mode in ("RGB", "L"):
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            image = Image.fromarray(pixels).convert(mode)
            for text in STEPS:
                steps = parse_steps([text])
                ours = np.asarray(apply_steps(steps, image))
                theirs = np.asarray(transforms.Compose([s.torchvision() for s in steps])(image))
                assert ours.shape == theirs.shape and np.array_equal(ours, theirs), (width, height, mode, text)
