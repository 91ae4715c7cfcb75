"""D-FINE folders of transformers (``DFineForObjectDetection``: config.json +
model.safetensors) converted by `vision.pretrained.rtdetr` / `vision.pretrained.dfine`, against
transformers' own outputs, and `vision.pretrained.dfine_config` on the published field set.

reference_dfine.py (its own process) saves two tiny D-FINEs of random weights, every
statistic randomized: ``small`` (affine blocks, 3 levels, no decoder input projection) and
``projected`` (2 levels as D-FINE N, a decoder narrower than the encoder as D-FINE X,
``discrete`` sampling), with their outputs on two 64 x 96 images and the detections of two
photos through transformers' processor and post-processing."""

import importlib.util
import json
import os
import re
import shutil

import numpy as np
import pytest

from vision.pretrained import dfine_config, rtdetr_config
from vision.pretrained import rtdetr as rtdetr_convert

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("the [reference] extra (pip install -e '.[reference]': torch, transformers) "
                "is not installed", allow_module_level=True)

pytestmark = pytest.mark.xdist_group("torch_reference")

ATOL, RTOL = 1e-4, 1e-5  # as tests/vision/pretrained/test_rtdetr_convert.py's

# A published D-FINE L config.json (docling-project's egret-large, written by transformers'
# D-FINE conversion, the field set of ustc-community/dfine-*-coco): every field.
PUBLISHED_LARGE = {
    "activation_function": "silu", "anchor_image_size": None, "attention_dropout": 0.0,
    "backbone_config": {
        "depths": [3, 4, 6, 3], "downsample_in_bottleneck": False,
        "downsample_in_first_stage": False, "embedding_size": 32, "hidden_act": "relu",
        "hidden_sizes": [256, 512, 1024, 2048], "layer_type": "basic", "model_type": "hgnet_v2",
        "num_channels": 3, "out_features": ["stage2", "stage3", "stage4"],
        "out_indices": [2, 3, 4], "stage_downsample": [False, True, True, True],
        "stage_in_channels": [48, 128, 512, 1024], "stage_kernel_size": [3, 3, 5, 5],
        "stage_light_block": [False, False, True, True],
        "stage_mid_channels": [48, 96, 192, 384],
        "stage_names": ["stem", "stage1", "stage2", "stage3", "stage4"],
        "stage_num_blocks": [1, 1, 3, 1], "stage_numb_of_layers": [6, 6, 6, 6],
        "stage_out_channels": [128, 512, 1024, 2048], "stage_downsample_strides": [2, 2, 2, 2],
        "stem_channels": [3, 32, 48], "stem_strides": [2, 1, 1, 2, 1],
        "use_learnable_affine_block": False},
    "batch_norm_eps": 1e-5, "d_model": 256, "decoder_activation_function": "relu",
    "decoder_attention_heads": 8, "decoder_ffn_dim": 1024, "decoder_in_channels": [256] * 3,
    "decoder_layers": 6, "decoder_method": "default", "decoder_n_points": [3, 6, 3],
    "decoder_offset_scale": 0.5, "depth_mult": 1.0, "dropout": 0.0, "encode_proj_layers": [2],
    "encoder_activation_function": "gelu", "encoder_attention_heads": 8,
    "encoder_ffn_dim": 1024, "encoder_hidden_dim": 256, "encoder_in_channels": [512, 1024, 2048],
    "encoder_layers": 1, "eval_idx": -1, "eval_size": None, "feat_strides": [8, 16, 32],
    "freeze_backbone_batch_norms": True, "hidden_expansion": 1.0,
    "id2label": {str(i): f"label_{i}" for i in range(17)},
    "label2id": {f"label_{i}": i for i in range(17)}, "layer_norm_eps": 1e-5, "layer_scale": 1,
    "learn_initial_query": False, "lqe_hidden_dim": 64, "lqe_layers": 2, "max_num_bins": 32,
    "model_type": "d_fine", "normalize_before": False, "num_denoising": 100,
    "num_feature_levels": 3, "num_queries": 300, "positional_encoding_temperature": 10000,
    "reg_scale": 4.0, "top_prob_values": 4, "torch_dtype": "float32", "up": 0.5,
    "use_focal_loss": True, "with_box_refine": True}


@pytest.fixture(scope="module")
def reference(torch_references):
    """(folder, expected arrays) of reference_dfine.py."""
    folder = torch_references["dfine"]
    return folder, dict(np.load(folder / "expected.npz"))


def _close(actual, expected, what):
    np.testing.assert_allclose(np.asarray(actual), expected, atol=ATOL, rtol=RTOL, err_msg=what)


@pytest.mark.parametrize("variant", ["small", "projected"])
def test_a_folder_gives_transformers_maps_logits_and_boxes(reference, variant):
    folder, expected = reference
    assert expected[f"{variant}_margin"] > 5e-4  # the top-k selections keep clear of ties
    model = rtdetr_convert.load_rtdetr(folder / variant)
    images = expected["images"]
    features = model.backbone(images)
    for i, feature in enumerate(features):
        _close(feature, expected[f"{variant}_backbone_{i}"], f"backbone level {i}")
    for i, level in enumerate(model.encoder(features)):
        _close(level, expected[f"{variant}_encoder_{i}"], f"encoder level {i}")
    _close(model.select_queries(images).enc_logits, expected[f"{variant}_enc_outputs_class"],
           "encoder cells' logits")
    outputs = model(images)
    _close(outputs["pred_logits"], expected[f"{variant}_logits"], "logits")
    _close(outputs["pred_boxes"], expected[f"{variant}_pred_boxes"], "boxes")
    assert model.class_names == ("cat", "dog", "bird", "fish", "horse")


def test_transformers_5_in_memory_names_read_as_the_saved_ones(reference, tmp_path):
    folder, _ = reference
    from safetensors.numpy import load_file, save_file

    state = load_file(folder / "small" / "model.safetensors")
    renamed = {}
    for name, array in state.items():
        name = re.sub(r"layers\.(\d+)\.fc([12])\.",
                      lambda m: f"layers.{m[1]}.mlp.layers.{int(m[2]) - 1}.", name)
        name = re.sub(r"encoder\.encoder\.(\d+)\.layers", r"encoder.aifi.\1.layers", name)
        renamed[name.replace(".out_proj.", ".o_proj.")] = array
    assert len(set(renamed) - set(state)) > 20
    (tmp_path / "v5").mkdir()
    shutil.copy(folder / "small" / "config.json", tmp_path / "v5")
    save_file(renamed, str(tmp_path / "v5" / "model.safetensors"))
    saved = rtdetr_convert.read_rtdetr(folder / "small")
    in_memory = rtdetr_convert.read_rtdetr(tmp_path / "v5")
    assert sorted(saved.arrays) == sorted(in_memory.arrays)
    for key, array in saved.arrays.items():
        np.testing.assert_array_equal(in_memory.arrays[key], array, err_msg=key)


def test_the_published_large_config_reads_to_its_architecture():
    settings = rtdetr_config.rtdetr_settings(PUBLISHED_LARGE)
    assert settings["family"] == "d_fine"
    assert settings["encoder"] == dict(
        hidden_dim=256, num_levels=3, encode_proj_layers=[2], num_layers=1, num_heads=8,
        ffn_dim=1024, dropout=0.0, encoder_activation="gelu", layer_norm_epsilon=1e-5,
        temperature=10000, activation="silu", hidden_expansion=1.0, epsilon=1e-5,
        num_blocks=3)
    assert settings["decoder"] == dict(
        num_layers=6, num_heads=8, ffn_dim=1024, num_levels=3, num_points=[3, 6, 3],
        offset_scale=0.5, method="default", max_num_bins=32, reg_scale=4.0, up=0.5,
        top_prob_values=4, lqe_hidden_dim=64, lqe_layers=2, dropout=0.0,
        attention_dropout=0.0, activation="relu", layer_norm_epsilon=1e-5)
    assert settings["model"] == dict(
        d_model=256, num_queries=300, num_feature_levels=3, layer_norm_epsilon=1e-5,
        batch_norm_epsilon=1e-5, num_denoising=100, label_noise_ratio=0.5,
        box_noise_scale=1.0)
    backbone = settings["backbone"]
    assert (backbone["stage_out_channels"], backbone["out_indices"]) == \
        ([128, 512, 1024, 2048], [2, 3, 4])
    from vision.config import preset

    assert rtdetr_config.rtdetr_settings(preset("dfine-l").rtdetr) == settings


@pytest.mark.parametrize("field, value, message", [
    ("layer_scale", 2, "layer_scale=2 is not supported"),
    ("eval_idx", 2, "eval_idx=2 is not supported"),
    ("num_feature_levels", 4, "num_feature_levels=4 is not supported"),
    ("decoder_method", "nearest", "decoder_method='nearest' is not supported"),
    ("encoder_in_channels", [512, 1024, 1024], "differs from the backbone's channels"),
    ("normalize_before", True, "normalize_before=True is not supported"),
])
def test_fields_that_would_change_the_computation_are_refused_by_name(field, value, message):
    with pytest.raises(ValueError, match=re.escape(f"model/config.json: {field}") + ".*"
                       + re.escape(message.split(" ", 1)[1])):
        rtdetr_config.rtdetr_settings({**PUBLISHED_LARGE, field: value}, "model/config.json")


def test_the_field_sets_are_the_installed_modeling_codes():
    """`MODEL_FIELDS` is every ``config.X`` modeling_d_fine.py reads (the backbone loader's
    too), so a field it starts to read is refused until this conversion decides on it."""
    import transformers

    path = os.path.join(os.path.dirname(transformers.__file__), "models", "d_fine",
                        "modeling_d_fine.py")
    with open(path) as f:
        read = set(re.findall(r"config\.([a-z][a-z_0-9]*)", f.read()))
    aliases = {"hidden_size", "num_labels"}  # d_model's and id2label's other names
    assert read - aliases <= dfine_config.MODEL_FIELDS
    assert set(PUBLISHED_LARGE) - {"backbone_config"} - dfine_config.MODEL_FIELDS == {
        "label2id", "model_type", "torch_dtype", "use_focal_loss"}  # bookkeeping, loss


@pytest.mark.slow
def test_convert_then_export_and_litert_detect_photos_as_transformers(reference, tmp_path):
    """tfx-convert-detr on the folder (its image processor read), then the export on
    uint8 photos: transformers' post-processed detections, scores within 1e-5, boxes within
    1e-4 of the side; and the LiteRT float32 file of that export (builtin operators only) on
    the same photos as `prepare_image` gives them: the export's detections, as closely
    (its ONNX file and int8-full: RT-DETR's test, the same code path)."""
    import contextlib
    import io

    from vision.commands.convert import main
    from vision.export.load import load_detector

    folder, expected = reference
    out, printed = tmp_path / "converted", io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(folder / "small"), "--out", str(out)]) == 0
    assert "D-FINE, HGNetV2 backbone, 3 decoder layers" in printed.getvalue()

    found = load_detector(out / "export")(expected["small_photos"])
    np.testing.assert_array_equal(found["labels"], expected["small_photo_labels"])
    np.testing.assert_allclose(found["scores"], expected["small_photo_scores"], atol=1e-5)
    np.testing.assert_allclose(found["boxes"], expected["small_photo_boxes"], atol=96e-4)
    assert json.loads((out / "export" / "classes.json").read_text())
    from ai_edge_litert.interpreter import Interpreter

    from vision.export.litert_onnx import (
        DetectorConverter,
        find_source,
        prepare_image,
    )
    from vision.export.quantization import dfine_float_tensors

    source = find_source(out)
    with DetectorConverter(source) as converter:
        data = converter.litert("float32")
    runner = Interpreter(model_content=data).get_signature_runner()
    # What int8-full keeps float, found by name in this file: the query selection, the box
    # heads (the encoder's, the first layer's pre-refinement one and each layer's) and the
    # decoder's softmax and integral over the bins.
    kept = {name.split(";")[0] for name in dfine_float_tensors(data)}
    for part in ("/enc_score_head", "/enc_output_", "/enc_bbox_head", "/pre_box_head",
                 "/box_head_0", "/box_head_2", "/Softmax", "/Sum"):
        assert any(part in name for name in kept), part
    assert not any("/layer_" in name for name in kept)
    for i, photo in enumerate(expected["small_photos"]):
        pixels, mask = prepare_image(photo, source.settings())
        got = runner(images=pixels[None], mask=mask[None])
        np.testing.assert_array_equal(got["labels"][0], found["labels"][i])
        np.testing.assert_allclose(got["scores"][0], found["scores"][i], atol=1e-5)
        np.testing.assert_allclose(got["boxes"][0] * [96, 64, 96, 64], found["boxes"][i],
                                   atol=96e-4)
