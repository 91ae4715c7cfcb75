"""Score an exported detector: python scripts/evaluate_detr.py --model DIR/export --data SPEC.

Scores every image of a coco: source and the validation split of embedded and tfds: data;
prints JSON with the COCO box AP, AP50 and AP75 (pycocotools) and the number of images.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfx_transformer.cli import positive, run_cli  # noqa: E402
from vision.data.sources import evaluation_split, load_source  # noqa: E402
from vision.evaluate import evaluate_records  # noqa: E402
from vision.export import load_detector  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--data", required=True,
                        help="embedded | coco:IMAGES_DIR:ANNOTATIONS.json | tfds:NAME")
    parser.add_argument("--limit", type=positive(int), default=None,
                        help="score at most N images")
    parser.add_argument("--batch-size", type=positive(int), default=8,
                        help="most images per call (consecutive images of one size)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the embedded data")
    args = parser.parse_args(argv)
    detector = load_detector(args.model)
    source = load_source(args.data, seed=args.seed)
    if source.num_classes != len(detector.class_names):
        raise ValueError(f"--data {args.data} has {source.num_classes} classes, the model "
                         f"{len(detector.class_names)}: {', '.join(detector.class_names)}.")
    split = evaluation_split(args.data)
    scores = evaluate_records(detector, source.records(split), args.batch_size,
                              limit=args.limit, num_classes=source.num_classes)
    if not scores["n"]:
        raise ValueError(f"--data {args.data}: no images to score in its {split!r} split.")
    print(json.dumps(scores))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
