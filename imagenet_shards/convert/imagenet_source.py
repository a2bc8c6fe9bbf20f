"""The images to convert: ImageNet's extracted folders or its downloaded archives, listed.

`open_source(root, splits, layout)` lists every source sample of the requested splits and
returns an `ImageNetSource`: the class table and, per split, the `SourceSample`s in canonical order
(class index, then source path) as a columnar `SourceListing` (imagenet_shards.convert.source_listing: ~90
bytes a sample, each SourceSample built when asked for), plus the files that were ignored as not
being images.
(The loader's `imagenet_shards.loader.source_kinds.resolve_source` resolves what a *training* source names;
this module only feeds the converter.)

Folder layout (what torchvision's ImageFolder reads):

    train/<class>/**/<name>.<ext>        validation/<class>/**/<name>.<ext>   (or val/)

Class index = position of the class folder's name in sorted order (as ImageFolder). The
class table comes from train/ (from validation/ when there is no train/); a validation
class folder without a train twin is an error. Files whose extension is not an image
extension (ImageFolder's list) and hidden files are ignored and reported.

Archive layout (as downloaded from image-net.org):

    ILSVRC2012_img_train.tar                   a tar of <wnid>.tar, each holding <wnid>_<n>.JPEG
    ILSVRC2012_img_val.tar                     flat: ILSVRC2012_val_00000001.JPEG ...
    ILSVRC2012_validation_ground_truth.txt     line i: the devkit ILSVRC2012_ID of validation image i
    synsets.txt                                line i: "<wnid> [words]", the wnid of ILSVRC2012_ID i
                                               (the devkit's meta.mat order)
    (both text files are also looked for under ILSVRC2012_devkit_t12/data/)

Class index = position of the wnid in sorted order, as for the folders, so both layouts
give the same labels. Archives are never extracted: a first pass reads each archive once, as
a stream, and records every image member's name, size and the absolute byte offset of its
data in the archive file. The stream is parsed with the shared direct tar parser
(imagenet_shards.formats.tar.iter_tar_members): the outer train tar member by member, each inner
per-class tar read whole into memory (ImageNet's largest is ~150 MB) and its headers parsed
there. tarfile's stream mode ("r|") copies its whole buffer on every 512-byte header read; the
direct parser lists several times faster (docs/design-figures.md), so listing ImageNet's
140 GB costs about what reading it once does.
In an uncompressed tar a member's data is one contiguous byte range, so a worker later reads
a sample with one `os.pread` of that range: exactly the member's bytes, with no extraction
and no temporary files. Why not stream again while encoding: a global shuffle puts samples of
every class into every shard, so a stream in archive order would have to be re-read once per
shard, or buffered whole (140 GB); reading byte ranges costs one read per sample, as the
folder layout does, and lets any number of workers read in parallel.

Keys: the file stem with "." replaced by "_" (webdataset cuts a key at the first dot of the
basename), e.g. n01440764_10026. Keys must be unique within a split; a clash is an error
naming both files.
"""

from imagenet_shards.errors import Error

import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from imagenet_shards.convert.source_listing import ListingBuilder, SourceListing
from imagenet_shards.fileio import pread_range
from imagenet_shards.dataset_folder import (IMAGENET_GROUND_TRUTH, IMAGENET_TRAIN_TAR, IMAGENET_VALIDATION_TAR, is_image_name,
                                     split_folder_names)
from imagenet_shards.formats.tar import TarFormatError, iter_tar_members

TRAIN_DIR = "train"
VALIDATION_DIRS = split_folder_names("validation")
TRAIN_TAR, VALIDATION_TAR = IMAGENET_TRAIN_TAR, IMAGENET_VALIDATION_TAR
GROUND_TRUTH_NAMES = (IMAGENET_GROUND_TRUTH, f"ILSVRC2012_devkit_t12/data/{IMAGENET_GROUND_TRUTH}")
SYNSETS_NAMES = ("synsets.txt", "ILSVRC2012_devkit_t12/data/synsets.txt")
VALIDATION_NUMBER = re.compile(r"ILSVRC2012_val_(\d+)$")
LAYOUTS = ("auto", "folder", "archive")


BOUNDING_BOX_FILE = "imagenet_2012_bounding_boxes.csv"  # beside train/, as the reference harness reads it


class ImageNetSourceError(Error):
    """The source cannot be converted: names the file or folder and the problem.

    `usage` is True when the cause is most likely the command line (a missing path, no
    recognisable layout) rather than the data.
    """

    def __init__(self, message, usage=False):
        super().__init__(message)
        self.usage = usage


@dataclass(frozen=True, slots=True)
class FileBytes:
    path: str

    def read(self) -> bytes:
        with open(self.path, "rb") as handle:
            return handle.read()


@dataclass(frozen=True, slots=True)
class ArchiveBytes:
    """One member's data: `size` bytes at absolute `offset` in the (uncompressed) tar at `path`."""

    path: str
    offset: int
    size: int

    def read(self) -> bytes:
        data = pread_range(self.path, self.size, self.offset)
        if len(data) != self.size:
            raise OSError(f"archive truncated: {self.size} bytes expected at offset {self.offset} of "
                          f"{self.path}, {len(data)} read")
        return data


class FolderFiles:
    """A listing's locator for the folder layout: each source path is a file under `root`."""

    def __init__(self, root: Path):
        text = str(root)
        self.prefix = "" if text == "." else text if text.endswith("/") else text + "/"

    def locate(self, row, source, size, extra) -> FileBytes:
        return FileBytes(self.prefix + source)


class ArchiveMembers:
    """A listing's locator for an archive: the `extra` column holds each member's data offset in `path`."""

    def __init__(self, path: str):
        self.path = path

    def locate(self, row, source, size, extra) -> ArchiveBytes:
        return ArchiveBytes(self.path, extra, size)


@dataclass
class SourceSplit:
    name: str
    samples: SourceListing  # a sequence of SourceSample, in canonical order (label, source)
    ignored: list = field(default_factory=list)  # {"path", "reason"}: files that are not images


@dataclass
class ImageNetSource:
    root: Path
    layout: str  # "folder" | "archive" | "dataset" (a converted dataset: imagenet_shards.convert.dataset_source)
    classes: list  # class index -> class name
    splits: dict  # split name -> SourceSplit
    provenance: dict = field(default_factory=dict)  # metadata.json fields about the source (a parent dataset)


def make_key(name: str) -> str:
    """The sample key of a file name: its stem, dots replaced (webdataset splits at the first dot)."""
    base = name.rsplit("/", 1)[-1]
    stem = base.rsplit(".", 1)[0] if "." in base[1:] else base
    return stem.replace(".", "_")


def detect_layout(root: Path) -> str:
    if (root / TRAIN_DIR).is_dir() or any((root / name).is_dir() for name in VALIDATION_DIRS):
        return "folder"
    if (root / TRAIN_TAR).is_file() or (root / VALIDATION_TAR).is_file():
        return "archive"
    raise ImageNetSourceError(
        f"--source {root}: found neither the folder layout (train/, validation/ or val/) nor the archive "
        f"layout ({TRAIN_TAR}, {VALIDATION_TAR})", usage=True)


def open_source(root, splits=("train", "validation"), layout="auto", sizes=False) -> ImageNetSource:
    """List the source samples of `splits` (see the module docstring).

    `sizes`: also stat every file of the folder layout (archives always know their sizes).
    Raises ImageNetSourceError.
    """
    root = Path(root)
    if not root.exists():
        raise ImageNetSourceError(f"--source {root} does not exist", usage=True)
    if not root.is_dir():
        raise ImageNetSourceError(f"--source {root} is not a folder", usage=True)
    if layout not in LAYOUTS:
        raise ImageNetSourceError(f"unknown source layout {layout!r}; expected one of {', '.join(LAYOUTS)}", usage=True)
    if layout == "auto":
        layout = detect_layout(root)
    source = _open_folders(root, splits, sizes) if layout == "folder" else _open_archives(root, splits)
    for split in source.splits.values():
        _check_unique_keys(split)
    if "train" in source.splits and (root / BOUNDING_BOX_FILE).is_file():
        boxes = read_bounding_boxes(root / BOUNDING_BOX_FILE)
        train = source.splits["train"]
        train.samples = train.samples.with_boxes(lambda path: _box_of(path, boxes))
    return source


def read_bounding_boxes(path) -> dict:
    """{image file name: [x1, y1, x2, y2]} from the reference's CSV (no header; rows
    `filename,x1,y1,x2,y2`, normalised; several rows for one image give their union)."""
    boxes = {}
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ImageNetSourceError(f"{path}: cannot read the bounding boxes: {getattr(error, 'strerror', None) or error}")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        try:
            if len(fields) != 5:
                raise ValueError
            x1, y1, x2, y2 = (float(v) for v in fields[1:])
            if not all(0.0 <= v <= 1.0 for v in (x1, y1, x2, y2)) or x1 > x2 or y1 > y2:
                raise ValueError
        except ValueError:
            raise ImageNetSourceError(f"{path}: line {number} is not 'filename,x1,y1,x2,y2' with 0 <= x1 <= x2 <= 1 and "
                              f"0 <= y1 <= y2 <= 1: {line[:100]!r}") from None
        name = os.path.basename(fields[0])
        old = boxes.get(name)
        boxes[name] = [x1, y1, x2, y2] if old is None else [min(old[0], x1), min(old[1], y1),
                                                            max(old[2], x2), max(old[3], y2)]
    return boxes


def _box_of(source: str, boxes: dict):
    name = source.replace(":", "/").rsplit("/", 1)[-1]
    return boxes.get(name) or boxes.get(os.path.splitext(name)[0]) or None


# ---------------------------------------------------------------- folder layout


def _validation_dir(root: Path, required: bool):
    found = [root / name for name in VALIDATION_DIRS if (root / name).is_dir()]
    if len(found) > 1:
        raise ImageNetSourceError(f"--source {root} holds both validation/ and val/: keep one", usage=True)
    if not found and required:
        raise ImageNetSourceError(
            f"--source {root}: no validation folder (validation/ or val/); convert only the train split "
            f"with --splits train", usage=True)
    return found[0] if found else None


def _class_folders(split_dir: Path):
    try:
        entries = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    except OSError as error:
        raise ImageNetSourceError(f"{split_dir}: cannot list the folder: {error.strerror or error}") from None
    if not entries:
        raise ImageNetSourceError(f"{split_dir}: no class folders (expected {split_dir.name}/<class>/<image files>)")
    return entries


def _open_folders(root: Path, splits, sizes: bool) -> ImageNetSource:
    split_dirs = {}
    for split in splits:
        if split == "train":
            if not (root / TRAIN_DIR).is_dir():
                raise ImageNetSourceError(
                    f"--source {root}: no train folder; convert only the validation split with --splits validation",
                    usage=True)
            split_dirs[split] = root / TRAIN_DIR
        else:
            split_dirs[split] = _validation_dir(root, required=True)
    table_dir = root / TRAIN_DIR if (root / TRAIN_DIR).is_dir() else _validation_dir(root, required=True)
    classes = _class_folders(table_dir)
    index = {name: i for i, name in enumerate(classes)}
    result = {}
    for split, split_dir in split_dirs.items():
        folders = _class_folders(split_dir)
        unknown = [name for name in folders if name not in index]
        if unknown:
            raise ImageNetSourceError(
                f"{split_dir / unknown[0]}: class folder has no twin in {table_dir} ({len(unknown)} such "
                f"folders); the class table comes from {table_dir.name}/")
        samples, ignored = ListingBuilder(classes, FolderFiles(root)), []
        for class_name in folders:
            found = _list_class_folder(root, split_dir / class_name, index[class_name], sizes, ignored, samples)
            if not found:
                raise ImageNetSourceError(f"{split_dir / class_name}: empty class folder (no image files); "
                                  f"remove it or add its images")
        result[split] = SourceSplit(split, samples.finish(), ignored)
    return ImageNetSource(root, "folder", classes, result)


def _list_class_folder(root: Path, folder: Path, label: int, sizes: bool, ignored, samples: ListingBuilder) -> int:
    """Add the class folder's images to `samples`; returns how many."""
    found = 0
    # os.walk with followlinks, as ImageFolder: a class folder may hold subfolders and symlinks.
    for directory, subdirs, files in os.walk(folder, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(directory) / name
            relative = path.relative_to(root).as_posix()
            if name.startswith("."):
                ignored.append({"path": relative, "reason": "hidden file"})
                continue
            if not is_image_name(name):
                ignored.append({"path": relative, "reason": "not an image file extension"})
                continue
            size = None
            if sizes:
                try:
                    size = path.stat().st_size
                except OSError as error:
                    raise ImageNetSourceError(f"{path}: cannot stat: {error.strerror or error}") from None
            samples.add(make_key(name), label, relative, size)
            found += 1
    return found


# ---------------------------------------------------------------- archive layout


def _stream_members(stream, label: str, offset: int = 0):
    """The regular members of a tar, read once from `stream` as a stream (shared direct parser).

    `offset` is where the stream starts in the archive file, so member offsets are absolute.
    """
    try:  # the walk ends where the stream does: no claimed size past it is ever allocated
        if isinstance(stream, io.BytesIO):
            end = offset + len(stream.getbuffer())
        else:
            end = offset + os.fstat(stream.fileno()).st_size
        yield from iter_tar_members(label, offset=offset, stream=stream, stop_at=end)
    except TarFormatError as error:
        raise ImageNetSourceError(f"not a readable tar archive: {error}") from None


def list_train_archive(path: Path, ignored: list):
    """Yield (class name, member name, absolute data offset, size) of every member of every inner
    per-class tar of the train tar, in archive order, reading it once as a stream: each inner tar is
    read whole (one class, ~150 MB for ImageNet's largest) and its headers parsed from memory. Each
    class is first announced as (class name, None, 0, 0). Other outer members are added to `ignored`."""
    seen = set()
    with open(path, "rb", buffering=0) as handle:
        for member in _stream_members(handle, str(path)):
            if not member.name.endswith(".tar"):
                ignored.append({"path": f"{TRAIN_TAR}:{member.name}", "reason": "not a per-class .tar"})
                continue
            class_name = member.name.rsplit("/", 1)[-1][: -len(".tar")]
            if class_name in seen:
                raise ImageNetSourceError(f"{path}: holds {member.name} twice")
            seen.add(class_name)
            yield class_name, None, 0, 0
            inner = io.BytesIO(member.data)
            for item in _stream_members(inner, f"{path}:{member.name}", offset=member.data_offset):
                yield class_name, item.name, item.data_offset, len(item.data)


def _archive_samples_train(root: Path):
    """(classes, the train SourceListing, ignored): every image member streamed into the listing with
    its class's order of appearance as a provisional label, relabelled by sorted class name at the end."""
    path = root / TRAIN_TAR
    if not path.is_file():
        raise ImageNetSourceError(f"--source {root}: {TRAIN_TAR} is missing; convert only the validation split with "
                          f"--splits validation", usage=True)
    ignored, appearance, counts = [], {}, []
    samples = ListingBuilder(None, ArchiveMembers(str(path.resolve())))
    for class_name, name, offset, size in list_train_archive(path, ignored):
        if name is None:
            appearance[class_name] = len(appearance)
            counts.append(0)
            continue
        display = f"{TRAIN_TAR}:{class_name}.tar:{name}"
        base = name.rsplit("/", 1)[-1]
        if not is_image_name(base) or base.startswith("."):
            ignored.append({"path": display, "reason": "not an image file extension"})
            continue
        samples.add(make_key(base), appearance[class_name], display, size, offset)
        counts[appearance[class_name]] += 1
    if not appearance:
        raise ImageNetSourceError(f"{path}: holds no per-class tars")
    classes = sorted(appearance)
    empty = [name for name in classes if not counts[appearance[name]]]
    if empty:
        raise ImageNetSourceError(f"{path}:{empty[0]}.tar: empty class archive (no image files)")
    relabel = np.empty(len(classes), dtype=np.int32)
    for label, name in enumerate(classes):
        relabel[appearance[name]] = label
    samples.classes = classes
    return classes, samples.finish(relabel), ignored


def _read_lines(path: Path):
    try:
        return path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ImageNetSourceError(f"{path}: cannot read: {getattr(error, 'strerror', None) or error}") from None


def _find(root: Path, names, what):
    for name in names:
        if (root / name).is_file():
            return root / name
    raise ImageNetSourceError(f"--source {root}: the {what} is missing (looked for {', '.join(names)})", usage=True)


def read_synsets(path: Path) -> list:
    """wnid of each devkit ILSVRC2012_ID (line i -> id i)."""
    wnids = []
    for number, line in enumerate(_read_lines(path), start=1):
        words = line.split()
        if not words or not re.fullmatch(r"n\d{8}", words[0]):
            raise ImageNetSourceError(f"{path}: line {number} {line!r} does not start with a wnid like n01440764")
        wnids.append(words[0])
    if len(set(wnids)) != len(wnids):
        raise ImageNetSourceError(f"{path}: a wnid is listed twice")
    return wnids


def read_ground_truth(path: Path, count: int) -> list:
    """Devkit id (1-based) of each validation image number (line i -> image i)."""
    ids = []
    for number, line in enumerate(_read_lines(path), start=1):
        text = line.strip()
        if not text.isdigit() or not 1 <= int(text) <= count:
            raise ImageNetSourceError(f"{path}: line {number} {line!r} is not a class id between 1 and {count}")
        ids.append(int(text))
    return ids


def _open_archives(root: Path, splits) -> ImageNetSource:
    train = _archive_samples_train(root) if "train" in splits else None
    synsets = None
    if "validation" in splits or train is None:
        synsets = read_synsets(_find(root, SYNSETS_NAMES, "synset list (devkit id -> wnid)"))
    classes = train[0] if train is not None else sorted(synsets)
    index = {name: i for i, name in enumerate(classes)}
    result = {}
    if train is not None:
        result["train"] = SourceSplit("train", train[1], train[2])
    if "validation" in splits:
        result["validation"] = _archive_validation(root, synsets, index)
    return ImageNetSource(root, "archive", classes, result)


def _archive_validation(root: Path, synsets, index) -> SourceSplit:
    path = root / VALIDATION_TAR
    if not path.is_file():
        raise ImageNetSourceError(f"--source {root}: {VALIDATION_TAR} is missing; convert only the train split with "
                          f"--splits train", usage=True)
    unknown = [wnid for wnid in synsets if wnid not in index]
    if unknown:
        raise ImageNetSourceError(f"{root / TRAIN_TAR}: no per-class tar for {unknown[0]}, which the synset list names "
                          f"({len(unknown)} such wnids)")
    truth_path = _find(root, GROUND_TRUTH_NAMES, "validation ground-truth file")
    truth = read_ground_truth(truth_path, len(synsets))
    samples, ignored = ListingBuilder(sorted(index, key=index.get), ArchiveMembers(str(path.resolve()))), []
    with open(path, "rb", buffering=0) as handle:
        for member in _stream_members(handle, str(path)):
            display = f"{VALIDATION_TAR}:{member.name}"
            base = member.name.rsplit("/", 1)[-1]
            if not is_image_name(base) or base.startswith("."):
                ignored.append({"path": display, "reason": "not an image file extension"})
                continue
            match = VALIDATION_NUMBER.search(base.rsplit(".", 1)[0])
            if not match:
                raise ImageNetSourceError(f"{display}: the name carries no validation image number "
                                  f"(ILSVRC2012_val_NNNNNNNN), so its ground-truth label is unknown")
            number = int(match.group(1))
            if not 1 <= number <= len(truth):
                raise ImageNetSourceError(f"{display}: image number {number} has no line in {truth_path} "
                                  f"({len(truth)} lines)")
            wnid = synsets[truth[number - 1] - 1]
            samples.add(make_key(base), index[wnid], display, len(member.data), member.data_offset)
    if not len(samples):
        raise ImageNetSourceError(f"{path}: holds no images")
    return SourceSplit("validation", samples.finish(), ignored)


def _check_unique_keys(split: SourceSplit) -> None:
    repeated = split.samples.first_repeated_key()
    if repeated is not None:
        sample, other = (split.samples.sample(row) for row in repeated)
        raise ImageNetSourceError(
            f"{split.name}: {sample.source} and {other.source} give the same sample key {sample.key!r}; "
            f"keys (file stems) must be unique within a split: rename one")
