"""Published DETR checkpoints without torch: a transformers-layout ``model.safetensors`` (the
names of ``facebook/detr-resnet-50``, written here from numpy) read into Keras paths, converted by
``scripts/convert_detr.py`` into a model directory, and used by ``--init-from``; and what a user
without torch, or with the wrong file, is told. The outputs against transformers' own model are
in test_reference_checkpoints.py (the ``[reference]`` extra)."""

import json
import os
import sys

import keras
import numpy as np
import pytest
from safetensors.numpy import save_file

from vision.commands import convert
from vision.config import preset
from vision.modeling.detr import build_model
from vision.pretrained.detr import COCO_CATEGORIES, read_reference
from vision.pretrained.init_from import init_from, load_reference_checkpoint

D, FFN, HEADS = 256, 2048, 8
N_A = [0, 12, 26, 29, 30, 45, 66, 68, 69, 71, 83]  # the COCO ids no category has


def _resnet50_names():
    """``{name: shape}`` of torchvision's ResNet-50 without ``fc`` (its published layout)."""
    shapes = {"conv1.weight": (64, 3, 7, 7)}
    shapes.update({f"bn1.{p}": (64,) for p in ("weight", "bias", "running_mean", "running_var")})
    in_channels = 64
    for stage, blocks in enumerate((3, 4, 6, 3)):
        width = 64 * 2**stage
        for b in range(blocks):
            block = f"layer{stage + 1}.{b}."
            convs = [(width, in_channels, 1), (width, width, 3), (4 * width, width, 1)]
            for j, (out, inp, k) in enumerate(convs, 1):
                shapes[f"{block}conv{j}.weight"] = (out, inp, k, k)
                for p in ("weight", "bias", "running_mean", "running_var"):
                    shapes[f"{block}bn{j}.{p}"] = (out,)
            if b == 0:
                shapes[f"{block}downsample.0.weight"] = (4 * width, in_channels, 1, 1)
                for p in ("weight", "bias", "running_mean", "running_var"):
                    shapes[f"{block}downsample.1.{p}"] = (4 * width,)
            in_channels = 4 * width
    return shapes


def _transformers_names(encoder_layers, decoder_layers, queries):
    shapes = {f"model.backbone.conv_encoder.model.{k}": v for k, v in _resnet50_names().items()}
    shapes.update({"model.input_projection.weight": (D, 2048, 1, 1),
                   "model.input_projection.bias": (D,),
                   "model.query_position_embeddings.weight": (queries, D),
                   "model.decoder.layernorm.weight": (D,), "model.decoder.layernorm.bias": (D,),
                   "class_labels_classifier.weight": (92, D),
                   "class_labels_classifier.bias": (92,)})
    for i, out in enumerate((D, D, 4)):
        shapes[f"bbox_predictor.layers.{i}.weight"] = (out, D)
        shapes[f"bbox_predictor.layers.{i}.bias"] = (out,)

    def layer(prefix, attentions, norms):
        for attention in attentions:
            for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                shapes[f"{prefix}{attention}.{p}.weight"] = (D, D)
                shapes[f"{prefix}{attention}.{p}.bias"] = (D,)
        shapes.update({f"{prefix}fc1.weight": (FFN, D), f"{prefix}fc1.bias": (FFN,),
                       f"{prefix}fc2.weight": (D, FFN), f"{prefix}fc2.bias": (D,)})
        for norm in norms:
            shapes[f"{prefix}{norm}.weight"] = shapes[f"{prefix}{norm}.bias"] = (D,)

    for i in range(encoder_layers):
        layer(f"model.encoder.layers.{i}.", ["self_attn"],
              ["self_attn_layer_norm", "final_layer_norm"])
    for i in range(decoder_layers):
        layer(f"model.decoder.layers.{i}.", ["self_attn", "encoder_attn"],
              ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"])
    return shapes


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A transformers-layout DETR-R50 checkpoint (1 + 2 layers, 10 queries) of random numbers,
    with the config.json of facebook/detr-resnet-50's classes beside it. Scaled so that the
    outputs are finite and differ from image to image and from query to query: each matrix by
    one over the root of its inputs, the queries by 1; norms' scales and BatchNorm variances
    near 1; biases and means small."""
    rng = np.random.default_rng(0)
    state = {}
    for name, shape in _transformers_names(1, 2, 10).items():
        noise = rng.standard_normal(shape)
        if name == "model.query_position_embeddings.weight":
            pass
        elif len(shape) > 1:
            noise /= np.sqrt(np.prod(shape[1:]))
        elif name.endswith("running_var"):
            noise = 1.0 + 0.02 * np.abs(noise)
        elif name.endswith(".weight"):  # a norm's scale
            noise = 1.0 + 0.02 * noise
        else:
            noise *= 0.02
        state[name] = noise.astype("float32")
    folder = tmp_path_factory.mktemp("detr-resnet-50")
    save_file(state, str(folder / "model.safetensors"))
    id2label = {str(i): "N/A" for i in range(91)}
    id2label.update({str(i): name for i, name in COCO_CATEGORIES})
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "detr", "encoder_attention_heads": HEADS, "id2label": id2label}))
    return folder / "model.safetensors", state


def test_the_published_names_land_on_the_keras_weights_with_the_n_a_classes_dropped(checkpoint):
    path, state = checkpoint
    reference = read_reference(path)
    assert reference.layout == "transformers"
    assert reference.config == {"backbone": "resnet50", "hidden_dim": D, "num_heads": HEADS,
                                "num_encoder_layers": 1, "num_decoder_layers": 2,
                                "ffn_dim": FFN, "num_queries": 10}
    kept = [i for i in range(91) if i not in N_A]
    assert reference.category_ids == tuple(kept) and len(reference.class_names) == 80
    assert reference.class_names[:3] == ("person", "bicycle", "car")
    arrays = reference.arrays
    # A Keras einsum kernel (d, heads, key_dim): row h * 32 + k of PyTorch's (out, in) matrix.
    q = state["model.decoder.layers.1.encoder_attn.q_proj.weight"]
    np.testing.assert_array_equal(arrays["decoder/layer_1/cross_attention/query/kernel"][:, 3, 5],
                                  q[3 * 32 + 5])
    out = state["model.encoder.layers.0.self_attn.out_proj.weight"]
    np.testing.assert_array_equal(
        arrays["encoder/layer_0/self_attention/attention_output/kernel"][2, 7], out[:, 2 * 32 + 7])
    conv = state["model.backbone.conv_encoder.model.layer2.0.conv2.weight"]  # (out, in, kh, kw)
    np.testing.assert_array_equal(arrays["backbone/layer2_0_conv2/kernel"][1, 2, 3, 4],
                                  conv[4, 3, 1, 2])
    np.testing.assert_array_equal(
        arrays["backbone/layer3_0_downsample_1/moving_variance"],
        state["model.backbone.conv_encoder.model.layer3.0.downsample.1.running_var"])
    head = state["class_labels_classifier.weight"]  # (92, d): COCO ids 0-90, then no object
    np.testing.assert_array_equal(arrays["class_head/kernel"], head[kept + [91]].T)
    np.testing.assert_array_equal(arrays["decoder/layer_0/feedforward_norm/gamma"],
                                  state["model.decoder.layers.0.final_layer_norm.weight"])


def test_convert_writes_a_model_directory_that_detect_and_fine_tuning_take(checkpoint, tmp_path,
                                                                          capsys):
    path, _ = checkpoint
    out = tmp_path / "detr"
    assert convert.main([str(path), "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["export", "model.keras"]
    classes = json.loads((out / "export" / "classes.json").read_text())
    assert classes["category_ids"][:5] == [1, 2, 3, 4, 5] and len(classes["class_names"]) == 80
    assert classes["class_names"][classes["category_ids"].index(90)] == "toothbrush"
    # The export gives what the converted model gives (bare TensorFlow, another process), on
    # an image that its resize (shorter side 800, longer at most 1333) leaves as it is.
    expected = load_reference_checkpoint(path)
    image = np.random.default_rng(1).integers(0, 256, (1, 16, 1333, 3), dtype="uint8")
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    outputs = expected({"images": ((image / 255.0 - mean) / std).astype("float32")})
    probs = keras.ops.convert_to_numpy(keras.ops.softmax(outputs["pred_logits"]))[..., :-1]
    assert np.isfinite(probs).all() and np.ptp(probs.max(-1)) > 1e-3  # each query its own
    script = ("import sys, numpy as np, tensorflow as tf\n"
              "m = tf.saved_model.load(sys.argv[1])\n"
              "image = np.random.default_rng(1).integers(0, 256, (1, 16, 1333, 3), 'uint8')\n"
              "out = m.signatures['serving_default'](images=tf.constant(image))\n"
              "np.save(sys.argv[2], out['scores'].numpy())\n")
    import subprocess

    subprocess.run([sys.executable, "-c", script, str(out / "export"), str(tmp_path / "s.npy")],
                   check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    np.testing.assert_allclose(np.load(tmp_path / "s.npy"), probs.max(-1), atol=1e-4)
    # The directory starts a fine-tuning run (its model.keras, the classes from the export).
    model, lines = build_model(expected.detr_config, 2), []
    init_from(model, str(out), ["cat", "dog"], lines.append)
    assert lines == ["class head: 81 → 3 outputs, re-initialized",
                     f"init from {out / 'model.keras'}: {len(model.weights) - 2} of "
                     f"{len(model.weights)} weights loaded"]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.input_proj.kernel),
                                  keras.ops.convert_to_numpy(expected.input_proj.kernel))
    # A second conversion to the same directory is refused; nothing in it changes.
    before = os.path.getmtime(out / "model.keras")
    with pytest.raises(SystemExit) as exit_info:
        convert.main([str(path), "--out", str(out)])
    assert exit_info.value.code == 2 and "already exists" in capsys.readouterr().err
    assert os.path.getmtime(out / "model.keras") == before


def test_init_from_a_checkpoint_keeps_the_coco_head_for_coco_and_replaces_it_for_two_classes(
        checkpoint):
    path, _ = checkpoint
    config = preset("r50-detr", num_encoder_layers=1, num_decoder_layers=2, num_queries=10)
    reference = read_reference(path)
    keras.utils.set_random_seed(3)
    # Two classes and fewer queries (4 of the 10): the head is re-initialized, the first
    # queries kept (one R50 model built for both; each one built costs about a second).
    model = build_model(preset("r50-detr", num_encoder_layers=1, num_decoder_layers=2,
                               num_queries=4), 2)
    lines = []
    report = init_from(model, str(path), ["cat", "dog"], lines.append)
    assert lines[0] == "class head: 81 → 3 outputs, re-initialized"
    assert report["reinitialized"] == ["class_head/kernel", "class_head/bias"]
    weights = {v.path.removeprefix("detr/"): keras.ops.convert_to_numpy(v) for v in model.weights}
    for key in ("backbone/layer4_2_bn3/moving_mean", "box_head/box_head_2/bias"):
        np.testing.assert_array_equal(weights[key], reference.arrays[key], err_msg=key)
    np.testing.assert_array_equal(weights["queries/query_embed"],
                                  reference.arrays["queries/query_embed"][:4])
    # The same 80 classes in another order: the head's columns follow the names; all 10
    # queries, as many as the file's, are loaded.
    names = list(reversed(reference.class_names))
    model, lines = build_model(config, 80), []
    init_from(model, str(path), names, lines.append)
    assert lines[0] == "class head: the same 80 classes in another order, reordered by name"
    kernel = keras.ops.convert_to_numpy(model.class_head.kernel)
    np.testing.assert_array_equal(kernel[:, 0], reference.arrays["class_head/kernel"][:, 79])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model.queries.query_embed),
                                  reference.arrays["queries/query_embed"])
    # Another width is refused naming the weight.
    with pytest.raises(ValueError, match="input_proj/kernel"):
        init_from(build_model(preset("r50-detr", hidden_dim=128, num_heads=8,
                                     num_encoder_layers=1, num_decoder_layers=2), 2),
                  str(path), ["cat", "dog"])


def test_a_pth_without_torch_and_a_foreign_file_get_one_line_and_exit_2(tmp_path, capsys,
                                                                      monkeypatch):
    pth = tmp_path / "detr-r50-e632da11.pth"
    pth.write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as when missing
    assert convert.main([str(pth), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "needs torch" in err and "Traceback" not in err
    other = tmp_path / "weights.safetensors"
    save_file({"encoder.weight": np.zeros((2, 2), "float32")}, str(other))
    assert convert.main([str(other), "--out", str(tmp_path / "out")]) == 2
    assert "not a DETR checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("config, message", [
    (None, "no config.json (a transformers folder holds config.json and model.safetensors)"),
    ({"model_type": "deimv2"}, "config.json: model_type 'deimv2' is not supported (rt_detr: "
                               "RTDetrForObjectDetection; rt_detr_v2: "
                               "RTDetrV2ForObjectDetection; d_fine: DFineForObjectDetection; "
                               "detr: DetrForObjectDetection)"),
])
def test_a_folder_of_another_detector_gets_one_line_and_exit_2(config, message, tmp_path,
                                                               capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    assert convert.main([str(folder), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
