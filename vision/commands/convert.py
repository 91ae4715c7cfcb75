"""Convert a published detector: python scripts/convert_detr.py CHECKPOINT --out DIR.

CHECKPOINT is

- a transformers folder (``config.json`` + ``model.safetensors``, what ``save_pretrained``
  writes and the Hub holds) of ``RTDetrForObjectDetection`` (``PekingU/rtdetr_r50vd`` and
  kin: RT-DETR, v2 too), of ``DFineForObjectDetection`` (``ustc-community/dfine-*``: D-FINE),
  their image processor's ``preprocessor_config.json`` read where present, or of
  ``DetrForObjectDetection`` (``facebook/detr-resnet-50`` or ``-101``); no torch needed;
- a facebookresearch/detr ``.pth`` (``detr-r50-e632da11.pth``, ``detr-r101-...``; reading it
  needs torch), or a transformers DETR ``model.safetensors`` with its ``config.json`` beside
  it.

Writes DIR/model.keras (Keras's format) and DIR/export/ (the ``Detector`` SavedModel and
classes.json with the checkpoint's class names, and COCO's category ids for COCO's classes, as
``train_detr.py`` writes it: ``detect.py``, ``evaluate_detr.py`` and ``serve.py`` take it). A
DETR's DIR is what ``train_detr.py --init-from DIR`` fine-tunes. DIR must not exist yet.
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
from vision.pretrained.rtdetr_config import RTDETR_TYPES  # noqa: E402


def command(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a transformers RT-DETR or DETR folder, a "
                                           "facebookresearch/detr .pth or a transformers DETR "
                                           "model.safetensors")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the directory to write (must not exist yet)")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    if os.path.exists(out):
        parser.error(f"--out {args.out}: already exists; choose a new directory (nothing in "
                     "it is replaced)")
    from vision.data.augment import FixedSize
    from vision.export.saved_model import export_detector

    if os.path.isdir(args.checkpoint) and _model_type(args.checkpoint) in RTDETR_TYPES:
        from vision.pretrained.rtdetr import load_rtdetr

        model = load_rtdetr(args.checkpoint, "checkpoint")
        size = FixedSize(**model.preprocessing)
        decoder = model.decoder
        from vision.modeling.dfine import DFine

        family = ("D-FINE, HGNetV2" if isinstance(model, DFine) else
                  f"RT-DETR, {len(model.backbone.depths)}-stage ResNet-vd")
        print(f"read {args.checkpoint}: {family} backbone, {decoder.num_layers} decoder layers, "
              f"{model.num_queries} queries, {model.num_classes} classes, "
              f"{size.height}x{size.width} input")
        image_size, max_size = size, None
    else:
        from vision.pretrained.init_from import load_reference_checkpoint

        checkpoint = args.checkpoint
        if os.path.isdir(checkpoint):  # a DetrForObjectDetection folder
            checkpoint = os.path.join(checkpoint, "model.safetensors")
        model = load_reference_checkpoint(checkpoint, "checkpoint")
        config = model.detr_config
        print(f"read {args.checkpoint}: DETR with {config.backbone}, "
              f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, "
              f"{config.num_queries} queries, {model.num_classes} classes")
        image_size, max_size = config.image_size, config.max_image_size
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".convert-", dir=parent)
    os.chmod(tmp, NEW_DIR_MODE)
    try:
        model.save(os.path.join(tmp, "model.keras"))
        export_detector(model, os.path.join(tmp, "export"), model.class_names, image_size,
                        max_size, model.category_ids)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {os.path.join(args.out, 'model.keras')} and {os.path.join(args.out, 'export')}")
    return 0


def _model_type(folder: str) -> str:
    """``config.json``'s ``model_type`` of a transformers folder: "rt_detr", "rt_detr_v2",
    "d_fine" or "detr"; ValueError naming the file otherwise."""
    from tfx_transformer.hf_files import read_json

    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise ValueError(f"checkpoint {folder}: no config.json (a transformers folder holds "
                         "config.json and model.safetensors)")
    kind = read_json(path).get("model_type")
    if kind not in (*RTDETR_TYPES, "detr"):
        raise ValueError(f"{path}: model_type {kind!r} is not supported (rt_detr: "
                         "RTDetrForObjectDetection; rt_detr_v2: RTDetrV2ForObjectDetection; "
                         "d_fine: DFineForObjectDetection; detr: DetrForObjectDetection)")
    return kind


def main(argv=None) -> int:
    """The command: `command` through `run_cli` (bad input: one ``error:`` line, exit 2)."""
    return run_cli(command, argv)


if __name__ == "__main__":
    sys.exit(main())
