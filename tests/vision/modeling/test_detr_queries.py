"""Tests of DETR's query strategies (`vision.modeling.queries`), geometry and initialization."""

import math

import keras
import numpy as np
import pytest

from tfx_transformer import sine_features
from vision.config import preset
from vision.modeling.backbone import build_backbone
from vision.modeling.detr import DETR, build_model
from vision.modeling.geometry import cell_centres, near_points, resize_mask
from vision.modeling.queries import (
    QUERY_LAYERS,
    LearnedQueries,
    ReferenceQueries,
    TwoStageQueries,
    query_layer_class,
)

NUM_CLASSES = 3
SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32))
D, Q = 16, 5  # width and queries of the layer-level tests


def _numpy(outputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


def _inputs(rng, batch=2, height=64, width=80):
    images = rng.normal(size=(batch, height, width, 3)).astype("float32")
    return {"images": images, "mask": np.ones((batch, height, width), bool)}


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _mlp(x, mlp):
    """A `vision.modeling.heads.MLP` by hand: ReLU between the dense layers."""
    for i, dense in enumerate(mlp.layers):
        x = x @ keras.ops.convert_to_numpy(dense.kernel) + keras.ops.convert_to_numpy(dense.bias)
        if i < len(mlp.layers) - 1:
            x = np.maximum(x, 0)
    return x


def _sine(values, num_feats, temperature=10000.0):
    """DETR's sine features by hand: per coordinate, sin (even j) / cos (odd j)."""
    out = []
    for k in range(values.shape[-1]):
        for j in range(num_feats):
            angle = values[..., k] / temperature ** (2 * (j // 2) / num_feats)
            out.append(np.sin(angle) if j % 2 == 0 else np.cos(angle))
    return np.stack(out, -1)


def _valid(batch_rows_cols, h, w):
    valid = np.zeros((len(batch_rows_cols), h, w), bool)
    for b, (rows, cols) in enumerate(batch_rows_cols):
        valid[b, :rows, :cols] = True
    return valid


def test_resize_mask_is_pytorch_nearest():
    valid = np.zeros((1, 5, 7), bool)
    valid[0, :3, :4] = True
    # PyTorch's nearest: output (i, j) reads input (floor(i * 5 / 3), floor(j * 7 / 2)).
    expected = valid[:, [0, 1, 3]][:, :, [0, 3]]
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(resize_mask(valid, 3, 2)), expected)


def test_cell_centres_and_windows_are_in_the_valid_frame():
    valid = _valid([(3, 4), (2, 2)], 3, 4)
    cx, cy, _, _ = (keras.ops.convert_to_numpy(t) for t in cell_centres(valid))
    np.testing.assert_allclose(cx[0, 0], [0.125, 0.375, 0.625, 0.875], atol=1e-5)
    np.testing.assert_allclose(cx[1, 0, :2], [0.25, 0.75], atol=1e-5)
    np.testing.assert_allclose(cy[1, :2, 0], [0.25, 0.75], atol=1e-5)
    points = np.array([[[0.1, 0.5]], [[0.7, 0.7]]], "float32")  # (B, Q = 1, 2)
    near = keras.ops.convert_to_numpy(near_points(valid, points, 0.3))  # (B, 1, 12)
    for b in range(2):
        rows, cols = np.nonzero(np.ones((3, 4)))
        hand = (np.abs(cx[b, rows, cols] - points[b, 0, 0]) <= 0.3) & (
            np.abs(cy[b, rows, cols] - points[b, 0, 1]) <= 0.3) & valid[b, rows, cols]
        np.testing.assert_array_equal(near[b, 0], hand)
    # (0.7, 0.7) in a 2 x 2-cell image: only the cell centred at (0.75, 0.75) is near.
    np.testing.assert_array_equal(near[1, 0].reshape(3, 4), [[0, 0, 0, 0], [0, 1, 0, 0],
                                                             [0, 0, 0, 0]])


def test_learned_queries_start_from_zeros_at_their_learned_positions():
    layer = LearnedQueries(Q, D, NUM_CLASSES)
    layer.build((None, None, D))
    memory = np.random.default_rng(0).normal(size=(2, 7, D)).astype("float32")
    out = layer(memory, np.ones((2, 7, 1), bool))
    weights = keras.ops.convert_to_numpy(layer.query_embed)  # (Q, D), N(0, 1) as DETR's
    assert weights.shape == (Q, D) and 0.5 < weights.std() < 1.5
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out.content), np.zeros((2, Q, D)))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(out.position),
                                  np.broadcast_to(weights, (2, Q, D)))
    assert out.reference is None and out.extra == {}
    with pytest.raises(ValueError, match="no reference points"):
        layer.embed(np.zeros((2, Q, 2), "float32"))


def test_reference_queries_are_grid_points_embedded_by_their_mlp():
    layer = ReferenceQueries(Q, D, NUM_CLASSES)
    layer.build((None, None, D))
    out = _numpy(layer(np.zeros((2, 7, D), "float32"), np.ones((2, 7, 1), bool)))
    # 5 queries: 3 columns x 2 rows over the image, at the centres of their cells.
    grid = [[x, y] for y in (0.25, 0.75) for x in (1 / 6, 0.5, 5 / 6)][:Q]
    np.testing.assert_allclose(_sigmoid(out.reference), [grid, grid], atol=1e-6)
    points = np.array(grid, "float32")[:, [1, 0]] * 2 * math.pi  # y before x
    position = _mlp(_sine(points, D // 2), layer.reference_mlp)  # (Q, D)
    np.testing.assert_allclose(out.position, [position, position], atol=1e-5)
    np.testing.assert_array_equal(out.content, np.zeros((2, Q, D)))


def test_two_stage_queries_pick_the_top_scored_cells():
    layer = TwoStageQueries(Q, D, NUM_CLASSES)
    layer.build((None, None, D))
    rng = np.random.default_rng(1)
    valid = _valid([(3, 4), (2, 2)], 3, 4)  # 12 and 4 valid cells: the second has fewer than Q
    memory = rng.normal(size=(2, 12, D)).astype("float32")
    out = _numpy(layer(memory, valid))
    enc = out.extra["enc_outputs"]
    np.testing.assert_array_equal(enc["valid"], valid.reshape(2, -1))
    # Brute force: the object score of a cell is its best class probability.
    head = layer.proposal_class_head
    logits = (memory @ keras.ops.convert_to_numpy(head.kernel)
              + keras.ops.convert_to_numpy(head.bias))  # (B, S, C + 1)
    np.testing.assert_allclose(enc["pred_logits"][valid.reshape(2, -1)],
                               logits[valid.reshape(2, -1)], atol=1e-5)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    score = (probs / probs.sum(-1, keepdims=True))[..., :-1].max(-1)  # (B, S)
    for b in range(2):
        cells = np.flatnonzero(valid[b].reshape(-1))
        best = cells[np.argsort(-score[b, cells], kind="stable")][:Q]
        n = len(best)
        np.testing.assert_allclose(out.content[b, :n], memory[b, best], atol=1e-6)
        boxes = enc["pred_boxes"][b, best]  # the proposals' boxes are the references
        np.testing.assert_allclose(_sigmoid(out.reference[b, :n]), boxes, atol=1e-5)
        # Fewer valid cells than queries: the rest are padded cells (certain no-object).
        padded = np.flatnonzero(~valid[b].reshape(-1))
        for q in range(n, Q):
            assert any(np.allclose(out.content[b, q], memory[b, c]) for c in padded)
    assert np.all(enc["pred_logits"][1].reshape(3, 4, -1)[2:, :, -1] > 1e3)  # padded: no-object
    position = _mlp(_sine(_sigmoid(out.reference)[..., [1, 0, 2, 3]] * 2 * math.pi, D // 2),
                    layer.reference_mlp)
    np.testing.assert_allclose(out.position, position, atol=1e-4)
    # Fewer cells than queries at all (3 < Q): the rest start from zeros at the centre box.
    few = _numpy(layer(memory[:1, :3], np.ones((1, 1, 3), bool)))
    np.testing.assert_array_equal(few.content[0, 3:], 0)
    np.testing.assert_array_equal(few.reference[0, 3:], 0)
    assert sorted(few.content[0, :3].sum(-1)) == pytest.approx(sorted(memory[0, :3].sum(-1)))


@pytest.mark.parametrize("name", sorted(QUERY_LAYERS))
def test_query_layers_round_trip_their_config(name):
    layer = QUERY_LAYERS[name](Q, D, NUM_CLASSES, name="queries")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer) and restored.get_config() == layer.get_config()


def test_query_type_and_radius_are_checked():
    for bad in ("anchors", "Learned", None):  # the error names the accepted ones
        accepted = r"one of \('learned', 'reference', 'encoder', 'mixed'\)"
        with pytest.raises(ValueError, match=accepted):
            query_layer_class(bad)
    backbone = build_backbone("tiny", filters=(8,))
    with pytest.raises(ValueError, match="query_type=.anchors"):
        DETR(NUM_CLASSES, backbone, hidden_dim=32, num_heads=4, query_type="anchors")
    with pytest.raises(ValueError, match="attention_radius=0.3, query_type='learned'"):
        DETR(NUM_CLASSES, backbone, hidden_dim=32, num_heads=4, attention_radius=0.3)
    with pytest.raises(ValueError, match="attention_radius=0"):
        DETR(NUM_CLASSES, backbone, hidden_dim=32, num_heads=4, query_type="reference",
             attention_radius=0)
    with pytest.raises(ValueError, match="box_refinement=True, query_type='reference'"):
        DETR(NUM_CLASSES, backbone, hidden_dim=32, num_heads=4, query_type="reference",
             box_refinement=True)


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


def test_reference_points_start_on_a_grid_and_shift_the_box_centres():
    model = build_model(preset("tiny", **SMALL, query_type="reference", box_refinement=False),
                        NUM_CLASSES)
    points = 1 / (1 + np.exp(-keras.ops.convert_to_numpy(model.queries.reference_logits)))
    # 6 queries: 3 columns x 2 rows covering the image.
    expected = [[x, y] for y in (0.25, 0.75) for x in (1 / 6, 0.5, 5 / 6)]
    np.testing.assert_allclose(points, expected, atol=1e-6)
    rng = np.random.default_rng(2)
    inputs = _inputs(rng)
    head = model.box_head.layers[-1]
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
    head = model.box_head.layers[-1]
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
