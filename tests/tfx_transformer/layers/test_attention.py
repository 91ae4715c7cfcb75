"""Attention: parity with keras.layers.MultiHeadAttention, masks, caches, numerics, errors."""

import keras
import numpy as np
import pytest

import tfx_transformer as tt

rng = np.random.default_rng(1)
B, T, S, D, H, K = 2, 5, 7, 16, 4, 8


def _pair(query, value, **kwargs):
    """A Keras MHA and ours with identical weights."""
    keras_kwargs = dict(kwargs)
    if "output_dim" in keras_kwargs:
        keras_kwargs["output_shape"] = keras_kwargs.pop("output_dim")
    theirs = keras.layers.MultiHeadAttention(num_heads=H, key_dim=K, **keras_kwargs)
    theirs(query, value)
    ours = tt.MultiHeadAttention(num_heads=H, key_dim=K, **kwargs)
    ours(query, value)
    ours.set_weights(theirs.get_weights())
    return theirs, ours


def _masks():
    """Masks of each accepted rank, every query row keeping at least one key."""
    m = rng.random((B, H, T, S)) > 0.4
    m[..., 0] = True
    return {"(T,S)": m[0, 0], "(B,T,S)": m[:, 0], "(B,H,T,S)": m}


def test_weights_have_keras_order_and_shapes():
    q, v = rng.normal(size=(B, T, D)), rng.normal(size=(B, S, 12))
    theirs, ours = _pair(q, v, value_dim=6, output_dim=10)
    assert [w.shape for w in ours.get_weights()] == [w.shape for w in theirs.get_weights()]
    assert len(ours.get_weights()) == 8


@pytest.mark.parametrize("mask_name", [None, "(T,S)", "(B,T,S)", "(B,H,T,S)"])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_matches_keras_multi_head_attention(kind, mask_name):
    q = rng.normal(size=(B, T, D)).astype("float32")
    v = q if kind == "self" else rng.normal(size=(B, S, D)).astype("float32")
    mask = None if mask_name is None else _masks()[mask_name]
    if mask is not None and kind == "self":
        mask = mask[..., :T]
    theirs, ours = _pair(q, v)
    want, want_w = theirs(q, v, attention_mask=mask, return_attention_scores=True)
    got, got_w, _ = ours(q, v, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(got_w, want_w, atol=1e-5)


def test_output_without_weights_and_its_gradients_match_keras():
    """The path training takes (no weights returned): output and weight gradients as Keras's
    layer, and zeros for a query with no key (Keras's layer gives the mean of the values)."""
    import tensorflow as tf

    q = rng.normal(size=(B, T, D)).astype("float32")
    v = rng.normal(size=(B, S, D)).astype("float32")
    mask = _masks()["(B,T,S)"]
    mask[1, 2] = False  # query 2 of the second sequence may attend nothing
    theirs, ours = _pair(q, v)
    results = []
    for layer in (theirs, ours):
        with tf.GradientTape() as tape:
            out = layer(q, v, attention_mask=mask)
            out = out if layer is theirs else out.output
            loss = tf.reduce_sum(tf.where(mask.any(-1)[..., None], out, 0.0) ** 2)
        results.append((np.asarray(out), tape.gradient(loss, layer.trainable_variables)))
    (want, want_grads), (got, got_grads) = results
    assert np.all(got[1, 2] == 0) and np.abs(want[1, 2]).max() > 1e-3
    keep = mask.any(-1)
    np.testing.assert_allclose(got[keep], want[keep], atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


def test_matches_keras_with_causal_mask_and_padding():
    q = rng.normal(size=(B, T, D)).astype("float32")
    pad = np.ones((B, T, T), bool)
    pad[0, :, 3:] = False  # first sequence has 3 valid keys
    theirs, ours = _pair(q, q)
    want, want_w = theirs(q, q, attention_mask=pad, use_causal_mask=True,
                          return_attention_scores=True)
    got, got_w, _ = ours(q, q, attention_mask=pad, use_causal_mask=True,
                         return_attention_scores=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(got_w, want_w, atol=1e-5)
    # Causal: no weight on later positions.
    assert np.all(np.triu(np.asarray(got_w), k=1) == 0)


def test_implicit_keras_masks_match_explicit_mask():
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 1]])
    emb = keras.layers.Embedding(10, D, mask_zero=True)
    x = emb(ids)
    ours = tt.MultiHeadAttention(num_heads=H, key_dim=K)
    implicit = ours(x, x).output
    valid = ids != 0
    explicit = ours(x, x, attention_mask=valid[:, :, None] & valid[:, None, :]).output
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)


def test_scaled_dot_product_attention_equals_formula():
    q = rng.normal(size=(B, H, T, K)).astype("float32")
    k = rng.normal(size=(B, H, S, K)).astype("float32")
    v = rng.normal(size=(B, H, S, 3)).astype("float32")
    mask = _masks()["(B,H,T,S)"]
    logits = np.einsum("bhtd,bhsd->bhts", q, k) / np.sqrt(K)
    logits = np.where(mask, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out, weights = tt.scaled_dot_product_attention(q, k, v, mask=mask, return_weights=True)
    np.testing.assert_allclose(weights, w, atol=1e-6)
    np.testing.assert_allclose(out, np.einsum("bhts,bhsd->bhtd", w, v), atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fully_masked_row_gives_zeros_not_nan(dtype):
    q = keras.ops.cast(rng.normal(size=(1, 2, 3, 4)), dtype)
    v = keras.ops.cast(rng.normal(size=(1, 2, 5, 4)), dtype)
    mask = np.ones((1, 1, 3, 5), bool)
    mask[..., 1, :] = False  # query row 1 may attend nothing
    out, w = tt.scaled_dot_product_attention(q, v, v, mask=mask, return_weights=True)
    out = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
    assert np.all(np.isfinite(out))
    assert np.all(out[:, :, 1] == 0)
    assert np.all(np.abs(out[:, :, 0]) > 0)

    policy = {"float32": "float32", "float16": "mixed_float16", "bfloat16": "mixed_bfloat16"}
    layer = tt.MultiHeadAttention(num_heads=2, key_dim=4, dtype=policy[dtype])
    x = rng.normal(size=(1, 3, 8)).astype("float32")
    y = layer(x, x, attention_mask=mask[:, 0, :, :3], return_attention_scores=True).attention
    y = keras.ops.convert_to_numpy(keras.ops.cast(y, "float32"))
    assert np.all(np.isfinite(y)) and np.all(y[:, :, 1] == 0)
    # The rows that may attend equal the float32 layer's, within the precision of the policy.
    exact = tt.MultiHeadAttention(num_heads=2, key_dim=4)
    exact(x, x)
    exact.set_weights(layer.get_weights())
    want = exact(x, x, attention_mask=mask[:, 0, :, :3], return_attention_scores=True).attention
    tol = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 2e-2}[dtype]
    np.testing.assert_allclose(y, want, atol=tol)


def test_dropout_only_in_training():
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer = tt.MultiHeadAttention(num_heads=H, key_dim=K, dropout=0.5, seed=1)
    a, b = layer(x, x, training=False).output, layer(x, x, training=False).output
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(layer(x, x, training=True).output, a)


def test_seeded_dropout_on_weights_equals_keras():
    """Keras's layer drops attention weights with a SeedGenerator(seed): so do we."""
    q = rng.normal(size=(B, T, D)).astype("float32")
    theirs, ours = _pair(q, q, dropout=0.5, seed=7)
    want, want_w = theirs(q, q, return_attention_scores=True, training=True)
    got = ours(q, q, return_attention_scores=True, training=True)
    np.testing.assert_allclose(got.output, want, atol=1e-5)
    np.testing.assert_allclose(got.attention, want_w, atol=1e-6)  # weights before dropout
    assert not np.allclose(got.output, ours(q, q).output, atol=1e-3)


def test_cache_step_by_step_equals_full_pass():
    x = rng.normal(size=(B, T, D)).astype("float32")
    layer = tt.MultiHeadAttention(num_heads=H, key_dim=K)
    full = layer(x, x, use_causal_mask=True).output
    cache = np.zeros((2, B, H, T, K), "float32")  # keys then values, heads-major
    steps = []
    for t in range(T):
        out = layer(x[:, t:t + 1], x[:, t:t + 1], use_causal_mask=True,
                    cache=cache, cache_index=t)
        steps.append(out.output)
        cache = out.cache
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
    # The cache holds every position's projected keys and values, heads-major.
    np.testing.assert_allclose(cache[0], np.transpose(layer.key_dense(x), (0, 2, 1, 3)),
                               atol=1e-6)
    np.testing.assert_allclose(cache[1], np.transpose(layer.value_dense(x), (0, 2, 1, 3)),
                               atol=1e-6)


def test_precomputed_cross_cache_equals_direct_call():
    q = rng.normal(size=(B, T, D)).astype("float32")
    m = rng.normal(size=(B, S, D)).astype("float32")
    layer = tt.MultiHeadAttention(num_heads=H, key_dim=K)
    direct = layer(q, m).output
    cache = layer.compute_cache(m)
    out = layer(q, m, cache=cache)
    np.testing.assert_allclose(out.output, direct, atol=1e-6)
    np.testing.assert_array_equal(out.cache, cache)  # returned unchanged


@pytest.mark.parametrize("index", [T, T + 3, -1])
def test_python_cache_index_outside_the_cache_raises(index):
    layer = tt.MultiHeadAttention(num_heads=H, key_dim=K)
    x = rng.normal(size=(B, 1, D)).astype("float32")
    cache = np.zeros((2, B, H, T, K), "float32")
    layer(x, x, cache=cache, cache_index=T - 1)  # the last slot is fine
    with pytest.raises(ValueError, match=f"cache_index={index}"):
        layer(x, x, cache=cache, cache_index=index)
    with pytest.raises(ValueError, match="cache_index"):  # two new steps from the last slot
        layer(np.concatenate([x, x], 1), np.concatenate([x, x], 1), cache=cache,
              cache_index=T - 1)


def test_float16_scores_beyond_float16_range_stay_finite():
    """q·k/√d = 160,000 overflows float16 (max 65504); the scores are formed in float32."""
    q = np.full((1, 1, 2, 16), 200.0, "float32")  # q·k = 16 · 200² = 640,000; /√16 = 160,000
    k = np.stack([np.full(16, 200.0), np.full(16, 199.0), np.full(16, -200.0)])[None, None]
    v = rng.normal(size=(1, 1, 3, 4)).astype("float32")
    want, want_w = tt.scaled_dot_product_attention(q, k, v, return_weights=True)
    np.testing.assert_allclose(want_w[..., 0], 1.0)  # the score gap (800) is decisive
    half = [keras.ops.cast(a, "float16") for a in (q, k, v)]
    got, got_w = tt.scaled_dot_product_attention(*half, return_weights=True)
    assert keras.backend.standardize_dtype(got.dtype) == "float16"
    got = keras.ops.convert_to_numpy(keras.ops.cast(got, "float32"))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)  # float16 precision of v
    np.testing.assert_allclose(keras.ops.cast(got_w, "float32"), want_w, atol=1e-3)

    # The layer under mixed_float16, with identity projections: the same attention.
    layer = tt.MultiHeadAttention(num_heads=1, key_dim=16, dtype="mixed_float16")
    x = np.concatenate([q[0, 0], k[0, 0, 2:]], 0)[None]  # (1, 3, 16) queries = keys = x
    layer(x, x)
    eye = np.eye(16, dtype="float32")
    layer.set_weights([eye[:, None], np.zeros((1, 16)), eye[:, None], np.zeros((1, 16)),
                       eye[:, None], np.zeros((1, 16)), eye[None], np.zeros(16)])
    out = layer(x, x, return_attention_scores=True)
    weights = keras.ops.convert_to_numpy(keras.ops.cast(out.attention, "float32"))[0, 0]
    # Rows 0 and 1 (score 160,000 with keys 0 and 1, -160,000 with key 2) split evenly.
    np.testing.assert_allclose(weights[:2], [[0.5, 0.5, 0.0]] * 2, atol=1e-3)
    np.testing.assert_allclose(weights[2], [0.0, 0.0, 1.0], atol=1e-3)
    output = keras.ops.convert_to_numpy(keras.ops.cast(out.output, "float32"))
    assert np.all(np.isfinite(output))
    np.testing.assert_allclose(output[0, :2], np.full((2, 16), 200.0), rtol=1e-3)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="num_heads"):
        tt.MultiHeadAttention(num_heads=0, key_dim=4)
    with pytest.raises(ValueError, match="num_heads"):
        tt.TransformerEncoderLayer(num_heads=-2, hidden_dim=8)
    layer = tt.MultiHeadAttention(num_heads=2, key_dim=4)
    q = rng.normal(size=(B, T, D)).astype("float32")
    with pytest.raises(ValueError, match="key"):
        layer(q, rng.normal(size=(B, S, D)), key=rng.normal(size=(B, S + 1, D)))
    with pytest.raises(ValueError, match="attention_mask"):
        layer(q, q, attention_mask=np.ones((T,), bool))
    with pytest.raises(ValueError, match="attention_mask"):
        layer(q, q, attention_mask=np.ones((1, 1, 1, T, T), bool))
    with pytest.raises(ValueError, match="mask"):
        tt.scaled_dot_product_attention(
            np.ones((1, 1, 2, 4)), np.ones((1, 1, 3, 4)), np.ones((1, 1, 3, 4)),
            mask=np.ones((3,), bool),
        )
    with pytest.raises(ValueError, match="divisible by `num_heads`"):
        tt.TransformerEncoderLayer(num_heads=3, hidden_dim=8)(q)
