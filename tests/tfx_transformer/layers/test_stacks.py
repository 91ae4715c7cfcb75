"""Encoder/decoder layers and stacks against a NumPy transcription of their formulas."""

import h5py
import keras
import numpy as np
import pytest

import tfx_transformer as tt

rng = np.random.default_rng(2)
B, T, S, D, H = 2, 6, 5, 16, 4
KW = dict(num_heads=H, hidden_dim=32, dropout=0.0)


def _x(*shape):
    return rng.normal(size=shape).astype("float32")


def _np(x):
    return np.asarray(keras.ops.convert_to_numpy(x), "float64")


def np_attention(mha, q_in, k_in, v_in, mask=None, causal=False):
    """softmax((q_in Wq)(k_in Wk)ᵀ/√dk, masked)(v_in Wv) Wo with the layer's weights."""
    proj = lambda x, dense: np.einsum("btd,dhk->bthk", x, _np(dense.kernel)) + _np(dense.bias)  # noqa: E731
    q, k, v = proj(q_in, mha.query_dense), proj(k_in, mha.key_dense), proj(v_in, mha.value_dense)
    logits = np.einsum("bthk,bshk->bhts", q, k) / np.sqrt(q.shape[-1])
    allowed = np.ones(logits.shape, bool)
    if mask is not None:
        allowed &= mask[:, None]  # (B, 1, T|1, S)
    if causal:
        allowed &= np.tril(np.ones(logits.shape[-2:], bool))
    logits = np.where(allowed, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    out = np.einsum("bhts,bshk->bthk", w, v)
    return np.einsum("bthk,hkd->btd", out, _np(mha.output_dense.kernel)) + _np(
        mha.output_dense.bias)


def np_norm(norm, x):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + norm.epsilon) * _np(norm.gamma) + _np(norm.beta)


def np_ffn(ffn, x):
    h = np.maximum(x @ _np(ffn.inner.kernel) + _np(ffn.inner.bias), 0.0)
    return h @ _np(ffn.outer.kernel) + _np(ffn.outer.bias)


def np_residual(layer, x, fn, norm):
    """Post-norm ``norm(x + f(x))`` or pre-norm ``x + f(norm(x))``."""
    return x + fn(np_norm(norm, x)) if layer.norm_first else np_norm(norm, x + fn(x))


def np_encoder_layer(layer, x, valid, pos, pos_in_values=False):
    mask = valid[:, None, :]

    def attend(h):
        return np_attention(layer.self_attention, h + pos, h + pos,
                            h + pos if pos_in_values else h, mask=mask)
    x = np_residual(layer, x, attend, layer.self_attention_norm)
    return np_residual(layer, x, lambda h: np_ffn(layer.feedforward, h), layer.feedforward_norm)


def np_decoder_layer(layer, x, mem, valid, qp, mp):
    x = np_residual(layer, x, lambda h: np_attention(
        layer.self_attention, h + qp, h + qp, h, causal=True), layer.self_attention_norm)
    x = np_residual(layer, x, lambda h: np_attention(
        layer.cross_attention, h + qp, mem + mp, mem, mask=valid[:, None, :]),
        layer.cross_attention_norm)
    return np_residual(layer, x, lambda h: np_ffn(layer.feedforward, h), layer.feedforward_norm)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_equals_numpy_formula(norm_first):
    x, pos = _x(B, S, D), _x(B, S, D)
    valid = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    layer = tt.TransformerEncoderLayer(**KW, norm_first=norm_first)
    got = _np(layer(x, padding_mask=valid, pos=pos))
    np.testing.assert_allclose(got, np_encoder_layer(layer, x, valid, pos), atol=1e-4)
    # Positions added to the values too would give something else: the check can fail.
    assert not np.allclose(got, np_encoder_layer(layer, x, valid, pos, True), atol=1e-3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_equals_numpy_formula(norm_first):
    x, mem, qp, mp = _x(B, T, D), _x(B, S, D), _x(B, T, D), _x(B, S, D)
    valid = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    layer = tt.TransformerDecoderLayer(**KW, norm_first=norm_first)
    got = layer(x, mem, memory_mask=valid, query_pos=qp, memory_pos=mp, use_causal_mask=True)
    assert isinstance(got, tt.AttentionOutput) and got.attention is None and got.cache is None
    want = np_decoder_layer(layer, x, mem, valid, qp, mp)
    np.testing.assert_allclose(_np(got.output), want, atol=1e-4)
    other = np_decoder_layer(layer, x, mem, valid, qp, np.zeros_like(mp))
    assert not np.allclose(_np(got.output), other, atol=1e-3)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_chains_its_layers_and_final_norm(norm_first):
    x = _x(B, S, D)
    valid = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    enc = tt.TransformerEncoder(2, **KW, norm_first=norm_first)
    got = _np(enc(x, padding_mask=valid))
    want = x.astype("float64")
    for layer in enc.layers:
        want = np_encoder_layer(layer, want, valid, 0.0)
    assert (enc.norm is not None) == norm_first  # final norm by default only for pre-norm
    if norm_first:
        want = np_norm(enc.norm, want)
    np.testing.assert_allclose(got, want, atol=1e-4)


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


def test_causal_decoder_stack_ignores_future_tokens():
    x, mem = _x(B, T, D), _x(B, S, D)
    dec = tt.TransformerDecoder(3, **KW)
    a = _np(dec(x, mem, use_causal_mask=True).output)
    for t in range(1, T):
        x2 = x.copy()
        x2[:, t:] = _x(B, T - t, D)
        b = _np(dec(x2, mem, use_causal_mask=True).output)
        np.testing.assert_allclose(a[:, :t], b[:, :t], atol=1e-5)
        assert not np.allclose(a[:, t:], b[:, t:])
    # Without the causal mask the past does change: the test above can fail.
    c = _np(dec(x2, mem).output)
    assert not np.allclose(_np(dec(x, mem).output)[:, 0], c[:, 0])


@pytest.mark.parametrize("use_cross_cache", [False, True])
def test_decoder_layer_cache_equals_full_pass(use_cross_cache):
    x, mem = _x(B, T, D), _x(B, S, D)
    valid = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)
    layer = tt.TransformerDecoderLayer(**KW)
    full = layer(x, mem, memory_mask=valid, use_causal_mask=True).output
    cache = layer.empty_cache(B, T)
    cross = layer.compute_cross_attention_cache(mem) if use_cross_cache else None
    steps = []
    for t in range(T):
        out = layer(x[:, t:t + 1], mem, memory_mask=valid, use_causal_mask=True,
                    cache=cache, cache_index=t, cross_attention_cache=cross)
        steps.append(out.output)
        cache = out.cache
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_decoder_stack_cache_equals_full_pass():
    x, mem = _x(B, T, D), _x(B, S, D)
    dec = tt.TransformerDecoder(2, **KW, norm_first=True)
    full = dec(x, mem, use_causal_mask=True).output
    cache = dec.empty_cache(B, T)
    assert tuple(cache.shape) == (2, 2, B, 4, T, 4)  # (L, 2, B, H, T, D)
    cross = dec.compute_cross_attention_cache(mem)
    steps = []
    for t in range(T):
        out = dec(x[:, t:t + 1], None, use_causal_mask=True, cache=cache, cache_index=t,
                  cross_attention_cache=cross)
        steps.append(out.output)
        cache = out.cache
    np.testing.assert_allclose(np.concatenate(steps, 1), full, atol=1e-5)


def test_layers_and_normalize_give_the_intermediate_outputs():
    x, mem = _x(B, T, D), _x(B, S, D)
    inter = tt.TransformerDecoder(3, **KW, return_intermediate=True)
    out = _np(inter(x, mem).output)
    assert out.shape == (3, B, T, D)
    last = tt.TransformerDecoder(3, **KW, final_norm=True)
    last(x, mem)
    last.set_weights(inter.get_weights())
    np.testing.assert_allclose(out[-1], last(x, mem).output, atol=1e-6)
    # Slice i is layer i's output through the shared final norm (public iteration).
    h = x
    for i, layer in enumerate(inter.layers):
        h = layer(h, mem).output
        np.testing.assert_allclose(out[i], inter.normalize(h), atol=1e-5)
    np.testing.assert_allclose(_np(inter.normalize(h)), np_norm(inter.norm, _np(h)), atol=1e-5)
    plain = tt.TransformerDecoder(1, **KW)  # post-norm, no intermediates: no final norm
    plain(x, mem)
    assert plain.norm is None and plain.normalize(x) is x


def test_cross_attention_weights_are_returned_per_layer():
    x, mem = _x(B, T, D), _x(B, S, D)
    valid = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], bool)
    dec = tt.TransformerDecoder(2, **KW)
    out = dec(x, mem, memory_mask=valid, return_cross_attention=True)
    weights = _np(out.attention)
    assert weights.shape == (2, B, 4, T, S) and out.cache is None
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(weights[:, 0, :, :, 2:] == 0)
    np.testing.assert_allclose(out.output, dec(x, mem, memory_mask=valid).output, atol=1e-6)
    # Layer i's weights are what layer i returns on its own input.
    h = x
    for i, layer in enumerate(dec.layers):
        step = layer(h, mem, memory_mask=valid, return_cross_attention=True)
        np.testing.assert_allclose(weights[i], step.attention, atol=1e-6)
        h = step.output


STACK_KEYS = {"name", "trainable", "dtype", "num_layers", "final_norm", "num_heads",
              "hidden_dim", "dropout", "attention_dropout", "activation_dropout", "activation",
              "norm_first", "layer_norm_epsilon", "kernel_initializer", "bias_initializer"}


def test_stack_configs_keep_their_keys_and_round_trip():
    dec = tt.TransformerDecoder(2, num_heads=4, hidden_dim=8, activation="gelu",
                                return_intermediate=True, layer_norm_epsilon=1e-6)
    config = dec.get_config()
    # The keys of the files saved before the stacks stopped subclassing ResidualBlockLayer.
    assert set(config) == STACK_KEYS | {"return_intermediate"}
    assert set(tt.TransformerEncoder(1, num_heads=2, hidden_dim=4).get_config()) == STACK_KEYS
    again = tt.TransformerDecoder.from_config(config)
    assert again.get_config() == config
    assert config["activation"] == "gelu" and config["layer_norm_epsilon"] == 1e-6
    assert config["attention_dropout"] == config["dropout"] == 0.1  # None resolved
    assert keras.activations.get(config["activation"]) is keras.activations.gelu
    again(_x(B, T, 8), _x(B, S, 8))
    assert [layer.name for layer in again.layers] == ["layer_0", "layer_1"]
    assert all(layer.feedforward.inner.activation is keras.activations.gelu
               for layer in again.layers)


def test_stack_arguments_are_checked_when_constructed():
    with pytest.raises(ValueError, match="num_layers"):
        tt.TransformerDecoder(0, num_heads=2, hidden_dim=4)
    with pytest.raises(ValueError, match="num_heads"):
        tt.TransformerEncoder(1, num_heads=0, hidden_dim=4)
    with pytest.raises(ValueError, match="dropout"):
        tt.TransformerDecoder(1, num_heads=2, hidden_dim=4, dropout=1.0)
    with pytest.raises(ValueError, match="memory_mask"):
        tt.TransformerDecoderLayer(**KW)(_x(B, T, D), _x(B, S, D), memory_mask=np.ones((S,)))


def _old_weight_paths():
    """The ``.weights.h5`` layout of stacks saved before this refactor (2 + 2 layers, pre-norm
    encoder and decoder with final norms): attribute paths, list items by class name."""
    attention = [f"{p}_dense/vars/{i}" for p in ("query", "key", "value", "output")
                 for i in (0, 1)]
    ffn = [f"feedforward/{d}/vars/{i}" for d in ("inner", "outer") for i in (0, 1)]
    norm = lambda name: [f"{name}/vars/0", f"{name}/vars/1"]  # noqa: E731
    paths = set()
    for stack, subs in (("encoder", ["self_attention"]),
                        ("decoder", ["self_attention", "cross_attention"])):
        for item in (f"transformer_{stack}_layer", f"transformer_{stack}_layer_1"):
            prefix = f"{stack}/layers/{item}/"
            paths |= {prefix + p for p in ffn + norm("feedforward_norm")}
            for sub in subs:
                paths |= {prefix + f"{sub}/{p}" for p in attention}
                paths |= {prefix + p for p in norm(f"{sub}_norm")}
        paths |= {f"{stack}/{p}" for p in norm("norm")}
    return paths


class _Stacks(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder = tt.TransformerEncoder(2, **KW, norm_first=True)
        self.decoder = tt.TransformerDecoder(2, **KW, norm_first=True)

    def call(self, inputs):
        x, mem = inputs
        return self.decoder(x, self.encoder(mem)).output


def test_weight_file_layout_is_unchanged(tmp_path):
    model = _Stacks()
    model((_x(B, T, D), _x(B, S, D)))
    path = str(tmp_path / "stacks.weights.h5")
    model.save_weights(path)
    with h5py.File(path) as f:
        names = []
        f.visit(lambda n: names.append(n) if "/vars/" in n else None)
    assert set(names) == _old_weight_paths()
