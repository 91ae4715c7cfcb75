"""Detect objects: python scripts/detect.py --model DIR/export [--threshold 0.7] IMAGE...

For each IMAGE writes OUTDIR/<name>.png (the image with labelled boxes) and OUTDIR/<name>.json
(its detections above the threshold: label, class_id, score, box [x0, y0, x1, y1] in pixels).
An unreadable image is reported on stderr and skipped; the exit code is then 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfx_transformer.cli import run_cli  # noqa: E402
from vision.export import load_detector  # noqa: E402
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


def detect_one(detector, path: str, threshold: float, out_dir: str, name: str) -> int:
    """Detects in one image file; writes NAME.png and NAME.json; returns the count kept."""
    with open(path, "rb") as f:
        data = f.read()
    image = tf.io.decode_image(data, channels=3, expand_animations=False).numpy()
    found = detector.detect_bytes([data])
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--threshold", type=float, default=0.7,
                        help="keep detections with a score above this")
    parser.add_argument("--out", default="detections", help="output folder (created)")
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files")
    args = parser.parse_args(argv)
    if not 0.0 <= args.threshold < 1.0:
        parser.error(f"--threshold must be in [0, 1), got {args.threshold}")
    detector = load_detector(args.model)
    os.makedirs(args.out, exist_ok=True)
    failed, taken = 0, set()
    for path in args.images:
        try:
            name = _output_name(path, taken)
            count = detect_one(detector, path, args.threshold, args.out, name)
        except (OSError, tf.errors.InvalidArgumentError) as error:
            message = getattr(error, "message", None) or str(error)
            print(f"error: cannot read image {path!r}: {' '.join(message.split())}",
                  file=sys.stderr)
            failed += 1
            continue
        print(f"{path}: {count} objects -> {os.path.join(args.out, name)}.png/.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
