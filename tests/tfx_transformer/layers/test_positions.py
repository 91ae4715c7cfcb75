"""Position encodings against their formulas, computed independently with NumPy."""

import math

import keras
import numpy as np
import pytest

import tfx_transformer as tt


def _paper_table(length, d):
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)), loop by loop."""
    pe = np.zeros((length, d))
    for p in range(length):
        for i in range(d // 2):
            pe[p, 2 * i] = math.sin(p / 10000 ** (2 * i / d))
            pe[p, 2 * i + 1] = math.cos(p / 10000 ** (2 * i / d))
    return pe


def test_sinusoidal_interleaved_equals_paper():
    x = np.zeros((2, 50, 32), "float32")
    got = np.asarray(tt.SinusoidalPositionEncoding()(x))
    np.testing.assert_allclose(got[1], _paper_table(50, 32), atol=1e-5)


def test_sinusoidal_concat_is_sines_then_cosines():
    x = np.zeros((1, 50, 32), "float32")
    got = np.asarray(tt.SinusoidalPositionEncoding(layout="concat")(x))[0]
    paper = _paper_table(50, 32)
    np.testing.assert_allclose(got[:, :16], paper[:, 0::2], atol=1e-5)
    np.testing.assert_allclose(got[:, 16:], paper[:, 1::2], atol=1e-5)


def test_sinusoidal_start_index_shifts_positions():
    x = np.zeros((1, 3, 8), "float32")
    got = np.asarray(tt.SinusoidalPositionEncoding()(x, start_index=7))[0]
    np.testing.assert_allclose(got, _paper_table(10, 8)[7:], atol=1e-5)


def test_sinusoidal_rejects_bad_arguments():
    with pytest.raises(ValueError, match="layout"):
        tt.SinusoidalPositionEncoding(layout="stacked")
    with pytest.raises(ValueError, match="max_length"):
        tt.SinusoidalPositionEncoding(max_length=4)(np.zeros((1, 5, 8)))


def test_learned_position_embedding_slices_its_table():
    layer = tt.LearnedPositionEmbedding(max_length=10)
    x = np.zeros((2, 4, 6), "float32")
    out = np.asarray(layer(x, start_index=3))
    table = np.asarray(layer.embeddings)
    np.testing.assert_allclose(out[0], table[3:7])
    np.testing.assert_allclose(out[1], table[3:7])


def _detr_sine(valid, num_pos_feats, temperature=10000.0, scale=2 * math.pi):
    """facebookresearch/detr PositionEmbeddingSine, NumPy, channels last."""
    not_mask = valid.astype("float64")
    y = not_mask.cumsum(1)
    x = not_mask.cumsum(2)
    eps = 1e-6
    y = y / (y[:, -1:, :] + eps) * scale
    x = x / (x[:, :, -1:] + eps) * scale
    dim_t = np.arange(num_pos_feats, dtype="float64")
    dim_t = temperature ** (2 * (dim_t // 2) / num_pos_feats)
    px, py = x[..., None] / dim_t, y[..., None] / dim_t
    px = np.stack([np.sin(px[..., 0::2]), np.cos(px[..., 1::2])], axis=4).reshape(*x.shape, -1)
    py = np.stack([np.sin(py[..., 0::2]), np.cos(py[..., 1::2])], axis=4).reshape(*y.shape, -1)
    return np.concatenate([py, px], axis=-1)


def test_sine_2d_equals_detr_on_differently_padded_images():
    valid = np.zeros((3, 6, 9), bool)
    valid[0] = True  # full image
    valid[1, :4, :5] = True  # smaller image padded bottom/right
    valid[2, :6, :2] = True  # narrow image
    got = np.asarray(tt.SinePositionEmbedding2D(num_pos_feats=16)(valid))
    want = _detr_sine(valid, 16)
    assert got.shape == (3, 6, 9, 32)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_sine_2d_unnormalised():
    valid = np.ones((1, 3, 4), bool)
    got = np.asarray(tt.SinePositionEmbedding2D(num_pos_feats=4, normalize=False)(valid))
    # y feature 0 at row r is sin(r + 1): cumulative count, no normalisation.
    np.testing.assert_allclose(got[0, :, 0, 0], np.sin([1.0, 2.0, 3.0]), atol=1e-6)
    np.testing.assert_allclose(got[0, 0, :, 4], np.sin([1.0, 2.0, 3.0, 4.0]), atol=1e-6)


@pytest.mark.parametrize("policy,tol", [("mixed_float16", 1e-3), ("mixed_bfloat16", 1e-2)])
def test_sine_2d_under_mixed_precision_equals_float32(policy, tol):
    """Values in [-1, 1]: float16 keeps ~3 decimal digits, bfloat16 ~2 (stated tolerances)."""
    valid = np.zeros((2, 5, 6), bool)
    valid[0] = True
    valid[1, :3, :4] = True
    out = tt.SinePositionEmbedding2D(num_pos_feats=8, dtype=policy)(valid)
    assert keras.backend.standardize_dtype(out.dtype) == keras.DTypePolicy(policy).compute_dtype
    want = np.asarray(tt.SinePositionEmbedding2D(num_pos_feats=8)(valid))
    got = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
    np.testing.assert_allclose(got, want, atol=tol)
    np.testing.assert_allclose(want, _detr_sine(valid, 8), atol=1e-5)


def test_add_position():
    x, pos = np.ones((2, 3, 4), "float32"), np.arange(12.0).reshape(3, 4)
    assert tt.add_position(x, None) is x
    np.testing.assert_allclose(tt.add_position(x, pos), x + pos)
    half = tt.add_position(keras.ops.cast(x, "float16"), pos)  # pos follows x's dtype
    assert keras.backend.standardize_dtype(half.dtype) == "float16"
