"""TFRecord shards: write, read back, CRCs checked independently, faults named, TF-slim labels.

The shards are written from the real sample photos (the session's `sample_source`), and
read back both by our reader and by the `tfrecord` package's own reader and index tool,
so a fault in our framing or Example encoding shows up as a disagreement with them.
"""

import hashlib
import io
import struct
from pathlib import Path

import crc32c
import pytest
from PIL import Image

from imagenet_shards.formats.tf_example import example_feature_spans, parse_example
from imagenet_shards.formats.tfrecord import (
    TFRecordFormatError,
    TFRecordShardWriter,
    find_tfrecord_shards,
    iter_tfrecord_records,
    parse_tfrecord_shard_name,
    read_tfrecord_index,
    tfrecord_index_path,
    tfrecord_shard_name,
)
from imagenet_shards.formats.tfslim_imagenet import (
    FEATURE_ENCODED,
    FEATURE_LABEL,
    LABEL_OFFSET,
    LabelOffsetError,
    TFSlimShardWriter,
    decide_label_offset,
    iter_tfrecord_samples,
    resolve_label_offset,
)


def independent_masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC32C, computed here from its definition, not by the code under test."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def split_records(raw: bytes):
    """[(offset, length bytes, length crc, data, data crc)] by walking the framing by hand."""
    records, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<Q", raw, offset)
        (length_crc,) = struct.unpack_from("<I", raw, offset + 8)
        data = raw[offset + 12 : offset + 12 + length]
        (data_crc,) = struct.unpack_from("<I", raw, offset + 12 + length)
        records.append((offset, raw[offset : offset + 8], length_crc, data, data_crc))
        offset += 16 + length
    assert offset == len(raw), "the framing does not end exactly at the end of the file"
    return records


@pytest.fixture(scope="session")
def source_images(sample_source):
    """[(key, label, synset, path)] of the sample's train images, labels by sorted class folder."""
    classes = sorted(p.name for p in (sample_source / "train").iterdir())
    images = []
    for label, synset in enumerate(classes):
        for path in sorted((sample_source / "train" / synset).iterdir()):
            images.append((path.stem, label, synset, path))
    return images


def write_shard(path, images):
    written = []
    with TFSlimShardWriter(path) as writer:
        for key, label, synset, source in images:
            data = source.read_bytes()
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                mode = image.mode
            written.append(writer.add_image(key, label, synset, data, height, width, source.name, colorspace=mode))
    return writer, written


@pytest.fixture(scope="session")
def shard(tmp_path_factory, source_images):
    """One shard of the sample's train images, with what the writer reported."""
    path = tmp_path_factory.mktemp("tfrecord") / tfrecord_shard_name("train", 0, 1)
    writer, written = write_shard(path, source_images)
    return path, writer, written


def test_round_trip_keys_labels_and_payload_bytes_equal_the_source(shard, source_images):
    path, writer, written = shard
    samples = list(iter_tfrecord_samples(path, label_offset=LABEL_OFFSET))
    assert [s["__key__"] for s in samples] == [key for key, *_ in source_images]
    assert [s["__label__"] for s in samples] == [label for _, label, *_ in source_images]
    assert [int(bytes(s["cls"])) for s in samples] == [label for _, label, *_ in source_images]
    for sample, (_, _, _, source) in zip(samples, source_images):
        assert bytes(sample["jpg"]) == source.read_bytes()
    assert writer.samples == len(source_images)


def test_written_offsets_point_at_the_records_and_the_raw_image_bytes(shard, source_images):
    path, writer, written = shard
    raw = path.read_bytes()
    assert writer.bytes_written == len(raw)
    assert writer.sha256 == hashlib.sha256(raw).hexdigest()
    assert [(w.record_offset, w.record_size) for w in written] == [(r[0], 16 + len(r[3])) for r in split_records(raw)]
    for record, (_, label, _, source) in zip(written, source_images):
        assert raw[record.payload_offset : record.payload_offset + record.payload_size] == source.read_bytes()
        assert record.label == label + 1


def test_every_crc_written_equals_an_independent_masked_crc32c(shard):
    path, _, written = shard
    records = split_records(path.read_bytes())
    assert len(records) == len(written)
    for offset, length_bytes, length_crc, data, data_crc in records:
        assert length_crc == independent_masked_crc(length_bytes), f"length CRC of the record at byte {offset}"
        assert data_crc == independent_masked_crc(data), f"data CRC of the record at byte {offset}"


def test_the_tfrecord_package_reads_our_shard_with_tfslim_features(shard, source_images):
    from tfrecord.reader import tfrecord_loader

    path, _, _ = shard
    examples = list(tfrecord_loader(str(path), None))
    assert len(examples) == len(source_images)
    for example, (key, label, synset, source) in zip(examples, source_images):
        assert bytes(example["image/encoded"]) == source.read_bytes()
        assert int(example["image/class/label"][0]) == label + 1  # TF-slim's 1..N
        assert bytes(example["image/class/synset"]) == synset.encode()
        assert bytes(example["image/filename"]) == source.name.encode()
        assert bytes(example["image/format"]) == b"JPEG"
        assert bytes(example["image/key"]) == key.encode()
        with Image.open(source) as image:
            assert (int(example["image/width"][0]), int(example["image/height"][0])) == image.size
            assert bytes(example["image/colorspace"]) == image.mode.encode()


def test_our_index_file_equals_the_tfrecord_package_tfrecord2idx_output(shard, tmp_path):
    from tfrecord.tools.tfrecord2idx import create_index

    path, _, written = shard
    reference = tmp_path / "reference.tfindex"
    create_index(str(path), str(reference))
    assert tfrecord_index_path(path).read_bytes() == reference.read_bytes()
    assert read_tfrecord_index(tfrecord_index_path(path)) == [(w.record_offset, w.record_size) for w in written]


def test_output_is_byte_reproducible_with_sorted_feature_names(shard, source_images, tmp_path):
    path, writer, _ = shard
    again, _ = write_shard(tmp_path / path.name, source_images)
    assert again.sha256 == writer.sha256
    # The tfrecord package's serialize_tf_example leaves the map in hash order, which changes
    # between processes; ours must be sorted, or a conversion in another process differs.
    for record in iter_tfrecord_records(path):
        names = list(example_feature_spans(record.data))
        assert names == sorted(names)


def test_our_example_parser_agrees_with_protobuf(shard):
    from tfrecord import example_pb2

    path, _, _ = shard
    for record in iter_tfrecord_records(path):
        example = example_pb2.Example.FromString(bytes(record.data))
        ours = parse_example(record.data)
        assert set(ours) == set(example.features.feature)
        for name, feature in example.features.feature.items():
            values = list(getattr(feature, feature.WhichOneof("kind")).value)
            assert [bytes(v) if isinstance(v, memoryview) else v for v in ours[name]] == values, name


@pytest.mark.parametrize(
    "features",
    [
        {"image/encoded": (bytes(range(256)) * 700, "byte"), "image/class/label": (1000, "int"), "b": (b"", "byte")},
        {"ints": ([0, -1, 2**63 - 1, -(2**63), 300], "int"), "floats": ([0.5, -2.25, 1e30], "float"), "k" * 200: (b"x", "byte")},
        {"empty_bytes": ([], "byte"), "empty_ints": ([], "int"), "empty_floats": ([], "float"), "many": ([b"a", b"bc"], "byte")},
    ],
)
def test_our_example_encoding_is_protobufs_deterministic_serialization(features):
    from tfrecord import example_pb2

    from imagenet_shards.formats.tf_example import serialize_example

    def feature(value, dtype):
        values = value if isinstance(value, list) else [value]
        kind = {"byte": "bytes_list", "int": "int64_list", "float": "float_list"}[dtype]
        lists = {"bytes_list": example_pb2.BytesList, "int64_list": example_pb2.Int64List, "float_list": example_pb2.FloatList}
        return example_pb2.Feature(**{kind: lists[kind](value=values)})

    expected = example_pb2.Example(features=example_pb2.Features(feature={k: feature(*v) for k, v in features.items()}))
    assert serialize_example(features) == expected.SerializeToString(deterministic=True)


def test_our_masked_crc_equals_the_tfrecord_packages():
    from tfrecord.writer import TFRecordWriter

    from imagenet_shards.formats.tfrecord import masked_crc32c

    for data in (b"", b"a", struct.pack("<Q", 123456), bytes(range(256)) * 40):
        assert struct.pack("<I", masked_crc32c(data)) == TFRecordWriter.masked_crc(data)
        assert masked_crc32c(data) == independent_masked_crc(data)


def test_writing_and_reading_do_not_import_torch(tmp_path):
    """`import tfrecord` imports torch (seconds per process): converter and validator workers must not pay it."""
    import subprocess
    import sys

    code = (
        "import sys; from imagenet_shards.formats.tfslim_imagenet import TFSlimShardWriter, iter_tfrecord_samples\n"
        f"with TFSlimShardWriter({str(tmp_path / 'x')!r}) as w: w.add_image('k', 0, 'n0', b'jpeg', 1, 1, 'k.JPEG')\n"
        f"assert [s['__key__'] for s in iter_tfrecord_samples({str(tmp_path / 'x')!r}, 1)] == ['k']\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tfrecord', 'google')))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def flipped(raw: bytes, position: int) -> bytes:
    return raw[:position] + bytes([raw[position] ^ 0x01]) + raw[position + 1 :]


@pytest.mark.parametrize(
    "where, problem",
    [("payload", "data CRC mismatch"), ("length", "length CRC mismatch"), ("data_crc", "data CRC mismatch")],
)
def test_a_flipped_byte_inside_a_record_is_named_by_shard_and_record_number(shard, tmp_path, where, problem):
    path, _, written = shard
    number = 3
    record = written[number]
    position = {
        "payload": record.payload_offset + record.payload_size // 2,
        "length": record.record_offset + 2,
        "data_crc": record.record_offset + record.record_size - 1,
    }[where]
    bad = tmp_path / path.name
    bad.write_bytes(flipped(path.read_bytes(), position))
    with pytest.raises(TFRecordFormatError) as caught:
        list(iter_tfrecord_records(bad))
    message = str(caught.value)
    assert path.name in message and f"record {number} (at byte {record.record_offset})" in message and problem in message
    assert caught.value.record == number
    # ... and the records before it were intact and readable
    assert len(list(iter_tfrecord_records(bad, stop_at=record.record_offset))) == number


@pytest.mark.parametrize("cut", ["inside_data", "inside_header"])
def test_a_truncated_shard_is_named_with_the_record_it_cuts(shard, tmp_path, cut):
    path, _, written = shard
    last = len(written) - 1
    record = written[last]
    end = record.record_offset + (record.record_size // 2 if cut == "inside_data" else 5)
    bad = tmp_path / path.name
    bad.write_bytes(path.read_bytes()[:end])
    with pytest.raises(TFRecordFormatError, match=rf"{path.name}: record {last} \(at byte {record.record_offset}\): truncated"):
        list(iter_tfrecord_records(bad))
    with open(bad, "rb") as stream:  # the same from a stream (e.g. HTTP), which has no size
        with pytest.raises(TFRecordFormatError, match=rf"record {last} .*truncated"):
            list(iter_tfrecord_records(bad.name, stream=stream))


def test_an_empty_file_is_an_error(tmp_path):
    empty = tmp_path / "train-00000-of-00001"
    empty.write_bytes(b"")
    with pytest.raises(TFRecordFormatError, match="empty file"):
        list(iter_tfrecord_records(empty))


def test_reading_a_byte_range_from_a_stream_gives_the_records_of_that_range(shard):
    path, _, written = shard
    first, stop = written[2], written[5]
    with open(path, "rb") as handle:
        handle.seek(first.record_offset)
        samples = list(iter_tfrecord_samples(path.name, 1, offset=first.record_offset, stop_at=stop.record_offset, stream=handle, first_record=2))
    mapped = list(iter_tfrecord_samples(path, 1))[2:5]
    assert [(s["__key__"], s["__offset__"], s["__record__"], bytes(s["jpg"])) for s in samples] == [
        (s["__key__"], s["__offset__"], s["__record__"], bytes(s["jpg"])) for s in mapped
    ]


def test_raw_records_are_copied_byte_for_byte_and_a_corrupt_one_is_refused(shard, tmp_path):
    path, _, written = shard
    raw = path.read_bytes()
    copy = tmp_path / "copy"
    chosen = [written[1], written[4]]
    with TFRecordShardWriter(copy) as writer:
        for record in chosen:
            writer.add_raw_record(raw[record.record_offset : record.record_offset + record.record_size])
    assert copy.read_bytes() == b"".join(raw[r.record_offset : r.record_offset + r.record_size] for r in chosen)
    bad = flipped(raw[written[0].record_offset : written[0].record_size], 40)
    with TFRecordShardWriter(tmp_path / "refused") as writer:
        with pytest.raises(TFRecordFormatError, match="CRC mismatch"):
            writer.add_raw_record(bad, source=path.name, number=0)


def test_a_failed_write_leaves_nothing_under_either_name(tmp_path, source_images):
    path = tmp_path / tfrecord_shard_name("train", 0, 2)
    with pytest.raises(RuntimeError):
        with TFSlimShardWriter(path) as writer:
            key, label, synset, source = source_images[0]
            writer.add_image(key, label, synset, source.read_bytes(), 1, 1, source.name)
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_tfslim_shard_names_and_an_incomplete_set_is_refused(tmp_path):
    assert tfrecord_shard_name("train", 0, 1024) == "train-00000-of-01024"
    assert tfrecord_shard_name("validation", 127, 128) == "validation-00127-of-00128"
    assert parse_tfrecord_shard_name("validation-00127-of-00128") == ("validation", 127, 128)
    assert parse_tfrecord_shard_name("train-000000.tar") is None
    for number in (0, 2):
        (tmp_path / tfrecord_shard_name("train", number, 3)).write_bytes(b"x")
    with pytest.raises(TFRecordFormatError, match="1 of 3 train shards are missing: train-00001-of-00003"):
        find_tfrecord_shards(tmp_path, "train")
    (tmp_path / tfrecord_shard_name("train", 1, 3)).write_bytes(b"x")
    assert [p.name for p in find_tfrecord_shards(tmp_path, "train")] == [tfrecord_shard_name("train", n, 3) for n in range(3)]
    assert find_tfrecord_shards(tmp_path, "validation") == []


def tiny_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 40)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def write_tfslim_file(path, labels):
    """A file as TF-slim's build_imagenet_data.py writes it, with the tfrecord package's own writer:
    labels as given (1..1000 for ImageNet), no image/key, no metadata, features in hash order."""
    from tfrecord.writer import TFRecordWriter

    jpeg = tiny_jpeg()
    writer = TFRecordWriter(str(path))
    for number, label in enumerate(labels):
        writer.write(
            {
                "image/height": (8, "int"),
                "image/width": (8, "int"),
                "image/colorspace": (b"RGB", "byte"),
                "image/channels": (3, "int"),
                "image/class/label": (label, "int"),
                "image/class/synset": (f"n{label:08d}".encode(), "byte"),
                "image/class/text": (b"some words", "byte"),
                "image/format": (b"JPEG", "byte"),
                "image/filename": (f"ILSVRC2012_val_{number + 1:08d}.JPEG".encode(), "byte"),
                "image/encoded": (jpeg, "byte"),
            }
        )
    writer.close()


def test_tfslim_labels_1_to_1000_without_metadata_load_as_0_to_999_with_a_message(tmp_path):
    labels = list(range(1000, 0, -1))  # TF-slim: 1..1000, 0 is "background" and never stored
    path = tmp_path / tfrecord_shard_name("validation", 0, 1)
    write_tfslim_file(path, labels)
    decision = resolve_label_offset([path])
    assert decision.offset == 1
    assert "label offset 1" in decision.reason and "TF-slim" in decision.reason
    samples = list(iter_tfrecord_samples(path, decision.offset))
    assert [s["__label__"] for s in samples] == [label - 1 for label in labels]
    assert sorted(s["__label__"] for s in samples) == list(range(1000))
    assert samples[0]["__key__"] == "ILSVRC2012_val_00000001"  # TF-slim has no key: the file name's stem
    assert bytes(samples[0]["jpg"]) == tiny_jpeg()


def test_label_offset_is_never_guessed(tmp_path):
    assert decide_label_offset([5, 0, 7]).offset == 0
    assert decide_label_offset([3, 10, 1], num_classes=10).offset == 1
    with pytest.raises(LabelOffsetError, match="cannot tell whether the labels start at 0 or at 1.*labels 1..9"):
        decide_label_offset([1, 5, 9])  # 1..9 of 1000 classes: no evidence either way
    with pytest.raises(LabelOffsetError, match="outside 0..1000"):
        decide_label_offset([1, 1001])
    with pytest.raises(LabelOffsetError, match="no records"):
        decide_label_offset([])
    path = tmp_path / "train-00000-of-00001"
    write_tfslim_file(path, [1, 2, 3])
    with pytest.raises(LabelOffsetError, match="give the label offset explicitly"):
        resolve_label_offset([path])
    assert resolve_label_offset([path], explicit=1).offset == 1
    assert "given explicitly" in resolve_label_offset([path], explicit=0).reason
    assert resolve_label_offset([path], metadata={"label_offset": 1, "classes": []}).reason == "label offset 1: from metadata.json"
    assert resolve_label_offset([path], metadata={"classes": ["a", "b", "c"]}).offset == 1  # 3 = the class count


def test_a_label_below_the_offset_is_an_error_not_a_negative_class(tmp_path):
    path = tmp_path / "train-00000-of-00001"
    write_tfslim_file(path, [2, 0, 1])
    with pytest.raises(TFRecordFormatError, match=r"record 1 .*image/class/label 0 minus label offset 1 is negative"):
        list(iter_tfrecord_samples(path, 1))


def test_a_record_that_is_not_an_example_is_named(tmp_path):
    from imagenet_shards.formats.tfrecord import frame_record

    path = tmp_path / "train-00000-of-00001"
    path.write_bytes(frame_record(b"\x0a\x05abc"))  # field 1 announces 5 bytes, 3 follow
    with pytest.raises(TFRecordFormatError, match=r"record 0 \(at byte 0\): not a tf.train.Example"):
        list(iter_tfrecord_samples(path, 1))
    assert FEATURE_ENCODED in parse_example(open_example_bytes())  # sanity: a real one parses
    assert parse_example(open_example_bytes())[FEATURE_LABEL] == [1]


def open_example_bytes():
    from imagenet_shards.formats.tf_example import serialize_example
    from imagenet_shards.formats.tfslim_imagenet import imagenet_example_features

    return serialize_example(imagenet_example_features("k", 0, "n0", tiny_jpeg(), 8, 8, "k.JPEG"))


def test_check_shard_names_every_corrupt_record_and_scans_agree_with_the_writer(shard, tmp_path):
    from imagenet_shards.formats.tfrecord import check_tfrecord_framing, header_entries, index_entries
    from imagenet_shards.formats.tfslim_imagenet import scan_tfrecord_shard

    path, _, written = shard
    expected = [(w.record_offset, w.record_size) for w in written]
    assert check_tfrecord_framing(path).ok and check_tfrecord_framing(path).entries == expected
    assert header_entries(path) == expected == index_entries(path)
    scanned = scan_tfrecord_shard(path, LABEL_OFFSET, name=path.name)
    assert [(r.record_offset, r.record_size, r.payload_offset, r.payload_size, r.label) for r in scanned] == [
        (w.record_offset, w.record_size, w.payload_offset, w.payload_size, w.label - 1) for w in written
    ]
    raw = path.read_bytes()
    for number in (2, 7):  # two corrupt payloads: both are named, the records after them still read
        raw = flipped(raw, written[number].payload_offset + 10)
    bad = tmp_path / path.name
    bad.write_bytes(raw)
    check = check_tfrecord_framing(bad)
    assert [p.record for p in check.problems] == [2, 7] and check.entries == expected
    assert all("data CRC mismatch" in str(p) and path.name in str(p) for p in check.problems)
    bad.write_bytes(raw[: written[-1].record_offset + 3])
    check = check_tfrecord_framing(bad)
    assert [p.record for p in check.problems] == [2, 7, len(written) - 1] and "truncated" in str(check.problems[-1])
    with pytest.raises(TFRecordFormatError, match=rf"record {len(written) - 1} .*truncated"):
        header_entries(bad)


@pytest.mark.parametrize("payload", [b"", b"k", b"n0", b"\x0a", bytes(200)])
def test_payload_offset_is_exact_even_for_payloads_equal_to_other_fields(tmp_path, payload):
    path = tmp_path / "train-00000-of-00001"
    with TFSlimShardWriter(path) as writer:
        first = writer.add_image("k", 0, "n0", b"\xff\xd8" * 100, 1, 1, "k.JPEG")
        second = writer.add_image("k", 0, "n0", payload, 1, 1, "n0")
    raw = path.read_bytes()
    for record, expected in ((first, b"\xff\xd8" * 100), (second, payload)):
        assert raw[record.payload_offset : record.payload_offset + record.payload_size] == expected
        spans = example_feature_spans(raw[record.record_offset + 12 : record.record_offset + record.record_size - 4])
        start, _ = spans[FEATURE_ENCODED][1][0]
        assert record.payload_offset == record.record_offset + 12 + start
