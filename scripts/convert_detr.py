"""Convert a DETR file saved before the query layers: python scripts/convert_detr.py OLD NEW.

OLD is a ``.keras`` archive or a ``.weights.h5`` checkpoint (``DIR/checkpoints/``,
``DIR/backup/``) written before the query strategies became layers; NEW (the same kind, may
be OLD) then loads with ``keras.saving.load_model`` / ``model.load_weights``. See
`vision.legacy`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from scripts._quiet import quiet_start  # noqa: E402

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from tfx_transformer.training.cli import run_cli  # noqa: E402
from vision.legacy import convert_legacy_weights  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("old", metavar="OLD", help="the old .keras or .weights.h5 file")
    parser.add_argument("new", metavar="NEW", help="the converted file (same kind)")
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    query_type = convert_legacy_weights(args.old, args.new)
    print(f"{args.old} (query_type={query_type!r}) -> {args.new}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
