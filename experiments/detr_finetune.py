"""Fine-tuning a trained detector to a new class list against training one from scratch.

A second class set on shapes-like images: discs and wedges (the circles and triangles of
`vision.data.shapes.ShapesGenerator`, with other names; squares are left unlabelled, so they are
background to learn). For each training-set size (``--images``), two runs of ``--minutes``
each on the same images: ``train_detr(..., init_from=DIR)`` (the class heads re-initialized,
every other weight from DIR's export) and the same run from random weights. Both are scored on
the same 100 held-out images (COCO AP by pycocotools); one JSON line per run.

    python experiments/detr_finetune.py --init-from runs/shapes --minutes 4 --images 50 200

``DIR`` is a finished ``train_detr.py --preset tiny`` work directory (e.g. the README's
``--data embedded`` run). Runs are sequential: two at once would share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from PIL import Image  # noqa: E402

from tfx_transformer.cli import positive  # noqa: E402
from tfx_transformer.training.run import RunOptions  # noqa: E402
from vision.config import preset  # noqa: E402
from vision.data.shapes import CLASS_NAMES, ShapesGenerator  # noqa: E402
from vision.training.train import train_detr  # noqa: E402

NEW_CLASSES = {"circle": "disc", "triangle": "wedge"}  # squares: unlabelled


def write_coco(folder: str, count: int, seed: int, split: str) -> str:
    """``count`` images (96..128 px) of the second class set as ``coco:`` data; its spec."""
    os.makedirs(folder, exist_ok=True)
    generator = ShapesGenerator(seed=seed, split=split, image_size=128, min_image_size=96)
    names = list(NEW_CLASSES.values())
    images, annotations = [], []
    for index in range(count):
        example = generator.example(index)
        Image.fromarray(example["image"]).save(os.path.join(folder, f"{index}.png"))
        height, width = example["image"].shape[:2]
        images.append({"id": index + 1, "file_name": f"{index}.png", "height": height,
                       "width": width})
        for (x0, y0, x1, y1), label in zip(example["boxes"].tolist(), example["labels"]):
            name = NEW_CLASSES.get(CLASS_NAMES[int(label)])
            if name is not None:
                annotations.append({"id": len(annotations) + 1, "image_id": index + 1,
                                    "category_id": names.index(name) + 1,
                                    "bbox": [x0, y0, x1 - x0, y1 - y0],
                                    "area": (x1 - x0) * (y1 - y0), "iscrowd": 0})
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(names)]
    path = os.path.join(folder, "annotations.json")
    with open(path, "w") as f:
        json.dump({"images": images, "annotations": annotations, "categories": categories}, f)
    return f"coco:{folder}:{path}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init-from", required=True, metavar="DIR",
                        help="a finished train_detr.py --preset tiny work directory")
    parser.add_argument("--minutes", type=positive(float), default=4.0,
                        help="training time budget of each run")
    parser.add_argument("--images", type=positive(int), nargs="+", default=[50, 200],
                        help="training-set sizes")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    root = args.workdir or tempfile.mkdtemp(prefix="detr_finetune_")
    held_out = write_coco(os.path.join(root, "held_out"), 100, seed=11, split="valid")
    for count in args.images:
        data = write_coco(os.path.join(root, f"train_{count}"), count, seed=3, split="train")
        for init in (args.init_from, None):
            name = f"{count}-{'finetuned' if init else 'scratch'}"
            run = RunOptions(time_budget=args.minutes, valid_fraction=0.0)
            train_detr(data, os.path.join(root, name), preset("tiny"), run,
                       log=lambda *a: None, init_from=init)
            scores = score_export(os.path.join(root, name, "export"), held_out)
            print(json.dumps({"images": count, "init_from": init, "minutes": args.minutes,
                              **scores}), flush=True)
    return 0


def score_export(export: str, data: str) -> dict:
    """COCO AP, AP50, AP75 and n of an export on every image of a ``coco:`` spec."""
    from vision.data.sources import load_source
    from vision.export.load import load_detector
    from vision.training.evaluate import evaluate_records, match_labels

    detector = load_detector(export)
    source = load_source(data, seed=0)
    label_map = match_labels(detector.class_names, detector.category_ids,
                             source.class_names, source.category_ids)
    scores = evaluate_records(detector, source.records("all"), progress=False,
                              num_classes=source.num_classes, label_map=label_map)
    return {k: scores[k] for k in ("AP", "AP50", "AP75", "n")}


if __name__ == "__main__":
    sys.exit(main())
