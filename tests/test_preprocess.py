"""Preprocessing steps, one type for the converter and the loader: parsing, canonical text, what
a metadata.json records, and pixels equal to torchvision's."""

import re

import numpy as np
import pytest
from PIL import Image

from imagenet_shards.loader.transform.pipeline import plan_steps, runtime_steps
from imagenet_shards.preprocess import (
    CenterCrop,
    PreprocessError,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    UnknownStep,
    apply_steps,
    canonical,
    output_size,
    parse_step,
    parse_stored_steps,
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


def test_stored_steps_read_what_the_converter_and_the_reference_harness_wrote():
    # this converter: canonical text; the reference harness: its command-line words, one step each
    written = canonical(parse_steps(["Resize(256)", "CenterCrop(224)"]))
    assert parse_stored_steps(written) == parse_steps(written) == [Resize(256), CenterCrop(224)]
    assert parse_stored_steps(["Resize(256) CenterCrop(224)"]) == [Resize(256), CenterCrop(224)]
    assert parse_stored_steps(None) == parse_stored_steps([]) == parse_stored_steps("") == []
    # the loader's runtime steps are the same type: a stored prefix of them is recognised as done
    assert parse_stored_steps(["Resize(256)", "CenterCrop(224)"]) == runtime_steps(False, 224, 256)
    assert plan_steps(False, 224, 256, parse_stored_steps(["Resize(256)", "CenterCrop(224, 224)"])) == ([], [])
    assert parse_stored_steps(["RandomResizedCrop(224)", "RandomHorizontalFlip()"]) == runtime_steps(True, 224, 256)
    assert canonical(runtime_steps(True, 224, 256)) == ["RandomResizedCrop(224)", "RandomHorizontalFlip()"]
    # a square crop given as a pair is the same step; an exact-size Resize pair is not a shorter-side Resize
    assert parse_stored_steps(["CenterCrop(224, 224)"]) == [CenterCrop(224)]
    assert parse_stored_steps(["Resize(256, 256)"]) == [Resize((256, 256))] != [Resize(256)]


@pytest.mark.parametrize("text", ["Blur(3)", "Resize(size=256)", "RandomHorizontalFlip(0.5)", "CenterCrop(0)"])
def test_a_stored_step_not_understood_is_kept_and_makes_the_loader_run_in_full(text):
    [step] = parse_stored_steps([text])
    assert isinstance(step, UnknownStep) and str(step) == text and step.name == text.split("(")[0]
    remaining, notes = plan_steps(False, 224, 256, [step])
    assert remaining == runtime_steps(False, 224, 256)
    assert notes == [f"stored step {text} is not understood; the runtime pipeline runs in full"]


@pytest.mark.parametrize("value, message", [
    (["Resize(256"], "'Resize(256' does not parse"),
    ("junk", "'junk' does not parse"),
    ([256], "256: expected a string"),
    ({"steps": ["Resize(256)"]}, "expected a list of strings"),
])
def test_a_stored_value_that_is_not_steps_is_an_error_quoting_it(value, message):
    with pytest.raises(PreprocessError, match=re.escape(message)):
        parse_stored_steps(value)


def test_runtime_steps_are_refused_at_conversion_and_not_applied():
    for text in ("RandomResizedCrop(224)", "RandomHorizontalFlip()"):
        with pytest.raises(PreprocessError, match="is random"):
            parse_steps([text])
    with pytest.raises(PreprocessError, match="not applied at conversion"):
        apply_steps([RandomHorizontalFlip()], Image.new("RGB", (4, 4)))
    assert output_size([RandomResizedCrop(224), RandomHorizontalFlip()]) == (224, 224)
    assert output_size([CenterCrop(224), UnknownStep(text="Blur(3)")]) is None


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
    from imagenet_shards.torchvision_cpu import transforms

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
