"""Translate with an exported model: python scripts/translate.py --model DIR/export [TEXT ...].

Without TEXT, translates standard input line by line (UTF-8, one sentence per line). The whole
input is read and checked before anything is translated: a line that is not UTF-8 is an error
naming its line number, and then nothing at all is translated, so the output is never a part
of the input that looks like the whole of it.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts._quiet import quiet_start  # noqa: E402

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from nlp.evaluate import translate_all  # noqa: E402
from nlp.export import NotATranslatorError, load_translator, read_info  # noqa: E402
from tfx_transformer.cli import positive, run_cli  # noqa: E402


def read_lines(stream, name: str = "stdin") -> list[str]:
    """The lines of ``stream`` (binary, or text without a binary buffer) without line ends.

    Raises:
        ValueError: a line is not UTF-8; names ``name`` and the line number ("stdin:3: ...").
    """
    binary = getattr(stream, "buffer", None)
    if binary is None:  # a text stream (e.g. io.StringIO): already decoded
        return [line.removesuffix("\n").removesuffix("\r") for line in stream]
    lines = []
    for number, raw in enumerate(binary, start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{name}:{number}: line is not valid UTF-8 ({error.reason} at byte "
                             f"{error.start + 1}); nothing was translated.") from None
        if number == 1:
            line = line.removeprefix("\ufeff")  # byte order mark
        lines.append(line.removesuffix("\n").removesuffix("\r"))
    return lines


def check_texts(texts: list[str]) -> list[str]:
    """``texts`` from the command line, each checked to be UTF-8 (not undecodable bytes)."""
    for number, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"TEXT argument {number} is not valid UTF-8: {text[:40]!r}; "
                             "nothing was translated.") from None
    return texts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="the export directory (DIR/export)")
    parser.add_argument("--beam-size", "--beam", type=positive(int), default=None,
                        help="beam width: the exported one (default) or 1 for greedy")
    parser.add_argument("--batch-size", type=positive(int), default=32)
    parser.add_argument("text", nargs="*", help="sentences to translate (default: stdin lines)")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    try:
        read_info(args.model)  # a wrong --model fails before stdin is read
        texts = check_texts(args.text) if args.text else read_lines(sys.stdin)
        translate = load_translator(args.model, args.beam_size)
    except NotATranslatorError as error:
        raise ValueError(f"--model {error}") from None
    for line in translate_all(translate, texts, args.batch_size, progress=False):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
