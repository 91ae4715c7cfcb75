"""Train a detector: python scripts/train_detr.py --data embedded --workdir DIR [--preset tiny].

Writes DIR/checkpoints/, DIR/export/ (SavedModel + classes.json), DIR/logs/ (TensorBoard) and
DIR/metrics.json, and prints the validation COCO AP. A killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

from tfx_transformer.quiet import onednn_default, quiet_start

onednn_default()  # TensorFlow's oneDNN kernels: faster training steps on x86-64
quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from tfx_transformer.cli import (  # noqa: E402
    COMMON_RUN_FLAGS,
    add_override_arguments,
    add_run_arguments,
    overrides_from_args,
    positive,
    run_cli,
    run_options_from_args,
)
from vision.config import PRESETS, preset  # noqa: E402
from vision.pretrained.init_from import check_init_source  # noqa: E402
from vision.training.train import train_detr  # noqa: E402

# DetrConfig field -> flag and argparse keywords.
CONFIG_FLAGS = {
    "batch_size": ("--batch-size", dict(type=positive(int), help="images per replica")),
    "num_queries": ("--num-queries", dict(
        type=positive(int), help="object queries (most objects per image)")),
    "learning_rate": ("--learning-rate", dict(
        type=positive(float),
        help="Transformer learning rate (the backbone's keeps the preset's multiplier)")),
    "clip_norm": ("--clip-norm", dict(
        type=positive(float), metavar="NORM",
        help="clip the gradients to this global norm (default: the preset's, DETR's 0.1)")),
    "backbone_weights": ("--backbone-weights", dict(
        metavar="FILE", help="r50: local ImageNet weights of torchvision's ResNet-50 (.pth, or "
                             ".safetensors with the same names)")),
}


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="embedded",
                        help="embedded | coco:IMAGES_DIR:ANNOTATIONS.json | tfds:NAME")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    add_run_arguments(parser, (*COMMON_RUN_FLAGS, "eval_limit"), mixed_precision="auto")
    add_override_arguments(parser, CONFIG_FLAGS)
    parser.add_argument("--init-from", metavar="PATH",
                        help="start from trained weights: a train_detr.py work directory, an "
                             "export, a model.keras, or with an rtdetr-* preset a transformers "
                             "RT-DETR folder (the class heads are re-initialized when the "
                             "classes differ)")
    parser.add_argument("--deim", action="store_true",
                        help="rtdetr-*/dfine-* presets: DEIM's training losses (the "
                             "matchability-aware loss, dense one-to-one box losses)")
    parser.add_argument("--skip-bad-images", action="store_true",
                        help="coco: train without the image files that cannot be decoded "
                             "(and their annotations) instead of stopping with their names")
    args = parser.parse_args(argv)
    if args.backbone_weights is not None and not os.path.isfile(args.backbone_weights):
        parser.error(f"--backbone-weights: no such file {args.backbone_weights!r}")
    overrides = overrides_from_args(args, CONFIG_FLAGS)
    if args.deim:
        if PRESETS[args.preset].architecture != "rtdetr":
            parser.error(f"--deim: DEIM trains the real-time detectors, an rtdetr-* or dfine-* "
                         f"preset (--preset {args.preset} is DETR)")
        overrides.update(matchability_aware_loss=True, dense_one_to_one=True)
    config = preset(args.preset, **overrides)
    if args.init_from is not None:
        check_init_source(args.init_from)  # before any data is read
    scores = train_detr(args.data, args.workdir, config, run_options_from_args(args),
                        skip_bad_images=args.skip_bad_images, init_from=args.init_from)
    print("validation:", " ".join(f"{k} {v}" for k, v in scores.items()))
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
