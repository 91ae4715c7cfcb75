"""The published checkpoint layouts against transformers' ``DetrForObjectDetection`` itself.

A DETR-R50 of random weights (two encoder and two decoder layers; its frozen BatchNorm
statistics randomized too, so that the buffers' conversion matters) is saved as transformers
saves it (``model.safetensors`` + ``config.json``, the layout of ``facebook/detr-resnet-50``)
and as facebookresearch/detr's ``.pth`` (``{"model": state_dict}`` under its names: packed
``in_proj_weight``, ``norm1``-``3``, ``class_embed``, ...); each is read by
`vision.pretrained.init_from.load_reference_checkpoint` and must give transformers' logits and
boxes, every decoder layer's too, on a padded batch of two images of different sizes. transformers'
model has its own ResNet-50 backbone, saved under timm's names (reference_detr.py): no timm or
torchvision needed. Needs the ``[reference]`` extra (torch, transformers)."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from vision.pretrained.detr import COCO_CATEGORIES
from vision.pretrained.init_from import load_reference_checkpoint

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("the [reference] extra (pip install -e '.[reference]': torch, transformers) "
                "is not installed", allow_module_level=True)

# transformers' DETR runs in its own process: importing its modeling code into a process that
# has TensorFlow loaded crashes it.
_REFERENCE = os.path.join(os.path.dirname(__file__), "reference_detr.py")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    id2label = {i: "N/A" for i in range(91)}
    id2label.update(dict(COCO_CATEGORIES))
    (folder / "id2label.json").write_text(json.dumps(id2label))
    subprocess.run([sys.executable, _REFERENCE, str(folder)], check=True,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    arrays = dict(np.load(folder / "expected.npz"))
    inputs = {"images": arrays.pop("images"), "mask": arrays.pop("mask")}
    return folder, inputs, arrays


@pytest.mark.parametrize("layout", ["detr-resnet-50/model.safetensors", "detr-r50.pth"])
def test_a_checkpoint_gives_transformers_logits_and_boxes_in_every_decoder_layer(reference,
                                                                                 layout):
    folder, inputs, expected = reference
    model = load_reference_checkpoint(folder / layout)
    assert model.num_classes == 80 and model.category_ids[-1] == 90
    outputs = model(inputs)
    columns = list(model.category_ids) + [91]  # COCO's real ids, then "no object"
    layers = [*outputs["aux_outputs"], outputs]
    assert len(layers) == expected["logits"].shape[1] == 2  # reference_detr.LAYERS
    for i, layer in enumerate(layers):
        logits = np.asarray(layer["pred_logits"])
        boxes = np.asarray(layer["pred_boxes"])
        np.testing.assert_allclose(logits, expected["logits"][:, i][..., columns], atol=1e-4,
                                   err_msg=f"decoder layer {i}")
        np.testing.assert_allclose(boxes, expected["boxes"][:, i], atol=1e-4,
                                   err_msg=f"decoder layer {i}")


def test_init_from_a_pth_loads_every_weight_but_the_class_head(reference):
    folder, _, _ = reference
    from vision.config import preset
    from vision.modeling.detr import build_model
    from vision.pretrained.detr import read_reference
    from vision.pretrained.init_from import init_from

    config = preset("r50-detr", num_encoder_layers=2, num_decoder_layers=2)  # the file's
    model, lines = build_model(config, 2), []
    init_from(model, str(folder / "detr-r50.pth"), ["cat", "dog"], lines.append)
    assert lines[0] == "class head: 81 → 3 outputs, re-initialized"
    arrays = read_reference(folder / "detr-r50.pth").arrays
    kernel = np.asarray(model.decoder.layers[1].cross_attention.value_dense.kernel)
    np.testing.assert_array_equal(kernel, arrays["decoder/layer_1/cross_attention/value/kernel"])
