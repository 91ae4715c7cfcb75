"""Score an exported translator: python scripts/evaluate_nmt.py --model DIR/export --data SPEC.

Scores every pair of a tsv: file and the held-out split of embedded and tfds: data; prints
JSON with sacrebleu BLEU and chrF, exact match and the number of pairs.
"""

from __future__ import annotations

import argparse
import json
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from nlp.data.sources import evaluation_split, load_pairs  # noqa: E402
from nlp.export.load import NotATranslatorError, load_translator, read_info  # noqa: E402
from nlp.training.evaluate import evaluate  # noqa: E402
from tfx_transformer.cli import positive, run_cli  # noqa: E402


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--data", required=True, help="embedded | tsv:PATH | tfds:NAME")
    parser.add_argument("--beam-size", "--beam", type=positive(int), default=None,
                        help="exported width or 1 (greedy)")
    parser.add_argument("--limit", type=positive(int), default=None, help="score at most N pairs")
    parser.add_argument("--batch-size", type=positive(int), default=64)
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    try:
        read_info(args.model)  # a wrong --model fails before the data is read
        pairs = load_pairs(args.data, evaluation_split(args.data), limit=args.limit)
        if not pairs:
            raise ValueError(f"--data {args.data}: no pairs to score.")
        translate = load_translator(args.model, args.beam_size)
    except NotATranslatorError as error:
        raise ValueError(f"--model {error}") from None
    scores, _ = evaluate(translate, pairs, args.batch_size, progress=sys.stderr.isatty())
    print(json.dumps(scores))
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
