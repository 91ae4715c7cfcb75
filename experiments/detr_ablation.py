"""Convergence aids of the `tiny` detector, one at a time, on shapes and on photo-like data.

Each aid is one `DetrConfig` value on top of the ``tiny`` preset (``--base``); each run
trains for ``--minutes`` with `vision.training.train.train_detr` (what ``train_detr.py``
runs) and prints one JSON line: the data, the aid, the epochs trained and COCO AP / AP50 / AP75
(pycocotools) on held-out images: 200 of ``embedded`` (``shapes``), or the 200 held-out
images of `photo_objects` (``photos``: real objects pasted onto real photographs, trained on
its 2,000 training images). Runs are sequential: two at once would share the cores.

    python experiments/detr_ablation.py --minutes 4 --data shapes photos \\
        --aids base look_forward_twice mixed_queries hybrid

Lines are also appended to ``--out`` (default ``detr_ablation.jsonl`` in the work
directory), so a cut-short sweep keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

from detr_finetune import score_export  # noqa: E402
from photo_objects import photo_objects  # noqa: E402

from tfx_transformer.cli import positive  # noqa: E402
from tfx_transformer.training.run import RunOptions  # noqa: E402
from vision.config import PRESETS, preset  # noqa: E402
from vision.training.train import train_detr  # noqa: E402

#: aid -> the DetrConfig fields it sets.
AIDS = {
    "base": {},
    # DINO: each layer's box is an offset from the previous layer's, with its gradient.
    "look_forward_twice": {"look_forward_twice": True},
    # DINO: two-stage reference boxes, learned content queries.
    "mixed_queries": {"query_type": "mixed"},
    # H-DETR: 5x as many training-only queries matched to 6 copies of the targets.
    "hybrid": {"one_to_many_queries": 100, "one_to_many_copies": 6},
    # The same at a lower cost: 2x the queries, 3 copies.
    "hybrid_small": {"one_to_many_queries": 40, "one_to_many_copies": 3},
    # DN-DETR / DINO: 3 groups of a positive and a negative noised copy of every target slot.
    "denoising": {"denoising_groups": 3},
    # RT-DETR's IoU-aware classification target (softmax form).
    "iou_aware": {"iou_aware_classification": True},
    # The tiny backbone's former per-pixel LayerNorm instead of its BatchNorm (the default).
    "layer_norm": {"tiny_norm": "layer"},
    # With --base rtdetr-*: RT-DETR's denoising queries, 8 in all (about 2/3 of rtdetr-tiny's
    # 20 matching queries, as 100 for up to ~50 objects is next to RT-DETR's 300). Fields
    # of "rtdetr" are merged into the base preset's.
    "rtdetr_denoising": {"rtdetr": {"num_denoising": 8}},
    # With --base rtdetr-* / dfine-*: DEIM's losses, each and both (`train_detr.py --deim`):
    # the matchability-aware loss; dense one-to-one box (and FGL, DDF) terms.
    "mal": {"matchability_aware_loss": True},
    "dense_o2o": {"dense_one_to_one": True},
    "deim": {"matchability_aware_loss": True, "dense_one_to_one": True},
}


def run_one(data: str, aid: str, changes: dict, args, root: str) -> dict:
    workdir = os.path.join(root, f"{data}-{aid}")
    if "rtdetr" in changes:  # RTDetrConfig fields on top of the base preset's
        changes = {**changes, "rtdetr": {**PRESETS[args.base].rtdetr, **changes["rtdetr"]}}
    config = preset(args.base, **changes)
    if data == "shapes":
        run = RunOptions(time_budget=args.minutes, eval_limit=200)
        scores = train_detr("embedded", workdir, config, run, log=lambda *a: None)
    else:
        train, held_out = photo_objects()
        run = RunOptions(time_budget=args.minutes, valid_fraction=0.0)
        train_detr(train, workdir, config, run, log=lambda *a: None)
        scores = score_export(os.path.join(workdir, "export"), held_out)
    with open(os.path.join(workdir, "metrics.json")) as f:
        epochs = json.load(f).get("train", {}).get("last_epoch")
    return {"data": data, "aid": aid, "base": args.base, "minutes": args.minutes,
            "changes": changes, "epochs": epochs,
            **{k: scores.get(k) for k in ("AP", "AP50", "AP75", "n")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive(float), default=4.0,
                        help="training time budget of each run")
    parser.add_argument("--data", nargs="+", choices=("shapes", "photos"),
                        default=["shapes", "photos"])
    parser.add_argument("--aids", nargs="+", default=list(AIDS),
                        help=f"aids to run, from {sorted(AIDS)}; 'a+b' combines two")
    parser.add_argument("--base", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    parser.add_argument("--out", default=None, help="JSON lines file (appended)")
    args = parser.parse_args(argv)
    runs = {}
    for aid in args.aids:
        parts = aid.split("+")
        unknown = [part for part in parts if part not in AIDS]
        if unknown:
            parser.error(f"--aids: unknown {unknown}; known: {sorted(AIDS)}")
        runs[aid] = {key: value for part in parts for key, value in AIDS[part].items()}
    root = args.workdir or tempfile.mkdtemp(prefix="detr_ablation_")
    out = args.out or os.path.join(root, "detr_ablation.jsonl")
    for data in args.data:
        for aid, changes in runs.items():
            line = json.dumps(run_one(data, aid, changes, args, root))
            print(line, flush=True)
            with open(out, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
