"""Tests of the contrastive denoising queries (`vision.modeling.denoising`) and their loss."""

import keras
import numpy as np
import pytest
from keras import ops

from vision.config import preset
from vision.matching.losses import SetCriterion
from vision.matching.matcher import HungarianMatcher
from vision.modeling.denoising import ContrastiveDenoising, RTDetrDenoising
from vision.modeling.detr import build_model
from vision.modeling.queries import QueryOutput

NUM_CLASSES = 4
SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32))


def _numpy(outputs):
    return keras.tree.map_structure(ops.convert_to_numpy, outputs)


def _xyxy(b):
    return np.concatenate([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)


def _targets(rng, batch=64, slots=3):
    centres = rng.uniform(0.35, 0.65, (batch, slots, 2))
    sizes = rng.uniform(0.05, 0.2, (batch, slots, 2))  # boxes and their noise stay inside
    valid = np.ones((batch, slots), bool)
    valid[:, 2] = False
    return {"labels": rng.integers(0, NUM_CLASSES, (batch, slots)),
            "boxes": np.concatenate([centres, sizes], -1).astype("float32"), "valid": valid}


def test_positives_move_within_the_noise_scale_negatives_beyond_it_labels_flip_at_half_rate():
    rng = np.random.default_rng(0)
    targets, groups, scale = _targets(rng), 4, 0.8
    layer = ContrastiveDenoising(groups, NUM_CLASSES, 8, label_noise=0.5, box_noise=scale,
                                 seed=1)
    layer.build()
    content, reference, meta = _numpy(layer(ops.convert_to_tensor(targets["labels"]),
                                            targets["boxes"], targets["valid"]))
    m = targets["labels"].shape[1]
    assert content.shape == (64, 2 * groups * m, 8) and reference.shape == (64, 2 * groups * m, 4)
    # Group by group: the M positives, then the M negatives, each a copy of the targets.
    positive = np.tile(np.arange(2 * m) < m, groups)
    np.testing.assert_array_equal(meta["labels"], np.tile(targets["labels"], (1, 2 * groups)))
    np.testing.assert_array_equal(meta["valid"], np.tile(targets["valid"], (1, 2 * groups)))
    np.testing.assert_array_equal(meta["positive"], np.broadcast_to(positive, (64, 2 * groups * m))
                                  & meta["valid"])  # a padding slot's query is no positive
    boxes = np.tile(targets["boxes"], (1, 2 * groups, 1))
    noised = 1 / (1 + np.exp(-reference.astype("float64")))
    half = np.concatenate([boxes[..., 2:], boxes[..., 2:]], -1) / 2
    moved = np.abs(_xyxy(noised) - _xyxy(boxes)) / (half * scale)  # per corner coordinate
    assert moved[:, positive].max() < 1.0 + 1e-3
    # A negative's corners may cross (a box of no size, clamped as DINO's): the others.
    kept = (noised[..., 2:] > 2e-3).all(-1)[:, ~positive]
    assert kept.mean() > 0.5
    negative = moved[:, ~positive][kept]
    assert negative.min() > 1.0 - 1e-3 and negative.max() < 2.0 + 1e-3
    # The content is the embedding of a label: the target's, or a random one at rate 1/4.
    table = layer.label_embed.numpy()
    labels = np.argmin(((content[..., None, :] - table) ** 2).sum(-1), axis=-1)
    np.testing.assert_allclose(content, table[labels], rtol=1e-6)
    changed = np.mean(labels != meta["labels"])
    assert 0.25 * 0.75 - 0.04 < changed < 0.25 * 0.75 + 0.04  # a random label may be the same


def test_the_matching_queries_do_not_see_the_denoising_ones_nor_groups_each_other():
    rng = np.random.default_rng(1)
    targets = _targets(rng, batch=2)
    targets["valid"][1, 1] = False  # image 1 has one object, image 0 two
    layer = ContrastiveDenoising(2, NUM_CLASSES, 8, seed=0)
    layer.build()

    class Queries:
        @staticmethod
        def embed(boxes):
            return ops.zeros(ops.shape(boxes)[:2] + (8,))

    start = QueryOutput(np.zeros((2, 5, 8), "float32"), np.zeros((2, 5, 8), "float32"),
                        np.zeros((2, 5, 4), "float32"), {})
    combined, meta = layer.extend(start, targets, Queries(), training=True)
    mask = _numpy(combined.self_attention_mask)
    # The batch has at most two objects an image: 2 groups x 2 x 2 queries.
    assert mask.shape == (2, 13, 13) and meta["matching"] == 5
    assert mask[:, :5, :5].all() and not mask[:, :5, 5:].any()
    assert mask[:, 5:, :5].all()
    group = np.arange(8) // 4
    same_group = group[:, None] == group[None]
    np.testing.assert_array_equal(mask[0, 5:, 5:], same_group)
    key_valid = np.tile([True, False], 4)  # image 1's second slot is padding
    np.testing.assert_array_equal(mask[1, 5:, 5:], same_group & key_valid[None])
    same, none = layer.extend(start, targets, Queries(), training=False)
    assert none is None and same is start


def test_denoising_queries_leave_the_matching_predictions_unchanged():
    # The LayerNorm backbone: BatchNorm's training statistics would differ from the inference's.
    config = preset("tiny", **SMALL, dropout=0.0, tiny_norm="layer", denoising_groups=2,
                    one_to_many_queries=4)
    model = build_model(config, NUM_CLASSES)
    rng = np.random.default_rng(0)
    targets = {key: value[:2] for key, value in _targets(rng).items()}
    inputs = {"images": rng.normal(size=(2, 64, 80, 3)).astype("float32"),
              "mask": np.ones((2, 64, 80), bool), "targets": targets}
    train, infer = _numpy(model(inputs, training=True)), _numpy(model(inputs, training=False))
    assert "denoising" not in infer
    for key in ("pred_logits", "pred_boxes"):
        np.testing.assert_allclose(train[key], infer[key], rtol=1e-4, atol=1e-5)
        assert train["one_to_many"][key].shape[1] == 4
        assert train["denoising"][key].shape[1] == 2 * 2 * 2  # 2 groups, 2 target slots
    config_back = type(model).from_config(model.get_config())
    assert config_back.denoising.groups == 2


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _giou(a, b):
    a, b = _xyxy(a), _xyxy(b)
    inter = np.prod(np.clip(np.minimum(a[..., 2:], b[..., 2:])
                            - np.maximum(a[..., :2], b[..., :2]), 0, None), -1)
    union = np.prod(a[..., 2:] - a[..., :2], -1) + np.prod(b[..., 2:] - b[..., :2], -1) - inter
    hull = np.prod(np.maximum(a[..., 2:], b[..., 2:]) - np.minimum(a[..., :2], b[..., :2]), -1)
    return inter / union - (hull - union) / hull


def test_the_denoising_loss_reconstructs_positives_and_rejects_negatives_without_matching():
    rng = np.random.default_rng(2)
    targets, groups, eos = _targets(rng, batch=2), 2, 0.1
    n = 2 * groups * 3
    layer = {"pred_logits": rng.normal(size=(2, n, NUM_CLASSES + 1)).astype("float32"),
             "pred_boxes": np.tile(targets["boxes"], (1, 2 * groups, 1))
             + rng.uniform(-0.03, 0.03, (2, n, 4)).astype("float32"),
             "labels": np.tile(targets["labels"], (1, 2 * groups)),
             "boxes": np.tile(targets["boxes"], (1, 2 * groups, 1)),
             "positive": np.broadcast_to(np.tile(np.arange(6) < 3, groups), (2, n)),
             "valid": np.tile(targets["valid"], (1, 2 * groups)), "groups": np.float32(groups)}
    outputs = {"pred_logits": np.zeros((2, 6, NUM_CLASSES + 1), "float32"),
               "pred_boxes": np.full((2, 6, 4), 0.5, "float32"), "denoising": layer}
    got = _numpy(SetCriterion(NUM_CLASSES, HungarianMatcher(), eos_coef=eos)(outputs, targets))
    positive = layer["positive"] & layer["valid"]
    target = np.where(positive, layer["labels"], NUM_CLASSES)
    nll = -np.take_along_axis(_log_softmax(layer["pred_logits"].astype("float64")),
                              target[..., None], -1)[..., 0]
    weights = np.where(positive, 1.0, eos) * layer["valid"]
    num_boxes = targets["valid"].sum() * groups
    l1 = np.abs(layer["pred_boxes"] - layer["boxes"]).sum(-1)
    giou = _giou(layer["pred_boxes"].astype("float64"), layer["boxes"])
    assert got["loss_ce_dn"] == pytest.approx((weights * nll).sum() / weights.sum(), rel=1e-5)
    assert got["loss_bbox_dn"] == pytest.approx(l1[positive].sum() / num_boxes, rel=1e-5)
    assert got["loss_giou_dn"] == pytest.approx((1 - giou[positive]).sum() / num_boxes,
                                                rel=1e-5)
    without = _numpy(SetCriterion(NUM_CLASSES, HungarianMatcher(), eos_coef=eos)(
        {k: v for k, v in outputs.items() if k != "denoising"}, targets))
    assert got["loss"] == pytest.approx(without["loss"] + got["loss_ce_dn"]
                                        + 5 * got["loss_bbox_dn"] + 2 * got["loss_giou_dn"],
                                        rel=1e-5)


def test_denoising_needs_reference_boxes():
    with pytest.raises(ValueError, match="denoising_groups"):
        preset("tiny-detr", denoising_groups=2)


@pytest.mark.parametrize("make", [
    lambda: ContrastiveDenoising(2, NUM_CLASSES, 8, seed=0, dtype="mixed_bfloat16"),
    lambda: RTDetrDenoising(6, NUM_CLASSES, 8, seed=0, dtype="mixed_bfloat16")])
def test_under_mixed_precision_the_boxes_stay_float32_and_the_content_is_bfloat16(make):
    targets = _targets(np.random.default_rng(2), batch=2)
    layer = make()
    layer.build()
    content, reference, meta = layer(ops.convert_to_tensor(targets["labels"]),
                                     targets["boxes"], targets["valid"])
    assert keras.backend.standardize_dtype(content.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(reference.dtype) == "float32"
    copies = ops.shape(meta["labels"])[1] // targets["labels"].shape[1]
    # The targets the loss compares with, exactly (not rounded to bfloat16's 8 bits).
    np.testing.assert_array_equal(ops.convert_to_numpy(meta["boxes"]),
                                  np.tile(targets["boxes"], (1, copies, 1)))
    assert type(layer).from_config(layer.get_config()).autocast is False  # as saved
