"""Train a translator: python scripts/train_nmt.py --data embedded --workdir DIR [--preset tiny]."""

from __future__ import annotations

import argparse
import os
import sys

from tfx_transformer.quiet import onednn_default, quiet_start

onednn_default()  # TensorFlow's oneDNN kernels: faster training steps on x86-64
quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from nlp.config import PRESETS, SCHEDULES, preset  # noqa: E402
from nlp.training.train import train_nmt  # noqa: E402
from tfx_transformer.cli import (  # noqa: E402
    COMMON_RUN_FLAGS,
    add_override_arguments,
    add_run_arguments,
    overrides_from_args,
    positive,
    run_cli,
    run_options_from_args,
)

# `preset` override (NMTConfig field or decoding setting) -> flag and argparse keywords.
CONFIG_FLAGS = {
    "batch_tokens": ("--batch-tokens", dict(type=positive(int), help="token budget per batch")),
    "vocab_size": ("--vocab-size", dict(type=positive(int))),
    "max_length": ("--max-length", dict(
        type=positive(int), help="drop training pairs longer than this many tokens")),
    "beam_size": ("--beam", dict(type=positive(int), metavar="BEAM",
                                 help="beam width of the export")),
    "schedule": ("--schedule", dict(
        choices=SCHEDULES, help="noam (default): the paper's; budget: warm-up over "
                                "--warmup-share of the run's steps or --time-budget, then "
                                "linear decay to 0")),
    "warmup_share": ("--warmup-share", dict(type=float, metavar="SHARE",
                                            help="share of the run spent warming up")),
    "patience": ("--patience", dict(
        type=positive(int), metavar="N",
        help="stop after N epochs without a better validation BLEU; export the best epoch")),
    "average_last": ("--average-last", dict(
        type=positive(int), metavar="N",
        help="export the mean of the weights of the last N epochs (up to the best one); "
             "default: a quarter of the epochs run, at most 10; 1: the last epoch alone")),
    "clip_norm": ("--clip-norm", dict(
        type=positive(float), metavar="NORM",
        help="clip the gradients to this global norm (default: no clipping)")),
    "valid_sentences": ("--valid-sentences", dict(
        type=int, metavar="N", help="held-out pairs scored (greedy BLEU/chrF) every epoch; "
                                    "0: none")),
}
EVAL_LIMIT = 1000  # held-out pairs translated and scored after training (--eval-limit)
# With --init-from, unless the flags say otherwise: the budget schedule (linear warm-up over a
# tenth of the run, then linear decay to 0; Noam's step^-0.5 when the run's length is not
# known), peaking at `nlp.training.train.FINE_TUNE_PEAK`.
FINE_TUNING = {"schedule": "budget", "warmup_share": 0.1}


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default="embedded",
                        help="embedded | tsv:PATH (source<TAB>target) | tfds:NAME")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    add_run_arguments(parser, (*COMMON_RUN_FLAGS, "eval_limit", "jit_compile"),
                      eval_limit=EVAL_LIMIT, mixed_precision="auto")
    add_override_arguments(parser, CONFIG_FLAGS)
    parser.add_argument("--init-from", metavar="MODEL_DIR",
                        help="fine-tune this model directory (tfx-convert-nmt's, e.g. an OPUS-MT "
                             "model) with its tokenizer and decoding, instead of training a "
                             "new model")
    args = parser.parse_args(argv)
    if args.init_from is not None:
        if args.vocab_size is not None:
            parser.error("--vocab-size: a fine-tuned model keeps its vocabulary (--init-from "
                         f"{args.init_from}); leave --vocab-size out")
        if not os.path.isdir(args.init_from):
            parser.error(f"--init-from {args.init_from}: not a directory (a model directory "
                         "written by tfx-convert-nmt is expected)")
    overrides = overrides_from_args(args, CONFIG_FLAGS)
    if args.init_from is not None:  # a trained model: a short warm-up, then linear decay
        overrides = {**FINE_TUNING, **overrides}
    config = preset(args.preset, **overrides)
    scores = train_nmt(args.data, args.workdir, config, run_options_from_args(args),
                       init_from=args.init_from)
    if scores:  # a non-chief worker scores nothing
        print("held-out:", " ".join(f"{k} {v}" for k, v in scores.items()))
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
