"""Quick start: the tiny translator and the tiny detector, end to end, offline, on a CPU.

Trains each on its embedded data for part of the time budget, prints held-out scores and
samples, exports both SavedModels and runs the exported models (``tfx-quickstart``).

    python scripts/quickstart.py [--minutes 8] [--workdir runs/quickstart]
"""

from __future__ import annotations

import argparse
import os
import sys

from tfx_transformer.training.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from tfx_transformer.training.cli import positive, run_cli  # noqa: E402
from tfx_transformer.training.run import RunOptions  # noqa: E402
from tfx_transformer.training.workdir import read_metrics  # noqa: E402

# The applications are imported inside the functions below: nothing else in `tfx_transformer`
# depends on them, and importing this module imports neither.


def translation(workdir: str, minutes: float) -> None:
    import tensorflow as tf

    from nlp import config as nmt_config
    from nlp.serving import load_translator
    from nlp.train import train_nmt

    print(f"\n== translation: tiny Transformer, English -> German, {minutes:.1f} min ==")
    scores = train_nmt("embedded", workdir, nmt_config.preset("tiny"),
                       RunOptions(time_budget=minutes, eval_limit=300))
    print(f"held-out ({scores['n']} sentences): BLEU {scores['bleu']}, chrF {scores['chrf']}, "
          f"exact match {scores['exact_match']:.2f}")
    for sample in read_metrics(workdir)["samples"][:3]:
        print(f"  {sample['source']}\n    -> {sample['translation']}")
    translate = load_translator(os.path.join(workdir, "export"))
    sentence = "There are twenty-one apples in the garden."
    out = translate(tf.constant([sentence])).numpy()[0].decode()
    print(f"exported model ({workdir}/export): {sentence} -> {out}")


def detection(workdir: str, minutes: float) -> None:
    from vision import config as detr_config
    from vision.data.shapes import ShapesGenerator
    from vision.plots import draw_detections
    from vision.serving import load_detector
    from vision.training.train import train_detr

    print(f"\n== detection: tiny DETR, synthetic shapes, {minutes:.1f} min ==")
    scores = train_detr("embedded", workdir, detr_config.preset("tiny"),
                        RunOptions(time_budget=minutes, eval_limit=200))
    print(f"validation ({scores['n']} images): AP {scores['AP']:.3f}, AP50 {scores['AP50']:.3f}, "
          f"AP75 {scores['AP75']:.3f}")
    detector = load_detector(os.path.join(workdir, "export"))
    example = ShapesGenerator(seed=0, split="valid").example(0)
    found = detector(example["image"][None])
    keep = found["scores"][0] > 0.5
    path = draw_detections(example["image"], found["boxes"][0][keep], found["scores"][0][keep],
                           found["labels"][0][keep], detector.class_names,
                           os.path.join(workdir, "detections.png"), title="held-out image")
    names = [detector.class_names[i] for i in found["labels"][0][keep]]
    truth = [detector.class_names[i] for i in example["labels"]]
    print(f"exported model ({workdir}/export) on a held-out image: {sorted(names)} "
          f"(truth {sorted(truth)}) -> {path}")


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive(float), default=8.0,
                        help="total training budget, split between the two models")
    parser.add_argument("--workdir", default=os.path.join("runs", "quickstart"))
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    if os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
        parser.error(f"--workdir {args.workdir!r} is a file, not a directory")
    translation(os.path.join(args.workdir, "nmt"), args.minutes / 2)
    detection(os.path.join(args.workdir, "detr"), args.minutes / 2)
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
