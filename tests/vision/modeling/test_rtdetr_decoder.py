"""`vision.modeling.rtdetr_decoder` against transformers' ``RTDetrDecoder`` at random weights.

reference_rtdetr_decoder.py runs transformers' decoder (with the per-layer class and box heads
of ``RTDetrForObjectDetection``, every weight and LayerNorm randomized, a denoising-style
self-attention mask) in a process of its own; its state, mapped by `transformers_arrays`,
must give every layer's logits and boxes within 1e-4.
"""

import json

import keras
import numpy as np
import pytest

from tfx_transformer.layers.testing import check_layer
from vision.modeling.rtdetr_decoder import (
    RTDetrDecoder,
    RTDetrDecoderLayer,
    build_decoder,
    transformers_arrays,
)

# The tests reading the reference stay on one worker, which runs it once.
pytestmark = pytest.mark.xdist_group("torch_reference")
SETTINGS = {"decoder": dict(num_layers=3, num_heads=4, ffn_dim=64, num_points=2, num_levels=3,
                            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                            activation="relu", layer_norm_epsilon=1e-5)}
SHAPES = [(4, 6), (2, 3), (1, 2)]
LENGTH = sum(h * w for h, w in SHAPES)


@pytest.fixture(scope="module")
def reference(torch_references):
    path = torch_references["rtdetr_decoder"]  # reference_rtdetr_decoder.py's arrays
    arrays = dict(np.load(path))
    state = {k: v for k, v in arrays.items() if k.startswith("model.decoder.")}
    return state, {k: v for k, v in arrays.items() if k not in state}


def converted(state):
    """The decoder of ``SETTINGS`` with ``state``'s weights; checks that every tensor is read
    and every weight given."""
    decoder = build_decoder(SETTINGS, num_classes=5)
    decoder.build((None, None, 32), (None, None, 32))
    used = set()
    arrays = transformers_arrays(state, SETTINGS["decoder"], used)
    assert used == set(state)
    assert set(arrays) == {v.path for v in decoder.weights}
    for variable in decoder.weights:
        variable.assign(arrays[variable.path])
    return decoder


def run(decoder, inputs, mask=True):
    batch, queries = inputs["target"].shape[:2]
    allowed = np.broadcast_to(inputs["attention_mask"], (batch, queries, queries))
    logits, boxes = decoder(inputs["target"], inputs["memory"], inputs["reference_logits"],
                            spatial_shapes=[tuple(map(int, s)) for s in inputs["spatial_shapes"]],
                            self_attention_mask=allowed if mask else None)
    return np.asarray(logits), np.asarray(boxes)


def test_every_layer_matches_transformers_rtdetr_decoder(reference):
    state, inputs = reference
    logits, boxes = run(converted(state), inputs)
    np.testing.assert_allclose(logits, inputs["intermediate_logits"], atol=1e-4)
    np.testing.assert_allclose(boxes, inputs["intermediate_reference_points"], atol=1e-4)
    # The comparison can fail: without the denoising mask the outputs are others.
    logits, boxes = run(converted(state), inputs, mask=False)
    assert np.abs(logits - inputs["intermediate_logits"]).max() > 1e-2


def test_published_names_give_the_same_arrays(reference):
    """``self_attn.out_proj``, ``fc1``/``fc2`` and top-level ``class_embed``/``bbox_embed``
    (the published files' names) map as transformers v5's names do."""
    state, _ = reference
    published = {}
    for name, value in state.items():
        name = name.replace(".o_proj.", ".out_proj.").replace(".mlp.fc", ".fc")
        if ".class_embed." in name or ".bbox_embed." in name:
            name = name[len("model.decoder."):]
        published[name] = value
    used = set()
    arrays = transformers_arrays(published, SETTINGS["decoder"], used)
    want = transformers_arrays(state, SETTINGS["decoder"], set())
    assert used == set(published) and arrays.keys() == want.keys()
    assert all(np.array_equal(arrays[k], want[k]) for k in want)
    with pytest.raises(KeyError, match="final_layer_norm"):
        transformers_arrays({k: v for k, v in state.items() if "final_layer_norm" not in k},
                            SETTINGS["decoder"], set())


def _inputs(rng, batch=2, queries=5, d=16):
    return (rng.normal(size=(batch, queries, d)).astype("float32"),
            rng.normal(size=(batch, LENGTH, d)).astype("float32"),
            rng.normal(size=(batch, queries, 4)).astype("float32"))


def test_a_new_decoder_starts_each_layer_from_its_reference_box():
    """transformers' initialization: zero last box layer (boxes = sigmoid of the references
    in every layer), class bias of prior 1 / (C + 1)."""
    rng = np.random.default_rng(0)
    target, memory, reference_logits = _inputs(rng)
    decoder = RTDetrDecoder(2, num_classes=3, num_heads=2, ffn_dim=32, num_points=2)
    logits, boxes = decoder(target, memory, reference_logits, spatial_shapes=SHAPES)
    assert logits.shape == (2, 2, 5, 3) and boxes.shape == (2, 2, 5, 4)
    sigmoid = 1 / (1 + np.exp(-reference_logits))
    np.testing.assert_allclose(np.asarray(boxes), np.broadcast_to(sigmoid[:, None], boxes.shape),
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(decoder.class_heads[0].bias), -np.log(3.0), atol=1e-6)


def test_decoder_layer_contract():
    rng = np.random.default_rng(1)
    target, memory, reference_logits = _inputs(rng)
    boxes = (1 / (1 + np.exp(-reference_logits)))[:, :, None, :].astype("float32")
    check_layer(RTDetrDecoderLayer, dict(num_heads=2, hidden_dim=32, num_points=2),
                {"x": target, "memory": memory, "reference_points": boxes,
                 "query_pos": rng.normal(size=target.shape).astype("float32"),
                 "self_attention_mask": rng.uniform(size=(2, 5, 5)) > 0.3},
                {"spatial_shapes": SHAPES}, expected_output_shape=target.shape,
                run_mixed_precision=False)  # the decoder's is checked below


def test_decoder_saves_and_runs_under_mixed_precision(tmp_path):
    rng = np.random.default_rng(2)
    target, memory, reference_logits = _inputs(rng)
    kwargs = dict(num_layers=2, num_classes=3, num_heads=2, ffn_dim=32, num_points=2)
    config = RTDetrDecoder(**kwargs).get_config()
    assert RTDetrDecoder.from_config(json.loads(json.dumps(config))).get_config() == config
    inputs = [keras.Input((5, 16)), keras.Input((LENGTH, 16)), keras.Input((5, 4))]
    model = keras.Model(inputs, RTDetrDecoder(**kwargs)(*inputs, spatial_shapes=SHAPES))
    for weight in model.weights:  # no zero box layer: the refinement must reload too
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.3)
    want = model((target, memory, reference_logits))
    model.save(tmp_path / "decoder.keras")
    got = keras.saving.load_model(tmp_path / "decoder.keras")((target, memory, reference_logits))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    mixed = RTDetrDecoder(**kwargs, dtype="mixed_bfloat16")
    mixed(target, memory, reference_logits, spatial_shapes=SHAPES)
    mixed.set_weights(model.layers[-1].get_weights())
    logits, boxes = mixed(target, memory, reference_logits, spatial_shapes=SHAPES)
    assert keras.backend.standardize_dtype(boxes.dtype) == "float32"
    assert keras.backend.standardize_dtype(logits.dtype) == "bfloat16"
    assert np.all(np.isfinite(np.asarray(boxes)))
    np.testing.assert_allclose(np.asarray(boxes), np.asarray(want[1]), atol=0.05)
