"""Convert an OPUS-MT (Marian) model: python scripts/convert_nmt.py FOLDER --out DIR.

FOLDER is a ``Helsinki-NLP/opus-mt-*`` model folder as the Hugging Face Hub serves it:
``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``, which needs torch),
``source.spm``, ``target.spm``, ``vocab.json`` and usually ``generation_config.json``; nothing
is downloaded. Writes DIR (which must not exist yet): ``model.keras`` (fine-tune it with
``train_nmt.py --init-from DIR``), the tokenizer files, ``model.json`` and ``export/``, the
translator SavedModel that ``translate.py``, ``evaluate_nmt.py`` and ``serve.py`` take. The
export decodes as transformers' ``generate`` does (beam ``num_beams``, ``length_penalty``,
its stopping rule), so translations equal what transformers gave.
"""

from __future__ import annotations

import argparse
import os
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported

from tfx_transformer.cli import run_cli  # noqa: E402


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="an OPUS-MT model folder (config.json, "
                                       "model.safetensors, source.spm, target.spm, vocab.json)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the directory to write (must not exist yet)")
    args = parser.parse_args(argv)
    if os.path.exists(args.out):
        parser.error(f"--out {args.out}: already exists; choose a new directory (nothing in "
                     "it is replaced)")
    from nlp.marian import read_marian
    from nlp.model_dir import write_model_dir

    model, tokenizer, decoding = read_marian(args.folder)
    write_model_dir(args.out, model, tokenizer, decoding, source=os.path.abspath(args.folder))
    print(f"wrote {args.out}: model.keras, the tokenizer, export/ (beam {decoding.beam_size}, "
          f"length penalty {decoding.length_penalty:g}, as transformers' generate)")
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
