"""Translate with an exported model: python scripts/translate.py --model DIR/export [TEXT ...].

Without TEXT, translates standard input line by line (UTF-8, one sentence per line). The whole
input is read and checked before anything is translated: a line that is not UTF-8 is an error
naming its line number, and then nothing at all is translated, so the output is never a part
of the input that looks like the whole of it.

Prints one translation per line. With --nbest K (1 to the export's beam size), prints the K
best hypotheses of the beam search for every sentence instead, best first, one per line:
NUMBER<TAB>SCORE<TAB>HYPOTHESIS, where NUMBER is the sentence's position in the input (1 for
the first TEXT or line) and SCORE its length-penalized log-probability (4 decimals, higher is
better; -1000000000.0000 marks a slot with no hypothesis). The first hypothesis of each
sentence is what translating without --nbest prints.

--model may also be a CTranslate2 directory (tfx-export --format ctranslate2): it translates
with ctranslate2.Translator at the export's beam settings (nlp.export.ctranslate2_runtime says where
its search differs from the SavedModel's), and --beam-size takes any width there.
"""

from __future__ import annotations

import argparse
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from nlp.export.ctranslate2_runtime import is_ct2_dir  # noqa: E402
from nlp.export.load import (  # noqa: E402
    NBEST,
    NotATranslatorError,
    load_translator,
    nbest_size,
    read_info,
)
from nlp.training.evaluate import nbest_all, translate_all  # noqa: E402
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


def check_nbest(nbest: int | None, info: dict, model: str, beam_size: int | None) -> None:
    """Raises `ValueError` naming ``--nbest`` unless the export can give lists of ``nbest``."""
    if nbest is None:
        return
    size = nbest_size(info)
    if size is None:
        raise ValueError(f"--nbest {nbest}: --model {model} has no {NBEST!r} signature (it was "
                         "exported before n-best lists existed); export the model again "
                         "(nlp.export.translator.export_translator)")
    if nbest > size:
        raise ValueError(f"--nbest {nbest}: this export keeps {size} hypotheses per sentence "
                         f"(its beam size); give --nbest 1 to {size}")
    if beam_size is not None and beam_size != info["beam_size"]:
        raise ValueError(f"--nbest {nbest}: n-best lists come from the export's beam search "
                         f"(beam size {info['beam_size']}); leave out --beam-size {beam_size}")


def translate_ct2(args) -> int:
    """``--model`` a CTranslate2 directory: `nlp.export.ctranslate2_runtime.Ct2Translator` prints
    the lines."""
    try:
        from nlp.export.ctranslate2_runtime import Ct2Translator

        translator = Ct2Translator(args.model)
    except ImportError as error:
        raise ValueError(f"--model {args.model} is a CTranslate2 directory: {error.name} is "
                         "not installed (pip install ctranslate2)") from None
    beam = translator.beam_size if args.beam_size is None else args.beam_size
    if args.nbest is not None and args.nbest > beam:
        raise ValueError(f"--nbest {args.nbest}: the search keeps {beam} hypotheses per "
                         f"sentence (its beam size); give --nbest 1 to {beam}")
    texts = check_texts(args.text) if args.text else read_lines(sys.stdin)
    if args.nbest is None:
        for line in translator.translate(texts, beam, args.batch_size):
            print(line, flush=True)
        return 0
    lists = translator.translate_nbest(texts, args.nbest, beam, args.batch_size)
    for number, hypotheses in enumerate(lists, start=1):
        for score, hypothesis in hypotheses:
            print(f"{number}\t{score:.4f}\t{hypothesis}", flush=True)
    return 0


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="the export directory (DIR/export), or a CTranslate2 directory")
    parser.add_argument("--beam-size", "--beam", type=positive(int), default=None,
                        help="beam width: the exported one (default) or 1 for greedy")
    parser.add_argument("--batch-size", type=positive(int), default=32)
    parser.add_argument("--nbest", type=positive(int), default=None, metavar="K",
                        help="print the K best hypotheses of each sentence: "
                             "NUMBER<TAB>SCORE<TAB>HYPOTHESIS lines (K: 1 to the beam size)")
    parser.add_argument("text", nargs="*", help="sentences to translate (default: stdin lines)")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    if is_ct2_dir(args.model):
        return translate_ct2(args)
    try:
        info = read_info(args.model)  # a wrong --model or --nbest fails before stdin is read
        check_nbest(args.nbest, info, args.model, args.beam_size)
        texts = check_texts(args.text) if args.text else read_lines(sys.stdin)
        translate = load_translator(args.model, args.beam_size)
    except NotATranslatorError as error:
        raise ValueError(f"--model {error}") from None
    if args.nbest is None:
        for line in translate_all(translate, texts, args.batch_size, progress=False):
            print(line, flush=True)
        return 0
    if translate.nbest_size is None:  # translator.json lists it, the SavedModel lacks it
        raise ValueError(f"--nbest {args.nbest}: --model {args.model} has no {NBEST!r} "
                         "signature; export the model again "
                         "(nlp.export.translator.export_translator)")
    lists = nbest_all(translate.translate_nbest, texts, args.nbest, args.batch_size,
                      progress=False)
    for number, hypotheses in enumerate(lists, start=1):
        for score, hypothesis in hypotheses:
            print(f"{number}\t{score:.4f}\t{hypothesis}", flush=True)
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
