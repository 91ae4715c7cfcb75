"""Convert a published DETR checkpoint: python scripts/convert_detr.py CHECKPOINT --out DIR.

CHECKPOINT is a facebookresearch/detr ``.pth`` (``detr-r50-e632da11.pth``, ``detr-r101-...``;
reading it needs torch) or a transformers ``model.safetensors`` (``facebook/detr-resnet-50`` or
``-101``, with its ``config.json`` beside it; no torch needed). Writes DIR/model.keras (Keras's
format: fine-tune it with ``train_detr.py --init-from DIR``) and DIR/export/ (the ``Detector``
SavedModel and classes.json with COCO's category ids and names, as ``train_detr.py`` writes it:
``detect.py``, ``evaluate_detr.py`` and ``serve.py`` take it). DIR must not exist yet.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from tfx_transformer.quiet import quiet_start

quiet_start()  # before TensorFlow is imported

from tfx_transformer.cli import run_cli  # noqa: E402
from tfx_transformer.training.workdir import NEW_DIR_MODE  # noqa: E402


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a facebookresearch/detr .pth or a transformers "
                                           "model.safetensors")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the directory to write (must not exist yet)")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        parser.error(f"--out {args.out}: already exists; choose a new directory (nothing in "
                     "it is replaced)")
    from vision.pretrained import load_reference_checkpoint
    from vision.training.export import export_detector

    model = load_reference_checkpoint(args.checkpoint, "checkpoint")
    config = model.detr_config
    print(f"read {args.checkpoint}: DETR with {config.backbone}, {config.num_encoder_layers}+"
          f"{config.num_decoder_layers} layers, {config.num_queries} queries, "
          f"{model.num_classes} classes")
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    os.chmod(tmp, NEW_DIR_MODE)
    try:
        model.save(os.path.join(tmp, "model.keras"))
        export_detector(model, os.path.join(tmp, "export"), model.class_names,
                        config.image_size, config.max_image_size, model.category_ids)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {os.path.join(args.out, 'model.keras')} and {os.path.join(args.out, 'export')}")
    return 0


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
