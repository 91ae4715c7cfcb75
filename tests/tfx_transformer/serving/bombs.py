"""Decompression bombs for the serving tests (imported by path: tests are not a package)."""

import struct
import zlib


def png_bomb(width: int, height: int) -> bytes:
    """A valid all-black RGB PNG of ``width`` x ``height`` made without holding its pixels: a
    20000 x 20000 one (1.2 GB decoded) is 1.2 MB, made in about a second. The deflate stream
    repeats one fully flushed block of rows (each such block compresses the same)."""
    row, rows = bytes(1 + 3 * width), 10
    block = zlib.compressobj(9, zlib.DEFLATED, -15)
    repeated = block.compress(row * rows) + block.flush(zlib.Z_FULL_FLUSH)
    last = zlib.compressobj(9, zlib.DEFLATED, -15)
    tail = last.compress(row * (height % rows)) + last.flush()
    adler = (((1 + 3 * width) * height % 65521) << 16) | 1  # Adler-32 of zeros
    stream = b"\x78\xda" + repeated * (height // rows) + tail + struct.pack(">I", adler)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                              0, 0, 0))
            + chunk(b"IDAT", stream) + chunk(b"IEND", b""))
