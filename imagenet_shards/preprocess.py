"""Preprocessing steps, one type for the converter and the loader: parse, canonical text, apply.

Steps are written as in the reference harness, one per command-line word:

    Resize(256)          shorter side to 256, aspect ratio kept   (torchvision Resize(256))
    Resize(256, 320)     exactly 256 high and 320 wide            (torchvision Resize((256, 320)))
    CenterCrop(224)      the central 224x224                      (torchvision CenterCrop(224))
    CenterCrop(224, 200) the central 224 high, 200 wide           (torchvision CenterCrop((224, 200)))

Sizes are (height, width), as torchvision takes them. The steps reproduce torchvision's
transforms on PIL images exactly: the same output-size arithmetic (Resize: the shorter side
becomes N, the longer one int(N * long / short); an image already at that size is returned
as is), PIL's antialiased bilinear filter, the same centre rounding and zero padding for a
crop larger than the image. They are written with PIL directly because importing torchvision
costs 4-8 s per process (every worker, every run); tests/test_preprocess.py checks that the
pixels equal torchvision's on many sizes. Random transforms (RandomResizedCrop, RandomCrop,
flips...) are refused at conversion: applied once they would freeze one random draw into the
dataset, while training needs a new draw every epoch. The loader runs them
(imagenet_shards.loader.transform.pipeline): `RandomResizedCrop(N)` and `RandomHorizontalFlip()` are steps of
this same type, so the loader compares its runtime steps with the stored ones directly.

API:

    parse_steps(["Resize(256)", "CenterCrop(224)"]) -> [Resize(256), CenterCrop(224)]   (conversion)
    parse_step("Resize( 256 )")                     -> Resize(256); str() is the canonical form
    canonical(steps)                                -> ["Resize(256)", ...]: what metadata.json records
    parse_stored_steps(metadata["train_transform_pipeline"]) -> the steps a dataset already holds
    apply_steps(steps, pil_image)                   -> pil_image
    output_size(steps)                              -> (height, width) when fixed, else None

`parse_steps` also accepts several steps in one string ("Resize(256) CenterCrop(224)").
A step that does not parse raises PreprocessError quoting it. `parse_stored_steps` reads what
this converter and the reference harness wrote (lists of such strings); a step it does not know
becomes an `UnknownStep` (the loader then runs its whole pipeline and says so) instead of an
error, since the images are already written. `Step.torchvision()` returns the equivalent
torchvision transform (for loaders that compose torchvision pipelines).
"""

import re
from dataclasses import dataclass

from PIL import Image

from imagenet_shards.errors import Error

_STEP = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(([^()]*)\)\s*[,;]?")
_SIZE = re.compile(r"\s*([0-9]+)\s*(?:,\s*([0-9]+)\s*)?,?\s*")
RANDOM_PREFIX = "Random"


class PreprocessError(Error, ValueError):
    """A step that does not parse or is not allowed at conversion; the message quotes it."""


@dataclass(frozen=True)
class Step:
    """One step: `size` is an int (Resize: shorter side; the crops: a square), (height, width), or
    None for a step without a size. Equal steps have equal canonical text (`str`)."""

    size: object = None

    name = "Step"
    sized = True  # takes one or two sizes; False: no argument
    square_pair_is_int = False  # "(N, N)" is the same step as "(N)" (crops), so stored text reads as N
    at_conversion = True  # deterministic: the converter may apply it once, for good
    keeps_size = False  # every output has its input's size

    def __str__(self) -> str:
        if self.size is None:
            return f"{self.name}()"
        if isinstance(self.size, tuple):
            return f"{self.name}({self.size[0]}, {self.size[1]})"
        return f"{self.name}({self.size})"

    def __repr__(self) -> str:
        return str(self)

    def apply(self, image):
        """Apply to a PIL image; returns a PIL image (conversion steps only)."""
        raise PreprocessError(f"preprocessing step {str(self)!r} is not applied at conversion")

    def torchvision(self):
        """The equivalent torchvision transform (imports torchvision)."""
        raise PreprocessError(f"preprocessing step {str(self)!r} has no torchvision equivalent")

    def fixed_size(self):
        """(height, width) of every output, or None when it depends on the input."""
        return None


class Resize(Step):
    name = "Resize"

    def output_size(self, width: int, height: int):
        """(width, height) after the step: torchvision's _compute_resized_output_size."""
        if isinstance(self.size, tuple):
            return self.size[1], self.size[0]
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = self.size, int(self.size * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)

    def apply(self, image):
        size = self.output_size(*image.size)
        if size == image.size:
            return image
        return image.resize(size, Image.BILINEAR)

    def torchvision(self):
        from imagenet_shards.torchvision_cpu import transforms

        return transforms.Resize(self.size)

    def fixed_size(self):
        return self.size if isinstance(self.size, tuple) else None


class CenterCrop(Step):
    name = "CenterCrop"
    square_pair_is_int = True

    def apply(self, image):
        crop_height, crop_width = self.fixed_size()
        width, height = image.size
        if (width, height) == (crop_width, crop_height):
            return image
        left = _crop_start(width, crop_width)
        top = _crop_start(height, crop_height)
        # PIL fills the part of the box outside the image with zeros: torchvision's padding.
        return image.crop((left, top, left + crop_width, top + crop_height))

    def torchvision(self):
        from imagenet_shards.torchvision_cpu import transforms

        return transforms.CenterCrop(self.size)

    def fixed_size(self):
        return self.size if isinstance(self.size, tuple) else (self.size, self.size)


class RandomResizedCrop(Step):
    """The loader's train crop (imagenet_shards.loader.transform.pipeline draws it); never applied at conversion."""

    name = "RandomResizedCrop"
    square_pair_is_int = True
    at_conversion = False

    def torchvision(self):
        from imagenet_shards.torchvision_cpu import transforms

        return transforms.RandomResizedCrop(self.size)

    def fixed_size(self):
        return self.size if isinstance(self.size, tuple) else (self.size, self.size)


class RandomHorizontalFlip(Step):
    """The loader's train flip (p = 0.5); never applied at conversion."""

    name = "RandomHorizontalFlip"
    sized = False
    at_conversion = False
    keeps_size = True

    def torchvision(self):
        from imagenet_shards.torchvision_cpu import transforms

        return transforms.RandomHorizontalFlip()


@dataclass(frozen=True)
class UnknownStep(Step):
    """A stored step this code does not know (or with arguments it does not read), kept as written:
    the loader cannot skip it, so it runs its whole pipeline and says so."""

    text: str = ""

    @property
    def name(self) -> str:
        match = _STEP.match(self.text)
        return match.group(1) if match else self.text

    def __str__(self) -> str:
        return self.text


def _crop_start(size: int, crop: int) -> int:
    """torchvision's center_crop offset along one axis (negative: zero padding before the image)."""
    if crop > size:
        return -((crop - size) // 2)
    return int(round((size - crop) / 2.0))


STEP_TYPES = {cls.name: cls for cls in (Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip)}
ALLOWED_FORMS = "Resize(N), Resize(H, W), CenterCrop(N), CenterCrop(H, W)"


def parse_step(text: str) -> Step:
    """One step from its text; PreprocessError (quoting the text) if it is not a known step."""
    steps = parse_steps([text])
    if len(steps) != 1:
        raise PreprocessError(f"preprocessing step {text!r}: expected exactly one step, found {len(steps)}")
    return steps[0]


def parse_steps(texts) -> list:
    """Conversion steps from a list of strings, each holding one or more steps; [] for no steps.
    PreprocessError for a step that does not parse, is unknown or is random."""
    if isinstance(texts, str):
        texts = [texts]
    return [_conversion_step(*token) for text in texts for token in _tokens(text)]


def parse_stored_steps(value) -> list:
    """The steps a metadata.json's `<split>_transform_pipeline` says were applied (None or [] -> []).

    Reads what this converter (canonical text) and the reference harness (its command-line words)
    wrote: a list of strings, each holding one or more steps. A step whose name or arguments are not
    understood becomes an `UnknownStep`; a square crop given as (N, N) reads as (N), the same step.
    PreprocessError (quoting it) for a value that is not text in that shape.
    """
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, (str, Step)):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise PreprocessError(f"stored preprocessing steps {value!r}: expected a list of strings like 'Resize(256)'")
    steps = []
    for item in value:
        if isinstance(item, Step):
            steps.append(item)
        else:
            steps += [_stored_step(*token) for token in _tokens(item)]
    return steps


def _tokens(text):
    """(step text, name, arguments) for each step in `text`; PreprocessError if it does not parse."""
    if not isinstance(text, str):
        raise PreprocessError(f"preprocessing step {text!r}: expected a string like 'Resize(256)'")
    if not text.strip():
        raise PreprocessError(f"preprocessing step {text!r} is empty; expected one of {ALLOWED_FORMS}")
    tokens, position = [], 0
    while position < len(text):
        match = _STEP.match(text, position)
        if not match or match.end() == position:
            raise PreprocessError(
                f"preprocessing step {text!r} does not parse (at {text[position:]!r}); "
                f"expected one of {ALLOWED_FORMS}")
        tokens.append((match.group(0).strip().rstrip(",;").strip(), match.group(1), match.group(2)))
        position = match.end()
        while position < len(text) and text[position].isspace():
            position += 1
    return tokens


def _sizes(arguments: str):
    """(first,) or (first, second) from "N" or "H, W"; None if the arguments are not that."""
    size = _SIZE.fullmatch(arguments)
    if not size:
        return None
    return (int(size.group(1)),) if size.group(2) is None else (int(size.group(1)), int(size.group(2)))


def _conversion_step(text: str, name: str, arguments: str) -> Step:
    if name.startswith(RANDOM_PREFIX):
        raise PreprocessError(
            f"preprocessing step {text!r} is random: applied once at conversion it would freeze one draw "
            f"into the dataset; apply it in the loader, every epoch. Allowed here: {ALLOWED_FORMS}")
    step_type = STEP_TYPES.get(name)
    if step_type is None or not step_type.at_conversion:
        raise PreprocessError(f"unknown preprocessing step {text!r}; expected one of {ALLOWED_FORMS}")
    values = _sizes(arguments)
    if values is None:
        raise PreprocessError(
            f"preprocessing step {text!r}: expected one or two positive integer sizes, as in "
            f"{name}(256) or {name}(256, 320)")
    if min(values) < 1:
        raise PreprocessError(f"preprocessing step {text!r}: sizes must be at least 1")
    return step_type(values[0] if len(values) == 1 else values)


def _stored_step(text: str, name: str, arguments: str) -> Step:
    step_type = STEP_TYPES.get(name)
    if step_type is None:
        return UnknownStep(text=text)
    if not step_type.sized:
        return step_type() if not arguments.strip() else UnknownStep(text=text)
    values = _sizes(arguments)
    if values is None or min(values) < 1:
        return UnknownStep(text=text)
    if len(values) == 1 or (step_type.square_pair_is_int and values[0] == values[1]):
        return step_type(values[0])
    return step_type(values)


def apply_steps(steps, image):
    for step in steps:
        image = step.apply(image)
    return image


def output_size(steps):
    """(height, width) of every output of `steps`, or None when it depends on the input image."""
    size = None
    for step in steps:
        fixed = step.fixed_size()
        if fixed is not None:
            size = fixed
        elif not step.keeps_size:
            size = None  # e.g. Resize(N): the longer side follows the input's aspect ratio
    return size


def canonical(steps) -> list:
    """The canonical strings of `steps`, as recorded in metadata.json."""
    return [str(step) for step in steps]
