"""Tests for the DETR model, its backbones, optimizer and post-processing."""

import re

import keras
import numpy as np
import pytest
from safetensors.numpy import save_file
from scipy.optimize import linear_sum_assignment

import vision.modeling.set_loss as set_loss_module
from vision.config import preset
from vision.matching.losses import SetCriterion
from vision.modeling.backbone import ResNetBackbone, TinyBackbone, build_backbone
from vision.modeling.detr import DETR, DetrOutput, build_criterion, build_model
from vision.modeling.optimizer import DetrAdamW, build_optimizer
from vision.modeling.postprocess import postprocess

NUM_CLASSES = 3


# A small variant of the tiny preset (same structure, stride 16) for the slower tests: one
# encoder layer, two decoder layers (the first, whose self-attention sees zeros, and one that
# gives the aux outputs). Tracing a train step takes time in proportion to the layers.
SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32),
             num_encoder_layers=1, num_decoder_layers=2)


def _images(rng, batch, height, width):
    return rng.normal(size=(batch, height, width, 3)).astype("float32")


def _targets():
    """Two images: three objects in the first, none in the second."""
    boxes = np.zeros((2, 3, 4), "float32")
    boxes[0] = [[0.3, 0.3, 0.2, 0.2], [0.7, 0.6, 0.3, 0.4], [0.5, 0.5, 0.9, 0.9]]
    labels = np.array([[0, 2, 1], [0, 0, 0]], "int32")
    valid = np.array([[True, True, True], [False, False, False]])
    return {"labels": labels, "boxes": boxes, "valid": valid}


def _numpy_outputs(outputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


def test_tiny_preset_output_shapes_and_aux_count():
    config = preset("tiny")
    model = build_model(config, NUM_CLASSES)
    rng = np.random.default_rng(0)
    outputs = _numpy_outputs(
        model({"images": _images(rng, 2, 64, 96), "mask": np.ones((2, 64, 96), bool)})
    )
    q = config.num_queries
    assert outputs["pred_logits"].shape == (2, q, NUM_CLASSES + 1)
    assert outputs["pred_boxes"].shape == (2, q, 4)
    assert len(outputs["aux_outputs"]) == config.num_decoder_layers - 1
    for aux in outputs["aux_outputs"]:
        assert aux["pred_logits"].shape == (2, q, NUM_CLASSES + 1)
        assert aux["pred_boxes"].shape == (2, q, 4)
        assert not np.allclose(aux["pred_boxes"], outputs["pred_boxes"])
    assert np.all((outputs["pred_boxes"] > 0) & (outputs["pred_boxes"] < 1))
    assert np.all(np.isfinite(outputs["pred_logits"]))
    assert model.backbone.stride == 2 ** len(config.tiny_filters)
    assert len(model.backbone_variables) == 3 * len(config.tiny_filters)  # kernel, gamma, beta
    # `forward` gives the same predictions in its one fixed structure.
    result = model.forward({"images": _images(np.random.default_rng(0), 2, 64, 96)})
    assert isinstance(result, DetrOutput) and result.cross_attention is None
    assert tuple(int(v) for v in result.feature_size) == (4, 6)  # 64 x 96 at stride 16
    np.testing.assert_allclose(keras.ops.convert_to_numpy(result.predictions["pred_boxes"]),
                               outputs["pred_boxes"], atol=1e-6)


def test_tiny_backbone_stride_and_zero_padding():
    backbone = TinyBackbone(filters=(4, 8))
    rng = np.random.default_rng(1)
    valid = np.zeros((1, 16, 12), bool)
    valid[0, :8, :4] = True
    features = keras.ops.convert_to_numpy(backbone(_images(rng, 1, 16, 12), valid=valid))
    assert features.shape == (1, 4, 3, 8)
    assert np.all(features[0, 2:] == 0) and np.all(features[0, :, 1:] == 0)
    assert np.any(features[0, :2, :1] != 0)
    restored = TinyBackbone.from_config(backbone.get_config())
    assert restored.filters == (4, 8) and restored.stride == 4 and restored.norm == "batch"


def test_tiny_backbone_batch_norm_takes_its_statistics_from_valid_pixels_only():
    backbone = TinyBackbone(filters=(4,), norm="batch")
    rng = np.random.default_rng(3)
    images = _images(rng, 2, 8, 6)
    valid = np.ones((2, 8, 6), bool)
    valid[1, 4:] = False  # the second image is 4 x 6, padded to 8 x 6
    padded = images * valid[..., None]
    features = keras.ops.convert_to_numpy(backbone(images, valid=valid, training=True))
    conv = keras.ops.convert_to_numpy(backbone.convs[0](np.pad(padded, [(0, 0), (1, 1), (1, 1),
                                                                         (0, 0)])))
    cells = valid[:, ::2, ::2]  # (2, 4, 3): the last two rows of the second image are padding
    mean, var = conv[cells].mean(0), conv[cells].var(0)  # over valid cells, biased, per channel
    expected = np.maximum((conv - mean) / np.sqrt(var + 1e-5), 0) * cells[..., None]
    np.testing.assert_allclose(features, expected, atol=1e-5)
    # PyTorch's running statistics: 0.9 running + 0.1 batch, the batch variance unbiased.
    norm = backbone.norms[0]
    running_mean, running_var = 0.1 * mean, 0.9 + 0.1 * conv[cells].var(0, ddof=1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm.moving_mean), running_mean,
                               atol=1e-6)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm.moving_variance), running_var,
                               rtol=1e-5)
    inference = keras.ops.convert_to_numpy(backbone(images, valid=valid))
    np.testing.assert_allclose(
        inference,
        np.maximum((conv - running_mean) / np.sqrt(running_var + 1e-5), 0) * cells[..., None],
        atol=1e-5)
    config = backbone.get_config()
    assert TinyBackbone.from_config(config).norm == "batch"
    del config["norm"]  # a model.keras saved before the option: the LayerNorm backbone
    assert TinyBackbone.from_config(config).norm == "layer"
    with pytest.raises(ValueError, match="norm"):
        TinyBackbone(norm="group")


@pytest.mark.parametrize(
    "queries", [{"query_type": "learned", "attention_radius": None, "box_refinement": False},
                {"query_type": "reference", "attention_radius": 0.4, "box_refinement": False},
                {"query_type": "encoder", "attention_radius": 0.4, "box_refinement": False},
                {"query_type": "encoder", "attention_radius": 0.4, "box_refinement": True}],
    ids=["learned", "reference", "encoder", "encoder-refined"],
)
def test_padded_batch_equals_each_image_alone(queries):
    model = build_model(preset("tiny", **SMALL, **queries), NUM_CLASSES)
    rng = np.random.default_rng(2)
    for v in model.backbone.weights:  # LayerNorm betas start at 0, which would hide leaks
        if v.path.endswith("beta"):
            v.assign(rng.normal(size=v.shape).astype("float32"))
    # The batch size 64x80 is a multiple of the stride 16; the second image is not, so
    # convolutions at its border would read padding if the backbone did not mask it.
    sizes = [(64, 48), (40, 72)]
    singles = [_images(rng, 1, h, w) for h, w in sizes]
    batch = _images(rng, 2, 64, 80)  # the padding holds noise: it must not matter
    mask = np.zeros((2, 64, 80), bool)
    for i, (h, w) in enumerate(sizes):
        batch[i, :h, :w] = singles[i][0]
        mask[i, :h, :w] = True
    together = _numpy_outputs(model({"images": batch, "mask": mask}))
    for i, (h, w) in enumerate(sizes):
        alone = _numpy_outputs(
            model({"images": singles[i], "mask": np.ones((1, h, w), bool)})
        )
        for key in ("pred_logits", "pred_boxes"):
            np.testing.assert_allclose(together[key][i], alone[key][0], atol=1e-4)
        np.testing.assert_allclose(
            together["aux_outputs"][0]["pred_boxes"][i],
            alone["aux_outputs"][0]["pred_boxes"][0],
            atol=1e-4,
        )
    # The two images' outputs differ (the comparison above is not trivial).
    assert not np.allclose(together["pred_boxes"][0], together["pred_boxes"][1], atol=1e-3)


def _compiled_small_model(name="tiny-detr"):
    config = preset(name, **SMALL)
    model = build_model(config, NUM_CLASSES)
    model.compile(
        optimizer=build_optimizer(config, model), criterion=build_criterion(config, NUM_CLASSES)
    )
    return model


def _fit_inputs():
    rng = np.random.default_rng(3)
    mask = np.ones((2, 32, 32), bool)
    mask[1, :, 16:] = False
    return {"images": _images(rng, 2, 32, 32), "mask": mask}


@pytest.mark.parametrize("name", ["tiny-detr", "tiny"])
def test_one_fit_step_updates_weights_and_reports_each_loss(tmp_path, name):
    model = _compiled_small_model(name)
    assert model.jit_compile is False  # the scipy matcher is a host callback
    x, y = _fit_inputs(), _targets()
    before = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    traces = []  # the train step is traced once: the optimizer is built before (two otherwise)
    train_step = model.train_step
    model.train_step = lambda data: (traces.append(1), train_step(data))[1]
    history = model.fit(x, y, batch_size=2, epochs=1, verbose=0).history
    assert len(traces) == 1
    for key in ("loss", "loss_ce", "loss_bbox", "loss_giou"):
        assert np.isfinite(history[key][0]) and history[key][0] > 0, key
    after = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    assert all(np.all(np.isfinite(v)) for v in after)
    changed = {v.path for v, b, a in zip(model.trainable_variables, before, after)
               if not np.array_equal(b, a)}
    assert {v.path for v in model.backbone_variables} <= changed
    unchanged = {v.path for v in model.trainable_variables} - changed
    if name == "tiny-detr":
        assert "detr/queries/query_embed" in changed
        # As in DETR, the first decoder layer's self-attention sees zeros (the decoder input)
        # and its value bias starts at zero, so its weights get no gradient on the first step.
        assert unchanged and all("decoder/layer_0/self_attention" in p for p in unchanged)
    else:  # two-stage queries start from the chosen cells' features, so the first layer
        # learns; on these 2 x 2-cell images a query's attention window may hold one cell,
        # whose softmax weight is 1 whatever its query and key: those get no gradient.
        assert all(re.search(r"cross_attention/(query|key)/", p) for p in unchanged)
        assert any("proposal_class_head" in p for p in changed)

    # `.keras` round trip: same outputs, same optimizer (state and backbone rate), criterion.
    path = str(tmp_path / "detr.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert isinstance(loaded, DETR) and isinstance(loaded.criterion, SetCriterion)
    ours, theirs = _numpy_outputs(model(x)), _numpy_outputs(loaded(x))
    keras.tree.map_structure(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), ours, theirs)
    assert isinstance(loaded.optimizer, DetrAdamW) and loaded.optimizer.has_backbone_variables
    assert loaded.optimizer.backbone_lr_multiplier == preset(name).backbone_lr_multiplier
    assert int(loaded.optimizer.iterations.numpy()) == 1
    assert loaded.jit_compile is False


def test_compile_defaults_and_replica_scaling(monkeypatch):
    model = build_model(preset("tiny", **SMALL), NUM_CLASSES)
    with pytest.raises(ValueError, match="criterion"):
        model.compile(loss="mse")
    with pytest.raises(ValueError, match="'images'"):
        model({"image": np.zeros((1, 32, 32, 3), "float32")})
    model.compile()
    assert isinstance(model.optimizer, DetrAdamW) and model.optimizer.has_backbone_variables
    assert model.criterion.num_classes == NUM_CLASSES and model.criterion.eos_coef == 0.1
    x, y = _fit_inputs(), _targets()
    y_pred = model(x)
    single = float(model.compute_loss(x, y, y_pred))
    assert single == pytest.approx(float(model.criterion(y_pred, y)["loss"]))
    # Two replicas (the cross-replica sum stood in for), the other holding as many targets:
    # same num_boxes, loss halved per replica.
    monkeypatch.setattr(set_loss_module, "num_replicas", lambda: 2)
    monkeypatch.setattr(set_loss_module, "replica_sum", lambda n: 2.0 * n)
    assert float(model.compute_loss(x, y, y_pred)) == pytest.approx(single / 2, rel=1e-6)
    # The other replica holding no targets: num_boxes = 3 / 2, box losses grow by 2.
    monkeypatch.setattr(set_loss_module, "replica_sum", lambda n: n)
    losses = model.criterion(y_pred, y, num_boxes=1.5)
    assert float(model.compute_loss(x, y, y_pred)) == pytest.approx(
        float(losses["loss"]) / 2, rel=1e-6
    )


@pytest.mark.parametrize("name", ["tiny-detr", "tiny"])
def test_mixed_precision_forward_is_float32_close_to_float32(name):
    config = preset(name, **SMALL)
    reference = build_model(config, NUM_CLASSES)
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = build_model(config, NUM_CLASSES)
    assert model.encoder.compute_dtype == "bfloat16"
    model.set_weights(reference.get_weights())  # float32 variables in both
    inputs = {"images": _images(np.random.default_rng(5), 2, 32, 48)}  # no mask: all valid
    outputs = model(inputs)
    assert keras.backend.standardize_dtype(outputs["pred_boxes"].dtype) == "float32"
    assert keras.backend.standardize_dtype(outputs["pred_logits"].dtype) == "float32"
    ours, full = _numpy_outputs(outputs), _numpy_outputs(reference(inputs))
    # Two-stage queries come in the order of their proposals' scores, which bfloat16 may swap
    # where two are close: compare each float32 query with its nearest bfloat16 one (a
    # one-to-one assignment; a proposal that bfloat16 leaves out still fails).
    for i in range(len(ours["pred_boxes"])):
        cost = np.abs(full["pred_boxes"][i][:, None] - ours["pred_boxes"][i][None]).sum(-1)
        order = linear_sum_assignment(cost)[1]
        ours["pred_boxes"][i], ours["pred_logits"][i] = (
            ours["pred_boxes"][i][order], ours["pred_logits"][i][order])
    # bfloat16 keeps 8 bits of mantissa (relative error ~4e-3 per operation): measured over
    # seeds, boxes differ by at most 1.4e-3 and logits (|logit| < 1.2) by 2.2e-2; the
    # tolerances leave about 3x room.
    np.testing.assert_allclose(ours["pred_boxes"], full["pred_boxes"], atol=5e-3)
    np.testing.assert_allclose(ours["pred_logits"], full["pred_logits"], atol=6e-2)


def test_postprocess_matches_a_hand_computation():
    logits = np.log(np.array([[[0.2, 0.7, 0.1], [0.5, 0.1, 0.4]]], "float32"))  # C = 2
    boxes = np.array([[[0.5, 0.5, 0.2, 0.4], [0.25, 0.75, 0.5, 0.5]]], "float32")
    sizes = np.array([[100, 200]])  # height 100, width 200
    result = _numpy_outputs(
        postprocess({"pred_logits": logits, "pred_boxes": boxes}, sizes, threshold=0.6)
    )
    np.testing.assert_allclose(result["scores"], [[0.7, 0.5]], rtol=1e-6)
    np.testing.assert_array_equal(result["labels"], [[1, 0]])
    np.testing.assert_allclose(
        result["boxes"], [[[80.0, 30.0, 120.0, 70.0], [0.0, 50.0, 100.0, 100.0]]], rtol=1e-6
    )
    np.testing.assert_array_equal(result["keep"], [[True, False]])
    assert result["labels"].dtype == np.int32
    unthresholded = postprocess({"pred_logits": logits, "pred_boxes": boxes}, sizes)
    assert np.all(keras.ops.convert_to_numpy(unthresholded["keep"]))
    with pytest.raises(ValueError, match="image_sizes"):
        postprocess({"pred_logits": logits, "pred_boxes": boxes}, np.array([100, 200]))


def test_resnet50_backbone_torchvision_layout_frozen_batchnorm_and_local_weights(tmp_path):
    backbone = build_backbone("resnet50")
    assert isinstance(backbone, ResNetBackbone)
    images = _images(np.random.default_rng(4), 1, 64, 97)
    features = keras.ops.convert_to_numpy(backbone(images))
    assert features.shape == (1, 2, 4, 2048)  # ceil(H / 32), as PyTorch's padded convs give
    layers = {layer.name: layer for layer in backbone._layers_in_order()}
    batch_norms = [layer for layer in layers.values()
                   if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(batch_norms) == 53 and not any(layer.trainable for layer in batch_norms)
    assert all(layer.epsilon == 1e-5 for layer in batch_norms)  # DETR's FrozenBatchNorm2d
    # v1.5: a stage's stride is in its first block's 3x3 convolution, not in the 1x1.
    assert layers["layer2_0_conv2"].strides == (2, 2) and layers["layer2_0_conv1"].strides == (1, 1)
    trainable = {v.path.split("/")[-2] for v in backbone.trainable_variables}
    assert "layer2_0_conv1" in trainable and "layer4_2_conv3" in trainable
    assert not any(name.startswith(("conv1", "layer1_")) or "bn" in name for name in trainable)
    # BatchNorm runs in inference mode even when training.
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(backbone(images, training=True)), features, atol=1e-5
    )
    # Weights from a local torchvision-layout file (PyTorch's (out, in, kh, kw) convolutions).
    state = {}
    for layer in layers.values():
        name = layer.name.replace("_", ".")
        if isinstance(layer, keras.layers.Conv2D):
            state[f"{name}.weight"] = np.ascontiguousarray(np.random.default_rng(len(state)).normal(
                0, 0.05, keras.ops.shape(layer.kernel)).astype("float32").transpose(3, 2, 0, 1))
        else:
            for theirs, ours in (("weight", "gamma"), ("bias", "beta"), ("running_mean",
                                 "moving_mean"), ("running_var", "moving_variance")):
                state[f"{name}.{theirs}"] = keras.ops.convert_to_numpy(getattr(layer, ours)) + 0.5
    save_file(state, str(tmp_path / "resnet50.safetensors"))
    reloaded = build_backbone("resnet50", weights=str(tmp_path / "resnet50.safetensors"))
    kernel = keras.ops.convert_to_numpy(reloaded._layers_in_order()[0].kernel)  # conv1
    np.testing.assert_array_equal(kernel[6, 2, 1, 9], state["conv1.weight"][9, 1, 6, 2])
    reloaded_layers = {layer.name: layer for layer in reloaded._layers_in_order()}
    moving_var = keras.ops.convert_to_numpy(reloaded_layers["layer3_0_bn2"].moving_variance)
    np.testing.assert_array_equal(moving_var, state["layer3.0.bn2.running_var"])
    with pytest.raises(ValueError, match="no such file"):
        build_backbone("resnet50", weights=str(tmp_path / "missing.pth"))
    del state["layer4.2.bn3.bias"]
    save_file(state, str(tmp_path / "partial.safetensors"))
    with pytest.raises(ValueError, match="layer4_2_bn3/beta"):
        build_backbone("resnet50", weights=str(tmp_path / "partial.safetensors"))
