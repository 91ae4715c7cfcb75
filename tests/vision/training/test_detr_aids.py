"""Tests of the convergence aids that one `DetrConfig` value turns on: look forward twice,
mixed query selection, and the hybrid one-to-many branch (queries and set loss)."""

from typing import NamedTuple

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops
from scipy.optimize import linear_sum_assignment

from vision.config import preset
from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher
from vision.modeling.detr import build_model
from vision.modeling.queries import MixedQueries, QueryOutput, TwoStageQueries
from vision.modeling.refinement import make_box_decoding

NUM_CLASSES = 3
SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32))


def _numpy(outputs):
    return keras.tree.map_structure(ops.convert_to_numpy, outputs)


class _Out(NamedTuple):
    output: object
    attention: object


class _DoublingDecoder:
    """A decoder stub: each layer doubles its input; ``normalize`` is the identity."""

    def __init__(self, num_layers):
        self.layers = [self._layer] * num_layers

    @staticmethod
    def _layer(x, memory, **kwargs):
        return _Out(x * 2.0, None)

    @staticmethod
    def normalize(x):
        return x


class _NoEmbedding:
    @staticmethod
    def embed(boxes):
        return ops.zeros(ops.shape(boxes)[:2] + (8,))


@pytest.mark.parametrize("look_forward_twice", [False, True])
def test_look_forward_twice_trains_each_box_offset_through_the_later_layers(look_forward_twice):
    # Layer i's output is h_i = 2^(i+1) x and its box logits are b_{i-1} + W h_i + c. The boxes
    # are the same either way; the last box's gradient with respect to W is
    # sum_i h_i (summed over images and queries) when each offset is from the previous box
    # with its gradient, and h_L alone when it is from a box without gradient.
    rng = np.random.default_rng(0)
    x = rng.normal(scale=0.05, size=(2, 3, 8)).astype("float32")  # logits stay within ±4
    reference = rng.normal(scale=0.5, size=(2, 3, 4)).astype("float32")
    head = keras.layers.Dense(4)
    head.build((None, 8))
    start = QueryOutput(x, ops.zeros_like(x), reference, {})
    decoding = make_box_decoding(True, None, 4, "encoder", look_forward_twice)
    with tf.GradientTape() as tape:
        decoded = decoding(_DoublingDecoder(3), head, _NoEmbedding(), start,
                           np.zeros((2, 4, 8), "float32"), np.zeros((2, 4, 8), "float32"),
                           np.ones((2, 2, 2), bool))
        last = ops.log(decoded.boxes[-1]) - ops.log(1 - decoded.boxes[-1])  # logits
        total = ops.sum(last)
    gradient = tape.gradient(total, head.kernel).numpy()
    kernel, bias = head.kernel.numpy(), head.bias.numpy()
    hidden = [x * 2.0 ** (i + 1) for i in range(3)]
    expected_boxes = reference + sum(h @ kernel + bias for h in hidden)
    np.testing.assert_allclose(last.numpy(), expected_boxes, rtol=1e-4, atol=1e-4)
    used = hidden if look_forward_twice else hidden[-1:]
    expected = sum(h.sum(axis=(0, 1)) for h in used)[:, None] * np.ones((1, 4))
    np.testing.assert_allclose(gradient, expected, rtol=1e-5)


def test_look_forward_twice_needs_box_refinement():
    with pytest.raises(ValueError, match="look_forward_twice.*box_refinement=True"):
        preset("tiny", box_refinement=False, look_forward_twice=True)


def _memory(batch=2, h=3, w=4, d=16):
    rng = np.random.default_rng(1)
    memory = rng.normal(size=(batch, h * w, d)).astype("float32")
    valid = np.ones((batch, h, w), bool)
    valid[1, :, 3:] = False
    return memory, valid


def test_mixed_queries_are_two_stage_boxes_with_learned_content():
    memory, valid = _memory()
    two_stage, mixed = TwoStageQueries(5, 16, NUM_CLASSES), MixedQueries(5, 16, NUM_CLASSES)
    for layer in (two_stage, mixed):
        layer.build((None, None, 16))
    shared = [w for w in mixed.weights if not w.path.endswith("query_content")]
    for source, target in zip(two_stage.weights, shared, strict=True):
        target.assign(source)
    got, same = _numpy(mixed(memory, valid)), _numpy(two_stage(memory, valid))
    np.testing.assert_array_equal(got.reference, same.reference)
    np.testing.assert_array_equal(got.position, same.position)
    np.testing.assert_array_equal(got.extra["enc_outputs"]["pred_boxes"],
                                  same.extra["enc_outputs"]["pred_boxes"])
    content = mixed.query_content.numpy()
    assert content.shape == (5, 16)
    np.testing.assert_array_equal(got.content, np.broadcast_to(content, (2, 5, 16)))
    assert not np.allclose(got.content, same.content)


def test_one_to_many_queries_train_beside_the_one_to_one_queries_without_changing_them():
    # With dropout off, the Q one-to-one queries of a training call equal those of an
    # inference call: the one-to-many queries are extra rows they cannot attend to (the
    # LayerNorm backbone: BatchNorm's training statistics would differ from the inference's).
    config = preset("tiny", **SMALL, dropout=0.0, tiny_norm="layer", one_to_many_queries=9)
    model = build_model(config, NUM_CLASSES)
    rng = np.random.default_rng(0)
    inputs = {"images": rng.normal(size=(2, 64, 80, 3)).astype("float32"),
              "mask": np.ones((2, 64, 80), bool)}
    inputs["mask"][1, :, 48:] = False
    train, infer = _numpy(model(inputs, training=True)), _numpy(model(inputs, training=False))
    assert "one_to_many" not in infer
    for key in ("pred_logits", "pred_boxes"):
        assert train[key].shape == infer[key].shape == (2, 6) + train[key].shape[2:]
        np.testing.assert_allclose(train[key], infer[key], rtol=1e-4, atol=1e-5)
        assert train["one_to_many"][key].shape[1] == 9
    assert len(train["one_to_many"]["aux_outputs"]) == len(train["aux_outputs"]) == 2
    features = model.backbone(inputs["images"], valid=inputs["mask"])
    memory, _, feature_valid = model._encode(features, ops.cast(inputs["mask"], "bool"), False)
    start = model.queries(memory, feature_valid, training=True)
    group = np.arange(15) >= 6
    np.testing.assert_array_equal(_numpy(start.self_attention_mask),
                                  np.broadcast_to(group[:, None] == group[None], (2, 15, 15)))


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _xyxy(b):
    return np.concatenate([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)


def _giou(a, b):
    a, b = _xyxy(a)[:, None], _xyxy(b)[None]
    inter = np.prod(np.clip(np.minimum(a[..., 2:], b[..., 2:])
                            - np.maximum(a[..., :2], b[..., :2]), 0, None), -1)
    area = lambda x: np.prod(x[..., 2:] - x[..., :2], -1)  # noqa: E731
    union = area(a) + area(b) - inter
    hull = np.prod(np.maximum(a[..., 2:], b[..., 2:]) - np.minimum(a[..., :2], b[..., :2]), -1)
    return inter / union - (hull - union) / hull


def _one_to_many_losses(logits, boxes, labels, targets, k, eos=0.1):
    """One image's hybrid losses written out: targets repeated k times, scipy's assignment on
    DETR's cost (1 class, 5 L1, 2 GIoU), weighted CE, L1 and GIoU over k * objects."""
    labels, targets = np.tile(labels, k), np.tile(targets, (k, 1))
    probs = _softmax(logits)
    cost = (-probs[:, labels] + 5 * np.abs(boxes[:, None] - targets[None]).sum(-1)
            - 2 * _giou(boxes, targets))
    rows, cols = linear_sum_assignment(cost)
    target_class = np.full(len(logits), logits.shape[-1] - 1)
    target_class[rows] = labels[cols]
    weights = np.where(np.arange(len(logits))[:, None] == rows[None], 1.0, 0.0).sum(-1)
    weights = np.where(weights > 0, 1.0, eos)
    nll = -np.log(probs[np.arange(len(logits)), target_class])
    return {"loss_ce_o2m": (weights * nll).sum() / weights.sum(),
            "loss_bbox_o2m": np.abs(boxes[rows] - targets[cols]).sum() / len(targets),
            "loss_giou_o2m": (1 - np.diag(_giou(boxes[rows], targets[cols]))).sum()
            / len(targets)}


def test_the_one_to_many_branch_is_matched_to_k_copies_of_the_targets():
    rng = np.random.default_rng(3)
    q, k = 8, 3
    logits = rng.normal(size=(1, q, NUM_CLASSES + 1)).astype("float32")
    boxes = np.concatenate([rng.uniform(0.3, 0.7, (1, q, 2)), rng.uniform(0.1, 0.3, (1, q, 2))],
                           -1).astype("float32")
    targets = {"labels": np.array([[0, 2]]),
               "boxes": np.array([[[0.4, 0.4, 0.2, 0.2], [0.6, 0.5, 0.1, 0.3]]], "float32"),
               "valid": np.array([[True, True]])}
    criterion = SetCriterion(NUM_CLASSES, HungarianMatcher(), aux_loss=True,
                             one_to_many_copies=k)
    one_to_one = {"pred_logits": logits[:, :2], "pred_boxes": boxes[:, :2]}
    outputs = {**one_to_one, "one_to_many": {
        "pred_logits": logits, "pred_boxes": boxes,
        "aux_outputs": [{"pred_logits": logits[:, ::-1], "pred_boxes": boxes[:, ::-1]}]}}
    got = _numpy(criterion(outputs, targets))
    expected = _one_to_many_losses(logits[0], boxes[0], targets["labels"][0],
                                   targets["boxes"][0], k)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-5)
        assert got[name.replace("_o2m", "_o2m_0")] == pytest.approx(value, rel=1e-5)
    without = _numpy(criterion(one_to_one, targets))
    weights = {"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0}
    added = sum(2 * weights[name.replace("_o2m", "")] * value for name, value in expected.items())
    assert got["loss"] == pytest.approx(without["loss"] + added, rel=1e-5)


def _iou(a, b):
    a, b = _xyxy(a), _xyxy(b)
    inter = np.prod(np.clip(np.minimum(a[2:], b[2:]) - np.maximum(a[:2], b[:2]), 0, None))
    return inter / (np.prod(a[2:] - a[:2]) + np.prod(b[2:] - b[:2]) - inter)


def test_iou_aware_classification_targets_the_matched_box_iou():
    # Query 0 sits near the object and is matched; query 1 is far away and is not.
    logits = np.array([[[1.0, -0.5, 0.2], [0.3, 0.1, 0.9]]], "float32")
    boxes = np.array([[[0.42, 0.5, 0.3, 0.2], [0.1, 0.1, 0.05, 0.05]]], "float32")
    targets = {"labels": np.array([[0]]), "boxes": np.array([[[0.4, 0.5, 0.3, 0.25]]], "float32"),
               "valid": np.array([[True]])}
    criterion = SetCriterion(2, HungarianMatcher(), eos_coef=0.1, aux_loss=False,
                             iou_aware=True)
    got = _numpy(criterion({"pred_logits": logits, "pred_boxes": boxes}, targets))
    log_p = np.log(_softmax(logits[0].astype("float64")))
    iou = _iou(boxes[0, 0].astype("float64"), targets["boxes"][0, 0])
    assert 0.5 < iou < 1
    expected = (-(iou * log_p[0, 0] + (1 - iou) * log_p[0, 2]) - 0.1 * log_p[1, 2]) / 1.1
    assert got["loss_ce"] == pytest.approx(expected, rel=1e-5)
    plain = _numpy(SetCriterion(2, HungarianMatcher(), eos_coef=0.1, aux_loss=False)(
        {"pred_logits": logits, "pred_boxes": boxes}, targets))
    assert plain["loss_ce"] == pytest.approx((-log_p[0, 0] - 0.1 * log_p[1, 2]) / 1.1, rel=1e-5)
    assert got["loss_bbox"] == pytest.approx(plain["loss_bbox"], rel=1e-6)
