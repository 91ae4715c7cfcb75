"""Train a detector: python scripts/train_detr.py --data embedded --workdir DIR [--preset tiny].

Writes DIR/checkpoints/, DIR/export/ (SavedModel + classes.json), DIR/logs/ (TensorBoard) and
DIR/metrics.json, and prints the validation COCO AP. A killed run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tfx_transformer import training  # noqa: E402
from vision.config import PRESETS  # noqa: E402
from vision.train import train_detr  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="embedded",
                        help="embedded | coco:IMAGES_DIR:ANNOTATIONS.json | tfds:NAME")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    training.add_common_arguments(parser, default_epochs=None)
    parser.add_argument("--batch-size", type=int, default=None, help="images per replica")
    parser.add_argument("--num-queries", type=int, default=None,
                        help="object queries (most objects per image)")
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="Transformer learning rate (the backbone's keeps the preset ratio)")
    parser.add_argument("--backbone-weights", default=None, metavar="FILE",
                        help="r50: local Keras ResNet-50 ImageNet weights (..._notop.h5)")
    parser.add_argument("--valid-fraction", type=float, default=0.05,
                        help="held-out share of a coco: source")
    parser.add_argument("--eval-limit", type=int, default=None,
                        help="validate and evaluate on at most N images")
    args = parser.parse_args(argv)
    for name in ("batch_size", "num_queries", "learning_rate", "eval_limit"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not 0.0 <= args.valid_fraction < 1.0:
        parser.error(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    if args.backbone_weights is not None and not os.path.isfile(args.backbone_weights):
        parser.error(f"--backbone-weights: no such file {args.backbone_weights!r}")
    overrides = {}
    if args.num_queries is not None:
        overrides["num_queries"] = args.num_queries
    if args.learning_rate is not None:
        base = PRESETS[args.preset]
        overrides["learning_rate"] = args.learning_rate
        overrides["backbone_learning_rate"] = (
            args.learning_rate * base.backbone_learning_rate / base.learning_rate)
    if args.backbone_weights is not None:
        overrides["backbone_weights"] = args.backbone_weights
    scores = train_detr(
        args.data, args.workdir, args.preset, epochs=args.epochs, max_steps=args.max_steps,
        time_budget=args.time_budget, batch_size=args.batch_size, strategy=args.strategy,
        mixed_precision=args.mixed_precision, seed=args.seed,
        valid_fraction=args.valid_fraction, eval_limit=args.eval_limit,
        config_overrides=overrides,
    )
    print("validation:", " ".join(f"{k} {v}" for k, v in scores.items()))
    return 0


if __name__ == "__main__":
    sys.exit(training.run_cli(main))
