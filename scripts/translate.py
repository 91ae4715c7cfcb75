"""Translate with an exported model: python scripts/translate.py --model DIR/export [TEXT ...].

Without TEXT, translates standard input line by line.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from nlp.evaluate import translate_all  # noqa: E402
from nlp.export import load_translator  # noqa: E402
from tfx_transformer.cli import positive, run_cli  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--beam-size", "--beam", type=positive(int), default=None,
                        help="beam width: the exported one (default) or 1 for greedy")
    parser.add_argument("--batch-size", type=positive(int), default=32)
    parser.add_argument("text", nargs="*", help="sentences to translate (default: stdin lines)")
    args = parser.parse_args(argv)
    translate = load_translator(args.model, args.beam_size)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    for line in translate_all(translate, texts, args.batch_size, progress=False):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
