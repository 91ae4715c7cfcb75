"""Whether a trained DETR's queries collapse: its losses and box spread in three modes.

Reads a finished ``train_detr`` work directory of an ``embedded`` run (its ``metrics.json``
config and the last checkpoint), and on ``--batches`` batches of the training and the
held-out images prints, per mode, the last decoder layer's set losses and the standard
deviation of the predicted boxes over the queries (0 = every query predicts the same box):

- ``inference``: what the export computes;
- ``training``: dropout on and BatchNorm's batch statistics, as ``fit``'s losses are made;
- ``training, no dropout``: the same with every dropout rate set to 0.

A model whose queries differ only through dropout has a low training loss (the matching
picks the noisy copies nearest each object) and a spread near 0 at inference.

    python experiments/detr_convergence.py --preset tiny-detr --minutes 10 --workdir runs/vanilla
    python experiments/detr_collapse.py runs/vanilla
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfx_transformer.layers.attention import MultiHeadAttention  # noqa: E402
from vision.config import DetrConfig  # noqa: E402
from vision.data.augment import DetrSizes  # noqa: E402
from vision.data.batching import ObjectLimit, make_batches  # noqa: E402
from vision.data.sources import load_source  # noqa: E402
from vision.modeling.detr import build_criterion, build_model  # noqa: E402

LOSSES = ("loss_ce", "loss_bbox", "loss_giou")


def load_run(workdir: Path):
    """The run's `DetrConfig`, its data source and the path of its last checkpoint."""
    metrics = json.loads((workdir / "metrics.json").read_text())
    fields = {field.name for field in dataclasses.fields(DetrConfig)}
    config = DetrConfig(**{key: tuple(value) if isinstance(value, list) else value
                           for key, value in metrics["config"].items() if key in fields})
    run = json.loads((workdir / "run.json").read_text())
    source = load_source(metrics["data"]["spec"], seed=run["split"]["seed"],
                         valid_fraction=run["split"]["valid_fraction"],
                         max_side=DetrSizes.scaled(config.image_size,
                                                   config.max_image_size).max_size)
    checkpoints = sorted((workdir / "checkpoints").glob("*.weights.h5"))
    if not checkpoints:
        raise SystemExit(f"error: {workdir}/checkpoints has no *.weights.h5")
    return config, source, checkpoints[-1]


def set_dropout(model: keras.Model, rate: float | None, saved: dict) -> None:
    """Every dropout rate to ``rate`` (``None``: back to the rates in ``saved``)."""
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, keras.layers.Dropout):
            saved.setdefault(id(layer), layer.rate)
            layer.rate = saved[id(layer)] if rate is None else rate
        elif isinstance(layer, MultiHeadAttention):
            saved.setdefault(id(layer), layer.dropout)
            layer.dropout = saved[id(layer)] if rate is None else rate


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdir", type=Path, help="a finished train_detr work directory")
    parser.add_argument("--batches", type=int, default=6, help="batches of each split")
    args = parser.parse_args(argv)
    config, source, checkpoint = load_run(args.workdir)
    limit = ObjectLimit(config.num_queries)
    sizes = dict(image_size=config.image_size, max_size=config.max_image_size)
    splits = {
        "train": source.batches("train", batch_size=config.batch_size, object_limit=limit,
                                seed=0, augmentation=config.augmentation, **sizes),
        "valid": make_batches(source.records("valid"), batch_size=config.batch_size,
                              object_limit=limit, **sizes),
    }
    model = build_model(config, source.num_classes)
    criterion = build_criterion(config, source.num_classes)
    for inputs, _ in splits["valid"].take(1):
        model(inputs)
    saved: dict = {}
    for split, batches in splits.items():
        for mode, training, dropout in (("inference", False, None), ("training", True, None),
                                        ("training, no dropout", True, 0.0)):
            model.load_weights(checkpoint)  # training mode moved BatchNorm's statistics
            set_dropout(model, dropout, saved)
            losses, spread = [], []
            for inputs, targets in batches.take(args.batches):
                outputs = model(inputs, training=training)
                values = criterion(outputs, targets)
                losses.append([float(values[key]) for key in LOSSES])
                boxes = keras.ops.convert_to_numpy(outputs["pred_boxes"])
                spread.append(float(boxes.std(axis=1).mean()))
            print(json.dumps({"split": split, "mode": mode,
                              **dict(zip(LOSSES, np.round(np.mean(losses, 0), 4).tolist())),
                              "box_std_over_queries": round(float(np.mean(spread)), 4)}),
                  flush=True)
    set_dropout(model, None, saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
