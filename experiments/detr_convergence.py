"""How far a DETR configuration gets on the embedded shapes in a fixed wall-clock budget.

Trains a preset, with some `DetrConfig` fields changed, on `embedded` data for ``--minutes``
(the same `vision.training.train.train_detr` as ``scripts/train_detr.py``: export and COCO AP on
held-out images included) and prints one JSON line with the changes and AP / AP50 / AP75.
Runs are sequential by design: two at once share the cores and each gets fewer steps.

    python experiments/detr_convergence.py --minutes 4 --eval-limit 200 \\
        --set augmentation='"detr"' --set lr_drop_fraction=null

``--set FIELD=JSON`` takes a JSON value (strings quoted, ``null`` for None, lists for tuples).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from tfx_transformer.cli import positive  # noqa: E402
from tfx_transformer.training.run import RunOptions  # noqa: E402
from vision.config import PRESETS, DetrConfig, preset  # noqa: E402
from vision.training.train import train_detr  # noqa: E402


def parse_changes(items: list[str]) -> dict:
    """``["FIELD=JSON", ...]`` -> ``{field: value}``; lists become tuples."""
    fields = {field.name for field in dataclasses.fields(DetrConfig)}
    changes = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in fields:
            raise ValueError(f"--set needs FIELD=JSON with a DetrConfig field; got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"--set {name}: {text!r} is not JSON ({error.msg})") from None
        changes[name] = tuple(value) if isinstance(value, list) else value
    return changes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--minutes", type=positive(float), default=4.0,
                        help="training time budget")
    parser.add_argument("--eval-limit", type=positive(int), default=200,
                        help="held-out images scored")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="change a DetrConfig field (repeatable)")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    args = parser.parse_args(argv)
    try:
        changes = parse_changes(args.set)
    except ValueError as error:
        parser.error(str(error))
    workdir = args.workdir or tempfile.mkdtemp(prefix="detr_convergence_")
    run = RunOptions(time_budget=args.minutes, eval_limit=args.eval_limit)
    scores = train_detr("embedded", workdir, preset(args.preset, **changes), run,
                        log=lambda *a: None)
    print(json.dumps({"preset": args.preset, "minutes": args.minutes, "changes": changes,
                      **scores}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
