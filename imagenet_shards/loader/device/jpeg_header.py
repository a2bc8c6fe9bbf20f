"""What a JPEG's header says, read from its markers alone (no decode), and the one rule for which
JPEGs a GPU decoder takes: `device_refusal`.

`get_data(jpeg_decode="device")` hands a sample's bytes to the accelerator's decoder (nvJPEG) only
when that decoder decodes it in hardware or on the GPU without falling back to host work: baseline
or extended sequential Huffman coding, 8-bit samples, grayscale or YCbCr with a chroma subsampling
the hardware engines take. Everything else (progressive or arithmetic coding, CMYK/YCCK, 12-bit,
unusual sampling factors, not a JPEG) is decoded on the host in the worker, and counted. The CPU
stand-in decoder (no CUDA) follows the same rule, so CI tests the same split of the work.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Optional

_SOF_BASELINE, _SOF_EXTENDED, _SOF_PROGRESSIVE = 0xC0, 0xC1, 0xC2
# SOF markers: C0-C3 Huffman, C5-C7 differential Huffman, C9-CB arithmetic, CD-CF differential arithmetic.
_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # TEM, RST0-7: no length field
_ADOBE = b"Adobe"
# Chroma subsampling (luma's horizontal, vertical factors; chroma at 1x1) that nvJPEG's hardware
# engines decode: 4:4:4, 4:2:2, 4:2:0, 4:4:0, 4:1:1 (nvJPEG docs, "Hardware Backend").
_DEVICE_SAMPLING = {(1, 1), (2, 1), (2, 2), (1, 2), (4, 1)}
_MAX_SCAN = 1 << 16  # bytes searched for the frame header (APP segments come first; EXIF with a thumbnail is ~64 KB)


class JpegHeader(NamedTuple):
    width: int
    height: int
    components: int
    sampling: tuple  # ((h, v) per component)
    sof: int  # the frame marker (0xC0 baseline, 0xC2 progressive, ...)
    precision: int  # bits per sample
    adobe_transform: Optional[int]  # the Adobe APP14 colour transform flag, if that segment is present


def read_header(data) -> Optional[JpegHeader]:
    """The frame header of a JPEG (bytes or any buffer), or None where the data is not a JPEG or
    its markers end before the frame header."""
    view = memoryview(data)[:_MAX_SCAN]
    if len(view) < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    position, adobe = 2, None
    while position + 4 <= len(view):
        if view[position] != 0xFF:
            return None
        marker = view[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker in _STANDALONE:
            position += 2
            continue
        length = (view[position + 2] << 8) | view[position + 3]
        segment = view[position + 4:position + 2 + length]
        if marker == 0xEE and bytes(segment[:5]) == _ADOBE and len(segment) >= 12:
            adobe = segment[11]
        if marker in _SOF_MARKERS:
            if len(segment) < 6:
                return None
            precision, height, width, count = struct.unpack_from(">BHHB", segment)
            if len(segment) < 6 + 3 * count:
                return None
            sampling = tuple((segment[7 + 3 * i] >> 4, segment[7 + 3 * i] & 15) for i in range(count))
            return JpegHeader(width, height, count, sampling, marker, precision, adobe)
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        position += 2 + length
    return None


def device_refusal(header: Optional[JpegHeader]) -> Optional[str]:
    """Why a GPU decoder should not take this JPEG (the worker decodes it on the host), or None
    where it should."""
    if header is None:
        return "not a JPEG the device decoder reads"
    if header.sof == _SOF_PROGRESSIVE:
        return "progressive JPEG"
    if header.sof not in (_SOF_BASELINE, _SOF_EXTENDED):
        return "lossless, hierarchical or arithmetic-coded JPEG"
    if header.precision != 8:
        return f"{header.precision}-bit JPEG"
    if header.components == 4:
        return "CMYK/YCCK JPEG"
    if header.components == 3 and header.adobe_transform == 0:
        return "RGB-coded JPEG (Adobe transform 0)"
    if header.components not in (1, 3):
        return f"JPEG with {header.components} components"
    if header.width < 1 or header.height < 1:
        return "JPEG without a size in its frame header"
    if header.components == 3:
        luma, *chroma = header.sampling
        if any(c != (1, 1) for c in chroma) or luma not in _DEVICE_SAMPLING:
            return "JPEG with unusual chroma subsampling " + ",".join(f"{h}x{v}" for h, v in header.sampling)
    return None
