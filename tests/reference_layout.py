"""A small writer of the reference harness's dataset layout (Graphcore's PyTorch CNN tooling), for tests.

Written from the layout's description (issue #11), not from the reference code:

    <split>-000000.tar ...  PAX tar (a pax header with the float mtime before every member; see write_tar);
                            one sample = members sorted by extension:
                              img:    <key>.cls  <key>.jpg  <key>.json
                              tensor: <key>.cls  <key>.json <key>.pth  (torch.save of a CHW uint8 tensor)
                            .cls: ASCII decimal; .json: {"bbox": [x1, y1, x2, y2]} or {"bbox": null}
    metadata.json           train_length, validation_length, format, shuffle, train_transform_pipeline,
                            validation_transform_pipeline, seed, image_quality, checksum
                            checksum: checksumdir's md5 dirhash of the folder, metadata.json excluded

Keys are the sample's position in its split ("0", "1", ...), as the reference numbers them.
"""

import io
import json
import tarfile
from pathlib import Path

import torch
from checksumdir import dirhash
from PIL import Image


SPLITS = ("train", "validation")


def folder_dirhash(folder, excluded=("metadata.json",)) -> str:
    """The reference harness's folder checksum, by checksumdir itself: dirhash(folder, "md5",
    excluded_files=...) - every file, hidden included, excluded names skipped wherever they are; md5 of
    the concatenated sorted md5 hex digests. (1.3.0: the same dirhash as the reference's 1.2.0, without
    1.2.0's import of pkg_resources, which setuptools >= 81 no longer ships.)"""
    return dirhash(str(folder), "md5", excluded_files=list(excluded))


def list_images(split_folder):
    """[(path, label)] in ImageFolder order: sorted class folders, sorted files."""
    classes = sorted(p.name for p in Path(split_folder).iterdir() if p.is_dir())
    return [(path, label) for label, name in enumerate(classes)
            for path in sorted((Path(split_folder) / name).iterdir()) if path.is_file()]


def tensor_payload(jpeg: bytes, size: int) -> bytes:
    image = Image.open(io.BytesIO(jpeg)).convert("RGB").resize((size, size))
    chw = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).reshape(size, size, 3).permute(2, 0, 1)
    buffer = io.BytesIO()
    torch.save(chw.contiguous(), buffer)
    return buffer.getvalue()


def encode_reference_sample(key, label, payload: bytes, payload_ext: str, bbox=None):
    """The sample's members, sorted by extension."""
    members = {"cls": str(label).encode(), "json": json.dumps({"bbox": bbox}).encode(), payload_ext: payload}
    return [(f"{key}.{ext}", members[ext]) for ext in sorted(members)]


# What a real reference shard's headers hold (its TarWriter under Python 3.8+, where tarfile's
# default format is PAX): a float mtime (the time of writing), so every member is preceded by a pax
# extended header carrying it ("NN mtime=1795401552.2119973"); mode 0444; owner bigdata/bigdata.
REFERENCE_MTIME = 1795401552.2119973


def write_tar(path, members) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for number, (name, data) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = REFERENCE_MTIME + number / 1000
            info.mode = 0o444
            info.uname = info.gname = "bigdata"
            tar.addfile(info, io.BytesIO(data))


def write_reference_dataset(source, target, fmt="img", samples_per_shard=8, tensor_size=32, bboxes=None,
                            image_quality=95):
    """Convert an ImageNet-style folder (`source`/train/<class>/*, `source`/validation/<class>/*) the
    reference's way: img stores the JPEG bytes as they are, tensor a CHW uint8 tensor of
    `tensor_size`^2. `bboxes`: {file stem: [x1, y1, x2, y2]} for train images. Returns the metadata."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    lengths = {}
    for split in SPLITS:
        images = list_images(Path(source) / split)
        lengths[split] = len(images)
        for shard, start in enumerate(range(0, len(images), samples_per_shard)):
            members = []
            for index, (path, label) in enumerate(images[start:start + samples_per_shard], start=start):
                data = path.read_bytes()
                bbox = (bboxes or {}).get(path.stem) if split == "train" else None
                if fmt == "img":
                    members += encode_reference_sample(index, label, data, "jpg", bbox)
                else:
                    members += encode_reference_sample(index, label, tensor_payload(data, tensor_size), "pth", bbox)
            write_tar(target / f"{split}-{shard:06d}.tar", members)
    steps = [] if fmt == "img" else [f"Resize({tensor_size})", f"CenterCrop({tensor_size})"]
    metadata = {
        "train_length": lengths["train"],
        "validation_length": lengths["validation"],
        "format": fmt,
        "shuffle": False,
        "train_transform_pipeline": steps,
        "validation_transform_pipeline": steps,
        "seed": 0,
        "image_quality": image_quality,
        "checksum": folder_dirhash(target),
    }
    (target / "metadata.json").write_text(json.dumps(metadata))
    return metadata


