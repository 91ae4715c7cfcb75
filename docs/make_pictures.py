"""Writes docs/detections.png and docs/attention.png from two finished training runs.

    python docs/make_pictures.py --detector runs/shapes --translator runs/nmt [--out docs]

The runs are the documented commands with their default flags (docs/detection.md,
docs/translation.md):

    python scripts/train_detr.py --data embedded --preset tiny --workdir runs/shapes \
        --time-budget 15
    python scripts/train_nmt.py --data embedded --preset tiny --workdir runs/nmt \
        --time-budget 10

``detections.png``: the detector's export on a held-out image of the built-in shapes (the
first with at least ``--min-objects`` shapes), boxes above ``--threshold`` (detect.py's value
in the docs). ``attention.png``: every head of the translator's last decoder layer attending to
the source while it translates ``--sentence`` greedily (`nlp.plots.plot_cross_attention`), read
from the run's ``model.keras`` the Keras way. docs/serving.png comes from
docs/make_serving_png.py with the same two runs' exports.
"""

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def detections(workdir: Path, out: Path, threshold: float, min_objects: int) -> str:
    from vision.data.shapes import ShapesGenerator
    from vision.export.load import load_detector
    from vision.plots import draw_detections

    detector = load_detector(workdir / "export")
    shapes = ShapesGenerator(seed=0, split="valid")
    index = next(i for i in range(1000) if len(shapes.example(i)["labels"]) >= min_objects)
    example = shapes.example(index)
    found = detector(example["image"][None])
    keep = found["scores"][0] > threshold
    return draw_detections(example["image"], found["boxes"][0][keep], found["scores"][0][keep],
                           found["labels"][0][keep], detector.class_names,
                           out / "detections.png", title=f"held-out image {index}")


def attention(workdir: Path, out: Path, sentence: str) -> str:
    import keras

    import nlp  # noqa: F401  (registers the saved classes)
    from nlp.plots import plot_cross_attention
    from nlp.text.tokenizer import load_tokenizer

    model = keras.saving.load_model(workdir / "model.keras", compile=False)
    return plot_cross_attention(model, load_tokenizer(workdir), sentence, out / "attention.png")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--detector", type=Path, help="a finished train_detr.py work directory")
    parser.add_argument("--translator", type=Path, help="a finished train_nmt.py work directory")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--threshold", type=float, default=0.7)
    parser.add_argument("--min-objects", type=int, default=4)
    parser.add_argument("--sentence", default="There are twenty-one apples in the garden.")
    args = parser.parse_args(argv)
    if args.detector:
        print(detections(args.detector, args.out, args.threshold, args.min_objects))
    if args.translator:
        print(attention(args.translator, args.out, args.sentence))
    return 0


if __name__ == "__main__":
    sys.exit(main())
