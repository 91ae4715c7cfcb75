"""Score an exported detector: python scripts/evaluate_detr.py --model DIR/export --data SPEC.

Scores every image of a coco: source and the validation split of embedded and tfds: data;
prints JSON with the COCO box AP, AP50 and AP75 (pycocotools, crowd regions ignored as COCO
does; the 100 best-scored detections of each image, as COCO counts them), the number of images,
and on the images without objects their number and the mean number of detections scored above
``--threshold`` (false positives per empty image); ``--per-class`` adds each class's AP.

The model's labels are matched to the data's through the export's classes.json: by COCO
category id where both have ids (the names of each id must agree too), else by class name.
The order may differ; classes that differ end the run with an error listing both.
"""

from __future__ import annotations

import argparse
import json
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from tfx_transformer.cli import positive, run_cli  # noqa: E402
from vision.data.sources import evaluation_split, load_source  # noqa: E402
from vision.export.load import load_detector, read_classes  # noqa: E402
from vision.training.evaluate import evaluate_records, match_labels  # noqa: E402


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--data", required=True,
                        help="embedded | coco:IMAGES_DIR:ANNOTATIONS.json | tfds:NAME")
    parser.add_argument("--limit", type=positive(int), default=None,
                        help="score at most N images")
    parser.add_argument("--batch-size", type=positive(int), default=8,
                        help="most images per call (consecutive images of one size)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the embedded data")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="score above which a detection on an image without objects is a "
                             "false positive (default 0.5)")
    parser.add_argument("--per-class", action="store_true",
                        help="also print the AP of each class (per_class)")
    parser.add_argument("--skip-bad-images", action="store_true",
                        help="coco: score without the image files that cannot be decoded")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    if not 0.0 <= args.threshold < 1.0:
        parser.error(f"--threshold must be in [0, 1), got {args.threshold}")
    class_names, category_ids = read_classes(args.model)  # a mismatch ends before the load
    source = load_source(args.data, seed=args.seed, skip_bad_images=args.skip_bad_images,
                         log=lambda *line: print(*line, file=sys.stderr))
    try:
        label_map = match_labels(class_names, category_ids, source.class_names,
                                 source.category_ids)
    except ValueError as error:
        raise ValueError(f"--model {args.model} and --data {args.data}: {error}") from None
    detector = load_detector(args.model)
    split = evaluation_split(args.data)
    scores = evaluate_records(detector, source.records(split), args.batch_size,
                              limit=args.limit, num_classes=source.num_classes,
                              label_map=label_map, threshold=args.threshold,
                              class_names=source.class_names if args.per_class else None)
    if not scores["n"]:
        raise ValueError(f"--data {args.data}: no images to score in its {split!r} split.")
    print(json.dumps(scores))
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
