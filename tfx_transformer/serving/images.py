"""An encoded image's size from its header, read before anything decodes it.

`image_size` reads width and height from the first bytes of the formats the detector decodes
(`vision.data.decode`: PNG, JPEG, GIF, BMP, WebP) without decoding a pixel; `pixel_problem`
says why an image is over a pixel limit. The server refuses such images before the model
decodes them, and ``tfx-detect`` and the detector's data pipeline do the same with files: a
400-megapixel PNG is 0.4 MB of zeros compressed, and decoding it allocates 1.2 GB.

`MAX_IMAGE_PIXELS` is Pillow's own default limit (``PIL.Image.MAX_IMAGE_PIXELS``, where it
warns; it refuses over twice that): 1024 x 1024 x 1024 // 4 // 3 = 89,478,485 pixels, an RGB
bitmap of 256 MiB once decoded. Camera and phone photos (12 to 50 megapixels) stay below it.
"""

from __future__ import annotations

import struct

__all__ = ["MAX_IMAGE_PIXELS", "image_size", "pixel_problem"]

MAX_IMAGE_PIXELS = 89_478_485

# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): not DHT, JPG, DAC.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers without a length: TEM, RSTn


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, start of scan: no frame header before it
            return None
        if marker in _SOF:
            if pos + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        pos += 2 + struct.unpack(">H", data[pos + 2:pos + 4])[0]
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8X" and len(data) >= 30:
        return (int.from_bytes(data[24:27], "little") + 1,
                int.from_bytes(data[27:30], "little") + 1)
    if kind == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` stored in an encoded image's header, or None when ``data`` does not
    start like a PNG, JPEG, GIF, BMP or WebP file with a complete header (the decoder then
    refuses it on its own). Reads at most the JPEG segments before the frame header."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24 and data[12:16] == b"IHDR":
        return struct.unpack(">II", data[16:24])
    if data[:3] == b"\xff\xd8\xff":
        return _jpeg_size(data)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data[:2] == b"BM" and len(data) >= 26:
        header = struct.unpack("<I", data[14:18])[0]
        if header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
            return struct.unpack("<HH", data[18:22])
        width, height = struct.unpack("<ii", data[18:26])
        return abs(width), abs(height)  # a negative height: stored top-down
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    return None


def pixel_problem(data: bytes, limit: int | None, flag: str = "--max-image-pixels") -> str:
    """'' when ``data``'s header gives at most ``limit`` pixels (or no size, or no limit);
    else one line naming the size, the limit and ``flag``."""
    size = image_size(data) if limit else None
    if size is None or size[0] * size[1] <= limit:
        return ""
    width, height = size
    return (f"a {width} x {height} image ({width * height:,} pixels) is larger than the limit "
            f"of {limit:,} pixels ({flag})")
