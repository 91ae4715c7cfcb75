"""Quick start: the tiny translator and the tiny detector, end to end, offline, on a CPU.

Trains each on its embedded data for an equal share of the time budget, prints held-out
scores and samples, exports both SavedModels and runs the exported models
(``tfx-quickstart``). The applications register their parts (``nlp.quickstart.run``,
``vision.quickstart.run``; `tfx_transformer.applications`): this module imports neither.

    python scripts/quickstart.py [--minutes 8] [--workdir runs/quickstart]
"""

from __future__ import annotations

import argparse
import os
import sys

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported; --verbose keeps its start-up lines

from tfx_transformer.applications import QUICKSTART, registered  # noqa: E402
from tfx_transformer.cli import positive, run_cli  # noqa: E402


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive(float), default=8.0,
                        help="total training budget, split between the two models")
    parser.add_argument("--workdir", default=os.path.join("runs", "quickstart"))
    parser.add_argument("--verbose", action="store_true",
                        help="keep TensorFlow's start-up and C++ log lines")
    args = parser.parse_args(argv)
    if os.path.exists(args.workdir) and not os.path.isdir(args.workdir):
        parser.error(f"--workdir {args.workdir!r} is a file, not a directory")
    parts = registered(QUICKSTART)
    for run in parts.values():
        run(args.workdir, args.minutes / len(parts))
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
