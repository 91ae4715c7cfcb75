"""Encoder/decoder layers and stacks: wiring, causality, caches, positions, intermediates."""

import keras
import numpy as np
import pytest

import tfx_transformer as tt

rng = np.random.default_rng(2)
B, T, S, D = 2, 6, 5, 16
KW = dict(num_heads=4, hidden_dim=32, dropout=0.0)


def _x(*shape):
    return rng.normal(size=shape).astype("float32")


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_written_out_composition(norm_first):
    x, pos = _x(B, S, D), _x(B, S, D)
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    layer = tt.TransformerEncoderLayer(**KW, norm_first=norm_first)
    got = layer(x, padding_mask=valid, pos=pos)
    mask = valid[:, None, :]
    attn, ffn = layer.self_attention, layer.feedforward
    n1, n2 = layer.self_attention_norm, layer.feedforward_norm
    if norm_first:
        h = n1(x)
        y = x + attn(h + pos, h, h + pos, attention_mask=mask)
        want = y + ffn(n2(y))
    else:
        y = n1(x + attn(x + pos, x, x + pos, attention_mask=mask))
        want = n2(y + ffn(y))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # The two placements really differ.
    other = tt.TransformerEncoderLayer(**KW, norm_first=not norm_first)
    other(x)
    other.set_weights(layer.get_weights())
    assert not np.allclose(other(x, padding_mask=valid, pos=pos), got, atol=1e-3)


def test_encoder_ignores_padded_positions():
    x = _x(B, S, D)
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    enc = tt.TransformerEncoder(2, **KW)
    a = np.asarray(enc(x, padding_mask=valid))
    x2 = x.copy()
    x2[0, 3:] = 100.0  # change only padded positions
    b = np.asarray(enc(x2, padding_mask=valid))
    np.testing.assert_allclose(a[0, :3], b[0, :3], atol=1e-5)
    np.testing.assert_allclose(a[1], b[1], atol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_query_and_memory_pos_change_q_and_k_only(norm_first):
    x, mem, qp, mp = _x(B, T, D), _x(B, S, D), _x(B, T, D), _x(B, S, D)
    layer = tt.TransformerDecoderLayer(**KW, norm_first=norm_first)
    got = layer(x, mem, query_pos=qp, memory_pos=mp, use_causal_mask=True)
    sa, ca, ffn = layer.self_attention, layer.cross_attention, layer.feedforward
    n1, n2, n3 = layer.self_attention_norm, layer.cross_attention_norm, layer.feedforward_norm
    if norm_first:
        h = n1(x)
        y = x + sa(h + qp, h, h + qp, use_causal_mask=True)
        h = n2(y)
        y = y + ca(h + qp, mem, mem + mp)
        want = y + ffn(n3(y))
    else:
        y = n1(x + sa(x + qp, x, x + qp, use_causal_mask=True))
        y = n2(y + ca(y + qp, mem, mem + mp))
        want = n3(y + ffn(y))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # Adding the positions to the values as well would give something else.
    wrong = n1(x + sa(x + qp, x + qp, x + qp, use_causal_mask=True))
    if not norm_first:
        assert not np.allclose(wrong, n1(x + sa(x + qp, x, x + qp, use_causal_mask=True)))


def test_causal_decoder_stack_ignores_future_tokens():
    x, mem = _x(B, T, D), _x(B, S, D)
    dec = tt.TransformerDecoder(3, **KW)
    a = np.asarray(dec(x, mem, use_causal_mask=True))
    for t in range(1, T):
        x2 = x.copy()
        x2[:, t:] = _x(B, T - t, D)
        b = np.asarray(dec(x2, mem, use_causal_mask=True))
        np.testing.assert_allclose(a[:, :t], b[:, :t], atol=1e-5)
        assert not np.allclose(a[:, t:], b[:, t:])
    # Without the causal mask the past does change: the test above can fail.
    c = np.asarray(dec(x2, mem))
    assert not np.allclose(np.asarray(dec(x, mem))[:, 0], c[:, 0])


@pytest.mark.parametrize("use_cross_cache", [False, True])
def test_decoder_layer_cache_equals_full_pass(use_cross_cache):
    x, mem = _x(B, T, D), _x(B, S, D)
    valid = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    layer = tt.TransformerDecoderLayer(**KW)
    full = layer(x, mem, memory_mask=valid, use_causal_mask=True)
    cache = layer.empty_cache(B, T)
    cross = layer.compute_cross_attention_cache(mem) if use_cross_cache else None
    steps = []
    for t in range(T):
        out, cache = layer(x[:, t:t + 1], mem, memory_mask=valid, use_causal_mask=True,
                           cache=cache, cache_index=t, cross_attention_cache=cross)
        steps.append(out)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_decoder_stack_cache_equals_full_pass():
    x, mem = _x(B, T, D), _x(B, S, D)
    dec = tt.TransformerDecoder(2, **KW, norm_first=True)
    full = dec(x, mem, use_causal_mask=True)
    cache = dec.empty_cache(B, T)
    assert tuple(cache.shape) == (B, 2, 2, T, 4, 4)
    cross = dec.compute_cross_attention_cache(mem)
    steps = []
    for t in range(T):
        out, cache = dec(x[:, t:t + 1], None, use_causal_mask=True, cache=cache,
                         cache_index=t, cross_attention_cache=cross)
        steps.append(out)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_return_intermediate_stacks_normed_layer_outputs():
    x, mem = _x(B, T, D), _x(B, S, D)
    inter = tt.TransformerDecoder(3, **KW, return_intermediate=True)
    out = np.asarray(inter(x, mem))
    assert out.shape == (3, B, T, D)
    last = tt.TransformerDecoder(3, **KW, final_norm=True)
    last(x, mem)
    last.set_weights(inter.get_weights())
    np.testing.assert_allclose(out[-1], last(x, mem), atol=1e-6)
    # Slice i is layer i's output through the shared final norm.
    h = x
    for i, layer in enumerate(inter.layers):
        h = layer(h, mem)
        np.testing.assert_allclose(out[i], inter.norm(h), atol=1e-5)


def test_cross_attention_weights_are_returned_per_layer():
    x, mem = _x(B, T, D), _x(B, S, D)
    valid = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    dec = tt.TransformerDecoder(2, **KW)
    out, weights = dec(x, mem, memory_mask=valid, return_cross_attention=True)
    weights = np.asarray(weights)
    assert weights.shape == (2, B, 4, T, S)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(weights[:, 0, :, :, 2:] == 0)
    np.testing.assert_allclose(out, dec(x, mem, memory_mask=valid), atol=1e-6)


def test_stack_configs_round_trip_with_layer_arguments():
    dec = tt.TransformerDecoder(2, num_heads=4, hidden_dim=8, activation="gelu",
                                return_intermediate=True, layer_norm_epsilon=1e-6)
    config = dec.get_config()
    again = tt.TransformerDecoder.from_config(config)
    assert again.get_config() == config
    assert config["activation"] == "gelu" and config["layer_norm_epsilon"] == 1e-6
    assert keras.activations.get(config["activation"]) is keras.activations.gelu
