"""The photos a sample is cut from: find and fingerprint them, decode one, deal them to classes.

find_photos lists a folder's readable photos (sorted, so the plan does not depend on the file
system's order); group_near_duplicates joins one original saved at two sizes;
assign_photos_to_classes gives each class its own groups with a similar total area.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from imagenet_shards.sample.names import EXIF_ORIENTATION_TAG, SampleDatasetError

DEFAULT_PHOTOS = Path(__file__).resolve().parent.parent / "photos"
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")
MAX_PHOTO_SIDE = 1600  # larger photos are shrunk on load: bounds memory and the crop scale
DUPLICATE_HASH_BITS = 20  # of 256: same original at two sizes differs by <= 6, distinct photos by >= 36


@dataclass(frozen=True)
class Photo:
    path: str  # absolute
    rel: str  # relative to the photo folder, with "/"
    width: int  # upright (after the EXIF orientation)
    height: int
    fingerprint: bytes  # difference hash, one byte per bit

    @property
    def area(self) -> int:
        return self.width * self.height


def find_photos(folder, exclude=None):
    """All photos under `folder` (recursive, sorted by relative path) and the unreadable ones.

    Returns (photos, skipped) where skipped is a list of {"path", "reason"}. Files under
    `exclude` (the output folder, should it lie inside the photo folder) are ignored.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise SampleDatasetError(f"photo folder {folder} does not exist or is not a folder")
    exclude = Path(exclude).resolve() if exclude is not None else None
    candidates = sorted(
        (p for p in folder.rglob("*") if p.suffix.lower() in PHOTO_SUFFIXES and p.is_file()
         and not (exclude and p.resolve().is_relative_to(exclude))),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    photos, skipped = [], []
    for path in candidates:
        rel = path.relative_to(folder).as_posix()
        try:
            with Image.open(path) as image:
                width, height = image.size
                if image.getexif().get(EXIF_ORIENTATION_TAG, 1) in (5, 6, 7, 8):
                    width, height = height, width
            fingerprint = difference_hash(path)  # decodes (at a reduced scale): finds broken files
        except Exception as error:  # PIL raises many types for bad files
            skipped.append({"path": rel, "reason": f"{type(error).__name__}: {error}"})
            continue
        photos.append(Photo(str(path.resolve()), rel, width, height, fingerprint.tobytes()))
    if not photos:
        raise SampleDatasetError(f"no usable photos ({', '.join('*' + s for s in PHOTO_SUFFIXES)}) under {folder}")
    return photos, skipped


def load_photo(path) -> Image.Image:
    """Decode a photo upright, as RGB, its longer side at most MAX_PHOTO_SIDE."""
    with Image.open(path) as image:
        image.draft("RGB", (MAX_PHOTO_SIDE, MAX_PHOTO_SIDE))  # JPEG: decode at a reduced scale when huge
        image = ImageOps.exif_transpose(image)
        image = image.convert("RGB")
    scale = MAX_PHOTO_SIDE / max(image.size)
    if scale < 1:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.LANCZOS)
    return image


def difference_hash(path) -> np.ndarray:
    """256-bit difference hash: tells one original saved at two sizes from distinct photos."""
    with Image.open(path) as image:
        image.draft("L", (64, 64))
        gray = ImageOps.exif_transpose(image).convert("L").resize((17, 16), Image.BILINEAR)
    pixels = np.asarray(gray, dtype=np.int16)
    return (pixels[:, 1:] > pixels[:, :-1]).ravel()


def group_near_duplicates(photos):
    """Lists of photos that are one original (difference hashes within DUPLICATE_HASH_BITS)."""
    hashes = np.array([np.frombuffer(p.fingerprint, dtype=np.bool_) for p in photos])
    parent = list(range(len(photos)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(photos) - 1):
        distances = (hashes[i + 1 :] != hashes[i]).sum(axis=1)
        for j in np.nonzero(distances <= DUPLICATE_HASH_BITS)[0]:
            a, b = root(i), root(i + 1 + int(j))
            parent[max(a, b)] = min(a, b)
    groups = {}
    for i, photo in enumerate(photos):
        groups.setdefault(root(i), []).append(photo)
    return [groups[k] for k in sorted(groups)]


def assign_photos_to_classes(groups, classes: int, rng):
    """Deal photo groups to classes: largest group first, to the class with the least photo area.

    Ties between classes are broken by a seeded random priority. Returns (per-class photo
    lists, shared) where shared tells that there were fewer groups than classes and some
    classes reuse another class's photos.
    """
    priority = rng.permutation(classes)
    order = sorted(range(len(groups)), key=lambda g: (-sum(p.area for p in groups[g]), groups[g][0].rel))
    assigned = [[] for _ in range(classes)]
    area = [0] * classes
    for g in order:
        target = min(range(classes), key=lambda c: (area[c], len(assigned[c]), priority[c]))
        assigned[target].extend(groups[g])
        area[target] += sum(p.area for p in groups[g])
    shared = len(groups) < classes
    if shared:
        filled = [c for c in range(classes) if assigned[c]]
        for n, c in enumerate(c for c in range(classes) if not assigned[c]):
            assigned[c] = list(assigned[filled[n % len(filled)]])
    return [sorted(photos, key=lambda p: p.rel) for photos in assigned], shared


def class_words(photos) -> str:
    """A human-readable class description: its source photos' names."""
    names = sorted({Path(p.rel).stem for p in photos})
    return ", ".join(names[:5]) + (f", ... ({len(names)} photos)" if len(names) > 5 else "")
