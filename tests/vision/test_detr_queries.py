"""Tests for DETR's initialization and its query types: learned, reference points, two-stage."""

import math

import keras
import numpy as np
import pytest

from tfx_transformer import sine_features
from vision.config import preset
from vision.losses import SetCriterion
from vision.matcher import HungarianMatcher
from vision.model import build_model

NUM_CLASSES = 3
SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32))


def _numpy(outputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


def _inputs(rng, batch=2, height=64, width=80):
    images = rng.normal(size=(batch, height, width, 3)).astype("float32")
    return {"images": images, "mask": np.ones((batch, height, width), bool)}


def test_transformer_kernels_have_pytorch_xavier_bounds():
    d, f = 32, 64
    model = build_model(preset("tiny", **SMALL), NUM_CLASSES)
    for stack in (model.encoder, model.decoder):
        for layer in stack.layers:
            attentions = [layer.self_attention]
            if hasattr(layer, "cross_attention"):
                attentions.append(layer.cross_attention)
            for attention in attentions:
                # PyTorch's packed in_proj_weight (3d, d): xavier bound sqrt(6 / 4d).
                for dense in (attention.query_dense, attention.key_dense, attention.value_dense):
                    kernel = keras.ops.convert_to_numpy(dense.kernel)
                    bound = math.sqrt(6.0 / (4 * d))
                    assert np.abs(kernel).max() <= bound
                    assert abs(kernel.std() - bound / math.sqrt(3)) < 0.1 * bound
                    assert not np.any(keras.ops.convert_to_numpy(dense.bias))
                kernel = keras.ops.convert_to_numpy(attention.output_dense.kernel)
                bound = math.sqrt(6.0 / (2 * d))  # out_proj (d, d)
                assert np.abs(kernel).max() <= bound
                assert abs(kernel.std() - bound / math.sqrt(3)) < 0.1 * bound
            for dense, fan_in in ((layer.feedforward.inner, d), (layer.feedforward.outer, f)):
                bias = keras.ops.convert_to_numpy(dense.bias)  # PyTorch's Linear default
                assert 0 < np.abs(bias).max() <= 1.0 / math.sqrt(fan_in)
                kernel = keras.ops.convert_to_numpy(dense.kernel)
                assert np.abs(kernel).max() <= math.sqrt(6.0 / (d + f))


def test_sine_features_formula():
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 7, size=(2, 3, 2)).astype("float32")
    got = keras.ops.convert_to_numpy(sine_features(values, 6, temperature=100.0))
    expected = np.zeros((2, 3, 12))
    for k in range(2):
        for j in range(6):
            angle = values[..., k] / 100.0 ** (2 * (j // 2) / 6)
            expected[..., 6 * k + j] = np.sin(angle) if j % 2 == 0 else np.cos(angle)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_query_type_and_radius_are_checked():
    with pytest.raises(ValueError, match="query_type"):
        build_model(preset("tiny", **SMALL, query_type="anchors"), NUM_CLASSES)
    with pytest.raises(ValueError, match="attention_radius"):
        build_model(preset("tiny-detr", **SMALL, attention_radius=0.3), NUM_CLASSES)
    with pytest.raises(ValueError, match="attention_radius"):
        build_model(preset("tiny", **SMALL, query_type="reference", attention_radius=0,
                           box_refinement=False),
                    NUM_CLASSES)
    with pytest.raises(ValueError, match="box_refinement"):
        build_model(preset("tiny", **SMALL, query_type="reference", box_refinement=True),
                    NUM_CLASSES)


@pytest.mark.parametrize("query_type", ["reference", "encoder"])
def test_cross_attention_stays_within_the_radius(query_type):
    radius = 0.3
    model = build_model(preset("tiny", **SMALL, query_type=query_type, attention_radius=radius,
                               box_refinement=query_type == "encoder"), NUM_CLASSES)
    rng = np.random.default_rng(1)
    inputs = _inputs(rng, height=96, width=128)  # 6 x 8 cells
    inputs["mask"][1, :, 80:] = False  # second image: 96 x 80 valid, 6 x 5 cells
    # With a zero box head, boxes = sigmoid(reference): the reference points themselves (the
    # same for every layer, also with box refinement).
    for v in (model.box_head[-1].kernel, model.box_head[-1].bias):
        v.assign(keras.ops.zeros_like(v))
    outputs, weights, (h, w) = model.forward(inputs, return_cross_attention=True)
    weights = keras.ops.convert_to_numpy(weights)  # (L, B, heads, Q, S)
    points = keras.ops.convert_to_numpy(model(inputs)["pred_boxes"])[..., :2]  # (B, Q, 2)
    for b, valid_w in enumerate((8, 5)):
        cols, rows = np.meshgrid(np.arange(w), np.arange(h))  # (h, w)
        cx = ((cols + 0.5) / valid_w).reshape(-1)  # (S,) centres in the valid frame
        cy = ((rows + 0.5) / h).reshape(-1)
        for q in range(SMALL["num_queries"]):
            near = (np.abs(cx - points[b, q, 0]) <= radius + 1e-5) & (
                np.abs(cy - points[b, q, 1]) <= radius + 1e-5)
            near &= (cols.reshape(-1) < valid_w)
            outside = weights[:, b, :, q][..., ~near]
            assert not outside.any()
            if near.any():  # the weights over the window are a distribution
                np.testing.assert_allclose(weights[:, b, :, q].sum(-1), 1.0, atol=1e-5)


def test_reference_points_start_on_a_grid_and_shift_the_box_centres():
    model = build_model(preset("tiny", **SMALL, query_type="reference", box_refinement=False),
                        NUM_CLASSES)
    points = 1 / (1 + np.exp(-keras.ops.convert_to_numpy(model.reference_logits)))
    # 6 queries: 3 columns x 2 rows covering the image.
    expected = [[x, y] for y in (0.25, 0.75) for x in (1 / 6, 0.5, 5 / 6)]
    np.testing.assert_allclose(points, expected, atol=1e-6)
    rng = np.random.default_rng(2)
    inputs = _inputs(rng)
    head = model.box_head[-1]
    for v in (head.kernel, head.bias):
        v.assign(keras.ops.zeros_like(v))
    boxes = _numpy(model(inputs))["pred_boxes"]  # sigmoid(0 + reference): the points
    np.testing.assert_allclose(boxes[..., :2], np.broadcast_to(points, (2, 6, 2)), atol=1e-6)
    np.testing.assert_allclose(boxes[..., 2:], 0.5, atol=1e-6)


def test_two_stage_queries_are_the_best_proposals():
    model = build_model(preset("tiny", **SMALL, box_refinement=False), NUM_CLASSES)
    rng = np.random.default_rng(3)
    inputs = _inputs(rng, height=96, width=128)  # 6 x 8 = 48 cells
    inputs["mask"][1, 48:, :] = False  # second image: 3 x 8 valid cells
    head = model.box_head[-1]
    for v in (head.kernel, head.bias):  # predicted boxes = the reference (proposal) boxes
        v.assign(keras.ops.zeros_like(v))
    outputs = _numpy(model(inputs))
    proposals = outputs["enc_outputs"]
    assert proposals["pred_logits"].shape == (2, 48, NUM_CLASSES + 1)
    probs = np.exp(proposals["pred_logits"] - proposals["pred_logits"].max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    score = probs[..., :-1].max(-1)  # (B, S)
    valid = np.ones((2, 6, 8), bool)
    valid[1, 3:] = False
    valid = valid.reshape(2, -1)
    # Padded cells are certain no-object, so they are never chosen.
    np.testing.assert_allclose(probs[~valid][:, -1], 1.0)
    for b in range(2):
        best = np.argsort(-np.where(valid[b], score[b], -1))[:6]
        np.testing.assert_allclose(
            np.sort(outputs["pred_boxes"][b], axis=0),
            np.sort(proposals["pred_boxes"][b][best], axis=0), atol=1e-5,
        )


def test_box_refinement_adds_each_layer_offset_to_the_previous_boxes():
    config = preset("tiny", **SMALL, query_type="encoder", box_refinement=True)
    model = build_model(config, NUM_CLASSES)
    inputs = _inputs(np.random.default_rng(7))
    plain = build_model(preset("tiny", **SMALL, box_refinement=False), NUM_CLASSES)
    plain.set_weights(model.get_weights())  # same weights, no refinement
    offset = np.array([0.3, -0.2, 0.1, 0.25], "float32")
    for m in (model, plain):  # every layer predicts the same logit offset
        m.box_head[-1].kernel.assign(np.zeros(m.box_head[-1].kernel.shape, "float32"))
        m.box_head[-1].bias.assign(offset)
    outputs = _numpy(model(inputs))
    proposals = _numpy(plain(inputs))["pred_boxes"]  # sigmoid(proposal + offset)
    start = np.log(proposals / (1 - proposals)) - offset  # the chosen proposals' logits
    layers = [aux["pred_boxes"] for aux in outputs["aux_outputs"]] + [outputs["pred_boxes"]]
    for i, boxes in enumerate(layers):  # layer i: sigmoid(proposal + (i + 1) * offset)
        expected = 1 / (1 + np.exp(-(start + (i + 1) * offset)))
        np.testing.assert_allclose(boxes, expected, atol=1e-4)


def test_two_stage_works_with_fewer_cells_than_queries():
    config = preset("tiny", **{**SMALL, "num_queries": 20}, query_type="encoder")
    model = build_model(config, NUM_CLASSES)
    outputs = _numpy(model(_inputs(np.random.default_rng(4), height=32, width=48)))  # 2 x 3
    assert outputs["pred_boxes"].shape == (2, 20, 4)
    assert np.all(np.isfinite(outputs["pred_boxes"]))
    assert outputs["enc_outputs"]["pred_boxes"].shape == (2, 6, 4)


def test_criterion_adds_the_proposal_losses():
    rng = np.random.default_rng(5)
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher())
    layer = lambda q: {  # noqa: E731
        "pred_logits": rng.normal(size=(2, q, NUM_CLASSES + 1)).astype("float32"),
        "pred_boxes": rng.uniform(0.2, 0.8, size=(2, q, 4)).astype("float32"),
    }
    outputs = {**layer(5), "aux_outputs": [layer(5)]}
    enc = layer(12)
    targets = {
        "labels": np.array([[0, 2], [1, 0]]),
        "boxes": rng.uniform(0.2, 0.6, size=(2, 2, 4)).astype("float32"),
        "valid": np.array([[True, True], [True, False]]),
    }
    without = {k: float(v) for k, v in criterion(outputs, targets).items()}
    with_enc = {k: float(v) for k, v in criterion({**outputs, "enc_outputs": enc},
                                                   targets).items()}
    alone = {k: float(v) for k, v in criterion(enc, targets).items()}
    for name in ("loss_ce", "loss_bbox", "loss_giou"):
        assert with_enc[f"{name}_enc"] == pytest.approx(alone[name], rel=1e-6)
        assert with_enc[name] == pytest.approx(without[name], rel=1e-6)
    extra = alone["loss_ce"] + 5 * alone["loss_bbox"] + 2 * alone["loss_giou"]
    assert with_enc["loss"] == pytest.approx(without["loss"] + extra, rel=1e-5)


def test_each_object_is_matched_to_several_proposals():
    # One image, one object of class 1; the two proposals nearest to it are also the most
    # confident, so they take the object when it is repeated twice.
    target = np.array([0.5, 0.5, 0.2, 0.2], "float32")
    shifts = np.array([0.01, 0.2, 0.03, 0.1], "float32")
    proposal_boxes = np.stack([target + [d, 0, 0, 0] for d in shifts])[None]  # (1, 4, 4)
    logits = np.zeros((1, 4, NUM_CLASSES + 1), "float32")
    logits[0, :, 1] = [2.0, 0.0, 1.0, 0.0]
    decoder = {"pred_logits": logits[:, :2], "pred_boxes": proposal_boxes[:, :2]}
    outputs = {**decoder, "enc_outputs": {"pred_logits": logits, "pred_boxes": proposal_boxes}}
    targets = {"labels": np.array([[1]]), "boxes": target[None, None],
               "valid": np.array([[True]])}
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher(), proposal_matches=2)
    losses = {k: float(v) for k, v in criterion(outputs, targets).items()}
    # Matched: proposals 0 and 2 (L1 0.01 and 0.03), divided by 2 x 1 object.
    assert losses["loss_bbox_enc"] == pytest.approx((0.01 + 0.03) / 2, rel=1e-4)
    log_p = logits[0] - np.log(np.exp(logits[0]).sum(-1, keepdims=True))  # (4, C + 1)
    nll = -log_p[[0, 1, 2, 3], [1, NUM_CLASSES, 1, NUM_CLASSES]]  # class 1 or no-object
    weights = np.array([1.0, 0.1, 1.0, 0.1])  # eos_coef for no-object
    assert losses["loss_ce_enc"] == pytest.approx((weights * nll).sum() / weights.sum(), rel=1e-5)
    # The decoder's own matching stays one-to-one: query 0 (L1 0.01) only.
    assert losses["loss_bbox"] == pytest.approx(0.01, rel=1e-4)
    with pytest.raises(ValueError, match="proposal_matches"):
        SetCriterion(NUM_CLASSES, HungarianMatcher(), proposal_matches=0)


@pytest.mark.parametrize("query_type", ["reference", "encoder"])
def test_query_types_round_trip_through_keras_files(tmp_path, query_type):
    refine = query_type == "encoder"
    model = build_model(
        preset("tiny", **SMALL, query_type=query_type, attention_radius=0.5,
               box_refinement=refine), NUM_CLASSES
    )
    inputs = _inputs(np.random.default_rng(6))
    path = str(tmp_path / "detr.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    assert (loaded.query_type, loaded.attention_radius) == (query_type, 0.5)
    assert loaded.box_refinement == refine
    np.testing.assert_allclose(
        _numpy(loaded(inputs))["pred_boxes"], _numpy(model(inputs))["pred_boxes"], atol=1e-6
    )


def test_padded_cells_are_never_matched_to_objects():
    # Three proposals; the best box for the object sits on a padded cell.
    target = np.array([0.5, 0.5, 0.9, 0.9], "float32")
    proposal_boxes = np.array([[target, [0.3, 0.3, 0.2, 0.2], [0.7, 0.7, 0.3, 0.3]]], "float32")
    logits = np.zeros((1, 3, NUM_CLASSES + 1), "float32")
    logits[0, 0, 0] = 5.0  # the padded cell: its no-object loss would be large
    enc = {"pred_logits": logits, "pred_boxes": proposal_boxes,
           "valid": np.array([[False, True, True]])}
    decoder = {"pred_logits": logits[:, 1:], "pred_boxes": proposal_boxes[:, 1:]}
    targets = {"labels": np.array([[0, 2]]), "boxes": np.stack([target, target])[None],
               "valid": np.array([[True, False]])}
    matcher = HungarianMatcher()
    indices = keras.ops.convert_to_numpy(
        matcher(logits, proposal_boxes, targets["labels"], targets["boxes"], targets["valid"],
                pred_valid=enc["valid"]))
    np.testing.assert_array_equal(indices, [[-1, -1, 0]])  # cell 2 is nearer than cell 1
    losses = SetCriterion(NUM_CLASSES, matcher)({**decoder, "enc_outputs": enc}, targets)
    l1 = np.abs(proposal_boxes[0, 2] - target).sum()
    assert float(losses["loss_bbox_enc"]) == pytest.approx(l1, rel=1e-5)
    # Valid cells have uniform logits: -log(1/4) each; the padded cell has weight 0.
    assert float(losses["loss_ce_enc"]) == pytest.approx(np.log(4), rel=1e-5)
    # More objects than valid proposals: the padded one still stays unmatched.
    crowded = {**targets, "valid": np.array([[True, True]])}
    indices = keras.ops.convert_to_numpy(
        matcher(logits, proposal_boxes, crowded["labels"], crowded["boxes"], crowded["valid"],
                pred_valid=np.array([[False, False, True]])))
    assert indices[0, 0] == -1 and indices[0, 1] == -1 and indices[0, 2] in (0, 1)
