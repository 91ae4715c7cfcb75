"""Convert a translation model: python scripts/convert_nmt.py MODEL --out DIR.

MODEL is a local folder or a Hugging Face Hub id (``Helsinki-NLP/opus-mt-en-de``; fetched
into the Hub's cache with ``huggingface_hub``, ``--revision`` pins it, ``HF_HUB_OFFLINE=1``
reads only the cache). Two families convert, told apart by config.json's ``model_type``:

- ``marian``: OPUS-MT (``Helsinki-NLP/opus-mt-*``, the Tatoeba ``opus-mt-tc-big-*``):
  ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``, which needs torch),
  ``source.spm``, ``target.spm``, ``vocab.json`` and usually ``generation_config.json``;
- ``m2m_100``: NLLB-200 and M2M100 (``facebook/nllb-200-*``): ``config.json``, the weights,
  ``sentencepiece.bpe.model``, ``generation_config.json``; ``--source-lang`` and
  ``--target-lang`` (NLLB codes such as ``eng_Latn``, ``deu_Latn``) are required and stored in
  the export, so a client sends plain strings.

Writes DIR (which must not exist yet): ``model.keras`` (fine-tune it with ``train_nmt.py
--init-from DIR``), the tokenizer files, ``model.json`` and ``export/``, the translator
SavedModel that ``translate.py``, ``evaluate_nmt.py`` and ``serve.py`` take. The export
decodes as transformers' ``generate`` does (beam ``num_beams``, ``length_penalty``, its
stopping rule), so translations equal what transformers gave.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tfx_transformer.cli import run_cli
from tfx_transformer.quiet import quiet_start

FAMILIES = ("marian", "m2m_100")


def model_type(folder: str) -> str:
    """config.json's ``model_type`` of ``folder`` (a converter checks the rest)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isdir(folder):
        raise ValueError(f"{folder}: not a directory, nor a Hub id (owner/name)")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"{folder}: no config.json (a transformers model folder is "
                         "expected)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable JSON ({error})") from None
    kind = config.get("model_type") if isinstance(config, dict) else None
    if kind not in FAMILIES:
        raise ValueError(f"{path}: model_type {kind!r} does not convert (only "
                         f"{', '.join(FAMILIES)}: OPUS-MT, NLLB-200 / M2M100)")
    return kind


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", metavar="MODEL",
                        help="a model folder, or a Hugging Face Hub id such as "
                             "Helsinki-NLP/opus-mt-en-de")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the directory to write (must not exist yet)")
    parser.add_argument("--revision", metavar="REV",
                        help="with a Hub id: the branch, tag or commit to fetch (default: main)")
    parser.add_argument("--source-lang", metavar="CODE",
                        help="NLLB / M2M100: the source language code (e.g. eng_Latn)")
    parser.add_argument("--target-lang", metavar="CODE",
                        help="NLLB / M2M100: the target language code (e.g. deu_Latn)")
    args = parser.parse_args(argv)
    if os.path.exists(args.out):
        parser.error(f"--out {args.out}: already exists; choose a new directory (nothing in "
                     "it is replaced)")
    from nlp.pretrained.hub import fetch_model, is_hub_id

    folder = args.model
    if is_hub_id(folder):
        folder = fetch_model(folder, revision=args.revision)
    elif args.revision:
        parser.error(f"--revision: {args.model} is a local folder, not a Hub id")
    kind = model_type(folder)
    quiet_start()  # TensorFlow from here on: a Hub id or folder refused above never loads it
    from nlp.pretrained.model_dir import write_model_dir

    if kind == "marian":
        for flag, value in (("--source-lang", args.source_lang),
                            ("--target-lang", args.target_lang)):
            if value is not None:
                parser.error(f"{flag}: an OPUS-MT (Marian) model has its language pair "
                             "built in (multilingual ones take a >>xxx<< token in the text)")
        from nlp.pretrained.marian import read_marian

        model, tokenizer, decoding = read_marian(folder)
    else:
        from nlp.pretrained.m2m100 import read_m2m100

        model, tokenizer, decoding = read_m2m100(folder, source_lang=args.source_lang,
                                                 target_lang=args.target_lang)
    source = (args.model + (f"@{args.revision}" if args.revision else "")
              if is_hub_id(args.model) else os.path.abspath(folder))
    write_model_dir(args.out, model, tokenizer, decoding, source=source)
    print(f"wrote {args.out}: model.keras, the tokenizer, export/ (beam {decoding.beam_size}, "
          f"length penalty {decoding.length_penalty:g}, as transformers' generate)")
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
