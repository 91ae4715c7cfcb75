"""Detect objects: python scripts/detect.py --model DIR/export [--threshold 0.7] IMAGE...

For each IMAGE writes OUTDIR/<name>.png (the image with labelled boxes) and OUTDIR/<name>.json
(its detections above the threshold: label, class_id, score, box [x0, y0, x1, y1] in pixels).
An image that cannot be read (missing, not a file, not a JPEG/PNG/GIF/BMP/WebP image) is
reported on stderr ("error: cannot read image ...") and skipped; the exit code is then 1, as
for an image whose header gives more than ``--max-image-pixels`` (default Pillow's limit,
89,478,485: a decompression bomb is refused before it is decoded). Any other
readable image is detected in, whatever its size or aspect ratio, as displayed: a JPEG's EXIF
orientation is applied (boxes, width and height are those of the upright photo).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfx_transformer.cli import positive, run_cli  # noqa: E402
from tfx_transformer.serving.images import MAX_IMAGE_PIXELS, pixel_problem  # noqa: E402
from vision.data.decode import decode_image  # noqa: E402
from vision.export.load import load_detector  # noqa: E402
from vision.plots import draw_detections  # noqa: E402


def _output_name(path: str, taken: set[str]) -> str:
    """The image's file name without extension; ``name-2``, ... when already used."""
    stem = os.path.splitext(os.path.basename(path))[0] or "image"
    name, n = stem, 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}"
    taken.add(name)
    return name


_decode = tf.function(decode_image, input_signature=[tf.TensorSpec([], tf.string)])


class UnreadableImageError(Exception):
    """An image file that cannot be opened or decoded; the message says why."""


def read_image(path: str, max_pixels: int | None = MAX_IMAGE_PIXELS) -> np.ndarray:
    """The file's pixels as displayed, ``(H, W, 3)`` uint8 (as the export's ``serving_bytes``
    decodes them: a JPEG's EXIF orientation applied, grayscale and RGBA converted, first GIF
    frame); `UnreadableImageError` when it cannot be read or decoded, or when its header gives
    more than ``max_pixels`` pixels (checked before decoding)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as error:
        raise UnreadableImageError(error.strerror or str(error)) from None
    problem = pixel_problem(data, max_pixels)
    if problem:
        raise UnreadableImageError(problem)
    try:
        return _decode(tf.constant(data)).numpy()
    except tf.errors.OpError as error:
        raise UnreadableImageError(f"not a decodable image ({' '.join(error.message.split())})"
                                   ) from None


def detect_one(detector, path: str, image: np.ndarray, threshold: float, out_dir: str,
               name: str) -> int:
    """Detects in one decoded image; writes NAME.png and NAME.json; returns the count kept."""
    found = detector(image[None])
    scores, labels, boxes = found["scores"][0], found["labels"][0], found["boxes"][0]
    order = [i for i in np.argsort(-scores, kind="stable") if scores[i] > threshold]
    names, ids = detector.class_names, detector.category_ids
    detections = [{"label": names[labels[i]], "class_id": int(labels[i]),
                   **({"category_id": int(ids[labels[i]])} if ids else {}),
                   "score": round(float(scores[i]), 4),
                   "box": [round(float(v), 2) for v in boxes[i]]} for i in order]
    with open(os.path.join(out_dir, name + ".json"), "w", encoding="utf-8") as f:
        json.dump({"image": path, "height": int(image.shape[0]), "width": int(image.shape[1]),
                   "threshold": threshold, "detections": detections}, f, indent=2)
    draw_detections(image, boxes[order], scores[order], labels[order], names,
                    os.path.join(out_dir, name + ".png"), title=os.path.basename(path))
    return len(detections)


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--threshold", type=float, default=0.7,
                        help="keep detections with a score above this")
    parser.add_argument("--out", default="detections", help="output folder (created)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    parser.add_argument("--max-image-pixels", type=positive(int), default=MAX_IMAGE_PIXELS,
                        help="refuse images with more pixels (width x height, read from the "
                             "header before decoding); default: Pillow's limit")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    if not 0.0 <= args.threshold < 1.0:
        parser.error(f"--threshold must be in [0, 1), got {args.threshold}")
    detector = load_detector(args.model)
    os.makedirs(args.out, exist_ok=True)
    failed, taken = 0, set()
    for path in args.images:
        try:
            image = read_image(path, args.max_image_pixels)
        except UnreadableImageError as error:
            print(f"error: cannot read image {path!r}: {error}", file=sys.stderr)
            failed += 1
            continue
        name = _output_name(path, taken)
        try:
            count = detect_one(detector, path, image, args.threshold, args.out, name)
        except tf.errors.OpError as error:  # a readable image: never called unreadable
            print(f"error: detection failed on image {path!r} ({image.shape[1]}x"
                  f"{image.shape[0]} pixels): {' '.join(error.message.split())}",
                  file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: {count} objects -> {os.path.join(args.out, name)}.png/.json")
    return 1 if failed else 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
