"""Writes the old-format DETR files that `test_detr_legacy.py` converts (not a test).

The files were written by the code *before* the query strategies became layers (commit
3416a1d): run this script from a checkout of that commit, which it imports first::

    cd OLD_CHECKOUT && python /path/to/tests/vision/data/make_legacy_fixtures.py OUT_DIR [--all]

It writes, gzipped, ``legacy-refined.keras.gz`` (the ``tiny`` preset's structure, small: a
compiled DETR after one training step, optimizer state included) and
``legacy-reference.weights.h5.gz`` (what `ModelCheckpoint` writes, for reference-point
queries), each with an ``.npz`` of the model's outputs on `batch()` (``out/...``) and after one
more training step on it (``next/...``, which checks that the optimizer state moved too).
``--all`` also writes every configuration of `CONFIGS` as ``.keras`` (not gzipped, not
committed: for a fuller check).
"""

from __future__ import annotations

import gzip
import os
import shutil
import sys

sys.path.insert(0, os.getcwd())  # the old checkout

import keras  # noqa: E402
import numpy as np  # noqa: E402

SMALL = dict(hidden_dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=2,
             ffn_dim=16, num_queries=4, tiny_filters=(8, 8), dropout=0.0)
CONFIGS = {
    "learned": dict(query_type="learned", attention_radius=None, box_refinement=False),
    "reference": dict(query_type="reference", attention_radius=0.4, box_refinement=False),
    "encoder": dict(query_type="encoder", attention_radius=None, box_refinement=False),
    "refined": dict(query_type="encoder", attention_radius=0.3, box_refinement=True),
}
COMMITTED = {"refined": ".keras", "reference": ".weights.h5"}
NUM_CLASSES = 3


def batch():
    """Two 32 x 48 images (the second with 16 padded columns) and their targets."""
    rng = np.random.default_rng(0)
    mask = np.ones((2, 32, 48), bool)
    mask[1, :, 32:] = False
    x = {"images": rng.normal(size=(2, 32, 48, 3)).astype("float32"), "mask": mask}
    y = {"labels": np.array([[0, 2], [1, 0]], "int32"),
         "boxes": np.array([[[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.4]],
                            [[0.5, 0.5, 0.4, 0.6], [0, 0, 0, 0]]], "float32"),
         "valid": np.array([[True, True], [True, False]])}
    return x, y


def flat_outputs(outputs, prefix):
    """``{prefix/pred_logits, prefix/aux_0/pred_boxes, prefix/enc/pred_boxes, ...}``."""
    flat = {}
    for key in ("pred_logits", "pred_boxes"):
        flat[f"{prefix}/{key}"] = keras.ops.convert_to_numpy(outputs[key])
        for i, aux in enumerate(outputs["aux_outputs"]):
            flat[f"{prefix}/aux_{i}/{key}"] = keras.ops.convert_to_numpy(aux[key])
        if "enc_outputs" in outputs:
            flat[f"{prefix}/enc/{key}"] = keras.ops.convert_to_numpy(outputs["enc_outputs"][key])
    return flat


def main(out_dir: str, everything: bool = False) -> None:
    from vision.config import preset
    from vision.modeling.detr import build_criterion, build_model
    from vision.training.optimizer import build_optimizer

    os.makedirs(out_dir, exist_ok=True)
    x, y = batch()
    for name, queries in CONFIGS.items():
        if not everything and name not in COMMITTED:
            continue
        keras.utils.set_random_seed(0)
        config = preset("tiny", **SMALL, **queries)
        model = build_model(config, NUM_CLASSES)
        model.compile(optimizer=build_optimizer(config, model),
                      criterion=build_criterion(config, NUM_CLASSES), jit_compile=False)
        model.train_on_batch(x, y)
        if everything:
            model.save(os.path.join(out_dir, f"{name}.keras"))
        if name in COMMITTED:
            path = os.path.join(out_dir, f"legacy-{name}{COMMITTED[name]}")
            if path.endswith(".keras"):
                model.save(path)
            else:
                model.save_weights(path)
            with open(path, "rb") as raw, gzip.open(path + ".gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            os.remove(path)
        arrays = {"x/images_sum": np.float64(x["images"].sum())}
        arrays.update(flat_outputs(model(x), "out"))
        model.train_on_batch(x, y)
        arrays.update(flat_outputs(model(x), "next"))
        prefix = "legacy-" if name in COMMITTED else ""
        np.savez_compressed(os.path.join(out_dir, f"{prefix}{name}.npz"), **arrays)


if __name__ == "__main__":
    main(sys.argv[1], "--all" in sys.argv[2:])
