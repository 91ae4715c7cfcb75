"""RT-DETR folders of transformers (``RTDetrForObjectDetection``: config.json +
model.safetensors) converted by `vision.pretrained.rtdetr`, against transformers' own outputs.

reference_rtdetr.py (its own process: transformers' PyTorch modeling code and TensorFlow in one
process crash) saves a tiny RT-DETR of random weights, every BatchNorm statistic randomized,
and two backbones alone (basic blocks; bottlenecks with ``downsample_in_bottleneck`` and
``downsample_in_first_stage``), with their outputs on two 64x96 images. Needs the
``[reference]`` extra (torch, transformers)."""

import importlib.util
import json
import re
import shutil
import zipfile

import numpy as np
import pytest

from vision.modeling.rtdetr_backbone import RTDetrResNetBackbone, transformers_arrays
from vision.pretrained import rtdetr as rtdetr_convert
from vision.pretrained import rtdetr_config

if not all(importlib.util.find_spec(name) for name in ("torch", "transformers")):
    pytest.skip("the [reference] extra (pip install -e '.[reference]': torch, transformers) "
                "is not installed", allow_module_level=True)


# One worker runs them all: the references are made once (a fixture is per worker).
pytestmark = pytest.mark.xdist_group("torch_reference")


# |ours - transformers'| <= ATOL + RTOL * |transformers'|: the feature maps reach 80 (float32
# rounding of 1e-7 relative per operation).
ATOL, RTOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def reference(torch_references):
    """(folder, expected arrays) of reference_rtdetr.py."""
    folder = torch_references["rtdetr"]
    expected = dict(np.load(folder / "expected.npz"))
    # The top-k selections must not hang on rounding: the reference keeps clear of ties.
    assert expected["topk_margin"] > 5e-4
    return folder, expected


@pytest.fixture(scope="module")
def model(reference):
    folder, _ = reference
    return rtdetr_convert.load_rtdetr(folder / "rtdetr")


def _close(actual, expected, what):
    np.testing.assert_allclose(np.asarray(actual), expected, atol=ATOL, rtol=RTOL, err_msg=what)


@pytest.mark.parametrize("variant", ["basic", "downsample"])
def test_basic_and_downsampling_backbones_give_transformers_feature_maps(reference, variant):
    folder, expected = reference
    config = json.loads((folder / variant / "config.json").read_text())
    backbone = RTDetrResNetBackbone(**rtdetr_config.backbone_settings(config),
                                    name="backbone")
    backbone.build((None, None, None, 3))
    from safetensors.numpy import load_file

    arrays = dict(transformers_arrays(load_file(folder / variant / "model.safetensors")))
    weights = {v.path.split("/", 1)[1]: v for v in backbone.weights}
    assert sorted(weights) == sorted(arrays)
    for key, variable in weights.items():
        variable.assign(arrays[key])
    for i, feature in enumerate(backbone(expected["images"])):
        _close(feature, expected[f"{variant}_{i}"], f"{variant} level {i}")


def test_backbone_encoder_and_query_selection_give_transformers_outputs(reference, model):
    _, expected = reference
    images = expected["images"]
    features = model.backbone(images)
    for i, feature in enumerate(features):
        _close(feature, expected[f"backbone_{i}"], f"backbone level {i}")
    for i, level in enumerate(model.encoder(features)):
        _close(level, expected[f"encoder_{i}"], f"hybrid encoder level {i}")
    selection = model.select_queries(images)
    for ours, theirs in (("enc_logits", "enc_outputs_class"),
                         ("enc_box_logits", "enc_outputs_coord_logits"),
                         ("topk_logits", "enc_topk_logits"),
                         ("reference_logits", "init_reference_points")):
        _close(getattr(selection, ours), expected[theirs], ours)
    assert [tuple(int(n) for n in s) for s in selection.spatial_shapes] == \
        [(8, 12), (4, 6), (2, 3), (1, 2)]  # the fourth: the extra stride-2 level
    assert selection.memory.shape == (2, 8 * 12 + 4 * 6 + 2 * 3 + 2, 32)


def test_the_model_gives_transformers_logits_and_boxes_in_every_decoder_layer(reference,
                                                                            model):
    _, expected = reference
    outputs = model(expected["images"])
    assert outputs["pred_logits"].shape == (2, 10, 5)  # sigmoid scores: no "no object"
    layers = [*outputs["aux_outputs"], outputs]
    assert len(layers) == 2
    for i, layer in enumerate(layers):
        _close(layer["pred_logits"], expected["intermediate_logits"][:, i], f"logits {i}")
        _close(layer["pred_boxes"], expected["intermediate_reference_points"][:, i],
               f"boxes {i}")
    _close(outputs["enc_outputs"]["pred_logits"], expected["enc_topk_logits"], "enc logits")
    _close(outputs["enc_outputs"]["pred_boxes"], expected["enc_topk_bboxes"], "enc boxes")
    _assert_same_detections(_detections(outputs, expected), expected)


def test_an_rtdetr_v2_folder_gives_transformers_logits_and_boxes(reference):
    """RTDetrV2ForObjectDetection (its decoder's attention: v2's offset scale and per-level
    points), converted as v1's (the points' scale buffers checked and read)."""
    folder, expected = reference
    assert expected["v2_topk_margin"] > 5e-4
    model = rtdetr_convert.load_rtdetr(folder / "rtdetr_v2")
    outputs = model(expected["images"])
    _close(outputs["pred_logits"], expected["v2_logits"], "v2 logits")
    _close(outputs["pred_boxes"], expected["v2_pred_boxes"], "v2 boxes")


def test_transformers_5_in_memory_names_read_as_the_saved_ones(reference, tmp_path):
    folder, _ = reference
    from safetensors.numpy import load_file, save_file

    state = load_file(folder / "rtdetr" / "model.safetensors")
    renamed = {}
    for name, array in state.items():
        name = name.replace(".out_proj.", ".o_proj.").replace(".fc1.", ".mlp.fc1.").replace(
            ".fc2.", ".mlp.fc2.")
        renamed[re.sub(r"encoder\.encoder\.(\d+)\.layers", r"encoder.aifi.\1.layers",
                       name)] = array
    assert renamed.keys() != state.keys()
    (tmp_path / "v5").mkdir()
    shutil.copy(folder / "rtdetr" / "config.json", tmp_path / "v5")
    save_file(renamed, str(tmp_path / "v5" / "model.safetensors"))
    saved = rtdetr_convert.read_rtdetr(folder / "rtdetr")
    in_memory = rtdetr_convert.read_rtdetr(tmp_path / "v5")
    assert sorted(saved.arrays) == sorted(in_memory.arrays)
    for key, array in saved.arrays.items():
        np.testing.assert_array_equal(in_memory.arrays[key], array, err_msg=key)
    assert saved.class_names == ("cat", "dog", "bird", "fish", "horse")
    assert saved.category_ids is None


def _detections(outputs, expected):
    """`rtdetr_postprocess` of ``outputs`` as transformers' lists: the kept ones per image."""
    from vision.modeling.postprocess import rtdetr_postprocess

    found = rtdetr_postprocess(outputs, expected["target_sizes"], float(expected["threshold"]))
    found = {key: np.asarray(value) for key, value in found.items()}
    return [{key: found[key][i][found["keep"][i]] for key in ("scores", "labels", "boxes")}
            for i in range(len(found["keep"]))]


def _assert_same_detections(detections, expected):
    for i, found in enumerate(detections):
        n = int(expected["det_count"][i])
        assert len(found["scores"]) == n, f"image {i}"
        np.testing.assert_array_equal(found["labels"], expected["det_labels"][i, :n])
        np.testing.assert_allclose(found["scores"], expected["det_scores"][i, :n], atol=1e-5)
        # Pixels of images up to 640 wide: 1e-4 of the side.
        np.testing.assert_allclose(found["boxes"], expected["det_boxes"][i, :n], atol=0.064)


def test_postprocess_gives_transformers_detections_of_the_same_outputs(reference):
    _, expected = reference
    outputs = {"pred_logits": expected["logits"], "pred_boxes": expected["pred_boxes"]}
    _assert_same_detections(_detections(outputs, expected), expected)


def test_the_processor_resize_is_pils_up_to_its_rounding(reference):
    from vision.data.augment import FixedSize

    folder, expected = reference
    size = FixedSize(**rtdetr_convert.read_rtdetr(folder / "rtdetr").preprocessing)
    assert (size.height, size.width, size.mean) == (64, 96, None)  # preprocessor_config.json
    pixels = np.asarray(size(expected["large_photo"]))  # 80 x 120 shrunk to 64 x 96
    # PIL resizes integers in fixed point and rounds the result: at most one grey level
    # apart, a third of one on average (rounding alone: a quarter).
    levels = np.abs(pixels - expected["large_pixels"]) * 255
    assert levels.max() <= 1 + 1e-4 and levels.mean() < 0.35, (levels.max(), levels.mean())


@pytest.fixture(scope="module")
def converted(reference, tmp_path_factory):
    """tfx-convert-detr's directory of the folder, and what it printed."""
    import contextlib
    import io

    from vision.commands.convert import main

    folder, _ = reference
    out = tmp_path_factory.mktemp("rtdetr") / "converted"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([str(folder / "rtdetr"), "--out", str(out)]) == 0
    return out, printed.getvalue()


@pytest.mark.slow
def test_convert_writes_a_model_file_and_an_export_that_detects_as_transformers(
        reference, converted):
    """tfx-convert-detr on the folder, then the export on uint8 photos against transformers'
    image processor, model and post-processing (every query's best pair, threshold 0)."""
    from vision.export.load import load_detector

    _, expected = reference
    assert expected["photo_margin"] > 5e-4
    out, printed = converted
    assert "RT-DETR" in printed and "64x96 input" in printed
    found = load_detector(out / "export")(expected["photos"])
    np.testing.assert_array_equal(found["labels"], expected["photo_labels"])
    np.testing.assert_allclose(found["scores"], expected["photo_scores"], atol=1e-5)
    np.testing.assert_allclose(found["boxes"], expected["photo_boxes"], atol=96e-4)  # 1e-4 side
    # model.keras: the model's config and weights (their save and load: test_rtdetr_layers.py).
    with zipfile.ZipFile(out / "model.keras") as archive:
        config = json.loads(archive.read("config.json"))
    assert config["class_name"] == "RTDetr" and config["config"]["num_classes"] == 5


@pytest.mark.slow
def test_litert_and_onnx_files_detect_as_the_export(reference, converted):
    """The LiteRT (builtin operators only) and ONNX float32 files of the converted model, on
    the photos as `prepare_image` gives them (resized to 64 x 96, no padding): the export's
    labels, scores within 1e-5, boxes within 1e-4 of the side."""
    from vision.export.litert_onnx import DetectorConverter, find_source, prepare_image
    from vision.export.load import load_detector

    _, expected = reference
    out, _ = converted
    want = load_detector(out / "export")(expected["photos"])
    source = find_source(out)
    settings = source.settings()
    assert (settings["input_height"], settings["input_width"], settings["input_size"]) == \
        (64, 96, None) and source.input_shape == (64, 96)
    inputs = [prepare_image(photo, settings) for photo in expected["photos"]]
    with DetectorConverter(source) as converter:
        files = {"litert": converter.litert("float32"), "onnx": converter.onnx("float32")}
        full = converter.litert("int8-full", [{"images": pixels[None], "mask": mask[None]}
                                              for pixels, mask in inputs])
    _assert_int8_full_keeps_the_layer_norms_float(files["litert"], full)
    import onnx

    from vision.export.quantization import query_selection_nodes

    kept = set(query_selection_nodes(onnx.load_from_string(files["onnx"])))  # int8: float
    products = [n.name for n in onnx.load_from_string(files["onnx"]).graph.node
                if n.name in kept and n.op_type in ("MatMul", "Gemm")]
    assert len(products) == 2 and {"enc_output", "enc_score_head"} == {
        name for name in ("enc_output", "enc_score_head") for p in products if f"/{name}_" in p}
    for kind, data in files.items():
        for i, (pixels, mask) in enumerate(inputs):
            got = _run(kind, data, pixels, mask)
            np.testing.assert_array_equal(got["labels"][0], want["labels"][i], err_msg=kind)
            np.testing.assert_allclose(got["scores"][0], want["scores"][i], atol=1e-5,
                                       err_msg=kind)
            np.testing.assert_allclose(got["boxes"][0] * [96, 64, 96, 64], want["boxes"][i],
                                       atol=96e-4, err_msg=kind)


def _assert_int8_full_keeps_the_layer_norms_float(float32: bytes, full: bytes) -> None:
    """RT-DETR's int8-full (trained, its AP50 is the float file's within 0.01:
    experiments/README.md): the dense layers in int8, every LayerNorm tensor in float."""
    from ai_edge_litert.interpreter import Interpreter

    from vision.export.quantization import layer_norm_tensors

    norms = layer_norm_tensors(float32)
    # Each of the 2 decoder layers' 3 LayerNorms, the encoder's 2 and the selection's 1.
    assert len({name.split("/moments/")[0] for name in norms if "/moments/" in name}) == 9
    types = {d["name"]: d["dtype"] for d in Interpreter(model_content=full).get_tensor_details()}
    assert all(types[name] == np.float32 for name in norms if name in types)
    assert sum(types[name] == np.float32 for name in norms if name in types) > len(norms) // 2
    assert sum(dtype == np.int8 for dtype in types.values()) > 100
    assert len(full) < 0.8 * len(float32)


def _run(kind, data, pixels, mask):
    """One image through a LiteRT or ONNX file."""
    if kind == "litert":
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter(model_content=data).get_signature_runner()(images=pixels[None],
                                                                      mask=mask[None])
    import onnxruntime

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, {"images": pixels[None], "mask": mask[None]})))
