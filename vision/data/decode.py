"""Decoding image files into the pixels a viewer displays, with core TensorFlow ops only.

Training, evaluation, ``scripts/detect.py`` and the exported ``serving_bytes`` signature
decode files here, so that they all see the same pixels:

- JPEG (camera files that PIL calls ``MPO`` too: TensorFlow decodes their first picture),
  PNG, GIF (first frame), BMP and WebP, converted to RGB;
- a JPEG's EXIF orientation (tag 0x0112 of its APP1 ``Exif`` segment, either byte order) is
  applied as ``PIL.ImageOps.exif_transpose`` applies it, so the image is the one annotation
  tools show and COCO ``width``/``height`` and boxes refer to (a phone photo stored sideways
  with orientation 6 comes out upright, its width and height swapped);
- `shrink` bounds the size of a decoded image, so a pipeline never holds many huge images.

Being core TensorFlow ops, this runs inside a SavedModel (no Python, no PIL).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["DECODABLE", "apply_orientation", "decode_image", "exif_orientation", "shrink"]

# Formats `decode_image` reads, as PIL names them (MPO: JPEG files with more pictures).
DECODABLE = ("JPEG", "MPO", "PNG", "GIF", "BMP", "WEBP")

_SCANNED = 1 << 18  # bytes of a file searched for the EXIF segment
_MAX_SEGMENTS = 64  # JPEG segments read before giving up on finding it
_MAX_ENTRIES = 256  # entries of the first IFD searched for the orientation tag
_ORIENTATION_TAG = 0x0112


def _reader(data):
    """``(byte, n)``: ``byte(i)`` is the int32 value of byte ``i`` of ``data`` (0 past the end)."""
    values = tf.cast(tf.io.decode_raw(tf.strings.substr(data, 0, _SCANNED), tf.uint8), tf.int32)
    n = tf.size(values)
    padded = tf.concat([values, [0]], 0)  # index n reads 0

    def byte(i):
        i = tf.convert_to_tensor(i, tf.int32)
        return tf.gather(padded, tf.where(tf.logical_and(i >= 0, i < n), i, n))

    return byte, n


def _exif_start(byte, n) -> tf.Tensor:
    """Offset of the TIFF header of a JPEG's first ``Exif`` APP1 segment, or -1."""
    exif = tf.constant([ord(c) for c in "Exif"] + [0, 0], tf.int32)
    is_jpeg = tf.logical_and(tf.equal(byte(0), 0xFF), tf.equal(byte(1), 0xD8))

    def cond(step, pos, found):
        return tf.logical_and(step < _MAX_SEGMENTS,
                              tf.logical_and(found < 0, tf.logical_and(pos >= 0, pos + 4 <= n)))

    def body(step, pos, found):
        marker = byte(pos + 1)
        length = byte(pos + 2) * 256 + byte(pos + 3)  # includes its own two bytes
        header = tf.stack([byte(pos + 4 + k) for k in range(6)])
        is_exif = tf.logical_and(tf.equal(marker, 0xE1), tf.reduce_all(tf.equal(header, exif)))
        found = tf.where(is_exif, pos + 10, found)
        # Not a marker, or the start of the scan / end of image: no EXIF segment follows.
        stop = tf.logical_or(tf.not_equal(byte(pos), 0xFF),
                             tf.logical_or(tf.equal(marker, 0xDA), tf.equal(marker, 0xD9)))
        return step + 1, tf.where(stop, -1, pos + 2 + length), found

    _, _, found = tf.while_loop(cond, body, (tf.constant(0), tf.where(is_jpeg, 2, -1),
                                             tf.constant(-1)))
    return found


def exif_orientation(data) -> tf.Tensor:
    """The EXIF orientation (1..8) of encoded image bytes; 1 where there is none.

    Args:
        data: () tf.string, an encoded image.

    Returns:
        () int32: the orientation tag of a JPEG's first ``Exif`` APP1 segment (IFD0), or 1 for
        other formats, files without it, and values outside 1..8 (as
        ``PIL.ImageOps.exif_transpose`` ignores them).
    """
    byte, n = _reader(data)
    start = _exif_start(byte, n)
    little = tf.logical_and(tf.equal(byte(start), 0x49), tf.equal(byte(start + 1), 0x49))

    def read16(i):
        return tf.where(little, byte(i) + byte(i + 1) * 256, byte(i) * 256 + byte(i + 1))

    def read32(i):
        low, high = read16(i), read16(i + 2)
        return tf.where(little, low + high * 65536, low * 65536 + high)

    ifd = start + read32(start + 4)
    count = tf.minimum(read16(ifd), _MAX_ENTRIES)
    entries = ifd + 2 + 12 * tf.range(count)  # (count,) offsets of the 12-byte IFD entries
    tags, types = read16(entries), read16(entries + 2)
    hit = tf.logical_and(tf.equal(tags, _ORIENTATION_TAG), tf.equal(types, 3))  # a SHORT
    values = tf.boolean_mask(read16(entries + 8), hit)
    value = tf.cond(tf.logical_and(start >= 0, tf.size(values) > 0),
                    lambda: values[0], lambda: tf.constant(1))
    return tf.where(tf.logical_and(value >= 1, value <= 8), value, 1)


def apply_orientation(image, orientation) -> tf.Tensor:
    """``image`` as displayed for an EXIF ``orientation``, as ``PIL.ImageOps.exif_transpose``.

    Args:
        image: (H, W, C).
        orientation: () int, 1..8 (other values: unchanged).

    Returns:
        (H, W, C), or (W, H, C) for orientations 5..8.
    """
    def transposed(x):
        return tf.transpose(x, [1, 0, 2])

    branches = [
        lambda: image,  # 1: as stored
        lambda: image[:, ::-1],  # 2: mirrored left-right
        lambda: image[::-1, ::-1],  # 3: rotated 180 degrees
        lambda: image[::-1],  # 4: mirrored top-bottom
        lambda: transposed(image),  # 5: transposed
        lambda: transposed(image)[:, ::-1],  # 6: rotated 90 degrees clockwise
        lambda: transposed(image[::-1, ::-1]),  # 7: transversed
        lambda: transposed(image)[::-1],  # 8: rotated 90 degrees counter-clockwise
    ]
    index = tf.convert_to_tensor(orientation, tf.int32) - 1
    index = tf.where(tf.logical_and(index >= 0, index < 8), index, 0)
    return tf.switch_case(index, branches)


def decode_image(data) -> tf.Tensor:
    """Decodes encoded image bytes to the RGB pixels displayed (EXIF orientation applied).

    Args:
        data: () tf.string, a JPEG (or MPO), PNG, GIF, BMP or WebP file's bytes.

    Returns:
        (H, W, 3) uint8; H and W are those of the displayed image.

    Raises:
        tf.errors.InvalidArgumentError: (when run) for bytes that are no decodable image.
    """
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
    image = apply_orientation(image, exif_orientation(data))
    image.set_shape([None, None, 3])
    return image


def shrink(image, max_side: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Resizes an image whose longer side exceeds ``max_side`` down to it (aspect kept).

    Args:
        image: (H, W, 3) uint8.
        max_side: Longest side kept.

    Returns:
        ``(image (H', W', 3) uint8, scale (2,) float32)``: the image (unchanged when small
        enough; else resized, bilinear and antialiased) and ``(H' / H, W' / W)``.
    """
    shape = tf.shape(image)[:2]
    size = tf.cast(shape, tf.float32)
    factor = tf.minimum(1.0, max_side / tf.reduce_max(size))
    new = tf.maximum(tf.cast(tf.round(size * factor), tf.int32), 1)

    def resized():
        pixels = tf.image.resize(image, new, antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(pixels), 0.0, 255.0), tf.uint8)

    small = tf.cond(tf.reduce_max(shape) > max_side, resized, lambda: image)
    small.set_shape([None, None, 3])
    return small, tf.cast(tf.shape(small)[:2], tf.float32) / size
