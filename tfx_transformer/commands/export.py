"""Write a model for another runtime: tfx-export --model DIR --format FORMAT --out PATH.

FORMAT is ``litert`` (a ``.tflite`` for LiteRT: phones, edge boards; builtin operators only)
or ``onnx`` (ONNX Runtime, TensorRT, ...) for a detector, ``ctranslate2`` (a CTranslate2
model directory) for a translator. --model is a finished work directory (train_detr.py,
train_nmt.py), its export/, or a converted checkpoint's directory (tfx-convert-detr,
tfx-convert-nmt). PATH must not exist: it is written beside itself and renamed into place,
so a failed run leaves nothing behind. It holds the model, what a caller needs beside it (the
class names, the tokenizer) and ``settings.json`` (format, precision, sizes).

--precision (what each format takes):

  litert       float32, float16 (float16 weights), int8 (int8 weights, dynamic range),
               int8-full (int8 weights and activations, attention kept in float;
               calibrated on images of the run's own training data: needs a train_detr.py
               work directory)
  onnx         float32, int8 (int8 weights, onnxruntime's dynamic quantization)
  ctranslate2  float32, int8 (float16 where CTranslate2's CPU kernels have it)

--input-size S (detector only): the side of the square input the file is fixed to; default
the run's longest resized side. docs/formats.md shows how to run each artefact.

Each format is found by name in the entry-point group ``tfx_transformer.commands.export``
(`tfx_transformer.applications.FORMATS`): the applications register their writers.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from tfx_transformer import applications  # noqa: E402
from tfx_transformer.cli import positive, run_cli  # noqa: E402

__all__ = ["FORMAT_NAMES", "PRECISIONS", "command", "main"]

FORMAT_NAMES = ("litert", "onnx", "ctranslate2")
PRECISIONS = ("float32", "float16", "int8", "int8-full")


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tfx-export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True,
                        help="a finished work directory, its export/, or a converted checkpoint")
    parser.add_argument("--format", required=True, choices=FORMAT_NAMES)
    parser.add_argument("--precision", default="float32", choices=PRECISIONS,
                        help="what the format holds (see above; default float32)")
    parser.add_argument("--out", required=True, metavar="PATH",
                        help="the directory to write (must not exist yet)")
    parser.add_argument("--input-size", type=positive(int), default=None, metavar="S",
                        help="detector: the side of the fixed square input (default: the "
                             "run's longest resized side)")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    out = pathlib.Path(args.out)
    if os.path.lexists(out):
        raise ValueError(f"--out {args.out}: already exists; choose a new path (nothing is "
                         "replaced)")
    if not os.path.exists(args.model):
        raise ValueError(f"--model {args.model}: no such file or directory")
    try:
        write = applications.load(applications.FORMATS, args.format)
        settings = write(pathlib.Path(args.model), out, args.precision, args.input_size)
    except ImportError as error:  # a runtime of the format is not installed
        raise ValueError(f"--format {args.format}: {error.name or error} is not installed "
                         "(pip install 'tfx-transformer[test]')") from None
    files = sorted(p.name for p in out.iterdir())
    print(f"wrote {args.out}: {', '.join(files)}")
    print(json.dumps({key: value for key, value in settings.items() if key != "files"}))
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
