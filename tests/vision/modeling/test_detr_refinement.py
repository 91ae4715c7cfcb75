"""Tests of the decoder side of DETR (`vision.modeling.refinement`): static references, iterative
box refinement, the cross-attention window."""

import keras
import numpy as np
import pytest
from keras import ops

from tfx_transformer import TransformerDecoder
from vision.config import preset
from vision.modeling.detr import build_model
from vision.modeling.geometry import near_points
from vision.modeling.heads import MLP
from vision.modeling.queries import ReferenceQueries, TwoStageQueries
from vision.modeling.refinement import IterativeRefinement, StaticReferences, make_box_decoding

NUM_CLASSES = 3
SMALL = dict(hidden_dim=32, num_heads=4, ffn_dim=64, num_queries=6, tiny_filters=(8, 16, 16, 32))
D, Q, H, W = 16, 5, 3, 4


def _numpy(outputs):
    return keras.tree.map_structure(keras.ops.convert_to_numpy, outputs)


def _inputs(rng, batch=2, height=64, width=80):
    images = rng.normal(size=(batch, height, width, 3)).astype("float32")
    return {"images": images, "mask": np.ones((batch, height, width), bool)}


def _parts(queries_class):
    """A decoder, a box head and a query layer, with an encoded 3 x 4 map (second image 3 x 2)."""
    decoder = TransformerDecoder(3, num_heads=2, hidden_dim=32, dropout=0.0,
                                 return_intermediate=True, final_norm=True)
    decoder.build((None, Q, D), (None, None, D))
    box_head = MLP(D, D, 4, 3)
    box_head.build((None, D))
    queries = queries_class(Q, D, NUM_CLASSES)
    queries.build((None, None, D))
    rng = np.random.default_rng(0)
    memory = rng.normal(size=(2, H * W, D)).astype("float32")
    memory_pos = rng.normal(size=(2, H * W, D)).astype("float32")
    valid = np.ones((2, H, W), bool)
    valid[1, :, 2:] = False
    return decoder, box_head, queries, memory, memory_pos, valid


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("radius", [None, 0.4])
def test_static_references_are_the_stack_plus_the_box_offsets(radius):
    decoder, box_head, queries, memory, memory_pos, valid = _parts(ReferenceQueries)
    start = queries(memory, valid)
    got = _numpy(StaticReferences(radius)(decoder, box_head, queries, start, memory,
                                          memory_pos, valid, return_cross_attention=True))
    if radius is None:
        mask = valid.reshape(2, -1)  # (B, S)
    else:
        mask = near_points(valid, ops.sigmoid(start.reference), radius)  # (B, Q, S)
    stack = decoder(start.content, memory, memory_mask=mask, query_pos=start.position,
                    memory_pos=memory_pos, return_cross_attention=True)
    hidden = ops.convert_to_numpy(stack.output)  # (L, B, Q, D)
    offsets = np.pad(ops.convert_to_numpy(start.reference), [(0, 0), (0, 0), (0, 2)])
    boxes = _sigmoid(ops.convert_to_numpy(box_head(hidden)) + offsets)  # centres shifted only
    np.testing.assert_allclose(got.hidden, hidden, atol=1e-6)
    np.testing.assert_allclose(got.boxes, boxes, atol=1e-6)
    np.testing.assert_allclose(got.attention, ops.convert_to_numpy(stack.attention), atol=1e-6)


def test_iterative_refinement_equals_a_hand_written_loop():
    decoder, box_head, queries, memory, memory_pos, valid = _parts(TwoStageQueries)
    start = queries(memory, valid)
    radius = 0.4
    got = _numpy(IterativeRefinement(radius)(decoder, box_head, queries, start, memory,
                                             memory_pos, valid, return_cross_attention=True))
    # By hand: each layer positioned by the previous layer's boxes, its box an offset of them.
    x, reference = start.content, ops.convert_to_numpy(start.reference)  # (B, Q, 4) logits
    # Cell centres in the valid frame of each image (padded cells are masked out below).
    cx = (np.arange(W) + 0.5)[None, None, :] / np.maximum(valid.sum(2, keepdims=True), 1)
    cy = (np.arange(H) + 0.5)[None, :, None] / np.maximum(valid.sum(1, keepdims=True), 1)
    for i, layer in enumerate(decoder.layers):
        points = _sigmoid(reference)
        window = ((np.abs(cx.reshape(2, 1, -1) - points[..., :1]) <= radius)
                  & (np.abs(cy.reshape(2, 1, -1) - points[..., 1:2]) <= radius)
                  & valid.reshape(2, 1, -1))  # (B, Q, S)
        position = queries.embed(ops.convert_to_tensor(points))
        out = layer(x, memory, memory_mask=window, query_pos=position, memory_pos=memory_pos,
                    return_cross_attention=True)
        x = out.output
        hidden = ops.convert_to_numpy(decoder.normalize(x))
        box = ops.convert_to_numpy(box_head(hidden)) + reference
        np.testing.assert_allclose(got.hidden[i], hidden, atol=1e-5, err_msg=f"layer {i}")
        np.testing.assert_allclose(got.boxes[i], _sigmoid(box), atol=1e-5, err_msg=f"layer {i}")
        np.testing.assert_allclose(got.attention[i], ops.convert_to_numpy(out.attention),
                                   atol=1e-5)
        reference = box
    # The boxes move from layer to layer (the comparison is not of constants).
    assert not np.allclose(got.boxes[0], got.boxes[-1], atol=1e-3)
    assert IterativeRefinement()(decoder, box_head, queries, start, memory, memory_pos,
                                 valid).attention is None


def test_box_decoding_checks_what_the_queries_offer():
    assert type(make_box_decoding(True, 0.3, 4)) is IterativeRefinement
    assert type(make_box_decoding(False, None, 0)) is StaticReferences
    assert make_box_decoding(False, 1, 2).attention_radius == 1.0
    with pytest.raises(ValueError, match="box_refinement=True, query_type='reference'"):
        make_box_decoding(True, None, 2, "reference")
    with pytest.raises(ValueError, match="attention_radius=0.5, query_type='learned'"):
        make_box_decoding(False, 0.5, 0, "learned")
    with pytest.raises(ValueError, match="box_refinement"):
        make_box_decoding("yes", None, 4)


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
    for v in (model.box_head.layers[-1].kernel, model.box_head.layers[-1].bias):
        v.assign(keras.ops.zeros_like(v))
    result = model.forward(inputs, return_cross_attention=True)
    weights = keras.ops.convert_to_numpy(result.cross_attention)  # (L, B, heads, Q, S)
    h, w = (int(v) for v in result.feature_size)
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


def test_box_refinement_adds_each_layer_offset_to_the_previous_boxes():
    config = preset("tiny", **SMALL, query_type="encoder", box_refinement=True)
    model = build_model(config, NUM_CLASSES)
    inputs = _inputs(np.random.default_rng(7))
    plain = build_model(preset("tiny", **SMALL, box_refinement=False), NUM_CLASSES)
    plain.set_weights(model.get_weights())  # same weights, no refinement
    offset = np.array([0.3, -0.2, 0.1, 0.25], "float32")
    for m in (model, plain):  # every layer predicts the same logit offset
        m.box_head.layers[-1].kernel.assign(np.zeros(m.box_head.layers[-1].kernel.shape, "float32"))
        m.box_head.layers[-1].bias.assign(offset)
    outputs = _numpy(model(inputs))
    proposals = _numpy(plain(inputs))["pred_boxes"]  # sigmoid(proposal + offset)
    start = np.log(proposals / (1 - proposals)) - offset  # the chosen proposals' logits
    layers = [aux["pred_boxes"] for aux in outputs["aux_outputs"]] + [outputs["pred_boxes"]]
    for i, boxes in enumerate(layers):  # layer i: sigmoid(proposal + (i + 1) * offset)
        expected = 1 / (1 + np.exp(-(start + (i + 1) * offset)))
        np.testing.assert_allclose(boxes, expected, atol=1e-4)


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
