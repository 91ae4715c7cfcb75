"""The detection part of the quick start (`tfx_transformer.commands.quickstart`): the tiny detector
on the built-in shapes, its validation AP, and its export run on a held-out image."""

from __future__ import annotations

import os

__all__ = ["run"]


def run(root: str, minutes: float) -> None:
    """Trains the tiny detector in ``root/detr`` for ``minutes``, prints its validation AP,
    and draws its export's detections on a held-out image (``root/detr/detections.png``)."""
    from tfx_transformer.training.run import RunOptions
    from vision import config
    from vision.data.shapes import ShapesGenerator
    from vision.export.load import load_detector
    from vision.plots import draw_detections
    from vision.training.train import train_detr

    workdir = os.path.join(root, "detr")
    print(f"\n== detection: tiny DETR, synthetic shapes, {minutes:.1f} min ==")
    scores = train_detr("embedded", workdir, config.preset("tiny"),
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
