"""RT-DETR's building blocks as Keras layers: the CSP block passes the shared layer checks
(config round trip, symbolic call, a fit step, mixed precision, .keras save/load), the 2-D
positions have their closed form, the backbone and the hybrid encoder take image sizes that
are not multiples of 32, a converted model saves and loads, and bad arguments are refused by
name. Outputs against transformers are in test_rtdetr_convert.py."""

import keras
import numpy as np
import pytest

from tfx_transformer.layers.testing import check_layer
from vision.modeling.hybrid_encoder import CSPRepLayer, HybridEncoder, sincos_positions_2d
from vision.modeling.rtdetr import RTDetr, anchors
from vision.modeling.rtdetr_backbone import RTDetrResNetBackbone
from vision.modeling.rtdetr_decoder import RTDetrDecoder

SMALL_BACKBONE = dict(depths=(1, 1, 1, 1), hidden_sizes=(16, 16, 32, 32), embedding_size=8)


def test_csp_block_is_a_well_made_keras_layer():
    x = np.random.default_rng(0).standard_normal((2, 5, 6, 8)).astype("float32")
    out = check_layer(CSPRepLayer, dict(channels=4, hidden_expansion=0.5, num_blocks=2),
                      {"x": x}, expected_output_shape=(2, 5, 6, 4))
    assert np.isfinite(out).all()


def test_sincos_positions_have_the_closed_form():
    pos = keras.ops.convert_to_numpy(sincos_positions_2d(3, 5, 8, temperature=100.0))
    omega = 100.0 ** -(np.arange(2) / 2)
    y, x = np.divmod(np.arange(15), 5)  # row-major cells
    expected = np.concatenate([np.sin(y[:, None] * omega), np.cos(y[:, None] * omega),
                               np.sin(x[:, None] * omega), np.cos(x[:, None] * omega)], -1)
    np.testing.assert_allclose(pos, expected, atol=1e-6)
    with pytest.raises(ValueError, match="`dim` must be divisible by 4"):
        sincos_positions_2d(2, 2, 6)


def test_anchors_mark_cells_outside_the_border_band_invalid():
    logits, valid = anchors([(2, 2), (1, 1)], grid_size=0.5)
    logits, valid = keras.ops.convert_to_numpy(logits), keras.ops.convert_to_numpy(valid)
    np.testing.assert_allclose(1 / (1 + np.exp(-logits[0, 0])), [0.25, 0.25, 0.5, 0.5])
    assert valid[0, :, 0].tolist() == [True] * 4 + [False]  # side 0.5 * 2 = 1: outside
    assert logits[0, 4, 0] == np.finfo("float32").max


def test_sizes_that_are_not_multiples_of_32_run_through_backbone_and_encoder():
    backbone = RTDetrResNetBackbone(**SMALL_BACKBONE)
    images = np.random.default_rng(0).standard_normal((1, 70, 45, 3)).astype("float32")
    features = backbone(images)
    shapes = [tuple(f.shape) for f in features]
    assert shapes == [(1, 9, 6, 16), (1, 5, 3, 32), (1, 3, 2, 32)]  # ceil(70 / 8), ...
    assert shapes == backbone.compute_output_shape(images.shape)
    encoder = HybridEncoder(hidden_dim=8, num_heads=2, ffn_dim=16)
    assert [tuple(x.shape) for x in encoder(features)] == [(1, 9, 6, 8), (1, 5, 3, 8),
                                                          (1, 3, 2, 8)]


def test_a_model_saves_and_loads_with_the_same_outputs(tmp_path):
    backbone = RTDetrResNetBackbone(depths=(1, 1, 1, 1), hidden_sizes=(8, 16, 32, 32),
                                    embedding_size=8, layer_type="basic", name="backbone")
    encoder = HybridEncoder(hidden_dim=8, num_heads=2, ffn_dim=16, name="encoder")
    decoder = RTDetrDecoder(2, 3, num_heads=2, ffn_dim=16, num_levels=4, num_points=2,
                            name="decoder")
    model = RTDetr(3, backbone, encoder, decoder, d_model=8, num_queries=5,
                   num_feature_levels=4)
    model.build((None, None, None, 3))
    images = np.random.default_rng(1).standard_normal((1, 64, 64, 3)).astype("float32")
    before = model(images)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    after = loaded({"images": images})
    assert before["pred_logits"].shape == (1, 5, 3) and len(before["aux_outputs"]) == 1
    for key in ("pred_logits", "pred_boxes"):
        np.testing.assert_array_equal(np.asarray(after[key]), np.asarray(before[key]))
    # The backbone's BatchNorms are frozen; the hybrid encoder's train.
    assert not any("normalization" in v.path for v in model.trainable_weights)
    assert any("fpn_blocks_0/conv1/norm/gamma" in v.path for v in model.trainable_weights)


@pytest.mark.parametrize("make, message", [
    (lambda: RTDetrResNetBackbone(layer_type="wide"), "`layer_type` must be one of"),
    (lambda: RTDetrResNetBackbone(out_indices=(5,)), "`out_indices` must be in"),
    (lambda: RTDetrResNetBackbone(depths=(1, 1), hidden_sizes=(8,)),
     "`depths` and `hidden_sizes` must have one entry per stage"),
    (lambda: HybridEncoder(num_levels=3, encode_proj_layers=(3,)),
     "`encode_proj_layers` must be levels in"),
    (lambda: RTDetr(2, RTDetrResNetBackbone(), HybridEncoder(), RTDetrDecoder(1, 2),
                    num_feature_levels=2),
     "`num_feature_levels` must be at least"),
])
def test_bad_arguments_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()
