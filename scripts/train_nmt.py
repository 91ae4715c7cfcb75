"""Train a translator: python scripts/train_nmt.py --data embedded --workdir DIR [--preset tiny]."""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nlp.config import PRESETS  # noqa: E402
from nlp.train import train_nmt  # noqa: E402
from tfx_transformer import training  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="embedded",
                        help="embedded | tsv:PATH (source<TAB>target) | tfds:NAME")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    training.add_common_arguments(parser, default_epochs=None)
    parser.add_argument("--batch-tokens", type=int, default=None, help="token budget per batch")
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=None,
                        help="drop training pairs longer than this many tokens")
    parser.add_argument("--valid-fraction", type=float, default=0.05,
                        help="held-out share of a tsv: file")
    parser.add_argument("--beam", type=int, default=None, help="beam width of the export")
    parser.add_argument("--xla", action="store_true",
                        help="XLA-compile the train step (one compilation per batch shape)")
    args = parser.parse_args(argv)
    for name in ("batch_tokens", "vocab_size", "max_length", "beam"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not 0.0 <= args.valid_fraction < 1.0:
        parser.error(f"--valid-fraction must be in [0, 1), got {args.valid_fraction}")
    scores = train_nmt(
        args.data, args.workdir, args.preset, epochs=args.epochs, max_steps=args.max_steps,
        time_budget=args.time_budget, batch_tokens=args.batch_tokens,
        vocab_size=args.vocab_size, max_length=args.max_length, strategy=args.strategy,
        mixed_precision=args.mixed_precision, seed=args.seed,
        valid_fraction=args.valid_fraction, beam_size=args.beam, jit_compile=args.xla,
    )
    print("held-out:", " ".join(f"{k} {v}" for k, v in scores.items()))
    return 0


if __name__ == "__main__":
    sys.exit(training.run_cli(main))
